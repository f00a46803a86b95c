"""`agentax.demos` on web pages in a real Chromium: on MiniWoB++ the recorder reproduces the
web recipe's shipped demonstrations; on a local page of one's own, `click_target` records
one-click demonstrations that the environment scores 1.0."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentax.demos import Demonstration, arecord, click_target, record_many
from agentax.envs import BrowserEnvironment, BrowserUnavailableError, UrlSite, check_browser_available
from agentax.records import Observation, Task
from agentax.text import ByteTokenizer, render_conversation

try:
    check_browser_available()
except BrowserUnavailableError as e:  # pragma: no cover - depends on the host
    pytest.skip(f"browser unavailable: {e}", allow_module_level=True)


def _tokens(convs):
    tok = ByteTokenizer()
    return [list(render_conversation(tok, c).token_ids) for c in convs]


def test_miniwob_recording_reproduces_the_web_recipes_demonstrations():
    from agentax.envs import shutdown_browser
    from agentax.envs._miniwob import miniwob_dir
    from agentax.recipes import web

    try:
        miniwob_dir()
    except BrowserUnavailableError as e:  # pragma: no cover - depends on the host
        pytest.skip(f"MiniWoB++ pages unavailable: {e}")
    train, _ = web.tasks(num_train=6, num_eval=0, seed=0, names=web.TINY_WEB_TASKS)
    shipped = web.demos(train, 6, seed=3, pages=6)
    rng = random.Random(3)

    def demonstrator(observation: Observation) -> str:
        """The shipped noisy demonstrator: the right click, or a random control's (p=0.5)."""
        from agentax.agents import page_controls

        ids = [c[0] for c in page_controls(observation.content)]
        target = web.scripted_target(observation.content)
        if target is None or rng.random() < 0.5:
            target = rng.choice(ids)
        return f"click {target}"

    try:
        recorded = record_many(web.make_env, web.make_agent, train, demonstrator, max_turns=1)
    finally:
        import asyncio

        asyncio.run(shutdown_browser())
    assert _tokens(recorded) == _tokens(shipped)


PAGE = """<!doctype html><html><body>
<button onclick="document.body.dataset.clicked='Red'">Red</button>
<button onclick="document.body.dataset.clicked='Green'">Green</button>
<button onclick="document.body.dataset.clicked='Blue'">Blue</button>
</body></html>"""


class ButtonsSite(UrlSite):
    """A page of three buttons; the instruction names one: reward 1.0 for clicking it."""

    state_js = "() => document.body.dataset.clicked || null"

    async def check(self, page: Any, task: Task, state: Any):
        if state is None:
            return 0.0, False, {}
        return float(state == task.answer), True, {}


def test_click_target_records_a_local_pages_demonstrations(tmp_path):
    import asyncio

    from agentax.agents import CompactWebAgent
    from agentax.envs import shutdown_browser

    page = tmp_path / "buttons.html"
    page.write_text(PAGE)
    tasks = [Task(id=f"b{i}", prompt=f'Click the "{color}" button.', answer=color,
                  meta={"url": page.as_uri()}) for i, color in enumerate(["Blue", "Red", "Green"])]

    async def go() -> list[Demonstration]:
        try:
            return [await arecord(BrowserEnvironment(sites={"url": ButtonsSite()}, max_steps=2),
                                  CompactWebAgent(), task, click_target(lambda t: t.answer))
                    for task in tasks]
        finally:
            await shutdown_browser()

    demos = asyncio.run(go())
    assert [d.reward for d in demos] == [1.0, 1.0, 1.0] and all(d.done for d in demos)
    for demo, task in zip(demos, tasks):
        user, assistant = demo.messages
        assert user.content.splitlines()[0] == task.prompt  # the compact view the agent shows
        clicked = next(ln for ln in user.content.splitlines()[1:] if ln.endswith(task.answer))
        assert assistant.content == f"click {clicked.split()[0]}"


def test_record_many_closes_the_browser_its_episodes_shared(tmp_path):
    """`record_many` runs a loop of its own: the Chromium its episodes shared must not outlive
    it (a leftover one stayed alive through the SFT and RL of `agentax train`, ~0.15 CPU-s a
    second on a 2-core host)."""
    from agentax.agents import CompactWebAgent

    page = tmp_path / "buttons.html"
    page.write_text(PAGE)
    tasks = [Task(id=f"b{i}", prompt=f'Click the "{c}" button.', answer=c,
                  meta={"url": page.as_uri()}) for i, c in enumerate(["Blue", "Red"])]
    envs: list[BrowserEnvironment] = []
    pids: list[int | None] = []

    def make_env() -> BrowserEnvironment:
        if envs:  # the browser of the first episode, while it runs
            pids.append(envs[0].host.browser_pid())
        envs.append(BrowserEnvironment(sites={"url": ButtonsSite()}, max_steps=2))
        return envs[-1]

    convs = record_many(make_env, CompactWebAgent, tasks, click_target(lambda t: t.answer))
    assert len(convs) == 2 and pids and pids[0] is not None
    assert envs[0].host.browser_pid() is None, "record_many left its browser running"


def test_record_many_plays_episodes_at_once_and_keeps_the_tasks_order(tmp_path):
    """`concurrency` episodes share the browser; the conversations come back in the tasks'
    order, each the one a one-at-a-time recording gives."""
    from agentax.agents import CompactWebAgent

    page = tmp_path / "buttons.html"
    page.write_text(PAGE)
    tasks = [Task(id=f"b{i}", prompt=f'Click the "{c}" button.', answer=c,
                  meta={"url": page.as_uri()}) for i, c in enumerate(["Blue", "Red", "Green"] * 3)]
    make_env = lambda: BrowserEnvironment(sites={"url": ButtonsSite()}, max_steps=2)  # noqa: E731
    policy = click_target(lambda t: t.answer)
    one_by_one = record_many(make_env, CompactWebAgent, tasks, policy)
    at_once = record_many(make_env, CompactWebAgent, tasks, policy, concurrency=4)
    assert _tokens(at_once) == _tokens(one_by_one)
    assert [c[-1].content for c in at_once] == [c[-1].content for c in one_by_one]
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1"):
        record_many(make_env, CompactWebAgent, tasks, policy, concurrency=0)

    def failing(observation, task):
        if task.id == "b5":
            raise RuntimeError("the policy failed on b5")
        return policy(observation, task)

    with pytest.raises(RuntimeError, match="failed on b5"):  # the error itself, not a group
        record_many(make_env, CompactWebAgent, tasks, failing, concurrency=4)
