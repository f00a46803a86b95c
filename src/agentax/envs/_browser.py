"""`BrowserEnvironment`: a real headless Chromium page the model acts on through text.

Each episode opens an isolated browser context (fresh cookies and storage) in the worker's
shared Chromium (`_browser_host`), loads its task's start page, and shows the model a compact
text view with a stable id per control (`_browser_obs`). The model answers with one action per
reply (`_browser_actions`: click / type / select / press / scroll / goto / done); a reply that
names no valid action, an unknown id, or a click that fails comes back as the next observation
(with the page again) and is counted, never raised.

*Sites* say where an episode starts and how it is scored: a `BrowserSite` gives the start URL,
an instruction, and the reward from the page or the app behind it after each action and at
`done`. Built-ins: `miniwob` (the MiniWoB++ pages, scored by their own JavaScript) and
`web_tasks` (a small local shop app, scored from its server state); a task names its site in
`task.meta["site"]`. `UrlSite` opens `task.meta["url"]` and scores the `done` answer.

Safety and failures:
* Network: the page may load only loopback (localhost, 127.0.0.1, ::1), file:, data:, blob: and
  about: URLs; every other request is aborted and counted (`blocked_requests`), and outside
  host names do not resolve. `goto` additionally accepts only the site's allow-list (its start
  page's origin, or folder for file: pages, plus `allow` prefixes).
* Timeouts: every browser call is bounded (`action_timeout_s`, `navigation_timeout_s`); a call
  that hangs fails its action (feedback) or, for the page view itself, the episode (TIMEOUT).
* A crashed browser ends only the episodes it held (`EnvError(kind="browser_crashed")`,
  counted in the host's `crashed_episodes`); the next reset relaunches it.

Trace spans (on the caller's track): `browser_navigate`, `browser_action`, `browser_observe`.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from agentax.envs._base import EnvError, Environment
from agentax.envs._browser_actions import BrowserAction, parse_browser_action
from agentax.envs._browser_host import BrowserHost, BrowserTab, browser_host, find_chromium
from agentax.envs._browser_obs import ID_ATTR, OBSERVE_JS, format_view
from agentax.records import Action, Observation, StepResult, Task, TrajectoryStatus
from agentax.trace import get_tracer, names

__all__ = ["BROWSER_SITES", "BROWSER_SPANS", "BrowserEnvironment", "BrowserSite", "UrlSite", "register_browser_site"]

BROWSER_SPANS = names.BROWSER_SPANS
"""Trace span names of browser work (launch, page loads, actions, page views), defined in
`agentax.trace.names` so that `agentax doctor` can tell a browser-bound run."""

_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}
_NOT_LOCAL = re.compile(r"^(?!(?:https?|wss?)://(?:localhost|127\.0\.0\.1|\[::1\])(?:[:/?#]|$)"
                        r"|(?:file|data|blob|about|chrome-error):)")
_ID_LINE = re.compile(r"^\[(\d+)\] ")
_LOCAL_SCHEMES = {"file", "data", "blob", "about", "chrome-error"}


def is_loopback_url(url: str) -> bool:
    """Whether a page may load `url`: loopback hosts and local schemes only."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in _LOCAL_SCHEMES:
        return True
    return parts.scheme in ("http", "https", "ws", "wss") and (parts.hostname or "") in _LOOPBACK


class BrowserSite:
    """Where a browser episode starts and how it is scored. Subclass and override.

    Attributes:
      root: CSS selector of the part of the page the observation shows (None: the body).
      skip: CSS selector of elements left out of the observation (None: none).
      allow: URL prefixes `goto` may open besides the start page's origin (or folder).
      state_js: a JavaScript function expression (`() => ...`) whose result `check` receives
        as `state`; it runs in the same page call as the text view (one round trip a step).
    """

    root: str | None = None
    skip: str | None = None
    allow: tuple[str, ...] = ()
    state_js: str | None = None

    def start_url(self, task: Task) -> str:
        """The page the episode opens."""
        raise NotImplementedError

    async def setup(self, page: Any, task: Task) -> str:
        """Prepare the loaded page; return the instruction shown above the page (default the
        task's prompt)."""
        return task.prompt

    async def check(self, page: Any, task: Task, state: Any) -> tuple[float, bool, Mapping[str, float]]:
        """After each action: (reward, done, metrics); `state` is what `state_js` returned (None
        without one). Default: nothing happens until `done`."""
        return 0.0, False, {}

    async def finish(self, page: Any, task: Task, answer: str) -> tuple[float, Mapping[str, float]]:
        """The model said `done(answer)`: (reward, metrics)."""
        return 0.0, {}

    async def release(self, task: Task) -> None:  # noqa: B027 - optional hook
        """The episode is over (free server-side state). Default: nothing."""


class UrlSite(BrowserSite):
    """Opens `task.meta["url"]`; `done(answer)` scores 1.0 if the answer equals `task.answer`
    (whitespace and case ignored), else 0.0."""

    def start_url(self, task: Task) -> str:
        url = task.meta.get("url")
        if not url:
            raise ValueError(f"task {task.id!r} has no meta['url'] (UrlSite opens it)")
        return str(url)

    async def finish(self, page: Any, task: Task, answer: str) -> tuple[float, Mapping[str, float]]:
        if task.answer is None:
            return 0.0, {}
        ok = " ".join(answer.split()).lower() == " ".join(str(task.answer).split()).lower()
        return float(ok), {}


BROWSER_SITES: dict[str, Any] = {"url": UrlSite}
"""Site factories by name (`task.meta["site"]`); `register_browser_site` adds one."""


def register_browser_site(name: str, factory: Any) -> None:
    """Register a `BrowserSite` class (or zero-argument factory) under `name`."""
    BROWSER_SITES[name] = factory


def _origin_prefix(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        return url.rsplit("/", 1)[0] + "/"
    return f"{parts.scheme}://{parts.netloc}/"


# A document that starts leaving (link, form submit, location change) says so at once, while the
# click that caused it is still being handled; `_settle` then waits for the next document. A
# next document that has committed but is still being parsed counts as leaving too: read then,
# its view would be empty (no title, no body yet).
_NAV_FLAG_JS = """
if (window.navigation) navigation.addEventListener('navigate', (e) => {
  if (!e.destination.sameDocument) window.__agentaxLeaving = true;
});
"""


_LEAVING_EXPR = "(window.__agentaxLeaving === true || document.readyState === 'loading')"
_LEAVING_JS = f"() => {_LEAVING_EXPR}"

# `type` into a plain text field in one page call: what Playwright's `fill` does for it (the
# element visible, enabled, editable and not inert; its text selected and focused, then the new
# text inserted as input), without its locator round trips (resolve, preview, state checks):
# half the CPU of a `type` step. Anything else (another input type, a contenteditable, an
# element that is hidden, disabled or not alone) answers "fill" and goes through `fill` itself.
_FOCUS_TEXT_JS = """
(sel) => {
  const all = document.querySelectorAll(sel);
  if (all.length !== 1) return 'fill';
  const el = all[0];
  const TYPE_INTO = new Set(['', 'email', 'password', 'search', 'tel', 'text', 'url']);
  const isInput = el.tagName === 'INPUT';
  if (!(isInput && TYPE_INTO.has(el.type.toLowerCase())) && el.tagName !== 'TEXTAREA') return 'fill';
  if (el.disabled || el.matches(':disabled') || el.readOnly || el.closest('[inert]')) return 'fill';
  const st = getComputedStyle(el);
  const r = el.getBoundingClientRect();
  if (st.visibility !== 'visible' || !(r.width > 0 && r.height > 0)) return 'fill';
  if (isInput) { el.select(); el.focus(); }
  else { el.selectionStart = 0; el.selectionEnd = el.value.length; el.focus(); }
  return document.activeElement === el ? 'insert' : 'fill';
}
"""

# One round trip a step: whether the page is leaving, the text view, and the site's state.
_COMBINED_JS = """
(args) => {
  const observe = __OBSERVE__;
  const state = __STATE__;
  return {leaving: __LEAVING__, view: observe(args), state: state ? state() : null};
}
""".replace("__LEAVING__", _LEAVING_EXPR)


class _BrowserCrashed(Exception):
    pass


async def _filter_request(host: BrowserHost, route: Any) -> None:
    """A context's route handler: loopback requests go on, others are refused and counted."""
    if is_loopback_url(route.request.url):
        await route.continue_()
        return
    host.stats["blocked_requests"] += 1
    await route.abort("blockedbyclient")


class BrowserEnvironment(Environment):
    """A headless-Chromium page, observed as text, acted on with parsed browser actions.

    Args:
      sites: sites by name, overriding `BROWSER_SITES` (e.g. `{"miniwob": MiniWoBSite(...)}`).
      default_site: the site of tasks without `meta["site"]` (default "url": `meta["url"]`).
      max_obs_chars: the observation text is cut to this many characters.
      max_text_len: each line of page text / control label is cut to this many characters.
      action_timeout_s: limit of one click / type / select / press / scroll / page view.
      navigation_timeout_s: limit of loading a page (reset, goto).
      viewport: (width, height) of the page.
      screenshot: also put a PNG of the page in `Observation.raw` (off: text only).
      executable_path: Chromium to drive (default: found on PATH or `$AGENTAX_CHROMIUM`).
      reuse_pages: start an episode in a page an earlier episode of this browser finished in,
        scrubbed (cookies, permissions, the storage of the origins it visited, `window.name`,
        history and pop-ups cleared), instead of opening a fresh context and page, which
        starts a renderer process. False: a fresh context for every episode (use it when a
        site's `setup` changes the page itself, e.g. registers handlers or routes). An
        episode that timed out or crashed never hands its page on.
      **limits: `max_steps` (default 10), `reset_timeout_s`, `step_timeout_s`.

    Raises:
      BrowserUnavailableError: no Chromium or no `playwright` (the message says how to install).
    """

    max_steps = 10
    reset_timeout_s = 60.0
    step_timeout_s = 60.0

    def __init__(
        self,
        *,
        sites: Mapping[str, BrowserSite] | None = None,
        default_site: str = "url",
        max_obs_chars: int = 3000,
        max_text_len: int = 80,
        action_timeout_s: float = 5.0,
        navigation_timeout_s: float = 15.0,
        viewport: tuple[int, int] = (800, 600),
        screenshot: bool = False,
        executable_path: str | None = None,
        reuse_pages: bool = True,
        **limits: Any,
    ) -> None:
        super().__init__(**limits)
        self.executable_path = find_chromium(executable_path)  # fails now, with the fix, if missing
        self.sites = dict(sites or {})
        self.default_site = default_site
        self.max_obs_chars = max_obs_chars
        self.max_text_len = max_text_len
        self.action_timeout_s = action_timeout_s
        self.navigation_timeout_s = navigation_timeout_s
        self.viewport = viewport
        self.screenshot = screenshot
        self.reuse_pages = reuse_pages
        self.browser_stats: dict[str, int] = {"actions": 0, "invalid_actions": 0, "failed_actions": 0,
                                              "blocked_gotos": 0, "crashed_episodes": 0}
        """Counters over this environment's lifetime."""
        self._host: BrowserHost | None = None
        self._tab: BrowserTab | None = None
        self._tab_clean = False
        self._context: Any = None
        self._page: Any = None
        self._gen = 0
        self._site: BrowserSite | None = None
        self._episode_task: Task | None = None
        self._shown_ids: set[int] = set()
        self._instruction = ""
        self._allow: tuple[str, ...] = ()

    # ------------------------------------------------------------------ sites

    def site_for(self, task: Task) -> BrowserSite:
        """The site of `task` (`meta["site"]`, else `default_site`)."""
        name = str(task.meta.get("site", self.default_site))
        if name in self.sites:
            return self.sites[name]
        factory = BROWSER_SITES.get(name)
        if factory is None:
            raise ValueError(f"unknown browser site {name!r} in task {task.id!r}; known: {sorted(BROWSER_SITES)}")
        site = self.sites[name] = factory()
        return site

    @property
    def page(self) -> Any:
        """The Playwright page of the current episode (None between episodes)."""
        return self._page

    @property
    def host(self) -> BrowserHost | None:
        """The shared browser host this environment's episodes run in."""
        return self._host

    # ------------------------------------------------------------------ episode

    async def _reset(self, task: Task) -> Observation:
        await self._release()
        site = self.site_for(task)
        self._host = browser_host(self.executable_path)
        nav_s = self.navigation_timeout_s
        try:
            key = (self.viewport,)
            tab = self._host.take_tab(key) if self.reuse_pages else None
            if tab is None:
                tab = await self._open_tab(key, nav_s)
            self._tab, self._tab_clean = tab, True
            self._context, self._page, self._gen = tab.context, tab.page, tab.generation
            self._context.set_default_timeout(self.action_timeout_s * 1000)
            self._context.set_default_navigation_timeout(nav_s * 1000)
            self._site, self._episode_task = site, task
            url = site.start_url(task)
            self._allow = (_origin_prefix(url), *site.allow)
            with get_tracer().span(names.BROWSER_NAVIGATE, args={"url": url[:200]}):
                await self._timed(self._page.goto(url, wait_until="load"), nav_s, f"loading {url[:100]}")
            self._instruction = await self._timed(site.setup(self._page, task), nav_s, "site setup")
            return (await self._observe_state())[0]
        except _BrowserCrashed as e:
            raise self._crash_error("reset", e) from None

    async def _open_tab(self, key: tuple, nav_s: float) -> BrowserTab:
        """A fresh context (network filter and navigation flag installed) and its page."""
        assert self._host is not None
        host = self._host
        context, gen = await self._timed(host.new_context(
            viewport={"width": self.viewport[0], "height": self.viewport[1]}, service_workers="block"),
            nav_s, "opening a browser context")
        self._context, self._gen = context, gen  # closed by `_release` if the rest fails
        # Only non-local URLs are routed to us (the pattern is matched in the driver), so
        # local pages load at full speed; the launch flags are a second wall behind this one.
        await self._timed(context.route(_NOT_LOCAL, functools.partial(_filter_request, host)), nav_s, "routing")
        await self._timed(context.add_init_script(_NAV_FLAG_JS), nav_s, "init script")
        page = await self._timed(context.new_page(), nav_s, "opening a page")
        tab = BrowserTab(context=context, page=page, generation=gen, key=key)
        tab.track(page)
        context.on("page", tab.track)
        return tab

    async def _timed(self, coro: Any, timeout_s: float, what: str) -> Any:
        """`_bounded`, a timeout being the episode's end (TIMEOUT) with what hung."""
        try:
            return await self._bounded(coro, timeout_s)
        except TimeoutError:
            raise EnvError(f"BrowserEnvironment: {what} took longer than {timeout_s} s",
                           status=TrajectoryStatus.TIMEOUT, kind="timeout", call="reset") from None

    async def _step(self, action: Action) -> StepResult:
        task = self.task
        assert task is not None and self._site is not None
        parsed = action.value if isinstance(action.value, BrowserAction) else parse_browser_action(action.text)
        info: dict[str, Any] = {}
        try:
            if isinstance(parsed, str):
                self.browser_stats["invalid_actions"] += 1
                obs, _state = await self._observe_state(feedback=f"Invalid action: {parsed}")
                return StepResult(observation=obs, info={"invalid_action": True})
            self.browser_stats["actions"] += 1
            if parsed.kind == "done":
                reward, metrics = await self._bounded(self._site.finish(self._page, task, parsed.text),
                                                      self.action_timeout_s)
                return StepResult(observation=Observation(), reward=reward, done=True,
                                  info={"answer": parsed.text, "metrics": dict(metrics)})
            feedback = await self._act(parsed)
            if feedback:
                info["failed_action"] = True
            obs, state = await self._observe_state(feedback=feedback)
            reward, done, metrics = await self._bounded(self._site.check(self._page, task, state),
                                                        self.action_timeout_s)
            return StepResult(observation=Observation() if done else obs, reward=reward, done=done,
                              info={**info, "metrics": dict(metrics)})
        except _BrowserCrashed as e:
            raise self._crash_error("step", e) from None

    async def _close(self) -> None:
        await self._release()

    async def _release(self) -> None:
        context, self._context, self._page = self._context, None, None
        tab, self._tab = self._tab, None
        task, self._episode_task = self._episode_task, None
        if self._site is not None and task is not None:
            try:
                await asyncio.wait_for(self._site.release(task), 5)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass
        # Only an episode that ended cleanly hands its page on (a timeout or crash may have
        # left it mid-navigation or hung).
        if (tab is not None and self._tab_clean and self.reuse_pages and self._host is not None
                and self._state()["broken"] is None and await self._host.recycle(tab)):
            return
        if context is not None:
            try:
                await asyncio.wait_for(context.close(), 5)
            except Exception:  # noqa: BLE001 - a dead browser's context is gone already
                pass

    # ------------------------------------------------------------------ browser calls

    def _crashed(self) -> bool:
        return self._host is None or not self._host.is_current(self._gen)

    def _crash_error(self, call: str, e: BaseException) -> EnvError:
        self.browser_stats["crashed_episodes"] += 1
        if self._host is not None:
            self._host.stats["crashed_episodes"] += 1
        return EnvError(f"BrowserEnvironment.{call}: the browser crashed during the episode ({e})",
                        status=TrajectoryStatus.ENV_ERROR, kind="browser_crashed", call=call)

    async def _bounded(self, coro: Any, timeout_s: float) -> Any:
        """Await a browser call under `timeout_s`; a crash anywhere raises `_BrowserCrashed`."""
        from playwright.async_api import Error as PlaywrightError

        try:
            return await asyncio.wait_for(coro, timeout_s)
        except asyncio.CancelledError:
            self._tab_clean = False  # the page may be mid-call: it is not handed on
            raise
        except TimeoutError:
            self._tab_clean = False
            if self._crashed():
                raise _BrowserCrashed("no answer from the browser") from None
            raise
        except PlaywrightError as e:
            if self._crashed():
                raise _BrowserCrashed(str(e).splitlines()[0]) from None
            raise

    async def _act(self, a: BrowserAction) -> str:
        """Run one action; return '' on success, else what went wrong (for the model)."""
        page, t = self._page, self.action_timeout_s
        with get_tracer().span(names.BROWSER_ACTION, args={"action": a.kind}) as span:
            try:
                if a.kind in ("click", "type", "select"):
                    # Ids the model can know are those of its last view: no browser call needed
                    # to turn down any other (an element that left since fails by timeout).
                    if a.target not in self._shown_ids:
                        raise LookupError(f"no element [{a.target}] on the page")
                    loc = page.locator(f'[{ID_ATTR}="{a.target}"]')
                    if a.kind == "click":
                        # A real mouse click at the element's center, scrolled into view, without
                        # Playwright's wait for a still element: on a busy host that wait alone
                        # outlasts the timeout, turning right clicks into failures (reward noise).
                        await self._bounded(loc.click(force=True), t)
                    elif a.kind == "type":
                        await self._type(loc, a.target, a.text, t)
                    else:
                        try:
                            await self._bounded(loc.select_option(label=a.text), t)
                        except Exception:  # noqa: BLE001 - not a label: try it as a value
                            await self._bounded(loc.select_option(value=a.text), t)
                elif a.kind == "press":
                    await self._bounded(page.keyboard.press(a.text), t)
                elif a.kind == "scroll":
                    dy = 300 if a.text == "down" else -300
                    await self._bounded(page.evaluate(f"window.scrollBy(0, {dy})"), t)
                elif a.kind == "goto":
                    if not any(a.text.startswith(p) for p in self._allow):
                        self.browser_stats["blocked_gotos"] += 1
                        span.set_arg("blocked", True)
                        return f"goto blocked: {a.text} is outside this task's sites ({', '.join(self._allow)})"
                    with get_tracer().span(names.BROWSER_NAVIGATE, args={"url": a.text[:200]}):
                        await self._bounded(page.goto(a.text, wait_until="load"), self.navigation_timeout_s)
                return ""
            except _BrowserCrashed:
                raise
            except Exception as e:  # noqa: BLE001 - a failed action is feedback for the model
                self.browser_stats["failed_actions"] += 1
                span.set_arg("ok", False)
                msg = "timed out" if isinstance(e, TimeoutError) else str(e).strip().splitlines()[0][:200]
                what = f"{a.kind} [{a.target}]" if a.target is not None else a.kind
                return f"{what} failed: {msg}"

    async def _type(self, loc: Any, target: int, text: str, timeout_s: float) -> None:
        """Replace the text of element `target` with `text` (as `loc.fill` does)."""
        page = self._page
        how = await self._bounded(page.evaluate(_FOCUS_TEXT_JS, f'[{ID_ATTR}="{target}"]'), timeout_s)
        if how != "insert":
            await self._bounded(loc.fill(text), timeout_s)
        elif text:
            await self._bounded(page.keyboard.insert_text(text), timeout_s)
        else:
            await self._bounded(page.keyboard.press("Delete"), timeout_s)

    async def _settle(self) -> None:
        """The page is leaving (a link, a form): wait until the next document has loaded."""
        from playwright.async_api import Error as PlaywrightError

        deadline = time.monotonic() + self.navigation_timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            try:
                leaving = await self._bounded(self._page.evaluate(_LEAVING_JS), self.action_timeout_s)
            except PlaywrightError:  # the old document went away under the call
                continue
            if not leaving:
                break
        await self._bounded(self._page.wait_for_load_state("load"), self.navigation_timeout_s)

    async def _observe_state(self, *, feedback: str = "") -> tuple[Observation, Any]:
        """The text view and the site's `state_js` result, in one page call (after any
        navigation the last action started has finished)."""
        from playwright.async_api import Error as PlaywrightError

        site = self._site
        assert site is not None
        t0 = time.perf_counter()
        args = [site.root, site.skip, self.max_text_len]
        js = _COMBINED_JS.replace("__OBSERVE__", OBSERVE_JS).replace("__STATE__", site.state_js or "null")
        with get_tracer().span(names.BROWSER_OBSERVE):
            out = None
            for _ in range(3):
                try:
                    out = await self._bounded(self._page.evaluate(js, args), self.action_timeout_s)
                except _BrowserCrashed:
                    raise
                except TimeoutError:
                    raise EnvError(f"BrowserEnvironment: the page view took longer than {self.action_timeout_s} s",
                                   status=TrajectoryStatus.TIMEOUT, kind="timeout", call="step") from None
                except PlaywrightError:  # a navigation replaced the document under the call
                    out = None
                if out is not None and not out["leaving"]:
                    break
                await self._settle()
            if out is None:
                raise EnvError("BrowserEnvironment: the page kept navigating; no view could be read",
                               status=TrajectoryStatus.ENV_ERROR, kind="exception", call="step")
            raw = None
            if self.screenshot:
                raw = await self._bounded(self._page.screenshot(type="png"), self.action_timeout_s)
        view = out["view"]
        self._shown_ids = {int(m.group(1)) for m in map(_ID_LINE.match, view["lines"]) if m}
        head = self._instruction if not feedback else f"{feedback}\n{self._instruction}".strip()
        text = format_view(list(view["lines"]), instruction=head, max_chars=self.max_obs_chars)
        obs = Observation(content=text, raw=raw, info={"url": view["url"], "title": view["title"],
                                                       "observe_s": time.perf_counter() - t0})
        return obs, out["state"]
