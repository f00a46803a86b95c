"""`agentax show RUN_DIR`: a run's episode transcripts, readable, filtered; `--html` writes one
self-contained page of them with the run's curves and the doctor's report (`_html.py`).

The records come from RUN_DIR/transcripts.jsonl (`_transcripts.py`). On a terminal the text
is coloured (rich); piped or redirected it is plain.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentax.run import is_run_dir, read_transcripts
from agentax.trace import CONFIG_FILENAME

__all__ = ["Filters", "add_parser", "conversation", "format_header", "parse_steps", "printable",
           "select", "show"]

TEXT_LIMIT = 20
"""Episodes printed when no --limit is given (the newest that match)."""


@dataclasses.dataclass(frozen=True)
class Filters:
    """Which records to show; None / empty = no restriction."""

    steps: tuple[int | None, int | None] = (None, None)
    """Inclusive RL step range (either end open)."""
    phase: str | None = None
    """'train', 'eval' (every evaluation) or an exact phase (eval_before, ...)."""
    success: bool | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    role: str | None = None
    """Only this role's view of multi-agent episodes."""


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """`N`, `A:B`, `A:` or `:B` -> an inclusive (low, high) step range."""
    low, sep, high = text.partition(":")
    try:
        lo = int(low) if low.strip() else None
        hi = (int(high) if high.strip() else None) if sep else lo
    except ValueError:
        raise ValueError(f"--step {text!r}: give a step N or a range A:B (A: and :B too)") from None
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"--step {text!r}: the range is empty ({lo} > {hi})")
    return lo, hi


def _matches(record: dict[str, Any], f: Filters) -> bool:
    phase, step, reward = str(record.get("phase", "")), record.get("step"), record.get("reward")
    if f.phase == "eval" and not phase.startswith("eval"):
        return False
    if f.phase not in (None, "eval") and phase != f.phase:
        return False
    lo, hi = f.steps
    if (lo is not None or hi is not None) and not isinstance(step, int):
        return False
    if (lo is not None and step < lo) or (hi is not None and step > hi):
        return False
    if f.role is not None and record.get("role") != f.role:
        return False
    if f.success is not None and bool(record.get("success")) != f.success:
        return False
    if not isinstance(reward, (int, float)):
        return f.reward_min is None and f.reward_max is None
    return not ((f.reward_min is not None and reward < f.reward_min)
                or (f.reward_max is not None and reward > f.reward_max))


def select(records: Iterable[dict[str, Any]], f: Filters) -> list[dict[str, Any]]:
    """The records that pass `f`, in file order."""
    return [r for r in records if _matches(r, f)]


def _policy(versions: Sequence[int]) -> str:
    """`v3`, or `v2-v3` for tokens of several policy versions ('' for none)."""
    if not versions:
        return ""
    return f"v{versions[0]}" if len(versions) == 1 else f"v{versions[0]}-v{versions[-1]}"


def format_header(record: dict[str, Any]) -> str:
    """One line naming an episode: phase, step, ids, outcome, tokens, policy versions."""
    phase = str(record.get("phase", "?"))
    if phase.startswith("eval") and record.get("mode"):
        phase += f" ({record['mode']})"
    tokens = record.get("tokens") or {}
    policy = _policy(record.get("policy_versions") or []) or "none"
    mark = "success" if record.get("success") else "failure"
    trained = f", {tokens.get('trained', 0)} trained" if phase == "train" else ""
    role = f" · role {record['role']} of {'/'.join(record.get('roles') or [])}" \
        if record.get("role") else ""
    return (f"{phase} · step {record.get('step', '?')} · {record.get('group_id', '?')}/"
            f"{record.get('sample_index', '?')}{role} · task {record.get('task_id', '?')} · reward "
            f"{record.get('reward', 0):.3g} {mark} · {record.get('status', '?')} "
            f"({record.get('reason', '')}) · tokens {tokens.get('prompt', 0)} in + "
            f"{tokens.get('completion', 0)} out{trained} · policy {policy}")


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7f] if chr(c) not in "\n\t"}


def printable(text: str) -> str:
    """`text` with control characters shown as \\xNN: a model's bytes must not drive the
    terminal (an escape sequence) or vanish from the page."""
    return text.translate(_CONTROL)


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _action_line(turn: dict[str, Any]) -> str:
    """What the agent parsed from a reply, in one line ('' when nothing)."""
    action, parts = turn.get("action") or {}, []
    for call in action.get("tool_calls", ()):
        parts.append(f"tool call {call.get('name')}({json.dumps(call.get('arguments', {}))})")
    for error in action.get("parse_errors", ()):
        parts.append(f"parse error: {error.get('message')}")
    if "final_answer" in action:
        parts.append(f"answer: {_short(action['final_answer'])}")
    if "value" in action:
        parts.append(f"action: {_short(action['value'])}")
    for result in turn.get("tool_results", ()):
        if not result.get("ok", True):
            parts.append(f"tool {result.get('name') or 'call'} failed ({result.get('error')})")
    if turn.get("reward"):
        parts.append(f"step reward {turn['reward']:.3g}")
    return "; ".join(parts)


def conversation(record: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(role, label detail, text) per message; an assistant message shows its model call's raw
    text (special tokens kept) and what was parsed from it (and, in a multi-agent episode, the
    episode role that called the model). Without messages, the turns. A
    black-box agent's return value comes last.
    Control characters are shown escaped (`printable`)."""
    turns = list(record.get("turns") or [])
    messages = list(record.get("messages") or [])
    if not messages:
        messages = [{"role": "assistant", "content": t.get("raw", "")} for t in turns]
    out, k = [], 0
    for m in messages:
        role, text, detail = str(m.get("role", "?")), str(m.get("content", "")), ""
        if role == "assistant" and k < len(turns):
            turn, k = turns[k], k + 1
            policy = _policy(turn.get("policy_versions") or [])
            detail = ((f"role {turn['role']}, " if turn.get("role") else "") +
                      f"{turn.get('completion_tokens', '?')} tokens, "
                      f"{turn.get('finish_reason', '?')}" + (f", {policy}" if policy else ""))
            text = str(turn.get("raw", text))
            action = _action_line(turn)
            if action:
                text += f"\n  -> {action}"
        elif role == "tool" and m.get("name"):
            detail = str(m["name"])
        out.append((role, detail, printable(text)))
    if record.get("agent_returned"):
        out.append(("agent", "returned: its final answer, not a reward", printable(str(record["agent_returned"]))))
    return out


_ROLE_STYLE = {"system": "magenta", "user": "cyan", "assistant": "green", "tool": "yellow"}


def print_records(records: Sequence[dict[str, Any]], console: Any) -> None:
    """Prints episodes: a header line, then the conversation (colours on a terminal only)."""
    from rich.text import Text

    for record in records:
        console.print(Text(format_header(record), style="bold"))
        for role, detail, text in conversation(record):
            label = f"{role} [{detail}]" if detail else role
            line = Text()
            line.append(f"  {label}: ", style=_ROLE_STYLE.get(role, ""))
            line.append(text.replace("\n", "\n    "))
            console.print(line)
        if record.get("error"):
            console.print(Text(f"  error: {printable(str(record['error']))}", style="red"))
        console.print()


def _filters(args: argparse.Namespace) -> Filters:
    phase = "train" if args.train else "eval" if args.eval else args.phase
    success = True if args.success else False if args.failure else None
    return Filters(steps=parse_steps(args.step) if args.step else (None, None), phase=phase,
                   success=success, reward_min=args.reward_min, reward_max=args.reward_max,
                   role=getattr(args, "role", None))


def show(args: argparse.Namespace) -> int:
    """`agentax show`: prints the matching episodes, or writes the HTML page (`--html`)."""
    from rich.console import Console

    run_dir = Path(args.run_dir)
    if not is_run_dir(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {CONFIG_FILENAME}); give "
                                "the folder `agentax train` or `agentax eval` wrote")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit {args.limit}: give a number of episodes >= 1")
    records = read_transcripts(run_dir)
    matching = select(records, _filters(args))
    html = args.html is not None
    limit = args.limit or (None if html else TEXT_LIMIT)
    chosen = matching[-limit:] if limit else matching
    if html:
        from agentax.cli._html import write_page

        out = Path(args.html) if args.html else run_dir / "transcripts.html"
        write_page(run_dir, chosen, out)
        print(f"wrote {out} ({len(chosen)} of {len(records)} episodes); open it in a browser")
        return 0
    if not chosen:
        print(f"no episode of the {len(records)} in {run_dir} matches these filters")
        return 0
    print_records(chosen, Console(highlight=False, soft_wrap=True))
    if len(chosen) < len(matching):
        print(f"(the last {len(chosen)} of {len(matching)} matching episodes; --limit N for "
              "more, --html for a page of all)")
    return 0


def add_parser(add: Any) -> None:
    """The `show` subcommand and its filters (`add(name, **kwargs)` makes a subparser)."""
    p = add("show", help="print a run's episode transcripts (or --html: one page)",
            description="Episodes from RUN_DIR/transcripts.jsonl: the sampled RL episodes "
            "and the first ones of every evaluation.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--step", metavar="N|A:B", help="RL step N, or steps A to B (A: or :B open)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--train", action="store_true", help="only trained RL episodes")
    kind.add_argument("--eval", action="store_true", help="only evaluation episodes")
    kind.add_argument("--phase", help="only this phase (train, eval_before, eval_mid, "
                      "eval_after, eval, eval_after_sft)")
    p.add_argument("--role", help="only this role's view of multi-agent episodes")
    outcome = p.add_mutually_exclusive_group()
    outcome.add_argument("--success", action="store_true", help="only episodes with reward > 0")
    outcome.add_argument("--failure", action="store_true", help="only episodes with reward <= 0")
    p.add_argument("--reward-min", type=float, metavar="X", help="only reward >= X")
    p.add_argument("--reward-max", type=float, metavar="X", help="only reward <= X")
    p.add_argument("--limit", type=int, metavar="N",
                   help=f"the last N matching episodes (default {TEXT_LIMIT}; all with --html)")
    p.add_argument("--html", nargs="?", const="", metavar="OUT",
                   help="write one self-contained HTML page (default RUN_DIR/transcripts.html)")
    p.set_defaults(fn=show)
