"""agentax.train: the jitted trainer — batches, RL and SFT steps, LoRA, sharding, checkpoints.

Feed `RLTrainer.step(groups)` complete `records.Group`s; publish `params_for_engine()` under
`policy_version`. See docs/training.md.
"""

from agentax.train._batch import Batch, HostSequence, MicroBatch, build_micro_batches, row_bucket, seq_bucket
from agentax.train._checkpoint import (
    DamagedCheckpointError,
    checkpoint_steps,
    latest_checkpoint_step,
    read_checkpoint_meta,
)
from agentax.train._config import POLICY_LOSSES, LoRAConfig, TrainerConfig
from agentax.train._lora import apply_lora, lora_paths, merge_lora
from agentax.train._optim import make_optimizer, make_schedule
from agentax.train._rl import RLTrainer, TrainMetrics
from agentax.train._sft import SFTMetrics, SFTTrainer, sft_examples
from agentax.train._step import NonFiniteUpdateError
from agentax.train._sharding import (
    DEFAULT_PARTITION_RULES,
    batch_sharding,
    data_parallel_size,
    make_mesh,
    param_shardings,
    partition_spec_for,
    shard_params,
)
from agentax.train._base import ValueHead

__all__ = [
    "Batch",
    "DamagedCheckpointError",
    "DEFAULT_PARTITION_RULES",
    "HostSequence",
    "LoRAConfig",
    "MicroBatch",
    "NonFiniteUpdateError",
    "POLICY_LOSSES",
    "RLTrainer",
    "SFTMetrics",
    "SFTTrainer",
    "TrainMetrics",
    "TrainerConfig",
    "ValueHead",
    "apply_lora",
    "batch_sharding",
    "build_micro_batches",
    "checkpoint_steps",
    "data_parallel_size",
    "latest_checkpoint_step",
    "lora_paths",
    "make_mesh",
    "make_optimizer",
    "make_schedule",
    "merge_lora",
    "param_shardings",
    "partition_spec_for",
    "read_checkpoint_meta",
    "row_bucket",
    "seq_bucket",
    "sft_examples",
    "shard_params",
]
