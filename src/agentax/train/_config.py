"""`TrainerConfig` and `LoRAConfig`: every knob of the RL and SFT trainers, validated up front.

A knob that is set must change what the trainer does; combinations the trainer cannot honour
(packing with per-sequence losses, KL-in-reward with a group estimator, ...) are rejected here
with a message that says what to change, instead of being silently ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from agentax import algos
from agentax.config import ConfigError

__all__ = ["LoRAConfig", "TrainerConfig", "POLICY_LOSSES"]

POLICY_LOSSES = algos.POLICY_LOSSES
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """Low-rank adapters (Hu et al. 2021) on chosen linear projections; the base stays frozen."""

    rank: int = 8
    """Rank r of the adapter A [in, r] @ B [r, out] (B starts at zero: the model is unchanged)."""
    targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    """Regexes matched (re.search) against module paths like 'layers/3/attn/q_proj'."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError(f"LoRAConfig.rank must be >= 1, got {self.rank}")
        if not self.targets:
            raise ConfigError("LoRAConfig.targets is empty; name at least one projection, "
                              "e.g. ('q_proj', 'v_proj')")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """Optimizer, batch shapes and RL algorithm of `RLTrainer` / `SFTTrainer`."""

    # ------------------------------------------------------------------ optimizer
    learning_rate: float = 1e-5
    """Peak learning rate of AdamW."""
    warmup_steps: int = 0
    """Linear warmup from 0 to learning_rate over this many optimizer updates."""
    decay_steps: int = 0
    """Cosine decay from learning_rate to min_lr_ratio * learning_rate after warmup; 0 = constant."""
    min_lr_ratio: float = 0.1
    """Final learning rate of the cosine decay, as a fraction of learning_rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (applied to matrices only, not norms or biases)."""
    adam_b1: float = 0.9
    """AdamW beta1."""
    adam_b2: float = 0.999
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float | None = 1.0
    """Clip gradients to this global norm; None disables clipping."""

    # ------------------------------------------------------------------ shapes
    micro_batch_size: int = 8
    """Rows per micro-batch; gradients are accumulated over micro-batches into one update."""
    max_seq_len: int = 1024
    """Longest trained sequence (tokens - 1); longer trajectories are cut and counted."""
    min_seq_bucket: int = 64
    """Smallest padded length."""
    seq_bucket_multiple: int = 0
    """Pad lengths to multiples of this; 0 = powers of two (fewer shapes, more padding)."""
    pack: bool = False
    """Pack several sequences per row (segment ids) instead of one padded sequence per row."""
    pack_length: int = 512
    """Target row length when packing (rows are at least as long as the longest sequence)."""
    compute_dtype: Literal["float32", "bfloat16"] | None = None
    """Activation dtype of the train step; None = the model's config.dtype. The weights are
    cast to it inside the step (the master copy keeps `master_dtype`)."""
    master_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the trained (master) weights, the Adam moments and the gradient accumulator.
    'bfloat16' halves the state but rounds away most updates at RL learning rates (a warning
    says so); the engine always receives weights in its own dtype."""

    # ------------------------------------------------------------------ memory
    remat: Literal["auto", "none", "full", "save_dots"] = "auto"
    """Recomputation of each layer in the backward pass: 'full' keeps only each layer's input
    (least memory, ~1/3 more compute), 'save_dots' also keeps the matmul outputs, 'none'
    keeps every activation (fastest, most memory); 'auto' = 'none' when the layers' saved
    activations for the step's shapes are estimated under 2 GiB (small models, short rows),
    else 'full' (every real model at real lengths)."""
    scan_layers: bool | Literal["auto"] = "auto"
    """Run the layers as one `lax.scan` (compile time independent of depth); layers whose
    parameters differ in structure (LoRA on some layers only) fall back to a loop. 'auto'
    scans models of 5 layers or more (shallower ones run ~10 % faster unrolled on the CPU)."""
    attention: Literal["auto", "blocked", "dense", "cudnn"] = "auto"
    """Training attention: 'blocked' (pure JAX, O(T x block) memory, skips masked blocks),
    'cudnn' (jax.nn.dot_product_attention's fused kernel, GPU), 'dense' (the [T, T] reference),
    'auto' = cudnn on GPU where it applies, else blocked, or dense where one layer's scores
    are small (256 MiB on an accelerator; on CPU 16 MiB, or a sequence of two blocks)."""
    attention_block: int = 0
    """Query/key block size of the blocked attention; 0 picks it: 512 on an accelerator, on
    CPU twice the head dimension within [64, 512]."""
    logits_chunk: int = 1024
    """Positions per chunk of the LM head in the loss and scoring passes: hidden -> logits ->
    log-prob of the target runs a chunk at a time, only over loss positions, recomputed in the
    backward pass, so no [B, T, V] buffer exists; a small vocabulary takes more positions a
    chunk (at most as many logits as this many positions of a 128k vocabulary: a byte
    model's batch is one chunk). 0 = the full [B, T, V] logits (the reference)."""
    mesh: Mapping[str, int] | None = dataclasses.field(default=None, hash=False)
    """Device mesh of the trainer for `agentax train`: axis sizes {'data': d, 'fsdp': f,
    'tensor': t} (missing axes = 1; their product must not exceed the devices); None = one
    device."""

    # ------------------------------------------------------------------ RL algorithm
    advantage: str = "grpo"
    """Advantage estimator by registered name (agentax.algos.register_advantage): built-in grpo,
    dr_grpo, rloo, reinforce_pp, gae; a user's own after its module is imported (run.imports)."""
    advantage_kwargs: Mapping[str, float] = dataclasses.field(default_factory=dict, hash=False)
    """Knobs of the estimator (grpo: eps, std_ddof; reinforce_pp: gamma; gae: gamma, lam, whiten)."""
    policy_loss: str = "ppo"
    """Policy loss by registered name (agentax.algos.register_policy_loss): built-in 'ppo'
    (clipped surrogate, token level) or 'gspo' (sequence-level ratio); a user's own after its
    module is imported (run.imports)."""
    clip_eps_low: float = 0.2
    """Lower clip: ratio >= 1 - clip_eps_low (GSPO: use ~3e-4)."""
    clip_eps_high: float | None = None
    """Upper clip (DAPO clip-higher, e.g. 0.28); None = clip_eps_low (GSPO: ~4e-4)."""
    dual_clip_c: float | None = None
    """PPO dual-clip constant (> 1) for negative advantages; None disables."""
    off_policy: Literal["none", "tis", "decoupled"] = "none"
    """Correction for stale tokens using the behaviour logprobs stored in trajectories."""
    is_cap: float | None = None
    """TIS: truncation cap (default 2); decoupled: drop tokens whose weight exceeds it."""
    agg_mode: str = "token-mean"
    """Loss aggregation (agentax.algos.AGG_MODES)."""
    agg_norm: float | None = None
    """Constant normaliser of 'seq-mean-token-sum-norm' (default: padded length)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (entropy is always reported)."""
    kl_coef: float = 0.0
    """KL penalty to the frozen reference policy; 0 = no reference model pass."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 (squared) or k3."""
    kl_in_reward: bool = False
    """Put -kl_coef * KL into per-token rewards (reinforce_pp / gae) instead of the loss."""
    value_coef: float = 0.5
    """Weight of the value-head loss (used only by estimators registered with needs_values, e.g. gae)."""
    value_clip_eps: float | None = 0.2
    """PPO value clipping; None = plain squared error."""
    ppo_epochs: int = 1
    """Optimizer updates per batch of groups (> 1 recomputes proximal logprobs first)."""
    recompute_proximal: bool = False
    """Recompute proximal logprobs in a separate pass even when ppo_epochs == 1 (identical
    values to the in-step stop-gradient, costs one extra forward; for checking)."""
    lora: LoRAConfig | None = None
    """Train low-rank adapters instead of all weights."""
    seed: int = 0
    """Seed of the trainer RNG (value-head init, LoRA init)."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A step whose loss, gradient or update is NaN/inf is never applied. 'stop': raise
    `NonFiniteUpdateError` (the run ends before it can checkpoint or export anything after
    it). 'skip': count it (`skipped`) and go on with the next batch."""

    def __post_init__(self) -> None:
        err = ConfigError
        if self.learning_rate <= 0:
            raise err(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise err("warmup_steps and decay_steps must be >= 0")
        if self.micro_batch_size < 1:
            raise err(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.min_seq_bucket < 1 or self.max_seq_len < self.min_seq_bucket:
            raise err(f"need 1 <= min_seq_bucket ({self.min_seq_bucket}) <= max_seq_len "
                      f"({self.max_seq_len})")
        if self.seq_bucket_multiple < 0:
            raise err("seq_bucket_multiple must be >= 0 (0 = powers of two)")
        try:
            spec = algos.advantage_spec(self.advantage)
        except ValueError as e:
            raise err(str(e)) from None
        try:
            loss = algos.policy_loss_spec(self.policy_loss)
        except ValueError as e:
            raise err(str(e)) from None
        if self.agg_mode not in algos.AGG_MODES:
            raise err(f"unknown agg_mode {self.agg_mode!r}; choose one of {algos.AGG_MODES}")
        if self.kl_estimator not in algos.KL_KINDS:
            raise err(f"unknown kl_estimator {self.kl_estimator!r}; choose one of {algos.KL_KINDS}")
        if self.off_policy not in algos.OFF_POLICY_MODES:
            raise err(f"unknown off_policy {self.off_policy!r}; choose one of "
                      f"{algos.OFF_POLICY_MODES}")
        if not loss.off_policy and self.off_policy != "none":
            raise err(f"policy_loss={self.policy_loss!r} has no behaviour-policy correction; "
                      "set off_policy='none' or use policy_loss='ppo'")
        if self.pack and (self.agg_mode != "token-mean" or not loss.token_level):
            raise err("pack=True puts several sequences in one row, so per-row (sequence) "
                      "statistics would mix them: use agg_mode='token-mean' and a token-level "
                      "policy_loss such as 'ppo', or pack=False")
        if self.kl_in_reward and spec.group_based:
            raise err(f"kl_in_reward=True needs a token-level estimator ('reinforce_pp' or "
                      f"'gae'); {self.advantage!r} uses one reward per sequence: keep the KL "
                      "as a loss term (kl_in_reward=False)")
        if self.kl_in_reward and self.kl_coef <= 0:
            raise err("kl_in_reward=True needs kl_coef > 0")
        if self.ppo_epochs < 1:
            raise err(f"ppo_epochs must be >= 1, got {self.ppo_epochs}")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise err(f"dual_clip_c must be > 1, got {self.dual_clip_c}")
        if self.attention_block != 0 and self.attention_block < 16:
            raise err(f"attention_block must be 0 (automatic) or >= 16, got "
                      f"{self.attention_block}")
        if self.logits_chunk < 0:
            raise err(f"logits_chunk must be >= 0 (0 = full logits), got {self.logits_chunk}")
        if self.mesh is not None:
            bad = set(self.mesh) - {"data", "fsdp", "tensor"}
            if bad:
                raise err(f"trainer.mesh has unknown axes {sorted(bad)}; use data, fsdp, tensor")
            if any(int(v) < 1 for v in self.mesh.values()):
                raise err(f"trainer.mesh axis sizes must be >= 1, got {dict(self.mesh)}")

    @property
    def needs_proximal_pass(self) -> bool:
        """True when proximal logprobs come from a separate pass before the first update."""
        return self.ppo_epochs > 1 or self.recompute_proximal

    @property
    def uses_value_head(self) -> bool:
        """The estimator reads value predictions (`register_advantage(..., needs_values=True)`)."""
        return algos.advantage_spec(self.advantage).needs_values
