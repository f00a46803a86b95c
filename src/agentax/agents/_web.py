"""`CompactWebAgent`: a browser page's text view, shortened to its instruction and controls.

`BrowserEnvironment` shows a page as text: the instruction line, then one line per control,
`[id] kind "name"`. `compact_view` keeps the instruction and `id name` per control (the form
a small byte-level model learns from), `page_controls` reads the controls back.
"""

from __future__ import annotations

import re

from agentax.agents._base import Agent
from agentax.envs import BrowserAction, parse_browser_action
from agentax.records import Action, Message, Observation

__all__ = ["CompactWebAgent", "compact_view", "page_controls"]

_CONTROL = re.compile(r'^\[(\d+)\] (\w+)(?: (?!")\S+)?(?: "([^"]*)")?')


def page_controls(text: str) -> list[tuple[int, str, str]]:
    """(id, kind, name) of each control line of a page's full text view."""
    out = []
    for line in text.splitlines():
        m = _CONTROL.match(line)
        if m:
            out.append((int(m.group(1)), m.group(2), m.group(3) or ""))
    return out


def compact_view(text: str) -> str:
    """The instruction line (and any feedback line before it), then `id name` per control."""
    lines = text.splitlines()
    head = []
    for line in lines:
        if line.startswith("["):
            break
        head.append(line)
        if not (line.startswith("Invalid action") or " failed: " in line):
            break
    body = [f"{i} {name or kind}" for i, kind, name in page_controls(text)]
    return "\n".join(head + body)


class CompactWebAgent(Agent):
    """Shows `compact_view(observation)` (`compact=False`: the full view); parses replies with
    `agentax.envs.parse_browser_action` (an unreadable one: the environment answers with the
    parse error, counted as `invalid_actions`)."""

    def __init__(self, *, compact: bool = True, system_prompt: str | None = None) -> None:
        super().__init__(system_prompt=system_prompt)
        self.compact = compact

    def format_observation(self, observation: Observation) -> list[Message]:
        text = compact_view(observation.content) if self.compact else observation.content
        return [Message(role="user", content=text)]

    def parse_reply(self, reply: str) -> Action:
        parsed = parse_browser_action(reply)
        if not isinstance(parsed, BrowserAction):
            self._count("invalid_actions")
            return Action(text=reply)  # the environment answers with the parse error
        return Action(text=reply, value=parsed)
