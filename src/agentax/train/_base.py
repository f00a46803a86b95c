"""State shared by `RLTrainer` and `SFTTrainer`: the split model, optimizer, mesh, counters.

The trainer owns a private copy of the model's parameters (the train step donates its buffers,
so the caller's model is never invalidated). Trainable parameters are all `nnx.Param`s, or
only the `nnx.LoRAParam`s when LoRA is on; everything else is frozen `rest`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

from agentax.models import Transformer
from agentax.train._batch import Batch, HostSequence, MicroBatch, build_micro_batches
from agentax.train._config import TrainerConfig
from agentax.train._lora import apply_lora, merge_lora
from agentax.train._optim import lr_schedule, make_optimizer, schedule_value
from agentax.train._sharding import (
    DEFAULT_PARTITION_RULES,
    batch_sharding,
    data_parallel_size,
    shard_params,
)
from agentax.train._step import (
    SUM_METRICS,
    CompileCounter,
    GraphDefs,
    StepOptions,
    accumulate_grads,
    apply_update,
    init_optimizer,
)

__all__ = ["TrainerBase", "ValueHead"]

log = logging.getLogger(__name__)


class ValueHead(nnx.Module):
    """PPO critic: a linear map from the policy's final hidden states to one value per token."""

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs):
        self.proj = nnx.Linear(hidden_size, 1, kernel_init=nnx.initializers.zeros_init(),
                               rngs=rngs)

    def __call__(self, hidden_btd: jax.Array) -> jax.Array:
        return self.proj(hidden_btd.astype(jnp.float32))[..., 0]  # [B, T]


def _copy(tree):
    return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


class TrainerBase:
    """Holds params / optimizer / mesh and runs accumulate + apply over micro-batches."""

    _kind = "base"

    def __init__(self, model: Transformer, config: TrainerConfig, *, mesh: Mesh | None = None,
                 partition_rules=DEFAULT_PARTITION_RULES, value_head: bool = False):
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be an agentax.models.Transformer, got {type(model)}")
        self.config = config
        self.mesh = mesh
        self.partition_rules = tuple(partition_rules)
        self.model_config = model.config
        rngs = nnx.Rngs(config.seed)
        self._rng = jax.random.key(config.seed)
        # Committed to one device without a mesh, like arrays restored from a checkpoint, so
        # that a resumed trainer hits the same compiled kernels as a fresh one.
        self._batch_sharding = (batch_sharding(mesh) if mesh is not None
                                else SingleDeviceSharding(jax.local_devices()[0]))
        graphdef, params, self._rest = self._split(model, rngs)
        tree = {"model": params}
        value_gd = None
        if value_head:
            value_gd, value_params = nnx.split(ValueHead(model.config.hidden_size, rngs=rngs))
            tree["value"] = self._place(value_params)
        self._graphdefs = GraphDefs(model=graphdef, value=value_gd)
        self._plain_graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(model.config)))[0]
        self._params = tree
        self._tx = make_optimizer(config)
        self._opts = StepOptions.from_config(config)
        # Explicit (committed) shardings everywhere: jit specialises on committed-ness. The
        # optimizer state's paths end in the parameter paths, so the same rules place it.
        self._opt_state, self._acc = self._place(init_optimizer(self._params, tx=self._tx))
        leaf_shardings = lambda t: tuple(x.sharding for x in jax.tree.leaves(t))  # noqa: E731
        self._acc_shardings = leaf_shardings(self._acc) if mesh is not None else None
        self._state_shardings = (leaf_shardings((self._params, self._opt_state, self._acc))
                                 if mesh is not None else None)
        self._replicated = (NamedSharding(mesh, P()) if mesh is not None
                            else self._batch_sharding)
        self._schedule_arg = jax.device_put(lr_schedule(config), self._replicated)
        self._row_multiple = data_parallel_size(mesh)
        self._compiles = CompileCounter()
        self.step_count = 0
        """Optimizer updates applied (skipped updates do not count)."""
        self.num_skipped_steps = 0
        """Steps whose update was skipped (non-finite loss/grads, or nothing to train)."""
        self._warned_cut = False  # trained tokens beyond max_seq_len are logged once
        self.data_position = 0
        """How many groups (RL) or examples (SFT) the trainer has consumed; checkpointed."""

    # ------------------------------------------------------------------ model copies

    def _place(self, tree):
        if self.mesh is not None:
            return shard_params(tree, self.mesh, self.partition_rules)
        return jax.device_put(tree, self._batch_sharding)

    def _split(self, model: Transformer, rngs: nnx.Rngs):
        """(graphdef, trainable params, frozen rest) of a private working copy of `model`,
        with LoRA adapters when on, placed on the trainer's devices."""
        work = self._working_copy(model)
        if self.config.lora is not None:
            apply_lora(work, self.config.lora, rngs=rngs)
        trainable = nnx.LoRAParam if self.config.lora is not None else nnx.Param
        graphdef, params, rest = nnx.split(work, trainable, ...)
        return graphdef, self._place(params), self._place(rest)

    def load_weights(self, model: Transformer) -> None:
        """Trains `model`'s weights from here on, keeping this trainer's compiled kernels,
        optimizer state and counters (a LoRA trainer gets fresh adapters over them): a trainer
        built and `precompile`d before its starting weights exist takes them this way (the CLI
        compiles its RL trainer's kernels while SFT trains). Call it before the first step.

        Raises:
          ValueError: `model` has another architecture than the trainer's.
        """
        if model.config != self.model_config:
            raise ValueError(f"load_weights needs the trainer's architecture {self.model_config}, "
                             f"got {model.config}")
        graphdef, params, self._rest = self._split(model, nnx.Rngs(self.config.seed))
        assert graphdef == self._graphdefs.model, "same config, same module structure"
        self._params = {**self._params, "model": params}

    def _working_copy(self, model: Transformer) -> Transformer:
        graphdef, state = nnx.split(model)
        state = _copy(state)
        dtype = self.config.compute_dtype
        if dtype is not None and dtype != model.config.dtype:
            cfg = dataclasses.replace(model.config, dtype=dtype)
            graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(cfg)))[0]
        return nnx.merge(graphdef, state)

    @property
    def model(self) -> Transformer:
        """The current policy as a module (with LoRA adapters when on), on fresh buffers."""
        return nnx.merge(self._graphdefs.model, _copy(self._params["model"]), _copy(self._rest))

    def params_for_engine(self, dtype=None) -> nnx.State:
        """Parameter state of a plain `Transformer(model_config)`: LoRA merged, fresh buffers.

        Safe to hand to an engine: the next train step does not invalidate it. `dtype` casts
        floating leaves (e.g. jnp.bfloat16 for serving). Merge it with the engine's graphdef:
        `nnx.merge(nnx.split(engine_model)[0], state)` or `nnx.update(engine_model, state)`.
        """
        full = nnx.merge_state(self._params["model"], self._rest) if self._rest else \
            self._params["model"]
        state = merge_lora(full) if self.config.lora is not None else _copy(full)
        if dtype is not None:
            state = jax.tree.map(
                lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
        return state

    def export_model(self) -> Transformer:
        """A plain `Transformer` (LoRA merged, original compute dtype) for export or eval."""
        return nnx.merge(self._plain_graphdef, self.params_for_engine())

    def export_pretrained(self, path, **kwargs) -> None:
        """Writes the current policy (LoRA merged) as a Hugging Face safetensors checkpoint.

        Calls `agentax.models.save_pretrained(model, path, **kwargs)`.
        """
        from agentax import models
        save = getattr(models, "save_pretrained", None)
        if save is None:
            raise NotImplementedError("agentax.models.save_pretrained is not available in this "
                                      "build; export params_for_engine() yourself")
        save(self.export_model(), path, **kwargs)

    @property
    def num_compiles(self) -> int:
        """Distinct compiled shapes of this trainer's jitted kernels so far."""
        return self._compiles.count

    @property
    def compiles_by_kernel(self) -> dict[str, int]:
        return self._compiles.by_kernel()

    @property
    def learning_rate(self) -> float:
        """Learning rate of the next update."""
        return float(schedule_value(self.step_count, lr_schedule(self.config)))

    def num_params(self, trainable_only: bool = True) -> int:
        tree = self._params if trainable_only else (self._params, self._rest)
        return int(sum(x.size for x in jax.tree.leaves(tree)))

    # ------------------------------------------------------------------ batches

    def _micro_batches(self, seqs: Sequence[HostSequence], *, with_rl: bool) -> list[MicroBatch]:
        c = self.config
        return build_micro_batches(
            seqs, micro_batch_size=max(c.micro_batch_size, self._row_multiple),
            max_seq_len=c.max_seq_len, min_seq_bucket=c.min_seq_bucket,
            seq_bucket_multiple=c.seq_bucket_multiple, pack=c.pack, pack_length=c.pack_length,
            row_multiple=self._row_multiple, with_rl=with_rl)

    def _put(self, tree):
        return jax.device_put(tree, self._batch_sharding)

    def _put_counts(self, counts) -> dict:
        return jax.device_put({k: np.float32(v) for k, v in counts.items()}, self._replicated)

    def _cut(self, ids, mask, *arrays, drop_tail: bool = False):
        """Cuts a sequence to max_seq_len + 1 tokens; returns (arrays, whether trained tokens
        were cut). Lost trained tokens are logged once per trainer, with the length that would
        have kept them. `drop_tail`: first drop the tokens after the last trained one (with
        causal attention they change no loss: an episode's final observation costs no
        positions)."""
        trained = np.flatnonzero(np.asarray(mask) > 0)
        last = int(trained[-1]) + 1 if trained.size else 0
        end = last if drop_tail and trained.size else ids.shape[0]
        limit = self.config.max_seq_len + 1
        cut = last > limit
        if cut and not self._warned_cut:
            self._warned_cut = True
            log.warning("a sequence has trained tokens up to position %d, beyond the trainer's "
                        "max_seq_len=%d: they are left out of the loss (counted in "
                        "truncated_sequences); raise max_seq_len to %d, or shorten the "
                        "sequences (collector.max_episode_tokens)", last - 1,
                        self.config.max_seq_len, last - 1)
        end = min(end, limit)
        return tuple(None if a is None else a[:end] for a in (ids, mask, *arrays)), cut

    # ------------------------------------------------------------------ update

    def _run_update(self, batches: Sequence[Batch], counts, rl: TrainerConfig | None, *,
                    compile_only: bool = False):
        """Accumulates over `batches` and applies one update; returns device results. With
        `compile_only`, compiles the same kernel calls (lowered ahead of time), runs nothing
        and returns None: a later call with the same shapes uses those kernels."""
        def call(kernel, *args, **kwargs):
            if not compile_only:
                return kernel(*args, **kwargs)
            kernel.lower(*args, **kwargs).compile()
            return None

        metrics = []
        for batch in batches:
            self._compiles.record("accumulate_grads", rl, batch)
            out = call(accumulate_grads, self._graphdefs, self._params, self._rest, batch, counts,
                       self._acc, rl=rl, opts=self._opts, acc_shardings=self._acc_shardings)
            if out is not None:
                self._acc, m = out
                metrics.append(m)
        self._compiles.record("apply_update", None)
        out = call(apply_update, self._params, self._opt_state, self._acc, counts["tokens"],
                   self._schedule_arg, tx=self._tx, state_shardings=self._state_shardings)
        if out is None:
            return None
        self._params, self._opt_state, self._acc, stats = out
        return metrics, stats

    @staticmethod
    def _combine(metrics: list[dict], total_tokens: float) -> dict[str, float]:
        """Micro-batch metrics (host) -> batch metrics: sums, maxima, token-weighted means."""
        out: dict[str, float] = {}
        keys = {k for m in metrics for k in m}
        for k in keys:
            vals = [(float(m[k]), float(m.get("num_tokens", 0.0))) for m in metrics if k in m]
            if k in SUM_METRICS:
                out[k] = sum(v for v, _ in vals)
            elif k.endswith("_max"):
                out[k] = max(v for v, _ in vals)
            else:
                w = sum(n for _, n in vals)
                out[k] = sum(v * n for v, n in vals) / w if w > 0 else 0.0
        return out

    @staticmethod
    def _counts(batches_host: Sequence[MicroBatch]) -> dict[str, np.float32]:
        tokens = sum(mb.num_trained_tokens for mb in batches_host)
        seqs = 0
        for mb in batches_host:
            sid = mb.sample_ids[mb.batch.loss_mask > 0]
            seqs += len(np.unique(sid))
        return {"tokens": np.float32(tokens), "seqs": np.float32(seqs)}

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_state(self):
        return {"params": self._params, "opt_state": self._opt_state,
                "rng": jax.random.key_data(self._rng)}

    def _checkpoint_meta(self) -> dict:
        from agentax.config import to_dict
        return {"kind": self._kind, "step_count": self.step_count,
                "num_skipped_steps": self.num_skipped_steps,
                "data_position": self.data_position,
                "model_config": to_dict(self.model_config),
                "lora": None if self.config.lora is None else to_dict(self.config.lora)}

    def _load_checkpoint(self, state, meta: dict) -> None:
        self._params, self._opt_state = state["params"], state["opt_state"]
        self._rng = jax.random.wrap_key_data(jnp.asarray(state["rng"]))
        self.step_count = int(meta["step_count"])
        self.num_skipped_steps = int(meta["num_skipped_steps"])
        self.data_position = int(meta["data_position"])

    def save_checkpoint(self, directory, step: int | None = None, *, run: dict | None = None):
        """Writes params, optimizer state, RNG and counters to `directory/step_<step>`.

        Returns the path written. `step` defaults to the number of applied updates. The
        directory appears only once complete (written under a temporary name, then renamed).
        `run`: a JSON-able record of the caller's position, stored as meta.json's "run".
        """
        from agentax.train._checkpoint import save_trainer_checkpoint
        return save_trainer_checkpoint(self, directory, self.step_count if step is None else step,
                                       run=run)

    def restore_checkpoint(self, directory, step: int | None = None) -> int:
        """Restores the latest (or the given) checkpoint under `directory`; returns its step.

        Raises:
          FileNotFoundError: no checkpoint there.
          ValueError: the checkpoint is from a different model / LoRA setup / trainer kind.
        """
        from agentax.train._checkpoint import restore_trainer_checkpoint
        return restore_trainer_checkpoint(self, directory, step)
