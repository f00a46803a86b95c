"""Jitted kernels of the trainers (module-level functions; the trainer classes only call them).

* `accumulate_grads` — loss and gradients of one micro-batch, added to a running sum.
* `apply_update` — one optimizer update from the summed gradients, skipped (params and
  optimizer state kept) when the loss, the gradient norm or the update is not finite, or no
  token trained; the trainer then stops or skips (`TrainerConfig.on_nonfinite`).
* `score_tokens` — logprobs of the targets (and value-head outputs) without gradients: the
  proximal policy before an update, or the frozen reference policy.
* `compute_advantages` — an `agentax.algos` advantage estimator by name, on the
  one-sequence-per-row layout.

Losses are normalised by counts over the whole optimizer batch (`global_count`), so the sum
of micro-batch gradients equals the gradient of the full-batch loss.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentax import algos
from agentax.train._batch import Batch
from agentax.train._config import TrainerConfig
from agentax.train._optim import schedule_count, schedule_value

__all__ = ["GraphDefs", "StepOptions", "CompileCounter", "NonFiniteUpdateError", "accumulate_grads",
           "apply_update", "score_tokens", "compute_advantages", "init_optimizer", "SUM_METRICS"]


class NonFiniteUpdateError(FloatingPointError):
    """A step's loss, gradient or update was NaN/inf (`TrainerConfig.on_nonfinite='stop'`).

    The update was not applied: the trainer still holds the weights of the last good step.
    """

# Metrics that are already normalised by the whole-batch count: micro-batch values add up.
SUM_METRICS = frozenset({"loss", "pg_loss", "kl", "vf_loss", "entropy", "nll", "num_tokens",
                         "num_seqs", "correct"})


class GraphDefs(NamedTuple):
    """Static structure of the trained modules (hashable; a static jit argument)."""

    model: Any
    value: Any = None


class StepOptions(NamedTuple):
    """How the train and scoring kernels run the model (a static jit argument): the memory
    knobs of `TrainerConfig` (see there), shared by the RL and the SFT loss."""

    remat: str = "auto"
    scan_layers: bool | str = "auto"
    attention: str = "auto"
    attention_block: int = 0
    logits_chunk: int = 1024
    activation_sharding: Any = None
    """Sharding of the [B, T, D] activations under a mesh (rows over data and fsdp): pinned
    at each layer, so XLA gathers each layer's fsdp-sharded weights instead of resharding
    the activations over their feature dimension and replicating the rows."""

    @classmethod
    def from_config(cls, config: TrainerConfig, mesh=None,
                    vocab_size: int | None = None) -> "StepOptions":
        """The options of `config`, with rows pinned to `mesh`; with `vocab_size`, a chunk of
        the LM head holds `logits_chunk` positions or more for a small vocabulary: at most as
        many logits as logits_chunk positions of a 128k one (a byte model's whole batch is
        one chunk, with no loop to pay for)."""
        chunk = config.logits_chunk
        if vocab_size:
            chunk = max(chunk, chunk * (1 << 17) // vocab_size)
        rows = None
        if mesh is not None:
            from jax.sharding import NamedSharding, PartitionSpec
            rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None, None))
        return cls(remat=config.remat, scan_layers=config.scan_layers,
                   attention=config.attention, attention_block=config.attention_block,
                   logits_chunk=chunk, activation_sharding=rows)


class CompileCounter:
    """Counts the distinct (kernel, static args, argument shapes) a trainer has dispatched.

    Each distinct key is one XLA compilation of that kernel (jit caches by exactly these).
    """

    def __init__(self) -> None:
        self.keys: set = set()

    def record(self, name: str, static: Any, *trees) -> None:
        leaves, treedef = jax.tree.flatten(trees)
        sig = tuple((tuple(x.shape), str(x.dtype)) for x in leaves)
        self.keys.add((name, static, str(treedef), sig))

    @property
    def count(self) -> int:
        return len(self.keys)

    def by_kernel(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.keys:
            out[k[0]] = out.get(k[0], 0) + 1
        return out


def _constrain(tree, shardings: tuple | None):
    """Pins each leaf of `tree` to its sharding (flattened order); None = leave to XLA."""
    if shardings is None:
        return tree
    leaves, treedef = jax.tree.flatten(tree)
    return jax.tree.unflatten(treedef, [jax.lax.with_sharding_constraint(x, s)
                                        for x, s in zip(leaves, shardings)])


def _forward(graphdefs: GraphDefs, params, rest, batch: Batch, opts: StepOptions, *,
             entropy: bool = False, entropy_grad: bool = True, correct: bool = False):
    """(per-token stats {"logp", ["entropy"], ["correct"]} each [B, T], values [B, T] or None).

    With `opts.logits_chunk` > 0 the LM head runs chunk by chunk over loss positions only
    (`algos.chunked_token_stats`; stats are 0 where loss_mask == 0, which every reader
    masks); 0 computes the full float32 logits [B, T, V] (the reference).
    """
    model = nnx.merge(graphdefs.model, params["model"], rest)
    hidden = model.hidden(batch.input_ids, batch.positions, batch.segment_ids,
                          remat=opts.remat, scan=opts.scan_layers, attention=opts.attention,
                          attention_block=opts.attention_block,
                          activation_sharding=opts.activation_sharding)  # [B, T, D]
    flags = dict(entropy=entropy, entropy_grad=entropy_grad, correct=correct)
    if opts.logits_chunk > 0:
        stats = algos.chunked_token_stats(hidden, batch.target_ids, batch.loss_mask,
                                          model.head(hidden.dtype), chunk=opts.logits_chunk,
                                          **flags)
    else:
        stats = algos.full_token_stats(hidden, batch.target_ids, batch.loss_mask,
                                       model.logits, **flags)
    values = None
    if graphdefs.value is not None and "value" in params:
        head = nnx.merge(graphdefs.value, params["value"])
        values = head(hidden)
    return stats, values


def _loss(params, rest, graphdefs: GraphDefs, batch: Batch, counts, rl: TrainerConfig | None,
          opts: StepOptions):
    if rl is None:  # SFT
        stats, values = _forward(graphdefs, params, rest, batch, opts, correct=True)
    else:  # the entropy is a loss term only with a coefficient, else a metric
        stats, values = _forward(graphdefs, params, rest, batch, opts, entropy=True,
                                 entropy_grad=rl.entropy_coef > 0)
    logp = stats["logp"]  # [B, T]
    mask = batch.loss_mask
    num_tokens = jnp.sum(mask)
    if rl is None:  # SFT: next-token negative log-likelihood
        loss = algos.aggregate_loss(-logp, mask, mode="token-mean", global_count=counts["tokens"])
        correct = jnp.sum(jnp.where(mask > 0, stats["correct"], False))
        return loss, {"loss": loss, "nll": loss, "correct": correct.astype(jnp.float32),
                      "num_tokens": num_tokens}
    count = counts["tokens"] if rl.agg_mode == "token-mean" else counts["seqs"]
    agg = dict(agg_mode=rl.agg_mode, agg_norm=rl.agg_norm, global_count=count)
    if batch.proximal_logprobs is not None:
        proximal = batch.proximal_logprobs
    else:  # one update per batch: the proximal policy is the current one, before the update
        proximal = jax.lax.stop_gradient(logp)
    common = dict(logp_bt=logp, proximal_logp_bt=proximal, advantages_bt=batch.advantages,
                  loss_mask_bt=mask, clip_eps_low=rl.clip_eps_low, **agg)
    loss, metrics = algos.policy_loss_spec(rl.policy_loss).fn(
        **common, behaviour_logp_bt=batch.behaviour_logprobs, clip_eps_high=rl.clip_eps_high,
        dual_clip_c=rl.dual_clip_c, off_policy=rl.off_policy, is_cap=rl.is_cap)
    metrics = dict(metrics)
    if rl.entropy_coef > 0:
        ent_loss, ent = algos.entropy_bonus(entropy_bt=stats["entropy"], loss_mask_bt=mask,
                                            coef=rl.entropy_coef, **agg)
        loss = loss + ent_loss
        metrics.update(ent)
    else:  # stats["entropy"] carries no gradient here
        metrics["entropy"] = algos.aggregate_loss(stats["entropy"], mask, mode=rl.agg_mode,
                                                  norm=rl.agg_norm, global_count=count)
    if rl.kl_coef > 0 and not rl.kl_in_reward and batch.ref_logprobs is not None:
        kl, kl_metrics = algos.kl_loss(logp_bt=logp, ref_logp_bt=batch.ref_logprobs,
                                       loss_mask_bt=mask, kind=rl.kl_estimator, **agg)
        loss = loss + rl.kl_coef * kl
        metrics.update(kl_metrics)
    if values is not None:  # a value head exists only for advantage='gae'
        vf, vf_metrics = algos.value_loss(values_bt=values, old_values_bt=batch.old_values,
                                          returns_bt=batch.returns, loss_mask_bt=mask,
                                          clip_eps=rl.value_clip_eps, **agg)
        loss = loss + rl.value_coef * vf
        metrics.update(vf_metrics)
    metrics["loss"] = loss
    metrics["num_tokens"] = num_tokens
    return loss, metrics


@functools.partial(jax.jit, static_argnames=("graphdefs", "rl", "opts", "acc_shardings"),
                   donate_argnames=("acc",))
def accumulate_grads(graphdefs: GraphDefs, params, rest, batch: Batch, counts, acc, *,
                     rl: TrainerConfig | None, opts: StepOptions = StepOptions(),
                     acc_shardings: tuple | None = None):
    """Adds one micro-batch's gradients and loss to `acc` = {"grads", "loss"}.

    Args:
      params: trainable state {"model": ..., ["value": ...]}; rest: frozen model state.
      rl: the trainer's config, whose RL fields choose the loss; None = the SFT loss.
      batch: the micro-batch on device.
      counts: {"tokens", "seqs"} float32 scalars over the whole optimizer batch.
      opts: how the model runs (remat, scan, attention, LM-head chunks).
      acc_shardings: shardings of acc's leaves (flattened), kept on the output under a mesh.
    Returns:
      (new acc, this micro-batch's metrics dict of scalars).
    """
    (loss, metrics), grads = jax.value_and_grad(_loss, has_aux=True)(
        params, rest, graphdefs, batch, counts, rl, opts)
    new = {"grads": jax.tree.map(jnp.add, acc["grads"], grads), "loss": acc["loss"] + loss}
    return _constrain(new, acc_shardings), metrics


@functools.partial(jax.jit, static_argnames=("tx", "state_shardings"),
                   donate_argnames=("params", "opt_state", "acc"))
def apply_update(params, opt_state, acc, num_tokens, schedule, *,
                 tx: optax.GradientTransformation, state_shardings: tuple | None = None):
    """One optimizer update; skipped when loss/grads/update are not finite or nothing trained.

    `tx` is the learning-rate-free transformation of `make_optimizer`; the step is scaled by
    `schedule_value(count, schedule)` here, so the schedule (`lr_schedule(config)`, a float32
    [4] array) is data, not part of the compiled kernel.

    Returns:
      (params, opt_state, zeroed acc for the next step, {"grad_norm", "applied", "loss"}).
    """
    grads = acc["grads"]
    grad_norm = optax.global_norm(grads)
    ok = jnp.isfinite(acc["loss"]) & jnp.isfinite(grad_norm) & (num_tokens > 0)
    safe_grads = jax.tree.map(lambda g: jnp.where(ok, g, 0.0), grads)
    lr = schedule_value(schedule_count(opt_state), schedule, xp=jnp)
    updates, new_opt = tx.update(safe_grads, opt_state, params)
    updates = jax.tree.map(lambda u: lr.astype(u.dtype) * u, updates)  # as optax scales
    # A finite gradient can still give a non-finite update (a NaN learning rate or epsilon).
    ok = ok & jnp.isfinite(optax.global_norm(updates))
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
    params = jax.tree.map(keep, new_params, params)
    opt_state = jax.tree.map(keep, new_opt, opt_state)
    zero = {"grads": jax.tree.map(jnp.zeros_like, grads), "loss": jnp.zeros((), jnp.float32)}
    params, opt_state, zero = _constrain((params, opt_state, zero), state_shardings)
    return params, opt_state, zero, {"grad_norm": grad_norm, "applied": ok, "loss": acc["loss"]}


@functools.partial(jax.jit, static_argnames=("tx",))
def init_optimizer(params, *, tx: optax.GradientTransformation):
    """(optimizer state, zeroed gradient accumulator) for `params`."""
    acc = {"grads": jax.tree.map(jnp.zeros_like, params), "loss": jnp.zeros((), jnp.float32)}
    return tx.init(params), acc


@functools.partial(jax.jit, static_argnames=("graphdefs", "opts"))
def score_tokens(graphdefs: GraphDefs, params, rest, batch: Batch, *,
                 opts: StepOptions = StepOptions()):
    """(target logprobs [B, T], values [B, T] or None) without gradient.

    With `opts.logits_chunk` > 0 the logprobs are 0 where `batch.loss_mask` is 0: the
    proximal and reference logprobs are read only at loss positions (policy losses, KL).
    """
    stats, values = _forward(graphdefs, params, rest, batch, opts)
    return stats["logp"], values


@functools.partial(jax.jit, static_argnames=("name", "knobs", "num_groups", "kl_coef",
                                             "kl_estimator"))
def compute_advantages(rewards_n, loss_mask_nt, group_ids_n, valid_n, values_nt=None,
                       behaviour_logp_nt=None, ref_logp_nt=None, *, name: str,
                       knobs: tuple = (), num_groups: int, kl_coef: float = 0.0,
                       kl_estimator: str = "k1"):
    """Advantages and returns [N, T] (one sequence per row) with estimator `name`.

    With `ref_logp_nt`, -kl_coef * KL(behaviour || ref) is added to per-token rewards first
    (`algos.kl_in_reward`); the metrics dict then holds its mean.
    """
    token_rewards, metrics = None, {}
    if ref_logp_nt is not None:
        token_rewards, metrics = algos.kl_in_reward(
            token_rewards_bt=jnp.zeros_like(loss_mask_nt), logp_bt=behaviour_logp_nt,
            ref_logp_bt=ref_logp_nt, loss_mask_bt=loss_mask_nt, beta=kl_coef, kind=kl_estimator)
    estimator = algos.get_advantage_estimator(name)
    adv, ret = estimator(rewards_b=rewards_n, loss_mask_bt=loss_mask_nt, group_ids_b=group_ids_n,
                         valid_b=valid_n, values_bt=values_nt, token_rewards_bt=token_rewards,
                         num_groups=num_groups, **dict(knobs))
    return adv, ret, metrics
