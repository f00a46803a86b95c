"""The bash recipe's parts: small shell tasks in the sandbox, scored by checking the files.

Each task asks for one file, `out.txt`, built from the task's input file or words: echo a
word, sort the lines, keep the distinct lines, count the lines, reverse the lines. The
environment is `CodeEnvironment` with a `bash` tool; after the final answer a check reads
out.txt in the sandbox (the task's test) and gives 1.0 when it is exactly right. The
warm-start demonstrator runs one correct command most of the time, and a wrong one (a
near-miss command, or none at all) otherwise.

Per-episode metrics: `tool_use` (a bash call was made) and `wrote_file` (out.txt exists).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from agentax.envs import CodeEnvironment
from agentax.records import Action, Message, StepResult, Task, ToolCall
from agentax.recipes._tasks import PromptToolAgent
from agentax.tools import SandboxConfig

__all__ = ["BASH_SCHEMA", "BashTaskEnvironment", "demos", "make_agent", "make_env", "tasks"]

BASH_SCHEMA = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}

_WORDS = ("ant", "bat", "cow", "doe", "eel", "fox", "gnu", "hen", "jay", "koi", "owl", "pig",
          "ram", "yak", "elk", "emu")
# kind: (prompt, right command, a near-miss command, expected output from the lines)
_KINDS = {
    "echo": ("Write {w} to out.txt", "echo {w} > out.txt", "echo {w}", None),
    "sort": ("Sort in.txt into out.txt", "sort in.txt > out.txt", "cat in.txt > out.txt",
             lambda lines: sorted(lines)),
    "uniq": ("Write the distinct lines of in.txt, sorted, to out.txt",
             "sort -u in.txt > out.txt", "sort in.txt > out.txt", lambda lines: sorted(set(lines))),
    "count": ("Write the number of lines of in.txt to out.txt", "wc -l < in.txt > out.txt",
              "wc -l in.txt > out.txt", lambda lines: [str(len(lines))]),
    "reverse": ("Reverse the lines of in.txt into out.txt", "tac in.txt > out.txt",
                "sort -r in.txt > out.txt", lambda lines: lines[::-1]),
}


def _expected(task: Task) -> list[str]:
    return list(task.meta["expected"])


def _check(sandbox: Any, task: Task, answer: str) -> float:
    try:
        text = sandbox.read_file("out.txt")
    except Exception:  # noqa: BLE001 - no file: the task is not done
        return 0.0
    return 1.0 if text.split() == _expected(task) else 0.0


class BashTaskEnvironment(CodeEnvironment):
    """`CodeEnvironment` with a bash tool and the out.txt check; reports `tool_use`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("sandbox_config", SandboxConfig(timeout_s=10.0))
        super().__init__(check=_check, tools=("bash",), **kwargs)
        self._used = False

    async def _reset(self, task: Task):
        self._used = False
        return await super()._reset(task)

    async def _step(self, action: Action) -> StepResult:
        self._used = self._used or bool(action.tool_calls)
        result = await super()._step(action)
        metrics = {"tool_use": float(self._used)}
        return dataclasses.replace(result, info={**result.info, "metrics": metrics})


def make_env(**kwargs: Any) -> BashTaskEnvironment:
    """A fresh environment (kwargs: `CodeEnvironment` limits such as max_steps)."""
    return BashTaskEnvironment(**kwargs)


def make_agent(*, list_tools: bool = False, system_prompt: str = "") -> PromptToolAgent:
    """A bash-calling agent; the tool list stays out of the prompt for the byte-level model."""
    return PromptToolAgent([BASH_SCHEMA], list_tools=list_tools, system_prompt=system_prompt)


def _task(i: int, rng: random.Random) -> Task:
    kind = rng.choice(sorted(_KINDS))
    prompt, right, _, fn = _KINDS[kind]
    if kind == "echo":
        word = rng.choice(_WORDS)
        return Task(id=f"bash-{i}", prompt=prompt.format(w=word),
                    meta={"kind": kind, "word": word, "expected": [word]})
    lines = [rng.choice(_WORDS) for _ in range(rng.randint(2, 4))]
    return Task(id=f"bash-{i}", prompt=prompt, meta={
        "kind": kind, "files": {"in.txt": "\n".join(lines) + "\n"}, "expected": fn(lines)})


def tasks(*, num_train: int, num_eval: int, seed: int) -> tuple[list[Task], list[Task]]:
    """Random tasks; held-out ones have input files (or words) never seen in training."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[Task] = []
    while len(out) < num_train + num_eval:
        t = _task(len(out), rng)
        key = f"{t.prompt}|{t.meta.get('files')}"
        if key in seen:
            continue
        seen.add(key)
        out.append(t)
    return out[:num_train], out[num_train:]


def demos(train_tasks: Sequence[Task], n: int, seed: int, *,
          right_rate: float = 0.6) -> list[list[Message]]:
    """The demonstrator: the right command with probability `right_rate`, else a near miss."""
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        task = train_tasks[i % len(train_tasks)]
        _, right, wrong, _ = _KINDS[task.meta["kind"]]
        command = (right if rng.random() < right_rate else wrong).format(w=task.meta.get("word"))
        call = ToolCall(name="bash", arguments={"command": command}, id=f"call_{i}")
        convs.append([
            Message(role="user", content=task.prompt),
            Message(role="assistant", content="", tool_calls=(call,)),
            Message(role="tool", content=task.meta["word"] if command == f"echo {task.meta.get('word')}"
                    else "[no output]", name="bash", tool_call_id=call.id),
            Message(role="assistant", content="done"),
        ])
    return convs
