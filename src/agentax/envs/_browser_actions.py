"""Browser actions and their text form: what a model writes to act on a page.

One action per reply, on its own line (the last line that starts with an action word counts,
so a model may think first; an optional `Action:` prefix is allowed):

    click 7                 type 8 "hello world"     select 9 "Blue"
    press Enter             scroll down              goto http://127.0.0.1:8000/page
    done                    done "the answer"

Calls in function form (`click(7)`, `type(8, "hello")`) and unquoted text (`type 8 hello`) are
read too. `parse_browser_action` returns a `BrowserAction`, or a one-line error message the
environment sends back to the model as its next observation.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["ACTION_HELP", "BrowserAction", "format_browser_action", "parse_browser_action"]

KINDS = ("click", "type", "select", "press", "scroll", "goto", "done")

ACTION_HELP = (
    'Actions (one per reply): click ID | type ID "text" | select ID "option" | press KEY | '
    'scroll up|down | goto URL | done ["answer"]'
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BrowserAction:
    """One parsed browser action.

    Attributes:
      kind: one of click, type, select, press, scroll, goto, done.
      target: the element id for click/type/select (None otherwise).
      text: the typed text, option, key, scroll direction, URL or answer.
    """

    kind: str
    target: int | None = None
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown browser action {self.kind!r}; expected one of {', '.join(KINDS)}")
        if self.kind in ("click", "type", "select") and self.target is None:
            raise ValueError(f"{self.kind} needs an element id (target)")


_LINE = re.compile(r"^\s*(?:action\s*:\s*)?(click|type|select|press|scroll|goto|done)\b(.*)$", re.I)


def _unquote(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'":
        return s[1:-1]
    return s


def parse_browser_action(reply: str) -> BrowserAction | str:
    """Parse the model's reply into a `BrowserAction`, or return why it could not be read."""
    lines = [ln for ln in reply.strip().splitlines() if _LINE.match(ln)]
    if not lines:
        snippet = reply.strip().replace("\n", " ")[:80]
        return f"no action found in your reply ({snippet!r}). {ACTION_HELP}"
    m = _LINE.match(lines[-1])
    assert m is not None
    kind, rest = m.group(1).lower(), m.group(2).strip()
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1].strip()
    if kind in ("click", "type", "select"):
        m_id = re.match(r"^\[?(\d+)\]?\s*,?\s*(.*)$", rest, re.S)
        if m_id is None:
            return f"{kind} needs an element id, as in `{kind} 3`; got {lines[-1].strip()!r}"
        target, arg = int(m_id.group(1)), _unquote(m_id.group(2))
        if kind != "click" and not arg:
            return f'{kind} needs text after the id, as in `{kind} {target} "..."`'
        return BrowserAction(kind=kind, target=target, text=arg if kind != "click" else "")
    arg = _unquote(rest)
    if kind == "press" and not arg:
        return "press needs a key, as in `press Enter`"
    if kind == "scroll":
        arg = arg.lower() or "down"
        if arg not in ("up", "down"):
            return f"scroll takes up or down, got {arg!r}"
    if kind == "goto" and not arg:
        return "goto needs a URL, as in `goto http://127.0.0.1:8000/`"
    return BrowserAction(kind=kind, text=arg)


def format_browser_action(action: BrowserAction) -> str:
    """The text form of `action` (what `parse_browser_action` reads back)."""
    if action.kind == "click":
        return f"click {action.target}"
    if action.kind in ("type", "select"):
        return f'{action.kind} {action.target} "{action.text}"'
    if action.kind == "done":
        return f'done "{action.text}"' if action.text else "done"
    return f"{action.kind} {action.text}"
