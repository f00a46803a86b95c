"""agentax.train: the jitted trainer — RL and SFT steps, LoRA, sharding, checkpoints.

Feed `RLTrainer.step(groups)` complete `records.Group`s; publish `params_for_engine()` under
`policy_version`. See docs/training.md.
"""

from agentax.train._checkpoint import (
    DamagedCheckpointError,
    DiskFullError,
    check_space,
    checkpoint_bytes,
    checkpoint_steps,
    latest_checkpoint_step,
    read_checkpoint_meta,
)
from agentax.train._config import LoRAConfig, TrainerConfig
from agentax.train._distributed import (
    broadcast_from_main,
    gather_objects,
    initialize_distributed,
    is_main_process,
    local_share,
    process_count,
    process_index,
)
from agentax.train._liveness import fail_job, leave_job, set_resume_hint
from agentax.train._memory import UpdateMemory, update_memory
from agentax.train._preflight import JoinError
from agentax.train._rl import RLTrainer, TrainMetrics
from agentax.train._sft import SFTMetrics, SFTTrainer, sft_examples
from agentax.train._sharding import DEFAULT_PARTITION_RULES, make_mesh, param_sharding_fn
from agentax.train._step import NonFiniteUpdateError

__all__ = [
    "DamagedCheckpointError",
    "DiskFullError",
    "JoinError",
    "broadcast_from_main",
    "gather_objects",
    "check_space",
    "checkpoint_bytes",
    "DEFAULT_PARTITION_RULES",
    "LoRAConfig",
    "NonFiniteUpdateError",
    "RLTrainer",
    "SFTMetrics",
    "SFTTrainer",
    "TrainMetrics",
    "TrainerConfig",
    "UpdateMemory",
    "checkpoint_steps",
    "fail_job",
    "initialize_distributed",
    "leave_job",
    "set_resume_hint",
    "is_main_process",
    "latest_checkpoint_step",
    "local_share",
    "process_count",
    "process_index",
    "make_mesh",
    "param_sharding_fn",
    "read_checkpoint_meta",
    "sft_examples",
    "update_memory",
]
