"""Task suites: the tasks, environment, agent and demonstrations of one `env.task` choice.

A `TaskSuite` is what a run needs from "the task": training and held-out tasks, a factory of
fresh environments and agents (one per episode), optional warm-start demonstrations, and how
to tell that an episode used a tool. `build_suite` is the one registry of task names.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from agentax.agents import Agent, ModelAgent, ToolAgent
from agentax.envs import TaskEnvironment, ToolEnvironment
from agentax.records import Message, Task
from agentax.recipes._calculator import (
    calculator_demos,
    calculator_reward,
    calculator_tasks,
    compact_calculator,
)
from agentax.tools import calculator

__all__ = ["SUITES", "TaskSuite", "build_suite", "load_demos_jsonl", "load_math_jsonl"]

SUITES = ("calculator", "math", "math_tool")

MATH_SYSTEM_PROMPT = (
    "Solve the math problem step by step. Put the final answer in \\boxed{}."
)
MATH_TOOL_SYSTEM_PROMPT = (
    "Solve the math problem. Use the calculator tool for arithmetic. Put the final answer in "
    "\\boxed{}."
)


class PromptToolAgent(ToolAgent):
    """A `ToolAgent` that can leave the tool schemas out of the prompt (`list_tools=False`).

    Calls are still parsed and checked against the offered tools; only the chat template's
    tool section is skipped, which keeps byte-level prompts short for the tiny demo model.
    """

    def __init__(self, tools: Any, *, list_tools: bool = True, **kwargs: Any) -> None:
        super().__init__(tools, **kwargs)
        self.list_tools = list_tools

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return super().tools if self.list_tools else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSuite:
    """Tasks, per-episode environment and agent factories, and optional demonstrations."""

    name: str
    train_tasks: tuple[Task, ...]
    eval_tasks: tuple[Task, ...]
    make_env: Callable[[], Any]
    make_agent: Callable[[], Agent]
    demos: Callable[[int, int], list[list[Message]]] | None = None
    """`demos(n, seed)` -> n demonstration conversations, or None when the task has none."""
    tools: tuple[dict[str, Any], ...] = ()
    """Schemas listed in the prompt (empty when no tools or list_tools is off)."""


_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


def load_math_jsonl(path: str | os.PathLike, *, limit: int = 0, prefix: str = "math") -> list[Task]:
    """Math problems from JSONL: {"question": ..., "answer": ...} a line.

    GSM8K answers (reasoning then `#### 42`) keep only the final number. Also accepted:
    "problem" for the question, "solution"/"final_answer" for the answer.

    Raises:
      FileNotFoundError / ValueError: the file is missing or a line lacks the fields.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"math task file {path!r} does not exist (env.train_file / env.eval_file)")
    tasks: list[Task] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            question = row.get("question", row.get("problem"))
            answer = row.get("final_answer", row.get("answer", row.get("solution")))
            if not isinstance(question, str) or answer is None:
                raise ValueError(f"{path}:{lineno}: needs string 'question' and an 'answer'")
            answer = str(answer)
            m = _GSM8K_ANSWER.search(answer)
            if m:
                answer = m.group(1).replace(",", "")
            tasks.append(Task(id=f"{prefix}-{lineno}", prompt=question, answer=answer))
            if limit and len(tasks) >= limit:
                break
    if not tasks:
        raise ValueError(f"{path}: no problems found")
    return tasks


def load_demos_jsonl(path: str | os.PathLike) -> list[list[Message]]:
    """Chat demonstrations from JSONL: {"messages": [{"role", "content", ...}, ...]} a line."""
    convs = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row.get("messages"), list):
                raise ValueError(f"{path}:{lineno}: expected {{\"messages\": [...]}}")
            convs.append([m if isinstance(m, Message) else _message(m) for m in row["messages"]])
    return convs


def _message(d: dict) -> Message:
    from agentax.records import ToolCall

    calls = tuple(
        ToolCall(name=c["function"]["name"], arguments=c["function"].get("arguments", {}),
                 id=c.get("id", ""))
        for c in d.get("tool_calls", ()) or ()
    )
    return Message(role=d["role"], content=d.get("content") or "", tool_calls=calls,
                   name=d.get("name"), tool_call_id=d.get("tool_call_id"))


def build_suite(
    task: str,
    *,
    seed: int = 0,
    num_train_tasks: int = 4000,
    num_eval_tasks: int = 64,
    max_digits: int = 2,
    max_steps: int = 3,
    train_file: str | None = None,
    eval_file: str | None = None,
    reward: str = "",
    system_prompt: str | None = None,
    tool_format: str = "hermes",
    list_tools: bool = True,
) -> TaskSuite:
    """Builds the named task suite ('calculator', 'math' or 'math_tool').

    Held-out tasks never appear among the training tasks.
    """
    if task not in SUITES:
        raise ValueError(f"unknown task {task!r}; choose one of {SUITES}")
    reward_fn: Any = reward or None
    if task == "calculator":
        pool = calculator_tasks(num_train_tasks + num_eval_tasks, seed=seed, max_digits=max_digits)
        train, held = pool[:num_train_tasks], pool[num_train_tasks:]
        tool = compact_calculator()
        sys_prompt = "" if system_prompt is None else system_prompt
        reward_fn = reward_fn or calculator_reward

        def demos(n: int, demo_seed: int) -> list[list[Message]]:
            # Demonstrations come from training questions only (cycled when n is larger).
            picked = [train[i % len(train)] for i in range(n)]
            return calculator_demos(picked, seed=demo_seed)

        return _tool_suite("calculator", train, held, tool, reward_fn, max_steps, sys_prompt,
                           tool_format, list_tools, demos)

    all_train = load_math_jsonl(train_file, prefix="train")  # type: ignore[arg-type]
    if eval_file:
        held = load_math_jsonl(eval_file, limit=num_eval_tasks, prefix="eval")
        train = all_train
    else:
        if len(all_train) <= num_eval_tasks:
            raise ValueError(f"{train_file} has {len(all_train)} problems, not more than "
                             f"env.num_eval_tasks={num_eval_tasks}; give env.eval_file or lower it")
        train, held = all_train[:-num_eval_tasks] if num_eval_tasks else all_train, \
            all_train[len(all_train) - num_eval_tasks:]
    if num_train_tasks:
        train = train[:num_train_tasks]
    reward_fn = reward_fn or "math_verify"
    if task == "math":
        sys_prompt = MATH_SYSTEM_PROMPT if system_prompt is None else system_prompt
        return TaskSuite(
            name="math", train_tasks=tuple(train), eval_tasks=tuple(held),
            make_env=lambda: TaskEnvironment(reward_fn),
            make_agent=lambda: ModelAgent(system_prompt=sys_prompt or None),
        )
    sys_prompt = MATH_TOOL_SYSTEM_PROMPT if system_prompt is None else system_prompt
    return _tool_suite("math_tool", train, held, calculator, reward_fn, max_steps, sys_prompt,
                       tool_format, list_tools, None)


def _tool_suite(name: str, train: Sequence[Task], held: Sequence[Task], tool, reward_fn,
                max_steps: int, system_prompt: str, tool_format: str, list_tools: bool,
                demos) -> TaskSuite:
    def make_env() -> ToolEnvironment:
        return ToolEnvironment([tool], reward_fn, max_steps=max_steps)

    def make_agent() -> Agent:
        return PromptToolAgent([tool], list_tools=list_tools, tool_format=tool_format,
                               system_prompt=system_prompt)

    return TaskSuite(name=name, train_tasks=tuple(train), eval_tasks=tuple(held),
                     make_env=make_env, make_agent=make_agent, demos=demos,
                     tools=tuple(tool.schema() for tool in [tool]) if list_tools else ())
