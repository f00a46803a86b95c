"""The engine's device runner: weights, KV cache and the jitted kernels.

It executes the scheduler's plans (`_scheduler.py`) and knows nothing about requests. Only
the engine's step thread calls it (except `stage_weights`, safe from any thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentax.engine._config import PAGE, EngineConfig
from agentax.engine._kernels import (ModelDef, compiled_count, copy_pages, decode_steps,
                                     prefill_chunk, weight_packer, weight_writer)
from agentax.engine._sampling import RowSampling
from agentax.engine._scheduler import DecodePlan, PrefillPlan, Scheduler
from agentax.models import (SCAN_AUTO_MIN_LAYERS, LayerStack, StackedKV, Transformer,
                            init_page_pool, make_mesh, param_shardings, plan_layer_stack)

__all__ = ["InPlace", "Runner", "lower_decode"]

log = logging.getLogger(__name__)


class Runner:
    """Holds the weights and the cache of one engine and runs its kernels.

    Args:
      model: the `Transformer` whose weights are used (never donated).
      config: the engine's sizes.
      mesh: shard over this mesh's 'tensor' axis (None: `config.tensor_parallel` devices
        from the model's first one; one device when that is 1).
    """

    def __init__(self, model: nnx.Module, config: EngineConfig, mesh: Mesh | None = None):
        self.config = cfg = config
        graphdef, state = nnx.split(model)
        weights, treedef = jax.tree.flatten(state)
        stack, self.unrolled_reason = _layer_stack(model, cfg)
        # unrolled_reason: why "auto" left a deep model's layers unrolled (None otherwise).
        self.model_def = ModelDef(graphdef, treedef, stack)
        device = min(weights[0].sharding.device_set, key=lambda d: d.id)
        self.mesh = mesh = _engine_mesh(device, cfg, mesh, model.config)
        if mesh is None:
            # Committed to one device: jit keys its cache on committedness, so weights from a
            # trainer (always committed) would otherwise recompile every kernel on first use.
            # A model sharded over a trainer's mesh is gathered onto the mesh's first device.
            self._place = jax.sharding.SingleDeviceSharding(device)
            leaves = [jax.device_put(w, w.sharding if w.sharding.device_set == {device}
                                     and stack is None else self._place) for w in weights]
            kv = self._place
        else:
            # Tensor parallel: attention heads, MLP columns / rows and the vocabulary over the
            # 'tensor' axis (the trainer's rules); the K/V cache over its kv-head axis. XLA
            # inserts the collectives; host arrays (tables, sampling) are replicated.
            self._place = NamedSharding(mesh, P())
            leaves = jax.tree.leaves(jax.device_put(state, param_shardings(state, mesh)))
            kv = NamedSharding(mesh, P(None, "tensor"))
        # What a published leaf must be: the model's flat leaves' shapes, dtypes, placements.
        self._leaves = [jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=w.sharding)
                        for w in leaves]
        self.weights = leaves
        """The kernels' weights: the model's flat leaves, or with stacked layers
        `model_def.pack(leaves)` (new buffers, packed once per version: the engine's own)."""
        self._packer = None
        if stack is not None:
            shardings = stack.shardings([w.sharding for w in leaves])
            self._packer = weight_packer(self.model_def, shardings)
            self.weights = self._packer(leaves)
            if mesh is not None:  # [L, ...]: the per-layer layout behind an unsharded axis
                kv = NamedSharding(mesh, P(None, None, "tensor"))
        # The cache too: an uncommitted first cache compiled the first prefill shape twice
        # (once for the fresh cache, once for the committed one the kernel returns). Every
        # layer is a pool of pages (a page holds any 16 positions: sliding-window layers
        # need no ring); stacked, one [L, ...] array each.
        self.cache = jax.device_put(_page_pool(model.config, cfg, stacked=stack is not None),
                                    kv)
        self.kv_cache_bytes = sum(c.nbytes for c in jax.tree.leaves(self.cache))
        self._table: jax.Array | None = None
        self._table_version = -1
        self._sampling_version = -1
        self._sampling_dev: tuple[RowSampling, jax.Array] | None = None
        self._pending: tuple[list, int, InPlace | None] | None = None
        self._pending_lock = threading.Lock()
        self.staged_count = self.applied_count = 0  # weights staged / swapped in, ever
        self._writer = None  # the in-place weight write, jitted for this engine's layout
        self.owns_weights = stack is not None
        """Whether only the engine holds `weights` (then a publication may write into them):
        not the model's arrays it was built from, nor arrays a caller staged."""
        self.compile_s = 0.0
        """Wall time of kernel calls that compiled (precompile included)."""

    # ------------------------------------------------------------------ weights

    @property
    def scanned(self) -> bool:
        """Whether the kernels run the layers as one scan over stacked weights."""
        return self.model_def.stack is not None

    @property
    def leaf_specs(self) -> list:
        """Shape, dtype and sharding (ShapeDtypeStructs) of each of the model's flat leaves as
        the engine takes them (`update_weights`), whatever layout the kernels hold."""
        return list(self._leaves)

    def leaves(self) -> list:
        """The current weights as the model's flat leaves (with stacked layers: slices of the
        stacks, new arrays)."""
        return self.model_def.unpack(self.weights)

    def check_and_place(self, leaves, treedef, *, cast: bool = True) -> list:
        if treedef != self.model_def.treedef or len(leaves) != len(self._leaves):
            raise ValueError(
                "update_weights: the state's tree differs from the engine's model; pass the "
                "state from nnx.split(model) of the same architecture"
            )
        for new, old in zip(leaves, self._leaves):
            if new.shape != old.shape:
                raise ValueError(f"update_weights: shape {new.shape} != engine's {old.shape}")
        # In the engine's own dtype (a trainer's float32 master copy reaches a bfloat16 engine
        # as bfloat16; cast before the move, so fewer bytes travel) and onto its own placement
        # (a no-op when already there): the compiled kernels are reused whatever dtype,
        # device or committedness the new arrays had. Without `cast` (an in-place write casts
        # in its kernel), the arrays keep their dtype.
        return [jax.device_put(_as_dtype(new, old.dtype) if cast else new, old.sharding)
                for new, old in zip(leaves, self._leaves)]

    def stage_weights(self, leaves: list, version: int, in_place: InPlace | None = None) -> None:
        """Queues new weights; `apply_staged` swaps them in, or with `in_place` writes them
        into the engine's own buffers and then sets `in_place.done` (safe from any thread)."""
        with self._pending_lock:
            replaced, self._pending = self._pending, (list(leaves), int(version), in_place)
            self.staged_count += 1
        if replaced is not None and replaced[2] is not None:
            replaced[2].finish("superseded")  # its caller returns; the newer version applies

    def drop_staged(self, why: str) -> None:
        """Forgets staged weights (the engine stops); an in-place caller is told `why`."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None and pending[2] is not None:
            pending[2].finish(why)

    def apply_staged(self, on_applied: Callable[[int], None]) -> None:
        """Swaps in staged weights (if any) and calls `on_applied(version)`; an in-place
        caller is released only after that, so it reads the new version when it returns."""
        if self._pending is None:
            return
        with self._pending_lock:
            pending, self._pending = self._pending, None
            count = self.staged_count
        leaves, version, in_place = pending
        if in_place is None:
            if self._packer is None:
                self.weights, self.owns_weights = leaves, False  # the caller may hold them
            else:  # stacked: new buffers of the engine's own, the old ones dropped
                self.weights, self.owns_weights = self._packer(leaves), True
            on_applied(version)
            self.applied_count = count
            return
        try:
            # The first write goes into a copy (the current buffers may be the model's own);
            # from then on into the engine's buffers, donated: no second copy of the weights.
            old = self.weights if self.owns_weights else [
                jax.device_put(w, w.sharding, may_alias=False) for w in self.weights]
            if self._writer is None:
                self._writer = weight_writer(self.model_def, [w.sharding for w in self.weights])
            self.weights = jax.block_until_ready(self._writer(old, leaves))
            self.owns_weights = True
        except BaseException as exc:
            in_place.finish(f"{type(exc).__name__}: {exc}")
            raise  # the old buffers may be gone: the engine stops with the error
        on_applied(version)
        self.applied_count = count
        in_place.finish(None)

    # ------------------------------------------------------------------ kernels

    def _timed(self, fn, *args):
        before = compiled_count()
        t = time.perf_counter()
        out = fn(*args)
        if compiled_count() != before:  # compiling happens inside the call, before dispatch
            self.compile_s += time.perf_counter() - t
        return out

    def _page_table(self, sched: Scheduler) -> jax.Array:
        """The scheduler's page table on the device, re-sent only when it changed."""
        if self._table_version != sched.table_version:
            # A copy: on CPU device_put may alias the numpy buffer the scheduler edits later.
            self._table = jax.device_put(sched.page_table.copy(), self._place)
            self._table_version = sched.table_version
        return self._table

    def copy_pages(self, copies: list[tuple[int, int]]) -> None:
        """Makes the scheduler's copy-on-write page copies (sources, destinations)."""
        n = 1 << (len(copies) - 1).bit_length()  # a power of two: few compilations
        src = np.zeros(n, np.int32)
        dst = np.full(n, self.config.kv_pages, np.int32)  # padding: past the pool, dropped
        src[:len(copies)], dst[:len(copies)] = zip(*copies)
        self.cache = self._timed(copy_pages, self.cache, jax.device_put(src, self._place),
                                 jax.device_put(dst, self._place))

    def prefill(self, plan: PrefillPlan, sched: Scheduler):
        """Runs one prefill call; returns device arrays (tokens [R], logprobs [R])."""
        sampling = RowSampling(*(jnp.asarray(a) for a in plan.sampling_r))
        token, logprob, self.cache = self._timed(
            prefill_chunk, self.model_def, self.weights, self.cache, self._page_table(sched),
            jnp.asarray(plan.tokens_rc), jnp.asarray(plan.positions_rc),
            jnp.asarray(plan.slots_r), sampling, self.config.max_seq_len)
        return token, logprob

    def decode(self, plan: DecodePlan, sched: Scheduler):
        """Runs one decode call; returns host arrays (tokens [S, N], logprobs [S, N], counts [S])."""
        if self._sampling_version != sched.sampling_version:
            # Per-slot settings change only when a request starts: re-sent then, not per call.
            self._sampling_dev = (
                RowSampling(jnp.asarray(sched.temperature), jnp.asarray(sched.top_k),
                            jnp.asarray(sched.top_p), jnp.asarray(sched.seed)),
                jnp.asarray(sched.stop_table),
            )
            self._sampling_version = sched.sampling_version
        sampling, stop_table = self._sampling_dev
        out_tok, out_lp, counts, self.cache = self._timed(
            decode_steps, self.model_def, self.weights, self.cache, self._page_table(sched),
            jnp.asarray(plan.state_4s), sampling, stop_table, plan.steps,
            self.config.max_seq_len)
        return jax.device_get((out_tok, out_lp, counts))

    def precompile(self) -> None:
        """Compiles every shape of `config.kernel_shapes()` (decode once, prefill per row
        bucket and chunk bucket, page copies per power of two), on inputs that write
        nothing."""
        cfg, s, t_max = self.config, self.config.max_slots, self.config.max_seq_len
        # A table of zeros (page 0 for every slot) is read, never written.
        table = jax.device_put(np.zeros((s, -(-t_max // PAGE)), np.int32), self._place)
        for kind, *shape in cfg.kernel_shapes():
            if kind == "copy":  # destinations past the pool: nothing is written
                n = shape[0]
                self.cache = self._timed(
                    copy_pages, self.cache, jax.device_put(np.zeros(n, np.int32), self._place),
                    jax.device_put(np.full(n, cfg.kv_pages, np.int32), self._place))
                continue
            if kind == "decode":
                state = np.zeros((4, s), np.int32)  # no slot active: nothing is written
                ones, zeros = jnp.ones((s,), jnp.float32), jnp.zeros((s,), jnp.int32)
                sampling = RowSampling(ones, zeros, ones, jnp.zeros((s,), jnp.uint32))
                args = (jnp.asarray(state), sampling,
                        jnp.full((s, cfg.max_stop_ids), -1, jnp.int32),
                        cfg.decode_steps_per_call)
                *_, self.cache = self._timed(decode_steps, self.model_def, self.weights,
                                             self.cache, table, *args, t_max)
                continue
            r, c = shape[:2]
            zeros, ones = jnp.zeros((r,), jnp.int32), jnp.ones((r,), jnp.float32)
            sampling = RowSampling(ones, zeros, ones, jnp.zeros((r,), jnp.uint32))
            args = (jnp.zeros((r, c), jnp.int32), jnp.full((r, c), t_max, jnp.int32), zeros,
                    sampling)
            *_, self.cache = self._timed(prefill_chunk, self.model_def, self.weights,
                                         self.cache, table, *args, t_max)
        jax.block_until_ready(self.cache)

    def kv_bytes_per_device(self) -> int:
        """Bytes of the K/V cache held on one device (the whole cache without a mesh)."""
        return sum(c.addressable_shards[0].data.nbytes for c in jax.tree.leaves(self.cache))


def _engine_mesh(device, cfg: EngineConfig, mesh: Mesh | None, model_config) -> Mesh | None:
    """The mesh the engine shards over, checked: only its 'tensor' axis may exceed 1, and
    it must divide the model's kv heads (the cache is split by them)."""
    tp = cfg.tensor_parallel
    if mesh is None and tp == 1:
        return None
    if mesh is None:
        devices = jax.devices(device.platform)
        start = devices.index(device)
        if start + tp > len(devices):
            raise ValueError(
                f"EngineConfig.tensor_parallel={tp} needs {tp} devices from {device}, only "
                f"{len(devices) - start} there (on CPU set XLA_FLAGS="
                f"--xla_force_host_platform_device_count={tp} before importing jax)")
        mesh = make_mesh(tensor=tp, devices=devices[start:start + tp])
    other = {a: n for a, n in mesh.shape.items() if a != "tensor" and n > 1}
    if "tensor" not in mesh.shape or other:
        raise ValueError(f"the engine shards over a mesh's 'tensor' axis only; got axes "
                         f"{dict(mesh.shape)} (use agentax.models.make_mesh(tensor=N))")
    tp = mesh.shape["tensor"]
    if model_config.num_kv_heads % tp:
        raise ValueError(f"tensor parallelism over {tp} devices splits the KV cache by kv "
                         f"heads: num_kv_heads={model_config.num_kv_heads} is not divisible "
                         f"by {tp}")
    return mesh


def lower_decode(model_config, config: EngineConfig) -> jax.stages.Lowered:
    """The decode kernel an `Engine(Transformer(model_config), config)` would run (its layers
    scanned or not as `config.scan_layers` decides), lowered on abstract arrays: nothing is
    allocated. `.as_text()` is its HLO, `.compile()` compiles it."""
    model = nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    stack, _ = _layer_stack(model, config)
    model_def = ModelDef(graphdef, treedef, stack)
    weights = jax.eval_shape(model_def.pack, leaves)
    cache = jax.eval_shape(lambda: _page_pool(model_config, config, stacked=stack is not None))
    s, t_max = config.max_slots, config.max_seq_len
    i32, f32, sds = jnp.int32, jnp.float32, jax.ShapeDtypeStruct
    sampling = RowSampling(sds((s,), f32), sds((s,), i32), sds((s,), f32), sds((s,), jnp.uint32))
    args = (sds((4, s), i32), sampling, sds((s, config.max_stop_ids), i32),
            config.decode_steps_per_call)
    table = sds((s, -(-t_max // PAGE)), i32)
    return decode_steps.lower(model_def, weights, cache, table, *args, t_max)


def _layer_stack(model, cfg: EngineConfig) -> tuple[LayerStack | None, str | None]:
    """The engine's `LayerStack` (None: layers unrolled) and, when `scan_layers` asked for a
    scan the model cannot have, why not ("auto": logged; True: an error)."""
    want = cfg.scan_layers
    if want == "auto":
        want = model.config.num_layers >= SCAN_AUTO_MIN_LAYERS
    if not want:
        return None, None
    plan = plan_layer_stack(model)
    if isinstance(plan, LayerStack):
        return plan, None
    if cfg.scan_layers is True:
        raise ValueError(f"EngineConfig.scan_layers=True: the layers cannot be scanned: {plan}")
    log.info("engine kernels run the layers unrolled: %s", plan)
    return None, plan


def _as_dtype(x, dtype):
    if x.dtype == dtype or not (jnp.issubdtype(x.dtype, jnp.floating)
                                and jnp.issubdtype(dtype, jnp.floating)):
        return x
    return x.astype(dtype) if isinstance(x, jax.Array) else np.asarray(x).astype(dtype)


def _page_pool(config, cfg: EngineConfig, *, stacked: bool = False):
    """A zeroed pool of `cfg.kv_pages` pages per layer: a `KVCache` of [P, K, PAGE, H] per
    layer, or with `stacked` a `StackedKV` of [L, P, K, PAGE, H] (the layers scanned)."""
    if not stacked:
        return init_page_pool(config, cfg.kv_pages, cfg.cache_dtype)
    dtype = jnp.dtype(cfg.cache_dtype or config.dtype)
    shape = (config.num_layers, cfg.kv_pages, config.num_kv_heads, PAGE, config.head_dim)
    return StackedKV(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


class InPlace:
    """A caller waiting for its weights to be written into the engine's buffers."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.failure: str | None = None
        """None once written; "superseded" when newer weights replaced them before the write;
        otherwise why they were not written."""

    def finish(self, failure: str | None) -> None:
        self.failure = failure
        self.done.set()
