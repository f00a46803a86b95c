"""`Agent` and `ModelAgent`: observations -> chat messages, model replies -> actions.

An agent holds the conversation (a list of `Message`) and nothing of the model: the rollout
layer renders `agent.messages` (with `agent.tools`) through the chat template, calls the engine
and hands the reply text back to `agent.act`. The loop, for one episode:

    agent.reset(task)
    agent.observe(await env.reset(task))         # -> the new messages (system + first user)
    while True:
        reply = <model>(agent.messages, tools=agent.tools)
        action = agent.act(reply)                # parses and appends the assistant message
        result = await env.step(action)
        if result.done: break
        agent.observe(result.observation)        # -> the new user / tool messages

A custom agent overrides any of three hooks: `system_prompt_for(task)`,
`format_observation(observation)`, `parse_reply(reply)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentax.records import Action, Message, Observation, Task

__all__ = ["Agent", "ModelAgent"]


class Agent:
    """Base agent: keeps the conversation; subclasses choose prompts and how replies parse.

    Args:
      system_prompt: the system message of every episode (None: no system message).
    """

    system_prompt: str | None = None

    def __init__(self, *, system_prompt: str | None = None) -> None:
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self._messages: list[Message] = []
        self._task: Task | None = None
        self._stats: dict[str, int] = {"replies": 0, "parse_errors": 0, "unknown_tools": 0}

    # ------------------------------------------------------------------ state

    @property
    def messages(self) -> list[Message]:
        """The conversation so far (a copy; the agent owns the list)."""
        return list(self._messages)

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """Tool schemas (OpenAI function form) to render into the prompt; None for no tools."""
        return None

    @property
    def task(self) -> Task | None:
        return self._task

    @property
    def stats(self) -> Mapping[str, int]:
        """Counters over this agent's lifetime: replies, parse_errors, unknown_tools, ..."""
        return dict(self._stats)

    def _count(self, key: str, n: int = 1) -> None:
        self._stats[key] = self._stats.get(key, 0) + n

    # ------------------------------------------------------------------ the loop API

    def reset(self, task: Task) -> list[Message]:
        """Start a new conversation for `task`; returns the messages added (the system one)."""
        self._task = task
        self._messages = []
        system = self.system_prompt_for(task)
        if system:
            self._messages.append(Message(role="system", content=system))
        return list(self._messages)

    def observe(self, observation: Observation) -> list[Message]:
        """Turn an observation into messages, append them, and return them."""
        if not isinstance(observation, Observation):
            raise TypeError(f"observe() takes an Observation, got {type(observation).__name__}")
        new = list(self.format_observation(observation))
        self._messages.extend(new)
        return new

    def act(self, reply: str) -> Action:
        """Parse the model's reply into an `Action` and append the assistant message."""
        action = self.parse_reply(reply)
        self._count("replies")
        if action.parse_errors:
            self._count("parse_errors", len(action.parse_errors))
        self._messages.append(self.assistant_message(reply, action))
        return action

    # ------------------------------------------------------------------ hooks

    def system_prompt_for(self, task: Task) -> str | None:
        """The system message for `task`; default `self.system_prompt`."""
        return self.system_prompt

    def format_observation(self, observation: Observation) -> list[Message]:
        """Default: each tool result becomes a `tool` message, then `content` (if any) a message
        with the observation's role."""
        out = [
            Message(role="tool", content=r.content, name=r.name or None, tool_call_id=r.call_id or None)
            for r in observation.tool_results
        ]
        if observation.content or not out:
            out.append(Message(role=observation.role, content=observation.content))
        return out

    def parse_reply(self, reply: str) -> Action:
        """Default: the whole reply (stripped) is the final answer."""
        return Action(text=reply, final_answer=reply.strip())

    def assistant_message(self, reply: str, action: Action) -> Message:
        """The assistant message kept in the conversation for `reply`."""
        return Message(role="assistant", content=reply, tool_calls=action.tool_calls)


class ModelAgent(Agent):
    """Plain chat agent, single- or multi-turn: every reply is the agent's answer.

    The environment decides whether the episode goes on (a multi-turn environment answers with
    another user message). `Action.final_answer` is the reply, stripped.
    """
