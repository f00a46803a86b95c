"""agentax.engine: continuous-batching generation in JAX with an asyncio front end.

`Engine(model, EngineConfig(...), eos_token_ids=...)` owns a preallocated KV cache (a pool
of 16-token pages, `kv_cache_tokens` positions) and a background step thread, and decodes up
to `max_slots` sequences together; `await engine.generate(ids, params, sequence_id=...)` returns a `records.Completion` with per-token logprobs and policy versions;
`engine.stream(...)` yields its `TokenChunk`s as they are sampled, then the `Completion`.
See docs/engine.md.

The config, stats and error types import no JAX; `Engine` loads JAX on first use (so the
host-side scheduler and its tests stay JAX-free).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from agentax.engine._config import EngineConfig, EngineStats
from agentax.engine._requests import (
    EngineClosed,
    EngineError,
    PromptTooLong,
    SequenceError,
    TokenChunk,
)

if TYPE_CHECKING:
    from agentax.engine._compilation import enable_compilation_cache
    from agentax.engine._engine import Engine

_LAZY = {
    "Engine": "agentax.engine._engine",
    "enable_compilation_cache": "agentax.engine._compilation",
}

__all__ = [
    "Engine",
    "EngineClosed",
    "EngineConfig",
    "EngineError",
    "EngineStats",
    "PromptTooLong",
    "SequenceError",
    "TokenChunk",
    "enable_compilation_cache",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agentax.engine' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
