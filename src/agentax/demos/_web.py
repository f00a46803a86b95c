"""A site-agnostic web demonstrator: click (or type into) the control a description names.

`BrowserEnvironment` lists a page's controls as `[id] kind "name"`; `click_target(target)` is a
policy for `agentax.demos.record` that finds the control whose name matches the target
description and answers `click ID` (or `type ID "text"`), on any site, without knowing it.
"""

from __future__ import annotations

from collections.abc import Callable

from agentax.agents import page_controls
from agentax.records import Observation, Task

__all__ = ["click_target"]


def _find(controls: list[tuple[int, str, str]], want: str) -> int | None:
    """The id of the control `want` names: equal name (case and spaces ignored) first, then
    the only name that contains it, then the only kind that equals it."""
    norm = " ".join(want.split()).casefold()
    for match in (lambda name: " ".join(name.split()).casefold() == norm,
                  lambda name: norm in name.casefold()):
        hits = [i for i, _, name in controls if name and match(name)]
        if hits:
            return hits[0] if len(hits) == 1 else None  # several: ambiguous
    kinds = [i for i, kind, _ in controls if kind.casefold() == norm]
    return kinds[0] if len(kinds) == 1 else None


def click_target(target: str | Callable[[Task], str], *, text: str | Callable[[Task], str] | None = None
                 ) -> Callable[[Observation, Task], str]:
    """A one-step policy: click the control `target` describes (or type `text` into it).

    Args:
      target: the control's name as the page shows it ("Submit", "Tab #2"), or a function of
        the task giving it (e.g. `lambda task: task.answer`).
      text: type this (or a function of the task) into the control instead of clicking.

    Returns:
      `policy(observation, task) -> reply` for `agentax.demos.record` / `record_many`, reading
      the environment's full text view (`Observation.content`), whatever the agent shows.

    Raises (when called):
      ValueError: no control, or more than one, matches the description (the message lists
        the page's controls).
    """
    def policy(observation: Observation, task: Task) -> str:
        want = target(task) if callable(target) else target
        controls = page_controls(observation.content)
        found = _find(controls, str(want))
        if found is None:
            listed = ", ".join(f"[{i}] {kind} {name!r}" for i, kind, name in controls) or "none"
            raise ValueError(f"task {task.id!r}: no single control on the page matches "
                             f"{want!r}; the page's controls: {listed}")
        if text is None:
            return f"click {found}"
        typed = text(task) if callable(text) else text
        return f'type {found} "{typed}"'

    return policy
