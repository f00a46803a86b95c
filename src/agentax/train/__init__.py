"""agentax.train: the jitted trainer — RL and SFT steps, LoRA, sharding, checkpoints.

Feed `RLTrainer.step(groups)` complete `records.Group`s; publish `params_for_engine()` under
`policy_version`. See docs/training.md.
"""

from agentax.train._checkpoint import latest_checkpoint_step
from agentax.train._config import LoRAConfig, TrainerConfig
from agentax.train._rl import RLTrainer, TrainMetrics
from agentax.train._sft import SFTMetrics, SFTTrainer, sft_examples
from agentax.train._sharding import DEFAULT_PARTITION_RULES, make_mesh

__all__ = [
    "DEFAULT_PARTITION_RULES",
    "LoRAConfig",
    "RLTrainer",
    "SFTMetrics",
    "SFTTrainer",
    "TrainMetrics",
    "TrainerConfig",
    "latest_checkpoint_step",
    "make_mesh",
    "sft_examples",
]
