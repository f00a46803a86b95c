"""BrowserEnvironment in a real headless Chromium: actions, ids, network wall, crashes, isolation.

Skipped (with the reason: how to install Chromium) where no Chromium or playwright is found.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentax.envs import (
    BROWSER_SPANS,
    BrowserAction,
    BrowserEnvironment,
    BrowserUnavailableError,
    EnvError,
    check_browser_available,
    format_browser_action,
    miniwob_task,
    parse_browser_action,
    shutdown_browser,
    web_task,
)
from agentax.records import Action, Task, TrajectoryStatus

try:
    check_browser_available()
except BrowserUnavailableError as e:  # pragma: no cover - depends on the host
    pytest.skip(f"browser unavailable: {e}", allow_module_level=True)

PAGE = """<!doctype html><html><head><title>Local</title></head><body>
<p id="msg">nothing yet</p>
<button onclick="document.getElementById('msg').textContent='clicked';
  var b = document.createElement('button'); b.textContent = 'New'; document.body.prepend(b);">Go</button>
<input id="name" type="text" placeholder="Your name">
<select id="color"><option>Red</option><option>Green</option><option>Blue</option></select>
<p id="key">no key</p>
<div style="height: 3000px">tall</div>
<script>
document.addEventListener('keydown', e => { document.getElementById('key').textContent = 'key ' + e.key; });
</script></body></html>"""


def run(coro):
    async def main():
        try:
            return await coro
        finally:
            await shutdown_browser()

    return asyncio.run(main())


@pytest.fixture
def page_task(tmp_path):
    path = tmp_path / "page.html"
    path.write_text(PAGE)
    return Task(id="local", prompt="Play with the page.", answer="Blue", meta={"url": path.as_uri()})


def ids(text, label):
    """The id of the control whose line holds `label`."""
    line = next(ln for ln in text.splitlines() if label in ln and ln.startswith("["))
    return int(line[1 : line.index("]")])


def test_action_text_round_trips_and_errors_are_messages():
    for a in (BrowserAction(kind="click", target=3), BrowserAction(kind="type", target=2, text="hi there"),
              BrowserAction(kind="select", target=9, text="Blue"), BrowserAction(kind="press", text="Enter"),
              BrowserAction(kind="scroll", text="up"), BrowserAction(kind="goto", text="http://127.0.0.1:1/x"),
              BrowserAction(kind="done", text="42")):
        assert parse_browser_action(format_browser_action(a)) == a
    thought = "I think so.\nAction: type(4, 'abc')"
    assert parse_browser_action(thought) == BrowserAction(kind="type", target=4, text="abc")
    assert parse_browser_action("click [7]") == BrowserAction(kind="click", target=7)
    for bad in ("hello", "click here", "type 3", "scroll sideways"):
        assert isinstance(parse_browser_action(bad), str)


def test_each_action_type_on_a_local_page(page_task):
    async def go():
        env = BrowserEnvironment(max_steps=20)
        obs = await env.reset(page_task)
        text = obs.content
        assert text.startswith("Play with the page.") and "nothing yet" in text
        go_id, name_id, color_id = ids(text, '"Go"'), ids(text, "input text"), ids(text, "select")
        r = await env.step(Action(text=f"click {go_id}"))
        assert "clicked" in r.observation.content and '"New"' in r.observation.content
        r = await env.step(Action(text=f'type {name_id} "Ada Lovelace"'))
        assert 'input text "Ada Lovelace"' in r.observation.content
        r = await env.step(Action(text=f'select {color_id} "Green"'))
        assert 'select "Green"' in r.observation.content
        r = await env.step(Action(text="press Escape"))
        assert "key Escape" in r.observation.content
        await env.step(Action(text="scroll down"))
        assert await env.page.evaluate("window.scrollY") == 300
        r = await env.step(Action(text="click 999"))
        assert r.observation.content.startswith("click [999] failed") and r.info["failed_action"]
        r = await env.step(Action(text="what now?"))
        assert r.observation.content.startswith("Invalid action") and r.info["invalid_action"]
        r = await env.step(Action(text='done "blue"'))
        assert r.done and r.reward == 1.0
        assert env.browser_stats["invalid_actions"] == 1 and env.browser_stats["failed_actions"] == 1
        await env.close()

    run(go())


TYPE_PAGE = """<!doctype html><html><body>
<input id="a" type="text" value="old"><textarea id="t">old text</textarea>
<input id="n" type="number"><input id="d" type="date"><input id="off" type="text" disabled value="x">
<div id="ce" contenteditable="true" tabindex="0">editable</div>
<p id="log"></p>
<script>
for (const id of ['a', 't', 'n', 'd'])
  document.getElementById(id).addEventListener('input', (e) => {
    document.getElementById('log').textContent += id + ':' + e.inputType + ';';
  });
</script></body></html>"""


def test_type_replaces_the_text_of_each_kind_of_field_as_fill_does(tmp_path):
    # Plain text fields take the one-call path; other fields go through Playwright's fill.
    path = tmp_path / "type.html"
    path.write_text(TYPE_PAGE)
    task = Task(id="type", prompt="Type.", meta={"url": path.as_uri()})

    async def go():
        env = BrowserEnvironment(max_steps=20, action_timeout_s=1.0)
        text = (await env.reset(task)).content
        a, t, n, d = ids(text, 'text "old"'), ids(text, "textarea"), ids(text, "number"), ids(text, "date")
        off, ce = ids(text, 'text "x"'), ids(text, "editable")
        r = await env.step(Action(text=f'type {a} "new words"'))
        assert 'input text "new words"' in r.observation.content and not r.info.get("failed_action")
        r = await env.step(Action(text=f'type {t} "more text"'))
        assert 'textarea "more text"' in r.observation.content
        r = await env.step(Action(text=f'type {n} "42"'))
        assert 'input number "42"' in r.observation.content
        r = await env.step(Action(text=f'type {n} "abc"'))
        assert r.info.get("failed_action") and "number" in r.observation.content.splitlines()[0]
        r = await env.step(Action(text=f'type {d} "2024-05-06"'))
        assert 'input date "2024-05-06"' in r.observation.content
        r = await env.step(Action(text=f'type {off} "y"'))  # disabled: fill waits, then fails
        assert r.info.get("failed_action") and r.observation.content.startswith(f"type [{off}] failed")
        r = await env.step(Action(text=f'type {ce} "changed"'))
        assert '"changed"' in r.observation.content and '"editable"' not in r.observation.content
        # Text "" (as a parsed action: the text form needs some) clears the field (fill's Delete).
        r = await env.step(Action(text="", value=BrowserAction(kind="type", target=a, text="")))
        assert 'input text ""' in r.observation.content
        log = await env.page.evaluate("document.getElementById('log').textContent")
        assert log.startswith("a:insertText;t:insertText;n:insertText;d:"), log
        assert log.endswith("a:deleteContentForward;"), log
        await env.close()

    run(go())


def test_element_ids_are_stable_across_observations(page_task):
    async def go():
        env = BrowserEnvironment()
        first = (await env.reset(page_task)).content
        before = {label: ids(first, label) for label in ('"Go"', "input text", "select")}
        # The click prepends a new button: old controls keep their ids, the new one gets a new id.
        after = (await env.step(Action(text=f"click {before[chr(34) + 'Go' + chr(34)]}"))).observation.content
        assert {label: ids(after, label) for label in before} == before
        assert ids(after, '"New"') not in before.values()
        again = (await env.step(Action(text="press Shift"))).observation.content
        assert {label: ids(again, label) for label in before} == before
        await env.close()

    run(go())


def test_outside_urls_are_blocked(tmp_path):
    path = tmp_path / "leak.html"
    path.write_text("""<html><body><p id="s">waiting</p><script>
      fetch('http://example.com/steal').then(() => { document.getElementById('s').textContent = 'leaked'; })
        .catch(() => { document.getElementById('s').textContent = 'fetch failed'; });
    </script></body></html>""")
    task = Task(id="leak", meta={"url": path.as_uri()})

    async def go():
        env = BrowserEnvironment()
        await env.reset(task)
        await asyncio.sleep(0.3)
        r = await env.step(Action(text="goto http://example.com/"))
        assert r.observation.content.startswith("goto blocked") and env.browser_stats["blocked_gotos"] == 1
        assert "fetch failed" in r.observation.content and "leaked" not in r.observation.content
        assert env.host.stats["blocked_requests"] >= 1
        assert env.page.url == path.as_uri()
        await env.close()

    run(go())


def test_a_killed_browser_fails_only_its_episodes_and_restarts(page_task):
    other_result = {}

    def other_worker(started, go_on):
        # A second worker (its own loop, its own browser) is not touched by the crash.
        async def episode():
            env = BrowserEnvironment()
            await env.reset(page_task)
            started.set()
            await asyncio.get_running_loop().run_in_executor(None, go_on.wait)
            r = await env.step(Action(text="press a"))
            other_result["content"] = r.observation.content
            await env.close()

        run(episode())

    async def go():
        started, go_on = threading.Event(), threading.Event()
        # A daemon: if the test fails before releasing it, the process must still exit.
        t = threading.Thread(target=other_worker, args=(started, go_on), daemon=True)
        t.start()
        envs = [BrowserEnvironment() for _ in range(3)]
        for env in envs:
            await env.reset(page_task)
        host = envs[0].host
        pid = host.browser_pid()
        assert pid is not None
        await asyncio.get_running_loop().run_in_executor(None, started.wait)
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if host.stats["crashes"]:
                break
            await asyncio.sleep(0.05)
        for env in envs:
            with pytest.raises(EnvError) as e:
                await env.step(Action(text="press a"))
            assert e.value.kind == "browser_crashed" and e.value.status is TrajectoryStatus.ENV_ERROR
        assert host.stats["crashes"] == 1 and host.stats["crashed_episodes"] == 3
        go_on.set()
        t.join(60)
        assert "key a" in other_result["content"]
        # The next episode relaunches the browser.
        obs = await envs[0].reset(page_task)
        assert "nothing yet" in obs.content and host.stats["launches"] == 2
        assert host.browser_pid() not in (None, pid)
        for env in envs:
            await env.close()

    run(go())


class _HTMLPage(BaseHTTPRequestHandler):
    """A local page server that logs nothing; `_start()` answers 200 with an HTML body to come."""

    def log_message(self, *args):
        return None

    def _start(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()


class _CookiePage(_HTMLPage):
    def do_GET(self):
        self._start()
        self.wfile.write(b"""<html><body><p>cookie: <span id=c></span></p><input type=text>
          <button onclick="document.cookie = 'who=' + document.querySelector('input').value;">Save</button>
          <script>document.getElementById('c').textContent = document.cookie || 'none';</script></body></html>""")


def test_twenty_concurrent_contexts_do_not_share_cookies():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CookiePage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"

    async def episode(i):
        # Generous limits: 20 pages opening at once on a busy 2-core host take a while.
        env = BrowserEnvironment(navigation_timeout_s=90, action_timeout_s=30, reset_timeout_s=180,
                                 step_timeout_s=180)
        obs = await env.reset(Task(id=f"c{i}", meta={"url": url}))
        assert "cookie: none" in obs.content
        await env.step(Action(text=f'type {ids(obs.content, "input")} "user{i}"'))
        await env.step(Action(text=f'click {ids(obs.content, "Save")}'))
        r = await env.step(Action(text=f"goto {url}"))
        await env.close()
        return r.observation.content

    async def go():
        return await asyncio.gather(*(episode(i) for i in range(20)))

    try:
        views = run(go())
    finally:
        server.shutdown()
    for i, view in enumerate(views):
        assert f"cookie: who=user{i}" in view, view


class _SlowBody(_HTMLPage):
    """`/` links to `/slow`, whose head arrives at once and whose body 0.8 s later."""

    def do_GET(self):
        self._start()
        if self.path != "/slow":
            self.wfile.write(b'<html><body><a href="/slow">Next</a></body></html>')
            return
        self.wfile.write(b"<html><head><title>Slow</title>" + b" " * 2048)
        self.wfile.flush()
        time.sleep(0.8)
        self.wfile.write(b"</head><body><p>Price: $3</p></body></html>")


def test_a_page_still_arriving_after_a_click_is_read_once_it_has_loaded():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowBody)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"

    async def go():
        env = BrowserEnvironment()
        obs = await env.reset(Task(id="slow", meta={"url": url}))
        r = await env.step(Action(text=f"click {ids(obs.content, 'Next')}"))
        await env.close()
        return r.observation

    try:
        obs = run(go())
    finally:
        server.shutdown()
    assert obs.info["url"].endswith("/slow")
    assert obs.info["title"] == "Slow" and "Price: $3" in obs.content, obs


# A page that reports what an earlier episode could have left behind, then leaves some of each.
_LEAVER = b"""<!doctype html><html><body><p id="seen">?</p><button id="pop">Pop</button><script>
(async () => {
  const db = await new Promise(ok => { const r = indexedDB.open('d'); r.onupgradeneeded = () =>
    r.result.createObjectStore('s'); r.onsuccess = () => ok(r.result); });
  const idb = await new Promise(ok => { const q = db.transaction('s').objectStore('s').get('k');
    q.onsuccess = () => ok(q.result || 'none'); });
  document.getElementById('seen').textContent = [
    'cookie=' + (document.cookie || 'none'), 'local=' + (localStorage.getItem('k') || 'none'),
    'session=' + (sessionStorage.getItem('k') || 'none'), 'idb=' + idb,
    'name=' + (window.name || 'none'), 'history=' + history.length].join(' ');
  document.cookie = 'k=1; max-age=3600'; localStorage.setItem('k', '1'); sessionStorage.setItem('k', '1');
  db.transaction('s', 'readwrite').objectStore('s').put('1', 'k'); window.name = 'left';
  history.pushState({}, '', '#pushed');
})();
document.getElementById('pop').onclick = () => window.open(location.href.split('#')[0] + '?popup');
</script></body></html>"""


class _Leaver(_HTMLPage):
    def do_GET(self):
        self._start()
        self.wfile.write(_LEAVER)


def test_a_recycled_page_carries_nothing_of_the_episode_before():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Leaver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"

    async def seen(env, i):
        obs = await env.reset(Task(id=f"l{i}", meta={"url": url}))
        for _ in range(100):  # the page's script is async (IndexedDB)
            if "cookie=" in obs.content and "history=" in obs.content:
                break
            await asyncio.sleep(0.02)
            obs = (await env.step(Action(text="scroll down"))).observation
        line = next(ln for ln in obs.content.splitlines() if "cookie=" in ln)
        await env.step(Action(text=f"click {ids(obs.content, 'Pop')}"))  # a pop-up, left open
        return line, env.page

    async def go():
        env = BrowserEnvironment(max_steps=200)
        first, page1 = await seen(env, 0)
        await env.close()
        host = env.host
        env2 = BrowserEnvironment(max_steps=200)
        second, page2 = await seen(env2, 1)  # a new environment, the same (recycled) page
        await env2.close()
        fresh = BrowserEnvironment(max_steps=200, reuse_pages=False)
        third, page3 = await seen(fresh, 2)
        await fresh.close()
        return first, second, third, page1 is page2, page3 is not page1, dict(host.stats)

    try:
        first, second, third, reused, fresh_page, stats = run(go())
    finally:
        server.shutdown()
    # The same view as a fresh context's page (history included: what `history.length` says).
    assert "cookie=none local=none session=none idb=none name=none" in first
    assert first == second == third, (first, second, third)
    assert reused and fresh_page
    assert stats["recycled_tabs"] >= 1 and stats["contexts"] == 2, stats


def test_a_timed_out_episode_does_not_hand_its_page_on(tmp_path, page_task):
    hang = tmp_path / "hang.html"
    hang.write_text('<button onclick="for (;;) {}">Hang</button>')

    async def go():
        env = BrowserEnvironment(step_timeout_s=1.0)
        obs = await env.reset(Task(id="hang", meta={"url": hang.as_uri()}))
        first = env.page
        with pytest.raises(EnvError) as err:  # the page never answers: the step's limit ends it
            await env.step(Action(text=f"click {ids(obs.content, 'Hang')}"))
        await env.reset(page_task)  # the same environment's next episode: a fresh page
        second = env.page
        await env.close()
        return err.value.status, first is not second, env.host.stats["recycled_tabs"]

    status, differs, recycled = run(go())
    assert status == TrajectoryStatus.TIMEOUT
    assert differs and recycled == 1  # only the clean second episode's page went back


def test_miniwob_seeds_give_fixed_instances_and_the_page_scores_them():
    async def go():
        env = BrowserEnvironment()
        a = (await env.reset(miniwob_task("click-button", 5))).content
        b = (await env.reset(miniwob_task("click-button", 5))).content
        c = (await env.reset(miniwob_task("click-button", 6))).content
        assert a == b and a != c
        for seed in range(5, 30):  # an instance with a wrong button too
            view = (await env.reset(miniwob_task("click-button", seed))).content
            target = view.splitlines()[0].split('"')[1]  # Click on the "X" button.
            wrong = [int(ln[1 : ln.index("]")]) for ln in view.splitlines()
                     if ln.startswith("[") and "button" in ln and f'"{target}"' not in ln]
            if wrong:
                break
        right = ids(view, f'button "{target}"')
        r = await env.step(Action(text=f"click {right}"))
        assert r.done and r.reward == 1.0 and r.info["metrics"]["success"] == 1.0
        await env.reset(miniwob_task("click-button", seed))
        r = await env.step(Action(text=f"click {wrong[0]}"))
        assert r.done and r.reward == -1.0
        obs = await env.reset(miniwob_task("login-user", 2))
        user, pw = obs.content.split('"')[1], obs.content.split('"')[3]
        await env.step(Action(text=f'type {ids(obs.content, "input text")} "{user}"'))
        await env.step(Action(text=f'type {ids(obs.content, "input password")} "{pw}"'))
        r = await env.step(Action(text=f'click {ids(obs.content, "Login")}'))
        assert r.done and r.reward == 1.0
        await env.close()

    run(go())


def test_web_tasks_flow_is_scored_from_the_app_state():
    task = web_task(3)
    order = task.meta["order"]
    item = task.prompt.split(" of the ")[1].split(" for ")[0]

    async def go(qty):
        env = BrowserEnvironment()
        obs = await env.reset(task)
        await env.step(Action(text=f'type {ids(obs.content, "input")} "{item}"'))
        search = ids(obs.content, 'button "Search"')
        obs = (await env.step(Action(text=f"click {search}"))).observation
        obs = (await env.step(Action(text=f'click {ids(obs.content, item)}'))).observation
        assert "Price: $" in obs.content
        await env.step(Action(text=f'type {ids(obs.content, "input")} "{order["name"]}"'))
        await env.step(Action(text=f'select {ids(obs.content, "select")} "{qty}"'))
        order_button = ids(obs.content, 'button "Order"')
        r = await env.step(Action(text=f"click {order_button}"))
        await env.close()
        return r

    r = run(go(order["qty"]))
    assert r.done and r.reward == 1.0 and r.info["metrics"] == {"success": 1.0, "found_item": 1.0, "ordered": 1.0}
    r = run(go(order["qty"] % 5 + 1))
    assert r.done and r.reward == 0.0 and r.info["metrics"]["ordered"] == 1.0


def test_browser_work_is_traced_on_the_episode_track(page_task):
    from agentax.trace import get_tracer, names

    tracer = get_tracer()

    async def go():
        env = BrowserEnvironment()
        with tracer.use_track(names.episode_track(3)):
            await env.reset(page_task)
            await env.step(Action(text="press a"))
        await env.close()

    tracer.take_events()
    run(go())
    spans = [(e[4], e[3]) for e in tracer.take_events() if e[0] == 0]
    track = names.episode_track(3)
    for name in BROWSER_SPANS[1:]:
        assert (name, track) in spans, name
    assert BROWSER_SPANS[0] in [n for n, _ in spans]


def test_missing_chromium_fails_at_construction_with_the_fix():
    with pytest.raises(BrowserUnavailableError, match="Chromium not found"):
        BrowserEnvironment(executable_path="/nonexistent/chrome")


def test_launch_keeps_playwrights_disabled_features_in_the_one_switch_chromium_reads():
    from agentax.envs._browser_host import launch_args

    args = launch_args(["--foo", "--disable-features=Mine"])
    switches = [a for a in args if a.startswith("--disable-features=")]
    assert len(switches) == 1 and args[-1] == switches[0] and "--foo" in args
    features = switches[0].split("=", 1)[1].split(",")
    # Playwright's (it routes requests with them off), the omnibox UI's, and the caller's.
    assert {"AvoidCorsURLLoaderRestartOnRedirect", "PaintHolding", "WebUIOmniboxPopup", "Mine"} <= set(features)


def _renderers_under(pid):
    kids = {}
    for e in os.listdir("/proc"):
        try:
            with open(f"/proc/{e}/stat") as f:
                kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(e))
        except (OSError, ValueError, IndexError):
            continue
    found, stack = 0, list(kids.get(pid, []))
    while stack:
        p = stack.pop()
        stack += kids.get(p, [])
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                found += b"--type=renderer" in f.read()
        except OSError:
            pass
    return found


def test_a_context_opens_only_its_page_no_browser_ui(page_task):
    # Headless Chrome built two omnibox-popup WebUI pages per window (context), in a renderer of
    # their own, and a spare renderer after each page load that no other context can use: more
    # than half a reset's CPU (issue 45). One renderer per open page is all it takes.
    async def go():
        envs = [BrowserEnvironment() for _ in range(3)]
        for env in envs:
            await env.reset(page_task)
        cdp = await envs[0].host._browser.new_browser_cdp_session()
        targets = (await cdp.send("Target.getTargets", {"filter": [{}]}))["targetInfos"]
        await cdp.detach()
        assert [t["url"] for t in targets if t["type"] == "browser_ui"] == []
        assert sum(t["type"] == "page" and t["url"] == page_task.meta["url"] for t in targets) == 3
        await asyncio.sleep(0.5)  # a spare would start right after the load
        assert _renderers_under(envs[0].host.browser_pid()) == 3
        for env in envs:
            await env.close()

    run(go())


def test_the_headless_shell_is_preferred_where_installed(monkeypatch):
    from agentax.envs import _browser_host

    monkeypatch.delenv("AGENTAX_CHROMIUM", raising=False)
    installed = {"chromium": "/usr/bin/chromium", "chromium-headless-shell": "/usr/bin/chromium-headless-shell"}
    monkeypatch.setattr(_browser_host.shutil, "which", installed.get)
    monkeypatch.setattr(_browser_host, "_unwrapped", lambda path: path)  # see the test below
    assert _browser_host.find_chromium() == "/usr/bin/chromium-headless-shell"
    del installed["chromium-headless-shell"]
    assert _browser_host.find_chromium() == "/usr/bin/chromium"


def test_a_launcher_script_that_does_not_exec_is_looked_through(tmp_path):
    # Debian's /usr/bin/chromium-headless-shell runs the binary without `exec`: launched
    # through it, the browser would be a child of a shell (the pid a crash is read from).
    from agentax.envs._browser_host import _unwrapped

    binary = tmp_path / "lib" / "chromium-headless-shell"
    binary.parent.mkdir()
    binary.write_bytes(b"\x7fELF not really")
    binary.chmod(0o755)
    wrapper = tmp_path / "chromium-headless-shell"
    wrapper.write_text(f'#!/bin/sh -e\n\n{binary} "$@"\n')
    wrapper.chmod(0o755)
    assert _unwrapped(str(wrapper)) == str(binary)
    other = tmp_path / "chromium"  # a script naming another binary is kept as it is
    other.write_text(f'#!/bin/sh\nexec {binary} --flag "$@"\n')
    other.chmod(0o755)
    assert _unwrapped(str(other)) == str(other)
    assert _unwrapped(str(binary)) == str(binary)
