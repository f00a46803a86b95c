"""The web recipe's parts: MiniWoB++ pages in a real headless Chromium, acted on from text.

Tasks are single-click MiniWoB++ pages at numbered seeds; held-out seeds are never trained on.
`WEB_TASKS` (`miniwob:click-tab`, `focus-text-2`, `click-dialog-2`, `click-button`) is the set
for a real checkpoint; `TINY_WEB_TASKS` leaves out click-button for the ~0.3M-parameter byte
model: finding a random word among the buttons is beyond it (imitating 1,920 demonstrations
that are all right, it clicked the right button on 2 of 12 held-out pages, about chance,
against 12 of 12 on each of the other three). The environment is `BrowserEnvironment` with MiniWoB's own reward mapped
to success (1.0 / 0.0), two actions an episode (a reply that names no valid action gets the
page back once).

`CompactWebAgent` shows the byte-level model only what the task needs: the instruction and one
short line per control (`3 OK`, `1 input`), and reads its reply with `parse_browser_action`
(`click 3`). A real checkpoint (`make_agent(compact=False)`) reads the full text view under a
system prompt that explains the actions.

Warm-start demonstrations come from a noisy scripted demonstrator: it reads the instruction
and clicks the right control, but clicks a random one with probability `noise`. Their
observations are real: the first pages of a few training tasks, opened in the browser once.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
from collections.abc import Sequence
from typing import Any

from agentax.agents import CompactWebAgent, compact_view
from agentax.agents import page_controls as _controls
from agentax.envs import (
    BROWSER_ACTION_HELP,
    BrowserEnvironment,
    MiniWoBSite,
    miniwob_task,
    shutdown_browser,
)
from agentax.records import Message, Task

__all__ = [
    "TINY_WEB_TASKS",
    "WEB_TASKS",
    "CompactWebAgent",
    "compact_view",
    "demos",
    "make_agent",
    "make_env",
    "scripted_target",
    "tasks",
]

WEB_TASKS = ("click-tab", "focus-text-2", "click-dialog-2", "click-button")
"""The MiniWoB++ pages a real checkpoint trains on (one click solves each)."""

TINY_WEB_TASKS = ("click-tab", "focus-text-2", "click-dialog-2")
"""The pages the tiny byte-level model trains on (`agentax train web`): `WEB_TASKS` less
click-button."""

_ORDINAL = re.compile(r"(\d+)(?:st|nd|rd|th)\b")

SYSTEM_PROMPT = ("You act on a web page shown as text; controls are listed as [id] kind \"name\". "
                 "Do what the first line asks. " + BROWSER_ACTION_HELP)


def scripted_target(text: str) -> int | None:
    """The id the instruction asks to click (the demonstrator's reading), or None."""
    instruction = next((ln for ln in text.splitlines() if ln and not ln.startswith("Invalid")), "")
    controls = _controls(text)
    m = _ORDINAL.search(instruction)
    if m and "input" in instruction:
        inputs = [i for i, kind, _ in controls if kind == "input"]
        k = int(m.group(1))
        return inputs[k - 1] if 0 < k <= len(inputs) else None
    m = re.search(r"Tab #(\d+)", instruction)
    quoted = re.search(r'"([^"]*)"', instruction)
    want = f"Tab #{m.group(1)}" if m else (quoted.group(1) if quoted else None)
    if want == "x":
        want = "Close"
    return next((i for i, _, name in controls if name == want), None)


def make_env(*, max_steps: int = 2, reward: str = "success", max_obs_chars: int = 1500,
             action_timeout_s: float = 10.0) -> BrowserEnvironment:
    """`BrowserEnvironment` on the MiniWoB++ pages (reward "success": 1.0 / 0.0)."""
    return BrowserEnvironment(sites={"miniwob": MiniWoBSite(reward=reward)}, max_steps=max_steps,
                              max_obs_chars=max_obs_chars, action_timeout_s=action_timeout_s)


def make_agent(*, compact: bool = True, system_prompt: str | None = None) -> CompactWebAgent:
    """The compact agent for the byte-level model; `compact=False` (a real checkpoint) shows
    the full view under `SYSTEM_PROMPT` unless another `system_prompt` is given."""
    if system_prompt is None and not compact:
        system_prompt = SYSTEM_PROMPT
    return CompactWebAgent(compact=compact, system_prompt=system_prompt or None)


def tasks(*, num_train: int, num_eval: int, seed: int,
          names: Sequence[str] = WEB_TASKS) -> tuple[list[Task], list[Task]]:
    """Training instances at seeds from `seed * 10**6`, held-out ones at seeds from
    `seed * 10**6 + 500_000`: never the same instance in both."""
    base = int(seed) * 10**6
    train = [miniwob_task(names[i % len(names)], base + i) for i in range(num_train)]
    held = [miniwob_task(names[i % len(names)], base + 500_000 + i) for i in range(num_eval)]
    return train, held


async def _first_views(task_list: Sequence[Task], concurrency: int) -> list[str]:
    envs = [make_env() for _ in range(concurrency)]
    views: list[str] = [""] * len(task_list)

    async def worker(k: int) -> None:
        for i in range(k, len(task_list), concurrency):
            views[i] = (await envs[k].reset(task_list[i])).content

    try:
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    finally:
        for env in envs:
            await env.close()
        await shutdown_browser()
    return views


def first_views(task_list: Sequence[Task], *, concurrency: int = 8) -> list[str]:
    """The first text view of each task, opened in a real browser (on a thread of its own, so
    it works inside or outside a running event loop)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["views"] = asyncio.run(_first_views(task_list, concurrency))
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            out["error"] = e

    t = threading.Thread(target=run, name="agentax-web-demos")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["views"]


def demos(train_tasks: Sequence[Task], n: int, seed: int, *, noise: float = 0.5,
          pages: int = 96, compact: bool = True) -> list[list[Message]]:
    """n one-click episodes of the noisy demonstrator on the first `pages` training tasks
    (cycled): the right click, or with probability `noise` a random control's."""
    rng = random.Random(seed)
    shown = first_views(list(train_tasks[:pages]))
    convs = []
    for i in range(n):
        view = shown[i % len(shown)]
        ids = [c[0] for c in _controls(view)]
        target = scripted_target(view)
        if target is None or rng.random() < noise:
            target = rng.choice(ids)
        user = compact_view(view) if compact else view
        convs.append([Message(role="user", content=user), Message(role="assistant", content=f"click {target}")])
    return convs
