"""Core records shared by every layer: what flows along agentax's data path.

These are plain frozen, keyword-only dataclasses (docs/design.md, "Records"). They sit at the
bottom layer so that environments, agents, the engine, the collector and the trainer can all
speak them without importing each other. Device arrays for one micro-batch are not records:
they stay private to `agentax.train`, next to the code that builds them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentax.config import frozen

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


# ----------------------------------------------------------------------------- generation


@frozen
class SamplingParams:
    """How the engine samples one request."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose mass reaches top_p; 1 disables."""
    max_tokens: int = 256
    """Maximum number of tokens to generate for this request."""
    stop_ids: tuple[int, ...] = ()
    """Token ids that end the completion (in addition to the model's eos ids); kept in output."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end the completion once they appear in the decoded output."""
    seed: int = 0
    """Per-request seed; the key of token i is derived from (seed, position), never from batch."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


class FinishReason(str, enum.Enum):
    """Why a completion stopped."""

    EOS = "eos"
    STOP = "stop"  # a stop id or stop string
    LENGTH = "length"  # max_tokens reached
    SLOT_FULL = "slot_full"  # the sequence reached the engine's max_seq_len
    CANCELLED = "cancelled"
    ERROR = "error"


@frozen
class Completion:
    """One model call's result: generated ids with their logprobs and policy versions."""

    token_ids: np.ndarray
    """[T] int32 generated ids (stop/eos token included when one ended the completion)."""
    logprobs: np.ndarray
    """[T] float32 logprob of each sampled token under the behaviour policy."""
    versions: np.ndarray
    """[T] int32 policy version of the weights that produced each token."""
    finish_reason: FinishReason
    prompt_len: int = 0
    """Prompt tokens of this call (new tokens only on a continuation)."""
    cached_prompt_tokens: int = 0
    """Tokens of the sequence served from KV pages shared with earlier prompts instead of
    prefilled (`EngineConfig.prefix_sharing`; for a new sequence at most `prompt_len`)."""
    sequence_id: int | None = None
    """Handle of the engine sequence; pass it back to continue the conversation without re-prefill."""
    queue_time_s: float = 0.0
    """Seconds the request waited for a slot."""
    total_time_s: float = 0.0
    """Seconds from submission to completion."""

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


# ----------------------------------------------------------------------------- interaction


@frozen
class ToolCall:
    """A parsed, well-formed tool call from a model reply."""

    name: str
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """OpenAI/HF chat-template form: {"type": "function", "function": {...}}."""
        out: dict[str, Any] = {
            "type": "function",
            "function": {"name": self.name, "arguments": dict(self.arguments)},
        }
        if self.id:
            out["id"] = self.id
        return out


@frozen
class ToolCallError:
    """A tool call that could not be parsed; `message` says what was wrong."""

    raw: str
    message: str


@frozen
class ToolResult:
    """The output of one executed tool call."""

    name: str
    content: str
    call_id: str = ""
    ok: bool = True
    error: str | None = None
    """Short error kind when ok is False (timeout, unknown_tool, bad_arguments, crashed...)."""
    elapsed_s: float = 0.0


@frozen
class Message:
    """One chat message; `to_dict` gives the form chat templates expect."""

    role: str  # system | user | assistant | tool
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    name: str | None = None
    tool_call_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@frozen
class Task:
    """One unit of work handed to `Environment.reset`: a question, a level, a repository..."""

    id: str
    prompt: str = ""
    answer: str | None = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@frozen
class Observation:
    """What an environment shows the agent.

    `content` is the text for the next user turn. Tool environments fill `tool_results`
    instead (each becomes a `tool` message); `raw` keeps the underlying value (a Gymnasium
    observation, say) for agents that format it themselves.
    """

    content: str = ""
    role: str = "user"
    tool_results: tuple[ToolResult, ...] = ()
    raw: Any = None
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@frozen
class Action:
    """What an agent hands the environment after parsing a model reply."""

    text: str
    """The model's reply text, as decoded."""
    tool_calls: tuple[ToolCall, ...] = ()
    parse_errors: tuple[ToolCallError, ...] = ()
    final_answer: str | None = None
    """Set when the reply is an answer (ends tool episodes)."""
    value: Any = None
    """An environment-specific parsed action (e.g. an int for a Gymnasium Discrete space)."""


@frozen
class StepResult:
    """What `Environment.step` returns."""

    observation: Observation
    reward: float = 0.0
    done: bool = False
    truncated: bool = False
    """True when the episode ended by a limit (max_steps, time) rather than by the task."""
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# ----------------------------------------------------------------------------- trajectories


class TrajectoryStatus(str, enum.Enum):
    """How an episode ended. Every started episode ends with exactly one of these."""

    OK = "ok"
    TRUNCATED = "truncated"  # max_steps / max_tokens / context full
    TIMEOUT = "timeout"
    ENV_ERROR = "env_error"
    PARSE_ERROR = "parse_error"
    MODEL_ERROR = "model_error"
    REWARD_ERROR = "reward_error"
    CANCELLED = "cancelled"


@frozen
class Turn:
    """One model call inside an episode and what the environment answered."""

    prompt_ids: np.ndarray
    """[P] int32 tokens fed to the model before this reply (new tokens only after turn 0)."""
    completion: Completion
    action: Action
    reward: float = 0.0
    observation: Observation | None = None
    env_time_s: float = 0.0


@frozen
class Trajectory:
    """A whole episode as one token stream plus what is needed to train on it.

    Arrays all have length T. `loss_mask` is 1 exactly on tokens the model generated;
    `logprobs` and `versions` hold the behaviour logprob / policy version on those tokens
    (0.0 / -1 elsewhere).
    """

    task_id: str
    token_ids: np.ndarray  # [T] int32
    loss_mask: np.ndarray  # [T] int8
    logprobs: np.ndarray  # [T] float32
    versions: np.ndarray  # [T] int32
    reward: float
    status: TrajectoryStatus
    turns: tuple[Turn, ...] = ()
    sample_index: int = 0
    """Index of this trajectory inside its group (0..G-1)."""
    group_id: str = ""
    timings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.token_ids.shape[0]
        for name in ("loss_mask", "logprobs", "versions"):
            arr = getattr(self, name)
            if arr.shape != (n,):
                raise ValueError(f"Trajectory.{name} has shape {arr.shape}, expected ({n},)")

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_generated(self) -> int:
        return int(self.loss_mask.sum())


@frozen
class Group:
    """The N trajectories of one task, released together (GRPO needs all of them)."""

    group_id: str
    task_id: str
    trajectories: tuple[Trajectory, ...]

    @property
    def rewards(self) -> np.ndarray:
        return np.asarray([t.reward for t in self.trajectories], dtype=np.float32)
