"""`RLTrainer`: one optimizer update (or `ppo_epochs` of them) per batch of complete groups.

`step(groups)`:
1. flattens the groups' trajectories, cuts overlong ones to `max_seq_len`, and drops from
   training (counted in `invalid_sequences`) any whose reward is NaN/inf;
2. lays them out as bucketed (optionally packed) micro-batches;
3. if needed, scores them without gradient: proximal logprobs (`ppo_epochs > 1`), reference
   logprobs (`kl_coef > 0`), old values (`advantage='gae'`);
4. computes advantages with the `agentax.algos` estimator named in the config, on a
   one-sequence-per-row layout (so packing never mixes sequences in a scan or a group);
5. accumulates gradients over the micro-batches and applies the update, which is skipped
   (params unchanged, `skipped=True`, counted) if the loss or gradient norm is not finite.

`policy_version` counts applied updates; tokens' staleness is `policy_version - version`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from agentax.models import Transformer
from agentax.records import Group
from agentax.train._base import TrainerBase, _abstract, _copy, _delete, _fresh
from agentax.train._batch import HostSequence, MicroBatch
from agentax.train._config import TrainerConfig
from agentax.train._distributed import to_host
from agentax.train._sharding import DEFAULT_PARTITION_RULES
from agentax.train._step import GraphDefs, NonFiniteUpdateError, compute_advantages, score_tokens

__all__ = ["RLTrainer", "TrainMetrics"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainMetrics:
    """What one `RLTrainer.step` did (host floats; fetched once at the end of the step)."""

    step: int
    """Optimizer updates applied so far (after this step)."""
    policy_version: int
    """Version of the weights after this step (publish them under this number)."""
    skipped: bool
    """True when no update was applied (see skip_reason)."""
    skip_reason: str = ""
    """'non-finite loss or gradients' or 'no trained tokens' when skipped."""
    loss: float = 0.0
    pg_loss: float = 0.0
    grad_norm: float = 0.0
    learning_rate: float = 0.0
    clip_frac_low: float = 0.0
    clip_frac_high: float = 0.0
    entropy: float = 0.0
    kl: float = 0.0
    approx_kl: float = 0.0
    reward_mean: float = 0.0
    advantage_abs_mean: float = 0.0
    staleness_mean: float = 0.0
    """Mean of policy_version - token version over trained tokens (before this update)."""
    staleness_max: int = 0
    num_groups: int = 0
    num_sequences: int = 0
    num_tokens: int = 0
    """Trained (loss-mask) tokens."""
    num_positions: int = 0
    """Padded positions computed (rows x length over all micro-batches)."""
    num_micro_batches: int = 0
    invalid_sequences: int = 0
    """Trajectories left out of the loss because their reward was NaN/inf."""
    truncated_sequences: int = 0
    """Trajectories whose trained tokens reach beyond max_seq_len (those tokens are not
    trained; untrained tails, e.g. a final observation, are dropped without counting)."""
    num_compiles: int = 0
    step_time_s: float = 0.0
    extra: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Every loss metric from agentax.algos (is_weight_mean, ratio_max, vf_loss, ...)."""

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.num_tokens / self.num_positions if self.num_positions else 0.0


def _pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


class RLTrainer(TrainerBase):
    """Trains a policy from complete groups with an `agentax.algos` estimator and loss.

    Args:
      model: the initial policy; its parameters are copied (the caller's model stays valid).
      config: a `TrainerConfig`.
      ref_model: frozen reference for the KL term; default a snapshot of `model` (with LoRA:
        the base model). Only used when `config.kl_coef > 0`.
      mesh: a `make_mesh(...)` mesh; None = default device.
      partition_rules: (regex, PartitionSpec) pairs for parameters.
      initial_version: policy version of `model` (the version its tokens carry).
    """

    _kind = "rl"

    def __init__(self, model: Transformer, config: TrainerConfig | None = None, *,
                 ref_model: Transformer | None = None, mesh: Mesh | None = None,
                 partition_rules=DEFAULT_PARTITION_RULES, initial_version: int = 0):
        config = config or TrainerConfig()
        super().__init__(model, config, mesh=mesh, partition_rules=partition_rules,
                         value_head=config.uses_value_head)
        self.policy_version = int(initial_version)
        """Version of the current weights: initial_version + applied updates."""
        self._initial_version = int(initial_version)
        self._ref = None
        self._ref_is_snapshot = config.kl_coef > 0 and ref_model is None
        if config.kl_coef > 0:
            if ref_model is None:
                self._snapshot_reference()
            else:
                other = RLTrainer.__new__(RLTrainer)
                other.config = dataclasses.replace(config, kl_coef=0.0, kl_in_reward=False,
                                                   advantage="grpo")
                TrainerBase.__init__(other, ref_model, other.config, mesh=mesh,
                                     partition_rules=partition_rules)
                other._snapshot_reference()  # frozen: in the model's own dtype
                self._ref = other._ref
        self._knobs = tuple(sorted(dict(config.advantage_kwargs).items()))

    def _snapshot_reference(self) -> None:
        if self.config.lora is None:  # frozen: the model's own dtype (the forward casts anyway)
            leaves, treedef = jax.tree.flatten(self._params["model"])
            params = jax.tree.unflatten(treedef, [_fresh(x, d) for x, d in
                                                  zip(leaves, self._export_dtypes)])
        else:  # the adapters at the start (B = 0: the base model)
            params = _copy(self._params["model"])
        self._ref = (self._graphdefs.model, {"model": params}, self._rest)

    def _release_params(self, keep=frozenset()) -> None:
        super()._release_params(keep)
        if self._ref_is_snapshot and self._ref is not None:  # rebuilt by load_weights
            graphdef, params, _ = self._ref
            abstract = _abstract(params)
            _delete(params, keep)
            self._ref = (graphdef, abstract, self._rest)

    def load_weights(self, model: Transformer) -> None:
        super().load_weights(model)
        if self._ref_is_snapshot:  # the default reference is the starting policy
            self._snapshot_reference()

    def precompile(self, groups: Sequence[Group]) -> None:
        """Compiles the kernels `step(groups)` would run, without training or counting the
        groups: the shapes follow their sizes and lengths; their tokens and rewards only feed
        the scoring and advantage kernels, which run once. A trainer built and precompiled
        before its data arrives, or before its weights exist (`load_weights`), then starts
        without compiling (the CLI compiles its RL trainer's kernels while SFT trains). A
        released trainer (`release()`) compiles the scoring kernels without running them.
        With several processes, every process calls it with its share, as `step`."""
        groups = self._gather([groups] if isinstance(groups, Group) else groups)
        _, seqs, rewards, group_ids, finite, _ = self._sequences(groups)
        mbs = self._micro_batches(seqs, with_rl=True)
        batches = self._score_and_advantages(mbs, [self._put(mb.batch) for mb in mbs], rewards,
                                             group_ids, finite, len(seqs),
                                             compile_only=self.released)
        self._run_update(batches, self._put_counts(self._counts(mbs)), self.config,
                         compile_only=True)

    # ------------------------------------------------------------------ host side

    def _sequences(self, groups: Sequence[Group]):
        if isinstance(groups, Group):
            groups = [groups]
        groups = list(groups)
        if not groups:
            raise ValueError("RLTrainer.step got no groups; pass at least one Group")
        seqs, rewards, group_ids, truncated = [], [], [], 0
        for gi, g in enumerate(groups):
            if not isinstance(g, Group):
                raise TypeError(f"RLTrainer.step expects agentax.records.Group items, got "
                                f"{type(g).__name__} at index {gi}")
            for t in g.trajectories:
                (ids, mask, lp, ver), cut = self._cut(
                    np.asarray(t.token_ids, np.int32), np.asarray(t.loss_mask, np.float32),
                    np.asarray(t.logprobs, np.float32), np.asarray(t.versions, np.int32),
                    drop_tail=True)
                truncated += cut
                seqs.append(HostSequence(token_ids=ids, loss_mask=mask, logprobs=lp,
                                         versions=ver))
                rewards.append(t.reward)
                group_ids.append(gi)
        if not seqs:
            raise ValueError("the groups passed to RLTrainer.step hold no trajectories")
        rewards = np.asarray(rewards, np.float64)
        finite = np.isfinite(rewards)
        # A NaN/inf reward would poison its group's statistics: train nothing on that sample.
        seqs = [s if ok else dataclasses.replace(s, loss_mask=np.zeros_like(s.loss_mask))
                for s, ok in zip(seqs, finite)]
        return (groups, seqs, np.where(finite, rewards, 0.0).astype(np.float32),
                np.asarray(group_ids, np.int32), finite, truncated)

    @staticmethod
    def _to_rows(mbs: Sequence[MicroBatch], arrays: Sequence[np.ndarray], n: int, t: int):
        out = np.zeros((n, t), np.float32)
        for mb, arr in zip(mbs, arrays):
            sel = mb.sample_ids >= 0
            out[mb.sample_ids[sel], mb.token_index[sel]] = np.asarray(arr)[sel]
        return out

    @staticmethod
    def _from_rows(mb: MicroBatch, rows_nt: np.ndarray) -> np.ndarray:
        sel = mb.sample_ids >= 0
        out = rows_nt[np.maximum(mb.sample_ids, 0), mb.token_index]
        return np.where(sel, out, 0.0).astype(np.float32)

    # ------------------------------------------------------------------ step

    def step(self, groups: Sequence[Group]) -> TrainMetrics:
        """Trains on complete groups; returns what happened (see `TrainMetrics`).

        With several processes (`jax.distributed`), every process calls `step` with its own
        share of the groups (none is fine); the trainer gathers them, in process order, and
        takes one global step on all devices: the same result on every process.

        Raises:
          ValueError: no groups, or groups without trajectories.
          TypeError: an item is not a `Group`.
        """
        t0 = time.perf_counter()
        self._check_live("RLTrainer.step")
        groups = self._gather([groups] if isinstance(groups, Group) else groups)
        c = self.config
        groups, seqs, rewards, group_ids, finite, truncated = self._sequences(groups)
        self.data_position += len(groups)
        mbs = self._micro_batches(seqs, with_rl=True)
        counts = self._counts(mbs)
        base = dict(num_groups=len(groups), num_sequences=len(seqs),
                    invalid_sequences=int((~finite).sum()), truncated_sequences=truncated,
                    reward_mean=float(rewards[finite].mean()) if finite.any() else 0.0)
        if counts["tokens"] == 0:
            self.num_skipped_steps += 1
            return TrainMetrics(step=self.step_count, policy_version=self.policy_version,
                                skipped=True, skip_reason="no trained tokens",
                                num_compiles=self.num_compiles,
                                step_time_s=time.perf_counter() - t0, **base)
        versions = np.concatenate([mb.batch.versions[mb.batch.loss_mask > 0] for mb in mbs])
        staleness = self.policy_version - versions
        batches = [self._put(mb.batch) for mb in mbs]
        batches = self._score_and_advantages(mbs, batches, rewards, group_ids, finite, len(seqs))
        lr = self.learning_rate
        dev_counts = self._put_counts(counts)
        epochs = [self._run_update(batches, dev_counts, self.config) for _ in range(c.ppo_epochs)]
        epochs = to_host(epochs)  # the one host sync of the step
        applied = sum(bool(stats["applied"]) for _, stats in epochs)
        self.step_count += applied
        self.policy_version += applied
        skipped = applied == 0
        self.num_skipped_steps += int(skipped)
        if applied < len(epochs) and c.on_nonfinite == "stop":
            bad = next(stats for _, stats in epochs if not bool(stats["applied"]))
            raise NonFiniteUpdateError(
                f"RL step {self.step_count + 1}: loss {float(bad['loss']):.4g}, gradient norm "
                f"{float(bad['grad_norm']):.4g} — a NaN/inf loss, gradient or update; it was not "
                "applied. Lower trainer.learning_rate or check the rewards, or set "
                "trainer.on_nonfinite=skip to skip such steps")
        metrics = self._combine(epochs[0][0], float(counts["tokens"]))
        adv_abs = float(self._adv_abs_sum / counts["tokens"])
        extra = {k: v for k, v in metrics.items()}
        return TrainMetrics(
            step=self.step_count, policy_version=self.policy_version, skipped=skipped,
            skip_reason="non-finite loss or gradients" if skipped else "",
            loss=float(epochs[0][1]["loss"]), pg_loss=metrics.get("pg_loss", 0.0),
            grad_norm=float(epochs[0][1]["grad_norm"]), learning_rate=lr,
            clip_frac_low=metrics.get("clip_frac_low", metrics.get("seq_clip_frac", 0.0)),
            clip_frac_high=metrics.get("clip_frac_high", 0.0),
            entropy=metrics.get("entropy", 0.0), kl=metrics.get("kl", 0.0),
            approx_kl=metrics.get("approx_kl", 0.0), advantage_abs_mean=adv_abs,
            staleness_mean=float(staleness.mean()), staleness_max=int(staleness.max()),
            num_tokens=int(counts["tokens"]),
            num_positions=int(sum(mb.batch.input_ids.size for mb in mbs)),
            num_micro_batches=len(mbs), num_compiles=self.num_compiles,
            step_time_s=time.perf_counter() - t0, extra=extra, **base)

    def _score(self, graphdefs: GraphDefs, params, rest, batch, compile_only: bool):
        """score_tokens(...); with `compile_only`, compiles it and returns zeros of its shapes
        (the state may be abstract: a released trainer precompiling)."""
        if not compile_only:
            return score_tokens(graphdefs, params, rest, batch, opts=self._opts)
        score_tokens.lower(graphdefs, params, rest, batch, opts=self._opts).compile()
        zeros = self._put(np.zeros(batch.input_ids.shape, np.float32))
        return zeros, (zeros if graphdefs.value is not None and "value" in params else None)

    def _score_and_advantages(self, mbs, batches, rewards, group_ids, finite, n_seqs, *,
                              compile_only: bool = False):
        c = self.config
        prox, values, ref = [None] * len(mbs), [None] * len(mbs), [None] * len(mbs)
        if c.needs_proximal_pass or c.uses_value_head:
            for i, b in enumerate(batches):
                self._compiles.record("score_tokens", "policy", b)
                lp, v = self._score(self._graphdefs, self._params, self._rest, b, compile_only)
                prox[i] = lp if c.needs_proximal_pass else None
                values[i] = v
        if self._ref is not None:
            ref_gd, ref_params, ref_rest = self._ref
            for i, b in enumerate(batches):
                self._compiles.record("score_tokens", "reference", b)
                ref[i], _ = self._score(GraphDefs(model=ref_gd), ref_params, ref_rest, b,
                                        compile_only)
        # Advantages on a one-sequence-per-row layout [N, T], padded to buckets.
        n = _pow2(n_seqs)
        t = max(mb.batch.input_ids.shape[1] for mb in mbs)
        mask_nt = self._to_rows(mbs, [mb.batch.loss_mask for mb in mbs], n, t)
        valid = np.zeros(n, np.float32)
        valid[:n_seqs] = finite & (mask_nt[:n_seqs].sum(axis=1) > 0)
        rew = np.zeros(n, np.float32)
        rew[:n_seqs] = rewards
        gid = np.zeros(n, np.int32)
        gid[:n_seqs] = group_ids
        gid[n_seqs:] = np.arange(n_seqs, n)  # padding rows: their own (invalid) groups
        values_nt = beh_nt = ref_nt = None
        if c.uses_value_head:
            values_nt = self._to_rows(mbs, to_host(values), n, t)
        if c.kl_in_reward:
            beh_nt = self._to_rows(mbs, [mb.batch.behaviour_logprobs for mb in mbs], n, t)
            ref_nt = self._to_rows(mbs, to_host(ref), n, t)
        self._compiles.record("compute_advantages", (c.advantage, self._knobs), mask_nt,
                              values_nt, ref_nt)
        adv_nt, ret_nt, _ = compute_advantages(
            rew, mask_nt, gid, valid, values_nt, beh_nt, ref_nt, name=c.advantage,
            knobs=self._knobs, num_groups=n, kl_coef=c.kl_coef, kl_estimator=c.kl_estimator)
        adv_nt, ret_nt = jax.device_get((adv_nt, ret_nt))  # computed on this process's device
        out = []
        self._adv_abs_sum = 0.0  # |advantage| over the micro-batches' rows, read on the host
        for i, (mb, b) in enumerate(zip(mbs, batches)):
            extra = {"advantages": self._from_rows(mb, adv_nt)}
            self._adv_abs_sum += float(np.abs(extra["advantages"]).sum())
            if c.uses_value_head:
                extra["returns"] = self._from_rows(mb, ret_nt)
            extra = self._put(extra)
            out.append(b.replace(proximal_logprobs=prox[i], ref_logprobs=ref[i],
                                 old_values=values[i] if c.uses_value_head else None, **extra))
        return out

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_meta(self) -> dict:
        meta = super()._checkpoint_meta()
        meta["policy_version"] = self.policy_version
        meta["value_head"] = self.config.uses_value_head
        return meta

    def _load_checkpoint(self, state, meta: dict) -> None:
        super()._load_checkpoint(state, meta)
        self.policy_version = int(meta["policy_version"])
