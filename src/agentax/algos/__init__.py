"""agentax.algos: advantage estimators and RL losses as pure, jittable JAX functions.

Arrays in, arrays out; no state, no I/O. Token-level arrays are [B, T] with `loss_mask_bt`
(1 on trained tokens), sequence-level [B], group-level [N, G]. Every loss returns
`(scalar_loss, metrics)` with metrics a dict of scalar arrays. Advantage estimators live in an
open registry (`register_advantage`), and so do policy losses (`register_policy_loss`). See docs/algorithms.md.
"""

from agentax.algos._advantages import (
    GROUP_ESTIMATORS,
    contiguous_group_ids,
    discounted_returns,
    dr_grpo_advantages,
    gae_advantages,
    group_advantages_flat,
    grpo_advantages,
    place_sequence_reward,
    reinforce_pp_advantages,
    rloo_advantages,
)
from agentax.algos._chunked import chunked_token_stats, full_token_stats
from agentax.algos._loss_registry import (
    POLICY_LOSSES,
    PolicyLossSpec,
    policy_loss_names,
    policy_loss_spec,
    register_policy_loss,
)
from agentax.algos._kl import KL_KINDS, kl_estimate, kl_in_reward, kl_loss
from agentax.algos._masked import AGG_MODES, aggregate_loss, masked_mean
from agentax.algos._policy import (
    OFF_POLICY_MODES,
    gspo_policy_loss,
    ppo_policy_loss,
    truncated_importance_weights,
)
from agentax.algos._registry import (
    ADVANTAGE_ESTIMATORS,
    AdvantageSpec,
    advantage_names,
    advantage_spec,
    get_advantage_estimator,
    register_advantage,
)
from agentax.algos._shaping import (
    check_finite_rewards,
    dynamic_sampling_keep_mask,
    overlong_penalty,
)
from agentax.algos._value import entropy_bonus, gather_logprobs, token_entropy, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "AdvantageSpec",
    "GROUP_ESTIMATORS",
    "KL_KINDS",
    "OFF_POLICY_MODES",
    "POLICY_LOSSES",
    "PolicyLossSpec",
    "advantage_names",
    "advantage_spec",
    "aggregate_loss",
    "check_finite_rewards",
    "chunked_token_stats",
    "contiguous_group_ids",
    "discounted_returns",
    "dr_grpo_advantages",
    "dynamic_sampling_keep_mask",
    "entropy_bonus",
    "full_token_stats",
    "gae_advantages",
    "gather_logprobs",
    "get_advantage_estimator",
    "group_advantages_flat",
    "grpo_advantages",
    "gspo_policy_loss",
    "kl_estimate",
    "kl_in_reward",
    "kl_loss",
    "masked_mean",
    "overlong_penalty",
    "place_sequence_reward",
    "policy_loss_names",
    "policy_loss_spec",
    "ppo_policy_loss",
    "register_advantage",
    "register_policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "token_entropy",
    "truncated_importance_weights",
    "value_loss",
]
