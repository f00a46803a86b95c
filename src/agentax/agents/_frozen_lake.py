"""`FrozenLakeAgent`: a custom agent by subclassing — grid-aware prompt, forgiving parser.

It shows the three hooks a custom agent overrides: the system prompt explains the grid and the
expected answer format, observations are passed through with a short reminder, and replies are
parsed with `parse_frozen_lake_action` ("left", "L", "0", "move left", "<action>up</action>"...).
A reply that names no action still becomes an `Action` (value None); the environment answers
it with feedback, and the agent counts it under `stats["invalid_actions"]`.
"""

from __future__ import annotations

from agentax.agents._base import Agent
from agentax.envs._gym import FROZEN_LAKE_ACTIONS, parse_frozen_lake_action  # the env's own format
from agentax.records import Action, Message, Observation

__all__ = ["FrozenLakeAgent"]


class FrozenLakeAgent(Agent):
    """Plays FrozenLake-v1 (use with `agentax.envs.make_frozen_lake`)."""

    system_prompt = (
        "You play FrozenLake on a grid. Legend: P you, S start, F frozen (safe), H hole (you lose), "
        "G goal (you win). Row 0 is the top, column 0 the left. 'down' increases the row, 'right' "
        "the column. Think briefly, then end your reply with one line 'Action: <left|down|right|up>'."
    )

    def format_observation(self, observation: Observation) -> list[Message]:
        text = observation.content
        if "Invalid action" not in text:
            text = f"{text}\nWhich way do you move?"
        return [Message(role="user", content=text)]

    def parse_reply(self, reply: str) -> Action:
        value = parse_frozen_lake_action(reply)
        if value is None:
            self._count("invalid_actions")
        return Action(text=reply, value=value)

    @staticmethod
    def action_name(value: int) -> str:
        return FROZEN_LAKE_ACTIONS[value]
