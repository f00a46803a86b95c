"""Tasks and demonstrations from files, and the prompt-tool agent the byte-level recipes share."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from agentax.agents import ToolAgent
from agentax.records import Message, Task

__all__ = ["PromptToolAgent", "load_demos_jsonl", "load_tasks"]


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


_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


def _rows(path: str) -> list[tuple[int, Any]]:
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), "
                             "or give the tasks as JSONL") from None
        return list(enumerate(pq.read_table(path).to_pylist(), 1))
    return list(_jsonl(path))


def _jsonl(path: str):
    """(line number, value) for each non-blank line of the JSONL file at `path`.

    Raises:
      ValueError: naming the file and line of text that is not UTF-8 or not JSON.
    """
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                                 f"column {e.start + 1}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg} at column {e.colno})") \
                    from None


def load_tasks(path: str | os.PathLike, *, limit: int = 0, prefix: str = "task") -> list[Task]:
    """Tasks from a JSONL file (one object a line) or a Parquet file (one row each).

    A row needs a prompt ('prompt', or 'question' / 'problem') and may have an 'answer' (or
    'final_answer' / 'solution'; GSM8K's reasoning-then-'#### 42' keeps only the final
    number), an 'id' and a 'meta' mapping; any other field also goes to `Task.meta`.

    Raises:
      FileNotFoundError / ValueError: the file is missing, empty, or a row lacks a prompt.
    """
    path = os.fspath(path)
    _need_file(path, "task file", "tasks.train_file / tasks.eval_file", ".jsonl or .parquet")
    tasks: list[Task] = []
    for lineno, row in _rows(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected an object, got {type(row).__name__}")
        row = dict(row)
        prompt = row.pop("prompt", None) or row.pop("question", None) or row.pop("problem", None)
        if not isinstance(prompt, str):
            raise ValueError(f"{path}:{lineno}: needs a string 'prompt' (or 'question')")
        answer = next((row.pop(k) for k in ("final_answer", "answer", "solution") if k in row), None)
        if answer is not None:
            answer = str(answer)
            m = _GSM8K_ANSWER.search(answer)
            if m:
                answer = m.group(1).replace(",", "")
        task_id = str(row.pop("id", f"{prefix}-{lineno}"))
        meta = {**dict(row.pop("meta", None) or {}), **row}
        tasks.append(Task(id=task_id, prompt=prompt, answer=answer, meta=meta))
        if limit and len(tasks) >= limit:
            break
    if not tasks:
        raise ValueError(f"{path}: no tasks found")
    return tasks


def load_demos_jsonl(path: str | os.PathLike) -> list[list[Message]]:
    """Chat demonstrations from JSONL: {"messages": [{"role", "content", ...}, ...]} a line.

    Raises:
      FileNotFoundError: no such file. ValueError: naming the file, the line and what is
      wrong with it (not UTF-8, not JSON, no "messages" list, a message without a role...).
    """
    path = os.fspath(path)
    _need_file(path, "demonstrations file", "sft.data", ".jsonl")
    convs = []
    for lineno, row in _jsonl(path):
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise ValueError(f"{path}:{lineno}: expected {{\"messages\": [...]}}, got "
                             f"{_short(row)}")
        messages = []
        for i, m in enumerate(row["messages"]):
            try:
                messages.append(m if isinstance(m, Message) else _message(m))
            except (KeyError, TypeError, AttributeError, ValueError) as e:
                raise ValueError(f"{path}:{lineno}: messages[{i}] {_message_problem(m, e)}") \
                    from None
        convs.append(messages)
    return convs


def _need_file(path: str, what: str, field: str, kind: str) -> None:
    """Raises unless `path` is a file to read, saying which of the ways it is not.

    Raises:
      IsADirectoryError: it is a directory. FileNotFoundError: nothing is there.
      ValueError: something other than a regular file (a FIFO, a socket, a device).
    """
    if os.path.isfile(path):
        return
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what} {path!r} is a directory, not a file ({field}): give the "
                                f"{kind} file itself")
    if os.path.exists(path):
        raise ValueError(f"{what} {path!r} is not a regular file ({field}); give a {kind} file")
    raise FileNotFoundError(f"{what} {path!r} does not exist ({field})")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message_problem(m: Any, error: Exception) -> str:
    if not isinstance(m, dict):
        return f"is {_short(m)}, not an object like {{\"role\": \"user\", \"content\": \"...\"}}"
    if not isinstance(m.get("role"), str):
        return "needs a string \"role\" (system, user, assistant or tool)"
    if isinstance(error, KeyError):
        return f"lacks {error.args[0]!r} (tool_calls need {{\"function\": {{\"name\": ...}}}})"
    return f"is malformed: {error}"


def _message(d: dict) -> Message:
    from agentax.records import ToolCall

    calls = tuple(
        ToolCall(name=c["function"]["name"], arguments=c["function"].get("arguments", {}),
                 id=c.get("id", ""))
        for c in d.get("tool_calls", ()) or ()
    )
    return Message(role=d["role"], content=d.get("content") or "", tool_calls=calls,
                   name=d.get("name"), tool_call_id=d.get("tool_call_id"))
