"""agentax: JAX-native asynchronous agentic reinforcement learning for language models."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# The top level re-exports the core records, exactly the public names of agentax.records.
# They load on first use (PEP 562): `import agentax` stays free of numpy, so the `agentax`
# command installs its signal handlers within milliseconds of starting (agentax.__main__).
__all__ = ["Action", "Completion", "FinishReason", "Group", "Message", "Observation",
           "SamplingParams", "StepResult", "Task", "ToolCall", "ToolCallError", "ToolResult",
           "Trajectory", "TrajectoryStatus", "Turn"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from agentax import records

        value = getattr(records, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'agentax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
