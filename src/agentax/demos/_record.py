"""Record demonstrations: a scripted policy plays your environment through your agent.

The loop is the collector's, with the policy in the model's place: the agent turns each
observation into messages, the policy's reply goes through `agent.act` (parsed exactly as a
model's reply would be), the environment steps on the resulting action. The conversation the
agent holds at the end is the demonstration: the same `Message` list an SFT warm start renders
(`sft.demos`), so what the policy is taught to say is what the agent reads back and what the
environment accepts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agentax.agents import Agent
from agentax.envs import ensure_async_env
from agentax.records import Message, Observation, Task, ToolCall
from agentax.text import format_tool_call

__all__ = ["Demonstration", "Reply", "arecord", "record", "record_many", "reply_text"]

Reply = str | ToolCall | Sequence[ToolCall]
"""What a scripted policy says in a turn: the reply text as a model would write it, or tool
calls (written in the agent's tool format, `agent.tool_format`, default hermes)."""

Policy = Callable[..., Reply] | Sequence[Reply]
"""`policy(observation)` or `policy(observation, task)` -> `Reply`, or the replies in order."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Demonstration:
    """One recorded episode."""

    task_id: str
    messages: tuple[Message, ...]
    """The agent's conversation: system (if any), observations, the policy's replies."""
    tools: tuple[dict[str, Any], ...] = ()
    """The agent's tool schemas (what the prompt lists; pass as `tools=` when rendering)."""
    reward: float = 0.0
    """The environment's summed step rewards."""
    done: bool = False
    """The environment ended the episode (False: `max_turns` replies were given first)."""
    truncated: bool = False
    steps: int = 0


def reply_text(reply: Reply, agent: Agent) -> str:
    """The text of `reply` as the model would write it to `agent` (tool calls in its format)."""
    if isinstance(reply, str):
        return reply
    calls = [reply] if isinstance(reply, ToolCall) else list(reply)
    if not calls or not all(isinstance(c, ToolCall) for c in calls):
        raise TypeError(f"a scripted reply is a str, a ToolCall or a list of ToolCalls, got "
                        f"{type(reply).__name__} {reply!r}")
    fmt = getattr(agent, "tool_format", "hermes")
    return "\n".join(format_tool_call(c, fmt) for c in calls)


def _caller(policy: Policy) -> Callable[[Observation, Task, int], Reply]:
    if isinstance(policy, (str, ToolCall)) or not callable(policy) and not isinstance(policy, Sequence):
        raise TypeError("policy must be a function (observation[, task]) -> reply or a list of "
                        f"replies, got {type(policy).__name__}")
    if not callable(policy):
        replies = list(policy)

        def scripted(obs: Observation, task: Task, turn: int) -> Reply:
            if turn >= len(replies):
                raise ValueError(f"the scripted policy's {len(replies)} replies ran out before "
                                 f"the episode of task {task.id!r} ended: give more replies, or "
                                 "a function of the observation")
            return replies[turn]
        return scripted
    try:
        takes_task = len(inspect.signature(policy).parameters) >= 2
    except (TypeError, ValueError):  # a builtin or C callable: observation only
        takes_task = False
    return (lambda obs, task, turn: policy(obs, task)) if takes_task else \
        (lambda obs, task, turn: policy(obs))


async def arecord(env: Any, agent: Agent, task: Task, policy: Policy, *,
                  max_turns: int = 32) -> Demonstration:
    """Plays one episode of `task` with `policy` in the model's place.

    Args:
      env: your environment (sync or async; closed at the end).
      agent: your agent (a fresh one, or one `reset` may reuse).
      task: the task to play.
      policy: `policy(observation)` or `policy(observation, task)` returning a `Reply`, or a
        list of replies. The observation is the environment's (`Observation`); the agent
        shows the model `agent.messages`, which `Demonstration.messages` holds at the end.
      max_turns: replies at most (the episode is then kept with `done=False`).

    Returns:
      The `Demonstration`.

    Raises:
      ValueError: a reply that the agent cannot parse (its tool call is malformed), or a
        list of replies that ran out before the episode ended.
    """
    step_of = _caller(policy)
    env = ensure_async_env(env)
    reward, done, truncated, steps = 0.0, False, False, 0
    try:
        agent.reset(task)
        observation = await env.reset(task)
        agent.observe(observation)
        for turn in range(max_turns):
            text = reply_text(step_of(observation, task, turn), agent)
            action = agent.act(text)
            if action.parse_errors:
                raise ValueError(f"task {task.id!r}, turn {turn}: the agent cannot parse the "
                                 f"policy's reply {text!r}: "
                                 + "; ".join(e.message for e in action.parse_errors))
            result = await env.step(action)
            steps += 1
            reward += float(result.reward)
            if result.done:
                done, truncated = True, bool(result.truncated)
                break
            observation = result.observation
            agent.observe(observation)
    finally:
        await env.close()
    return Demonstration(task_id=task.id, messages=tuple(agent.messages),
                         tools=tuple(agent.tools or ()), reward=reward, done=done,
                         truncated=truncated, steps=steps)


async def _close_shared() -> None:
    """Closes what the episodes of the running loop shared (the browser, MCP sessions).

    `record` and `record_many` run an event loop of their own; a browser left open when it
    ends stays alive, idle but not free (~0.15 CPU-s a second on a 2-core host, its Chromium
    and Playwright driver processes), until the process exits: through the SFT and RL that
    follow in `agentax train`."""
    from agentax.envs import shutdown_browser
    from agentax.tools import close_mcp_connections

    await close_mcp_connections(10.0)
    try:
        await asyncio.wait_for(shutdown_browser(), 30.0)
    except Exception:  # noqa: BLE001 - a browser that already died has nothing to close
        pass


def record(env: Any, agent: Agent, task: Task, policy: Policy, *,
           max_turns: int = 32) -> Demonstration:
    """`arecord` from synchronous code (runs its own event loop; closes the browser or MCP
    sessions its episode opened when it ends)."""
    async def run() -> Demonstration:
        try:
            return await arecord(env, agent, task, policy, max_turns=max_turns)
        finally:
            await _close_shared()

    return asyncio.run(run())


def record_many(env_factory: Callable[[], Any], agent_factory: Callable[[], Agent],
                tasks: Iterable[Task], policy: Policy, *, min_reward: float | None = None,
                max_turns: int = 32, concurrency: int = 1) -> list[list[Message]]:
    """Demonstrations for `tasks`, one episode each, in the tasks' order, as `sft.demos`
    returns them.

    Args:
      env_factory / agent_factory: what `env.factory` / `agent.factory` name (called per task).
      tasks: the tasks to play (repeat one to record it several times).
      policy: as in `arecord` (a list of replies serves every task).
      min_reward: keep only episodes whose reward reaches it (None: keep all).
      max_turns: replies at most per episode.
      concurrency: episodes played at once (they share one browser, or one MCP session per
        server). Above 1 the policy's calls interleave across episodes, so a policy that
        draws from one shared random generator records different demonstrations from run to
        run; seed its randomness per task to keep them fixed.

    Returns:
      The conversations (lists of `Message`), ready for `sft.demos`. The browser (or MCP
      sessions) the episodes shared is closed before it returns.

    Raises:
      ValueError: `concurrency` < 1, or as `arecord` raises (the other episodes are cancelled).
    """
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"record_many: concurrency must be an integer >= 1, got {concurrency!r}")
    tasks = list(tasks)

    async def run() -> list[list[Message]]:
        gate = asyncio.Semaphore(concurrency)

        async def one(task: Task) -> Demonstration:
            async with gate:
                return await arecord(env_factory(), agent_factory(), task, policy,
                                     max_turns=max_turns)

        try:
            async with asyncio.TaskGroup() as group:  # a failure cancels the episodes left
                played = [group.create_task(one(task)) for task in tasks]
        except BaseExceptionGroup as e:  # the first failure, as a sequential loop would raise
            raise e.exceptions[0] from None
        finally:
            await _close_shared()
        return [list(d.messages) for d in (p.result() for p in played)
                if min_reward is None or d.reward >= min_reward]

    return asyncio.run(run())
