"""The swe_tiny recipe's parts: `SWEEnvironment` on its three bundled repositories.

The task is the issue text; the environment offers the repository tools and rewards 1.0 when
the test suite passes after the final answer. The demonstrator applies each repository's
reference fix with `replace_in_file` and answers, but sometimes runs the tests first or makes
a near-miss edit. With three repositories there is nothing to hold out: evaluation runs the
same three tasks (this recipe shows the SWE loop end to end, not generalisation).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from agentax.agents import SWEAgent
from agentax.envs import SWE_REPOS, SWEEnvironment
from agentax.records import Message, Task, ToolCall

__all__ = ["CompactSWEAgent", "demos", "make_agent", "make_env", "tasks"]


class CompactSWEAgent(SWEAgent):
    """`SWEAgent` that can leave the tool list out of the prompt (every byte is a token)."""

    def __init__(self, *, list_tools: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.list_tools = list_tools

    @property
    def tools(self):
        return super().tools if self.list_tools else None


def make_env(**kwargs: Any) -> SWEEnvironment:
    """A fresh SWE environment (kwargs: max_steps, test_command, ...)."""
    return SWEEnvironment(**kwargs)


def make_agent(*, list_tools: bool = False, system_prompt: str = "") -> CompactSWEAgent:
    return CompactSWEAgent(list_tools=list_tools, system_prompt=system_prompt)


def tasks(*, num_train: int, num_eval: int, seed: int) -> tuple[list[Task], list[Task]]:
    """The three repositories, as short issue prompts; evaluation uses the same three."""
    out = [Task(id=f"swe/{name}", prompt=f"Fix: {repo['issue']}", meta={"repo": name})
           for name, repo in sorted(SWE_REPOS.items())]
    return out, out[:num_eval] if num_eval else out


def demos(train_tasks: Sequence[Task], n: int, seed: int, *,
          right_rate: float = 0.7) -> list[list[Message]]:
    """The reference fix (with probability `right_rate`), else a near miss."""
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        task = train_tasks[i % len(train_tasks)]
        repo = SWE_REPOS[task.meta["repo"]]
        path, old, new = repo["fix"]
        line = repo["files"][path][:repo["files"][path].index(old)].count("\n") + 1
        right = rng.random() < right_rate
        call = ToolCall(name="replace_in_file", id=f"call_{i}",
                        arguments={"path": path, "old": old, "new": new if right else old})
        convs.append([
            Message(role="user", content=task.prompt),
            Message(role="assistant", content="", tool_calls=(call,)),
            Message(role="tool", content=f"Replaced 1 occurrence in {path} at line {line}",
                    name="replace_in_file", tool_call_id=call.id),
            Message(role="assistant", content="Fixed."),
        ])
    return convs
