"""agentax.pipeline: rollout and training as overlapping stages with bounded staleness."""

from agentax.pipeline._accounting import Accounting, AccountingError
from agentax.pipeline._breaker import RunFailed
from agentax.pipeline._config import GROUP_FILTERS, PipelineConfig
from agentax.pipeline._placement import Placement
from agentax.pipeline._pipeline import (
    Pipeline,
    PipelineResult,
    StepRecord,
    drop_all_equal_rewards,
    group_staleness,
    split_roles,
)
from agentax.pipeline._staleness import STRAGGLER_FACTOR, StalenessGate, StragglerLimit

__all__ = [
    "Accounting",
    "AccountingError",
    "GROUP_FILTERS",
    "Pipeline",
    "PipelineConfig",
    "PipelineResult",
    "Placement",
    "RunFailed",
    "STRAGGLER_FACTOR",
    "StalenessGate",
    "StepRecord",
    "StragglerLimit",
    "drop_all_equal_rewards",
    "group_staleness",
    "split_roles",
]
