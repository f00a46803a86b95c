"""agentax: JAX-native asynchronous agentic reinforcement learning for language models."""

from agentax import records as _records
from agentax.records import (
    Action,
    Completion,
    FinishReason,
    Group,
    Message,
    Observation,
    SamplingParams,
    StepResult,
    Task,
    ToolCall,
    ToolCallError,
    ToolResult,
    Trajectory,
    TrajectoryStatus,
    Turn,
)

__version__ = "0.1.0"

# The top level re-exports the core records, exactly the public names of agentax.records.
__all__ = list(_records.__all__)
