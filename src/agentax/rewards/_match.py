"""`exact_match`: the response (optionally normalised) equals the task's answer."""

from __future__ import annotations

import re

from agentax.records import Task

__all__ = ["exact_match"]


def exact_match(task: Task, response: str, *, ignore_case: bool = True, normalize_whitespace: bool = True) -> float:
    """1.0 if `response` equals `task.answer`, else 0.0.

    With `normalize_whitespace` both are stripped and inner runs of whitespace become one
    space; with `ignore_case` they are compared case-insensitively (casefold). Use
    `functools.partial(exact_match, ignore_case=False)` for a strict variant.

    Raises:
        ValueError: the task has no answer.
    """
    if task.answer is None:
        raise ValueError(f"task {task.id!r} has no answer; exact_match needs Task.answer")
    a, b = str(response), str(task.answer)
    if normalize_whitespace:
        a, b = re.sub(r"\s+", " ", a).strip(), re.sub(r"\s+", " ", b).strip()
    if ignore_case:
        a, b = a.casefold(), b.casefold()
    return 1.0 if a == b else 0.0
