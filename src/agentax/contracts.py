"""The contracts between agentax's parts, as typing protocols.

`GenerateFn` is what the collector asks of an engine (sample, continue, release: a fixed
player's `FunctionPolicy` is one too); `EngineClient` adds what the pipeline, the OpenAI
endpoint and the scale layer ask (stream, weights, version, stats). `EpisodeDriver` is an
environment that runs the model calls of its episode itself (a black-box agent through the
OpenAI endpoint, `agentax.serve.OpenAIAgentEnvironment`): the collector hands it the engine and
its limits, and keeps the episode's deadline, cancellation, cleanup and run reward stage. `agentax.engine.Engine`, `agentax.scale.EngineRouter`,
`agentax.scale.RayEngineReplica` and `agentax.agents.testing.ScriptedEngine` implement it
(tests/test_contracts.py checks each against it, member by member), and so may a user's own.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agentax.records import Completion, SamplingParams

__all__ = ["ENGINE_CLIENT_MEMBERS", "GENERATE_FN_MEMBERS", "EngineClient", "EpisodeDriver",
           "GenerateFn", "check_engine_client",
           "stream_whole"]


@runtime_checkable
class GenerateFn(Protocol):
    """What the collector needs from a model: sample a completion, continue it, release it.

    A conversation is an engine sequence: `generate` without `sequence_id` starts one, and
    passing a completion's `sequence_id` back continues it with only the new tokens; `release`
    ends it.
    """

    async def generate(self, prompt_ids: Sequence[int] | np.ndarray,
                       params: SamplingParams | None = None, *,
                       sequence_id: int | None = None) -> Completion:
        """One completion (a continuation of `sequence_id` when given)."""
        ...

    def release(self, sequence_id: int | None) -> None:
        """Forgets a sequence and frees what it holds; unknown ids (and None) are ignored."""
        ...


@runtime_checkable
class EngineClient(GenerateFn, Protocol):
    """The front end of an engine: `GenerateFn` plus stream, weights, version and stats.

    `wait_published` blocks (call it from a thread, not the event loop); the others do not.
    """

    def stream(self, prompt_ids: Sequence[int] | np.ndarray,
               params: SamplingParams | None = None, *,
               sequence_id: int | None = None) -> AsyncIterator[Any]:
        """As `generate`, yielding token chunks as they are sampled, then the `Completion`
        last (an engine that cannot stream yields only the `Completion`: `stream_whole`)."""
        ...

    def update_weights(self, state: Any, version: int) -> None:
        """New weights for tokens sampled from now on, tagged with `version`."""
        ...

    def wait_published(self, timeout_s: float | None = None) -> bool:
        """Blocks until the weights last given to `update_weights` are the ones new tokens
        are sampled with (an engine may take them in the background); False: timed out."""
        ...

    @property
    def policy_version(self) -> int:
        """The version new tokens are sampled with."""
        ...

    def stats(self) -> Any:
        """A snapshot of the engine's counters."""
        ...


@runtime_checkable
class EpisodeDriver(Protocol):
    """An environment whose episode makes its own model calls through `engine`.

    The collector runs one episode of it as it runs an agent/environment pair: it sets the
    episode's deadline (`config.episode_timeout_s`, with `config.close_timeout_s` of grace),
    cancels it, closes the environment and adds the run's reward stage; the driver applies
    the per-call limits of `config` (turns, tokens, model timeout) to its calls.
    """

    async def drive_episode(self, engine: Any, tokenizer: Any, task: Any, *,
                            sampling: SamplingParams, config: Any,
                            template_kwargs: Any = None) -> Any:
        """The episode's trajectory, or one per trained role; never raises but on cancel."""
        ...


GENERATE_FN_MEMBERS = ("generate", "release")
ENGINE_CLIENT_MEMBERS = (*GENERATE_FN_MEMBERS, "stream", "update_weights", "wait_published",
                         "policy_version", "stats")


def check_engine_client(engine: Any, where: str,
                        members: Sequence[str] = ENGINE_CLIENT_MEMBERS) -> None:
    """Raises TypeError naming what `engine` lacks of `EngineClient` (`members` of it)."""
    cls = type(engine)
    missing = [m for m in members
               if not (hasattr(cls, m) if m == "policy_version" else callable(getattr(engine, m, None)))]
    if missing:
        raise TypeError(f"{where} needs an agentax.contracts.EngineClient (an agentax Engine, "
                        f"EngineRouter or ScriptedEngine); {cls.__name__} has no "
                        f"{', '.join(missing)}")
    gen = getattr(engine, "generate", None)
    if "generate" in members and not inspect.iscoroutinefunction(gen):
        raise TypeError(f"{where}: {cls.__name__}.generate must be an async method "
                        "(`async def generate(prompt_ids, params=None, *, sequence_id=None)`)")


async def stream_whole(client: Any, prompt_ids: Sequence[int] | np.ndarray,
                       params: SamplingParams | None = None, *,
                       sequence_id: int | None = None) -> AsyncIterator[Any]:
    """`EngineClient.stream` for an engine that answers whole: yields only the `Completion`."""
    yield await client.generate(prompt_ids, params, sequence_id=sequence_id)
