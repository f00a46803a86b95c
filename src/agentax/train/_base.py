"""State shared by `RLTrainer` and `SFTTrainer`: the split model, optimizer, mesh, counters.

The trainer owns a private copy of the model's trainable parameters (the train step donates
its buffers, so the caller's model is never invalidated). Trainable parameters are all
`nnx.Param`s, or only the `nnx.LoRAParam`s when LoRA is on; everything else is frozen `rest`.

Mixed precision: the trainable copy (the master weights), the Adam moments and the gradient
accumulator are held in `TrainerConfig.master_dtype` (float32 by default) whatever the model's
dtype; the forward casts weights to the compute dtype at use (the model's `config.dtype`, or
`compute_dtype`). The frozen rest keeps the model's dtype, and what leaves the trainer
(`params_for_engine`, `export_model`) is in the model's own dtype again.
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
from agentax.train._distributed import (gather_objects, is_multiprocess, put_global, sync,
                                        to_host)
from agentax.train._lora import apply_lora, merge_lora
from agentax.train._optim import lr_schedule, make_optimizer, schedule_value
from agentax.train._sharding import (
    DEFAULT_PARTITION_RULES,
    batch_sharding,
    data_parallel_size,
    param_shardings,
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


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def _fresh(x, dtype, *, take: bool = False):
    """`x` in `dtype` (floating leaves only) in a buffer of its own; with `take`, `x` itself
    when it already has that dtype (the caller hands its buffer over)."""
    if _is_float(x) and x.dtype != dtype:
        return x.astype(dtype)  # the cast allocates: no copy first
    return x if take else jnp.array(x, copy=True)


def _abstract(tree):
    """Shapes, dtypes and shardings of `tree` (what lowering a kernel needs, no buffers)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


def _localize(tree):
    """With several processes: each leaf that spans processes whole on this process's first
    device, gathered one tensor at a time (what a process-local engine or exporter takes);
    `tree` itself in a single process. A collective: every process calls it."""
    if not is_multiprocess():
        return tree
    sync("localize")
    device = jax.local_devices()[0]

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(to_host(x), device)
        return x
    return jax.tree.map(one, tree)


def _delete(tree, keep=frozenset()) -> None:
    """Frees the device buffers of `tree`'s arrays (except those whose id is in `keep`)."""
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array) and id(x) not in keep and not x.is_deleted():
            x.delete()


_warned_bf16_master = False


def _warn_bf16_master() -> None:
    global _warned_bf16_master
    if _warned_bf16_master:
        return
    _warned_bf16_master = True
    log.warning("trainer.master_dtype='bfloat16': the trained weights, Adam moments and "
                "gradient accumulator are bfloat16 (8 mantissa bits), so every update smaller "
                "than ~0.4% of its weight rounds away; at RL learning rates (1e-6) most "
                "updates vanish silently. Set trainer.master_dtype: float32 (the default) to "
                "keep float32 master weights (the forward still computes in bfloat16)")


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
        self._master_dtype = jnp.dtype(config.master_dtype)
        if config.master_dtype == "bfloat16":
            _warn_bf16_master()
        graphdef, params, self._rest, self._export_dtypes = self._split(model, rngs)
        tree = {"model": params}
        value_gd = None
        if value_head:
            value_gd, value_params = nnx.split(ValueHead(model.config.hidden_size, rngs=rngs))
            tree["value"] = self._own(value_params)
        self._graphdefs = GraphDefs(model=graphdef, value=value_gd)
        self._plain_graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(model.config)))[0]
        self._params = tree
        self._tx = make_optimizer(config)
        self._opts = StepOptions.from_config(config, mesh, model.config.vocab_size)
        # Explicit (committed) shardings everywhere: jit specialises on committed-ness. The
        # optimizer state's paths end in the parameter paths, so the same rules place it.
        self._opt_state, self._acc = self._place(init_optimizer(self._params, tx=self._tx))
        leaf_shardings = lambda t: tuple(x.sharding for x in jax.tree.leaves(t))  # noqa: E731
        self._acc_shardings = leaf_shardings(self._acc) if mesh is not None else None
        self._state_shardings = (leaf_shardings((self._params, self._opt_state, self._acc))
                                 if mesh is not None else None)
        self._replicated = (NamedSharding(mesh, P()) if mesh is not None
                            else self._batch_sharding)
        self._schedule_arg = put_global(lr_schedule(config), self._replicated)
        self._row_multiple = data_parallel_size(mesh)
        self.released = False
        """True after `release()` (or `export_model(release=True)`) until `load_weights`."""
        self._compiles = CompileCounter()
        self.step_count = 0
        """Optimizer updates applied (skipped updates do not count)."""
        self.num_skipped_steps = 0
        """Steps whose update was skipped (non-finite loss/grads, or nothing to train)."""
        self._warned_cut = False  # trained tokens beyond max_seq_len are logged once
        self.data_position = 0
        """How many groups (RL) or examples (SFT) the trainer has consumed; checkpointed."""

    # ------------------------------------------------------------------ model copies

    def _shardings(self, tree):
        if self.mesh is not None:
            return param_shardings(tree, self.mesh, self.partition_rules)
        return jax.tree.map(lambda _: self._batch_sharding, tree)

    def _place(self, tree):
        """`tree` on the trainer's shardings (its arrays themselves where already there)."""
        return jax.tree.map(put_global, tree, self._shardings(tree))

    def _own(self, tree):
        """A copy of `tree` that only this trainer holds (the train step donates it), on the
        trainer's shardings, floating leaves in the master dtype. Each leaf goes straight to
        its sharding and is cast there: no whole-model copy is staged on one device."""
        dtype = self._master_dtype

        def one(x, sharding):
            placed = put_global(x, sharding)  # may share buffers with x (even resharded)
            if _is_float(x) and x.dtype != dtype:
                return placed.astype(dtype)
            return jnp.array(placed, copy=True)
        return jax.tree.map(one, tree, self._shardings(tree))

    def _split(self, model: Transformer, rngs: nnx.Rngs):
        """(graphdef computing in the compute dtype, trainable master params, frozen rest,
        the model's dtypes of the trainable leaves) of `model`, with LoRA adapters when on.

        The trainable leaves are copied (onto the trainer's shardings, in the master dtype);
        the frozen rest keeps the model's dtype and is shared with `model` where it already
        sits on the right devices (nothing donates it)."""
        work = self._working_copy(model)
        if self.config.lora is not None:
            apply_lora(work, self.config.lora, rngs=rngs)
        trainable = nnx.LoRAParam if self.config.lora is not None else nnx.Param
        graphdef, params, rest = nnx.split(work, trainable, ...)
        dtypes = tuple(x.dtype for x in jax.tree.leaves(params))
        return graphdef, self._own(params), self._place(rest), dtypes

    def load_weights(self, model: Transformer) -> None:
        """Trains `model`'s weights from here on, keeping this trainer's compiled kernels,
        optimizer state and counters (a LoRA trainer gets fresh adapters over them): a trainer
        built and `precompile`d before its starting weights exist takes them this way (the CLI
        compiles its RL trainer's kernels while SFT trains). Call it before the first step. A
        released trainer (`release()`) gets a fresh optimizer state and accumulator.

        Raises:
          ValueError: `model` has another architecture than the trainer's.
        """
        if model.config != self.model_config:
            raise ValueError(f"load_weights needs the trainer's architecture {self.model_config}, "
                             f"got {model.config}")
        if not self.released:  # the old weights go before the new ones arrive
            _delete(self._params["model"])
        graphdef, params, self._rest, self._export_dtypes = self._split(
            model, nnx.Rngs(self.config.seed))
        assert graphdef == self._graphdefs.model, "same config, same module structure"
        if self.released:
            value = self._params.get("value")
            self._params = {"model": params}
            if value is not None:  # a fresh (zero) head, as a new trainer gets
                self._params["value"] = self._own(nnx.split(ValueHead(
                    self.model_config.hidden_size, rngs=nnx.Rngs(self.config.seed)))[1])
            self._opt_state, self._acc = self._place(init_optimizer(self._params, tx=self._tx))
            self.released = False
        else:
            self._params = {**self._params, "model": params}

    def release(self) -> None:
        """Frees this trainer's device state: master weights, optimizer state and gradient
        accumulator are deleted, the frozen rest dropped (it may be shared with the model it
        came from). Shapes and shardings stay: `precompile` still compiles the step's kernels,
        and `load_weights(model)` makes the trainer usable again (the CLI frees its SFT
        trainer this way once the RL trainer has its weights, and its RL trainer while SFT
        trains, so that one trainer state exists at a time)."""
        if self.released:
            return
        self._release_optimizer()
        self._release_params()

    def _release_optimizer(self) -> None:
        abstract = _abstract((self._opt_state, self._acc))
        _delete((self._opt_state, self._acc))
        self._opt_state, self._acc = abstract
        self.released = True

    def _release_params(self, keep=frozenset()) -> None:
        abstract = _abstract((self._params, self._rest))
        _delete(self._params, keep)
        self._params, self._rest = abstract
        self.released = True

    def _check_live(self, what: str) -> None:
        if self.released:
            raise RuntimeError(f"{what}: this trainer was released (release() / "
                               "export_model(release=True)); give it weights with "
                               "load_weights(model) first")

    def _working_copy(self, model: Transformer) -> Transformer:
        """`model`'s state (not copied) under a graphdef that computes in the compute dtype."""
        graphdef, state = nnx.split(model)
        dtype = self.config.compute_dtype
        if dtype is not None and dtype != model.config.dtype:
            cfg = dataclasses.replace(model.config, dtype=dtype)
            graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(cfg)))[0]
        return nnx.merge(graphdef, state)

    @property
    def model(self) -> Transformer:
        """The current policy as a module (with LoRA adapters when on), on fresh buffers."""
        return nnx.merge(self._graphdefs.model, _copy(self._params["model"]), _copy(self._rest))

    def params_for_engine(self, dtype=None, *, live: bool = False) -> nnx.State:
        """Parameter state of a plain `Transformer(model_config)`: LoRA merged (in float32,
        rounded once), in the model's own dtype (the master copy may be float32).

        Safe to hand to an engine: the next train step does not invalidate it (trained leaves
        are fresh buffers; frozen leaves, e.g. a LoRA base, are shared with the trainer, which
        never donates them). `dtype` casts floating leaves instead (e.g. jnp.float32 to read
        the master weights unrounded). Merge it with the engine's graphdef:
        `nnx.merge(nnx.split(engine_model)[0], state)` or `nnx.update(engine_model, state)`.
        With several processes (a collective: every process calls it), each process gets the
        whole state on its first local device, for its own engine (gathered per tensor).

        `live=True` returns the trainer's own arrays instead (no copy, no cast: a float32
        master stays float32; LoRA is still merged into new arrays), valid only until the
        next train step donates them: for a consumer that copies them at once, as
        `Engine.update_weights(state, version, in_place=True)` does.
        """
        self._check_live("params_for_engine")
        if live and self.config.lora is None and not is_multiprocess():
            return nnx.merge_state(self._params["model"], self._rest) if jax.tree.leaves(
                self._rest) else self._params["model"]
        return _localize(self._engine_state(dtype))

    def _engine_state(self, dtype=None, *, take: bool = False) -> nnx.State:
        if self.config.lora is not None:
            return merge_lora(nnx.merge_state(self._params["model"], self._rest), dtype)
        leaves, treedef = jax.tree.flatten(self._params["model"])
        params = jax.tree.unflatten(treedef, [
            _fresh(x, d if dtype is None else dtype, take=take)
            for x, d in zip(leaves, self._export_dtypes)])
        if not jax.tree.leaves(self._rest):
            return params
        rest = self._rest if dtype is None else jax.tree.map(
            lambda x: x.astype(dtype) if _is_float(x) else x, self._rest)
        return nnx.merge_state(params, rest)

    def export_model(self, *, release: bool = False) -> Transformer:
        """A plain `Transformer` (LoRA merged, the model's own dtype) for export or eval.

        With several processes (a collective: every process calls it), each process gets the
        whole model on its first local device (gathered per tensor).

        Args:
          release: also `release()` this trainer, freeing its optimizer state before the
            export is made and handing over the master weights that need no cast instead of
            copying them (the CLI's SFT trainer ends this way).
        """
        self._check_live("export_model")
        if not release:
            return nnx.merge(self._plain_graphdef, _localize(self._engine_state()))
        self._release_optimizer()
        state = _localize(self._engine_state(take=True))
        self._release_params(keep=frozenset(id(x) for x in jax.tree.leaves(state)))
        return nnx.merge(self._plain_graphdef, state)

    def export_pretrained(self, path, **kwargs) -> None:
        """Writes the current policy (LoRA merged) as a Hugging Face safetensors checkpoint.

        Calls `agentax.models.save_pretrained(model, path, **kwargs)` on the trainer's own
        (sharded) weights: no copy of the model is made; each tensor is gathered and cast to
        the model's dtype on the host in turn. With several processes every process calls it
        (process 0 writes).
        """
        from agentax.models import save_pretrained

        self._check_live("export_pretrained")
        sync("export_pretrained")  # save_pretrained all-gathers tensor by tensor
        if self.config.lora is not None:
            state = self._engine_state()  # the merge makes new tensors anyway
        else:  # the trainer's own buffers: save_pretrained casts on the host, tensor by tensor
            state = self._params["model"]
            if jax.tree.leaves(self._rest):
                state = nnx.merge_state(state, self._rest)
        save_pretrained(nnx.merge(self._plain_graphdef, state), path, **kwargs)

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
        """Host rows (the same global batch on every process) onto the batch sharding: each
        process puts only its own devices' rows."""
        return put_global(tree, self._batch_sharding)

    def _put_counts(self, counts) -> dict:
        return put_global({k: np.float32(v) for k, v in counts.items()}, self._replicated)

    @staticmethod
    def _gather(local: Sequence) -> list:
        """Every process's share of a step's data, in process order (`local` itself in a
        single process): the trainers' steps take this process's share."""
        return gather_objects(list(local))

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

        if not compile_only:
            self._check_live("step")
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
                # on the trainer's devices: Orbax saves no process-local array across hosts
                "rng": put_global(to_host(jax.random.key_data(self._rng)), self._replicated)}

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
        self._check_live("save_checkpoint")
        return save_trainer_checkpoint(self, directory, self.step_count if step is None else step,
                                       run=run)

    def restore_checkpoint(self, directory, step: int | None = None) -> int:
        """Restores the latest (or the given) checkpoint under `directory`; returns its step.

        Raises:
          FileNotFoundError: no checkpoint there.
          ValueError: the checkpoint is from a different model / LoRA setup / trainer kind.
        """
        from agentax.train._checkpoint import restore_trainer_checkpoint
        self._check_live("restore_checkpoint")
        return restore_trainer_checkpoint(self, directory, step)
