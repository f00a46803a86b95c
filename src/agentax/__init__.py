"""agentax: JAX-native asynchronous agentic reinforcement learning for language models."""

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

__all__ = [
    "Action",
    "Completion",
    "FinishReason",
    "Group",
    "Message",
    "Observation",
    "SamplingParams",
    "StepResult",
    "Task",
    "ToolCall",
    "ToolCallError",
    "ToolResult",
    "Trajectory",
    "TrajectoryStatus",
    "Turn",
]
