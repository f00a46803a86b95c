"""agentax.engine: continuous-batching generation in JAX with an asyncio front end.

`Engine(model, EngineConfig(...), eos_token_ids=...)` owns a preallocated KV cache of
`max_slots` sequences and a background step thread; `await engine.generate(ids, params,
sequence_id=...)` returns a `records.Completion` with per-token logprobs and policy versions.
See docs/engine.md.
"""

from agentax.engine._config import EngineConfig, EngineStats
from agentax.engine._engine import (
    Engine,
    EngineClosed,
    EngineError,
    PromptTooLong,
    SequenceError,
)

__all__ = [
    "Engine",
    "EngineClosed",
    "EngineConfig",
    "EngineError",
    "EngineStats",
    "PromptTooLong",
    "SequenceError",
]
