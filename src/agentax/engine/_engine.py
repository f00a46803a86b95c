"""`Engine`: continuous-batching generation over a preallocated KV cache, with an asyncio front end.

A background thread owns the model, the cache and every piece of scheduling state; callers
talk to it only through a lock-protected inbox, and it answers by resolving asyncio futures on
the caller's loop with `call_soon_threadsafe`. Nothing here blocks an event loop.

One iteration of the step thread:

1. drain the inbox (new requests, cancellations, releases), apply pending weights;
2. admit waiting requests into slots (FIFO; a continuation whose sequence is still parked in
   its slot goes straight back to it; otherwise a free slot, else the least recently used
   parked sequence is evicted);
3. prefill: feed chunks of admitted prompts up to a token budget (chunk lengths are powers of
   two, so prefill compiles a handful of times), sampling the first token at the last chunk;
4. decode: one jitted call runs `decode_steps_per_call` steps over every slot at once, with
   on-device stop checks; the host then appends the new tokens, checks stop strings and
   resolves the requests that finished. Their slots are parked for a continuation.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentax.engine._config import EngineConfig, EngineStats
from agentax.engine._kernels import compiled_count, decode_steps, prefill_chunk
from agentax.engine._requests import (
    EngineClosed,
    EngineError,
    PromptTooLong,
    SequenceError,
    _Request,
    _resolve,
    _Sequence,
)
from agentax.engine._sampling import RowSampling
from agentax.engine._telemetry import Telemetry
from agentax.models import init_cache, kv_cache_bytes
from agentax.records import Completion, FinishReason, SamplingParams

__all__ = ["Engine", "EngineError", "EngineClosed", "PromptTooLong", "SequenceError"]

log = logging.getLogger(__name__)


class Engine:
    """Continuous-batching generation engine.

    Args:
      model: an `agentax.models.Transformer`.
      config: slots, slot length, prefill chunking, fused decode steps.
      eos_token_ids: ids that end every completion (finish reason EOS).
      tokenizer: anything with `decode(ids) -> str`; needed only for stop strings.
      tracer: an `agentax.trace` tracer; None uses `agentax.trace.get_tracer()` if present.
      policy_version: version of the initial weights (tagged on every token they produce).

    The engine starts its step thread at construction; call `shutdown()` (or use it as a
    context manager) to stop it.
    """

    def __init__(
        self,
        model: nnx.Module,
        config: EngineConfig | None = None,
        *,
        eos_token_ids: Sequence[int] = (),
        tokenizer: Any = None,
        tracer: Any = None,
        policy_version: int = 0,
    ):
        self.config = cfg = config or EngineConfig()
        self.model_config = model.config
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        if len(self.eos_token_ids) > cfg.max_stop_ids:
            raise ValueError(
                f"{len(self.eos_token_ids)} eos ids do not fit max_stop_ids={cfg.max_stop_ids}; "
                "raise EngineConfig.max_stop_ids"
            )
        self.tokenizer = tokenizer
        graphdef, state = nnx.split(model)
        weights, treedef = jax.tree.flatten(state)
        self._graphdef, self._treedef = graphdef, treedef
        self._model_def = (graphdef, treedef)
        # Committed to their devices: jit keys its cache on committedness, so weights from a
        # trainer (always committed) would otherwise recompile every kernel on first use.
        self._weights = [jax.device_put(w, w.sharding) for w in weights]
        self._version = int(policy_version)
        self._pending_weights: tuple[list, int] | None = None
        self._weights_lock = threading.Lock()

        s, t = cfg.max_slots, cfg.max_seq_len
        self._cache = init_cache(self.model_config, s, t, dtype=cfg.cache_dtype)
        self.kv_cache_bytes = kv_cache_bytes(self.model_config, s, t, dtype=cfg.cache_dtype)
        # Host mirror of the per-slot decode inputs.
        self._tok = np.zeros(s, np.int32)
        self._pos = np.zeros(s, np.int32)
        self._active = np.zeros(s, bool)
        self._remaining = np.zeros(s, np.int32)
        self._temperature = np.ones(s, np.float32)
        self._top_k = np.zeros(s, np.int32)
        self._top_p = np.ones(s, np.float32)
        self._seed = np.zeros(s, np.uint32)
        self._stop_table = np.full((s, cfg.max_stop_ids), -1, np.int32)
        self._slot_seq: list[_Sequence | None] = [None] * s
        self._sampling_dev: tuple[RowSampling, jax.Array] | None = None
        """Device copies of the per-slot sampling settings and stop table (None = stale)."""

        self._sequences: collections.OrderedDict[int, _Sequence] = collections.OrderedDict()
        self._next_sequence_id = 1
        self._use_clock = 0
        self._waiting: collections.deque[_Request] = collections.deque()
        self._prefilling: collections.deque[_Request] = collections.deque()

        self._inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self._inbox_lock = threading.Lock()
        self._wake = threading.Event()
        self._paused = False
        self._closing = False
        self._error: BaseException | None = None

        self._counts = collections.Counter()
        self._tokens_per_step = 0.0
        self._compiles_at_start = compiled_count()
        self._telemetry = Telemetry(tracer)

        self._thread = threading.Thread(target=self._run, name="agentax-engine", daemon=True)
        self._thread.start()

    # ================================================================== public API

    async def generate(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        params: SamplingParams | None = None,
        *,
        sequence_id: int | None = None,
    ) -> Completion:
        """Generates a completion; call from any asyncio task (never blocks the loop).

        Args:
          prompt_ids: token ids to feed. On a continuation these are only the NEW tokens
            (tool output, next user message) that follow the previous completion.
          params: sampling parameters (default `SamplingParams()`).
          sequence_id: `Completion.sequence_id` of an earlier completion to continue; its
            KV cache is reused if still parked, else the history is re-prefilled.

        Returns:
          The `Completion` (its `sequence_id` continues the conversation).

        Raises:
          PromptTooLong: the prompt (plus history) leaves no room for a token in a slot.
          SequenceError: `sequence_id` is unknown (released / cancelled) or already busy.
          ValueError: bad ids or stop strings without a tokenizer.
          EngineError / EngineClosed: the engine failed or was shut down.
        Cancelling the awaiting task frees the request's slot and forgets its sequence.
        """
        req = self._make_request(prompt_ids, params, sequence_id)
        loop = asyncio.get_running_loop()
        req.loop, req.future = loop, loop.create_future()
        self._post("submit", req)
        try:
            return await req.future
        except asyncio.CancelledError:
            self._post("cancel", req, check=False)
            raise

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int] | np.ndarray],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        release: bool = True,
    ) -> list[Completion]:
        """Synchronous helper for offline use: generates all prompts concurrently.

        Args:
          prompts: token-id prompts.
          params: one `SamplingParams` for all, or one per prompt.
          release: free each sequence after its completion (no continuation possible).

        Returns:
          Completions in prompt order. Must not be called from a running event loop's thread
          (use `await engine.generate(...)` there).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "generate_batch blocks; inside an event loop use `await engine.generate(...)`"
            )
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")

        async def run() -> list[Completion]:
            outs = await asyncio.gather(*(self.generate(p, sp) for p, sp in zip(prompts, params)))
            if release:
                for c in outs:
                    self.release(c.sequence_id)
            return list(outs)

        return asyncio.run(run())

    def release(self, sequence_id: int | None) -> None:
        """Forgets a sequence and frees its parked slot (after its request, if one is in flight).

        Non-blocking and safe from any thread; unknown ids are ignored.
        """
        if sequence_id is not None:
            self._post("release", int(sequence_id), check=False)

    def update_weights(self, state_or_model: Any, version: int) -> None:
        """Swaps in new weights between two decode calls; in-flight requests continue.

        Tokens sampled afterwards are tagged with `version`. Non-blocking.

        Args:
          state_or_model: a `Transformer` of the same architecture, or its `nnx.State`
            (from `nnx.split(model)`), or the flat list of its parameter leaves.
          version: the policy version of these weights.
        """
        if isinstance(state_or_model, nnx.Module):
            graphdef, state = nnx.split(state_or_model)
            if graphdef != self._graphdef:
                raise ValueError("update_weights: the model's structure differs from the engine's")
            leaves, treedef = jax.tree.flatten(state)
        elif isinstance(state_or_model, list):
            leaves, treedef = state_or_model, self._treedef
        else:
            leaves, treedef = jax.tree.flatten(state_or_model)
        if treedef != self._treedef or len(leaves) != len(self._weights):
            raise ValueError(
                "update_weights: the state's tree differs from the engine's model; pass the "
                "state from nnx.split(model) of the same architecture"
            )
        for new, old in zip(leaves, self._weights):
            if new.shape != old.shape:
                raise ValueError(f"update_weights: shape {new.shape} != engine's {old.shape}")
        # Onto the engine's own placement (a no-op when already there), so the compiled
        # kernels are reused whatever device or committedness the new arrays had.
        leaves = [jax.device_put(new, old.sharding) for new, old in zip(leaves, self._weights)]
        with self._weights_lock:
            self._pending_weights = (list(leaves), int(version))
        self._wake.set()

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine decodes with now."""
        return self._version

    def pause(self) -> None:
        """Stops running steps after the current one; requests queue up. Non-blocking."""
        self._paused = True
        self._wake.set()

    def resume(self) -> None:
        self._paused = False
        self._wake.set()

    @property
    def num_compiles(self) -> int:
        """Compilations of the engine kernels since this engine was built."""
        return compiled_count() - self._compiles_at_start

    def stats(self) -> EngineStats:
        """A snapshot of the counters (cheap; safe from any thread)."""
        seqs = list(self._slot_seq)
        busy = sum(1 for q in seqs if q is not None and q.request is not None)
        parked = sum(1 for q in seqs if q is not None and q.request is None)
        c = self._counts
        return EngineStats(
            active_slots=busy,
            parked_slots=parked,
            free_slots=len(seqs) - busy - parked,
            waiting_requests=len(self._waiting) + c["inbox_submits"],
            tokens_per_step=self._tokens_per_step,
            evictions=c["evictions"],
            total_tokens=c["total_tokens"],
            prefill_tokens=c["prefill_tokens"],
            steps=c["steps"],
            decode_calls=c["decode_calls"],
            prefill_calls=c["prefill_calls"],
            occupancy=c["decode_tokens"] / max(c["slot_steps"], 1),
            completed=c["completed"],
            failed=c["failed"],
            num_compiles=self.num_compiles,
            policy_version=self._version,
        )

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stops the step thread; every pending request fails with `EngineClosed`."""
        self._closing = True
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ================================================================== caller side

    def _make_request(self, prompt_ids, params, sequence_id) -> _Request:
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        ids = np.asarray(prompt_ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"prompt_ids must be a 1-D sequence of ints, got shape {ids.shape}")
        ids = ids.astype(np.int32)
        vocab = self.model_config.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"prompt_ids must lie in [0, {vocab}); got {ids.min()}..{ids.max()}")
        if sequence_id is None and ids.size == 0:
            raise ValueError("prompt_ids is empty; a new sequence needs at least one token")
        if sequence_id is None and ids.size >= self.config.max_seq_len:
            raise PromptTooLong(
                f"prompt of {ids.size} tokens leaves no room in a slot of max_seq_len="
                f"{self.config.max_seq_len}; shorten it or raise EngineConfig.max_seq_len"
            )
        stop = set(self.eos_token_ids) | {int(i) for i in params.stop_ids}
        if len(stop) > self.config.max_stop_ids:
            raise ValueError(
                f"{len(stop)} eos + stop ids exceed EngineConfig.max_stop_ids="
                f"{self.config.max_stop_ids}"
            )
        if params.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass Engine(..., tokenizer=...)")
        return _Request(
            ids=ids, params=params, sequence_id=sequence_id, loop=None, future=None,
            submit_time=time.perf_counter(), stop_set=frozenset(stop),
        )

    def _post(self, kind: str, item: Any, *, check: bool = True) -> None:
        if check:
            if self._error is not None:
                raise EngineError(f"the engine failed: {self._error!r}") from self._error
            if self._closing:
                raise EngineClosed("the engine is shut down")
        with self._inbox_lock:
            self._inbox.append((kind, item))
            if kind == "submit":
                self._counts["inbox_submits"] += 1
        self._wake.set()

    # ================================================================== step thread

    def _run(self) -> None:
        try:
            if self.config.precompile:
                self._precompile()
            while True:
                self._wake.clear()
                self._drain_inbox()
                if self._closing:
                    break
                self._apply_pending_weights()
                if self._paused:
                    self._wake.wait(self.config.idle_wait_s)
                    continue
                self._admit()
                worked = self._prefill_some()
                worked = self._decode() or worked
                if not worked:
                    self._wake.wait(self.config.idle_wait_s)
        except BaseException as exc:  # noqa: BLE001 - reported, and fails every request
            log.exception("agentax engine step loop failed")
            self._error = exc
        finally:
            self._drain_inbox()
            if self._error is not None:
                err: BaseException = EngineError(f"the engine step loop failed: {self._error!r}")
                err.__cause__ = self._error
            else:
                err = EngineClosed("the engine was shut down before this request finished")
            self._closing = True
            self._fail_everything(err)

    def _precompile(self) -> None:
        """Runs every kernel shape once on inputs that write nothing (positions past the end)."""
        cfg, s, t_max = self.config, self.config.max_slots, self.config.max_seq_len
        for r in cfg.prefill_row_buckets:
            for c in cfg.prefill_buckets:
                zeros, ones = jnp.zeros((r,), jnp.int32), jnp.ones((r,), jnp.float32)
                sampling = RowSampling(ones, zeros, ones, jnp.zeros((r,), jnp.uint32))
                *_, self._cache = prefill_chunk(
                    self._model_def, self._weights, self._cache, jnp.zeros((r, c), jnp.int32),
                    jnp.full((r, c), t_max, jnp.int32), zeros, zeros, sampling,
                )
        state = np.zeros((4, s), np.int32)  # no slot active: nothing is written
        sampling = RowSampling(jnp.array(self._temperature), jnp.array(self._top_k),
                               jnp.array(self._top_p), jnp.array(self._seed))
        *_, self._cache = decode_steps(
            self._model_def, self._weights, self._cache, jnp.array(state), sampling,
            jnp.array(self._stop_table), cfg.decode_steps_per_call,
        )
        jax.block_until_ready(self._cache)

    def _fail_everything(self, err: BaseException) -> None:
        with self._inbox_lock:
            late = [item for kind, item in self._inbox if kind == "submit"]
            self._inbox.clear()
            self._counts["inbox_submits"] = 0
        pending = list(self._waiting) + late
        pending += [q.request for q in self._slot_seq if q is not None and q.request is not None]
        pending += list(self._prefilling)
        for req in pending:
            if not req.done:
                self._fail(req, err)
        self._waiting.clear()
        self._prefilling.clear()

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
            self._counts["inbox_submits"] = 0
        for kind, item in items:
            if kind == "submit":
                self._accept(item)
            elif kind == "cancel":
                self._cancel(item)
            elif kind == "release":
                seq = self._sequences.get(item)
                if seq is not None:
                    if seq.request is not None:
                        seq.release_when_done = True
                    else:
                        self._drop_sequence(seq)

    def _apply_pending_weights(self) -> None:
        if self._pending_weights is None:
            return
        with self._weights_lock:
            pending, self._pending_weights = self._pending_weights, None
        self._weights, self._version = pending

    # ------------------------------------------------------------------ admission

    def _accept(self, req: _Request) -> None:
        """Attaches a submitted request to its sequence and queues it."""
        t_max = self.config.max_seq_len
        if req.sequence_id is None:
            seq = _Sequence(id=self._next_sequence_id, tokens=[])
            self._next_sequence_id += 1
            self._sequences[seq.id] = seq
            self._forget_old_sequences()
        else:
            seq = self._sequences.get(req.sequence_id)
            if seq is None:
                return self._fail(req, SequenceError(
                    f"unknown sequence_id {req.sequence_id}: it was released, cancelled, or "
                    f"forgotten (EngineConfig.max_sequences={self.config.max_sequences})"
                ))
            if seq.request is not None:
                return self._fail(req, SequenceError(
                    f"sequence {seq.id} already has a request in flight; await it first"
                ))
            if len(seq.tokens) + req.ids.size >= t_max:
                return self._fail(req, PromptTooLong(
                    f"sequence {seq.id} holds {len(seq.tokens)} tokens; {req.ids.size} more "
                    f"leave no room in a slot of max_seq_len={t_max}"
                ))
            self._sequences.move_to_end(seq.id)
        req.seq = seq
        seq.request = req
        seq.tokens.extend(int(i) for i in req.ids)
        self._waiting.append(req)

    def _forget_old_sequences(self) -> None:
        while len(self._sequences) > self.config.max_sequences:
            for seq in self._sequences.values():
                if seq.request is None:
                    self._drop_sequence(seq)
                    break
            else:
                return

    def _admit(self) -> None:
        blocked = False
        for req in list(self._waiting):
            seq = req.seq
            if seq.slot is None:
                if blocked:
                    continue
                slot = self._find_slot()
                if slot is None:
                    blocked = True  # FIFO: later requests needing a slot wait behind this one
                    continue
                seq.slot, seq.cached = slot, 0
                self._slot_seq[slot] = seq
            self._waiting.remove(req)
            self._start(req)

    def _find_slot(self) -> int | None:
        for slot, seq in enumerate(self._slot_seq):
            if seq is None:
                return slot
        parked = [q for q in self._slot_seq if q is not None and q.request is None]
        if not parked:
            return None
        victim = min(parked, key=lambda q: q.last_used)
        slot = victim.slot
        victim.slot, victim.cached = None, 0
        self._slot_seq[slot] = None
        self._counts["evictions"] += 1
        return slot

    def _start(self, req: _Request) -> None:
        seq, slot, p = req.seq, req.seq.slot, req.params
        req.admit_time = time.perf_counter()
        req.pending = seq.tokens[seq.cached:]
        self._temperature[slot] = p.temperature
        self._top_k[slot] = p.top_k
        self._top_p[slot] = p.top_p
        self._seed[slot] = p.seed & 0xFFFFFFFF
        self._stop_table[slot] = -1
        self._stop_table[slot, : len(req.stop_set)] = sorted(req.stop_set)
        self._active[slot] = False
        self._sampling_dev = None
        self._prefilling.append(req)

    # ------------------------------------------------------------------ prefill

    def _prefill_some(self) -> bool:
        """Runs one prefill call over the first requests waiting for prefill (FIFO).

        Each request contributes one row of at most `prefill_chunk` tokens; the call's shape
        is (row bucket, chunk bucket of its longest row), kept within the token budget.
        """
        if not self._prefilling:
            return False
        cfg = self.config
        rows: list[tuple[_Request, int]] = []
        chunk = 0
        for req in self._prefilling:
            n = min(len(req.pending), cfg.prefill_chunk)
            c = max(chunk, cfg.chunk_bucket(n))
            if rows and cfg.row_bucket(len(rows) + 1) * c > cfg.token_budget:
                break
            rows.append((req, n))
            chunk = c
            if len(rows) == cfg.prefill_rows:
                break
        self._prefill_rows(rows, chunk)
        return True

    def _prefill_rows(self, rows: list[tuple[_Request, int]], chunk: int) -> None:
        cfg = self.config
        r, t_max = cfg.row_bucket(len(rows)), cfg.max_seq_len
        tokens = np.zeros((r, chunk), np.int32)
        positions = np.full((r, chunk), t_max, np.int32)  # padding writes nothing
        slots = np.zeros(r, np.int32)
        last = np.zeros(r, np.int32)
        for i, (req, n) in enumerate(rows):
            seq = req.seq
            tokens[i, :n] = req.pending[:n]
            positions[i, :n] = np.arange(seq.cached, seq.cached + n)
            slots[i], last[i] = seq.slot, n - 1
        sampling = RowSampling(
            jnp.array(self._temperature[slots]), jnp.array(self._top_k[slots]),
            jnp.array(self._top_p[slots]), jnp.array(self._seed[slots]),
        )
        n_tokens = sum(n for _, n in rows)
        with self._telemetry.span("PREFILL", tokens=n_tokens, rows=len(rows), bucket=chunk):
            token, logprob, self._cache = prefill_chunk(
                self._model_def, self._weights, self._cache, jnp.array(tokens),
                jnp.array(positions), jnp.array(slots), jnp.array(last), sampling,
            )
        self._counts["prefill_calls"] += 1
        self._counts["prefill_tokens"] += n_tokens
        self._counts["prefill_padded_tokens"] += r * chunk
        finished = False
        for req, n in rows:
            del req.pending[:n]
            req.seq.cached += n
            finished = finished or not req.pending
        if not finished:
            return
        token, logprob = jax.device_get((token, logprob))
        self._prefilling = collections.deque(q for q in self._prefilling if q.pending)
        for i, (req, _) in enumerate(rows):
            if req.pending:
                continue
            seq, slot = req.seq, req.seq.slot
            if not self._record(req, token[i: i + 1], logprob[i: i + 1]):
                self._pos[slot] = seq.cached
                self._tok[slot] = seq.tokens[-1]
                self._remaining[slot] = req.params.max_tokens - len(req.out_tokens)
                self._active[slot] = True

    # ------------------------------------------------------------------ decode

    def _decode(self) -> bool:
        if not self._active.any():
            return False
        steps = self.config.decode_steps_per_call
        version = self._version
        active_before = int(self._active.sum())
        if self._sampling_dev is None:  # per-slot settings change only when a request starts
            self._sampling_dev = (
                RowSampling(
                    jnp.array(self._temperature), jnp.array(self._top_k),
                    jnp.array(self._top_p), jnp.array(self._seed),
                ),
                jnp.array(self._stop_table),
            )
        sampling, stop_table = self._sampling_dev
        state = np.stack([self._tok, self._pos, self._active.astype(np.int32), self._remaining])
        with self._telemetry.span("DECODE_STEP", active=active_before, steps=steps):
            out_tok, out_lp, counts, self._cache = decode_steps(
                self._model_def, self._weights, self._cache, jnp.array(state),
                sampling, stop_table, steps,
            )
            out_tok, out_lp, counts = jax.device_get((out_tok, out_lp, counts))
        n_steps = int(counts.max())
        self._counts["decode_calls"] += 1
        self._counts["steps"] += n_steps
        self._counts["slot_steps"] += n_steps * len(self._tok)
        self._counts["decode_tokens"] += int(counts.sum())
        self._tokens_per_step = float(counts.sum()) / max(n_steps, 1)
        emitted = np.flatnonzero(counts)
        self._pos[emitted] += counts[emitted]
        self._remaining[emitted] -= counts[emitted]
        for slot in emitted:
            c = int(counts[slot])
            seq = self._slot_seq[slot]
            seq.cached += c
            if self._record(seq.request, out_tok[slot, :c], out_lp[slot, :c], version):
                continue
            self._tok[slot] = seq.tokens[-1]
        self._telemetry.counters(
            active=active_before, waiting=len(self._waiting),
            tokens_per_step=self._tokens_per_step, evictions=self._counts["evictions"],
        )
        return True

    # ------------------------------------------------------------------ completion

    def _record(self, req: _Request, tokens: np.ndarray, logprobs: np.ndarray,
                version: int | None = None) -> bool:
        """Appends sampled tokens to a request; finishes it if they end it. True if finished."""
        seq = req.seq
        version = self._version if version is None else version
        n_before = len(req.out_tokens)
        req.out_tokens.extend(int(t) for t in tokens)
        req.out_logprobs.extend(float(x) for x in logprobs)
        req.out_versions.extend([version] * len(tokens))
        seq.tokens.extend(int(t) for t in tokens)
        reason = None
        if req.params.stop_strings:
            cut = self._stop_string_cut(req, n_before)
            if cut is not None:
                drop = len(req.out_tokens) - cut
                if drop:
                    del req.out_tokens[cut:], req.out_logprobs[cut:], req.out_versions[cut:]
                    del seq.tokens[-drop:]
                seq.cached = min(seq.cached, len(seq.tokens) - 1)
                reason = FinishReason.STOP
        if reason is None:
            last, p = req.out_tokens[-1], req.params
            if last in self.eos_token_ids:
                reason = FinishReason.EOS
            elif last in req.stop_set:
                reason = FinishReason.STOP
            elif len(req.out_tokens) >= p.max_tokens:
                reason = FinishReason.LENGTH
            elif len(seq.tokens) >= self.config.max_seq_len:
                reason = FinishReason.SLOT_FULL
        if reason is None:
            return False
        self._finish(req, reason)
        return True

    def _stop_string_cut(self, req: _Request, n_before: int) -> int | None:
        """Number of output tokens up to and including the one completing a stop string."""
        stops = req.params.stop_strings
        decode = self.tokenizer.decode
        if not any(s in decode(req.out_tokens) for s in stops):
            return None
        for k in range(n_before + 1, len(req.out_tokens) + 1):
            text = decode(req.out_tokens[:k])
            if any(s in text for s in stops):
                return k
        return len(req.out_tokens)

    def _finish(self, req: _Request, reason: FinishReason) -> None:
        seq = req.seq
        now = time.perf_counter()
        req.done = True
        seq.request = None
        self._use_clock += 1
        seq.last_used = self._use_clock
        if seq.slot is not None:
            self._active[seq.slot] = False
        self._counts["completed"] += 1
        self._counts["total_tokens"] += len(req.out_tokens)
        completion = Completion(
            token_ids=np.asarray(req.out_tokens, np.int32),
            logprobs=np.asarray(req.out_logprobs, np.float32),
            versions=np.asarray(req.out_versions, np.int32),
            finish_reason=reason,
            prompt_len=int(req.ids.size),
            sequence_id=seq.id,
            queue_time_s=(req.admit_time or now) - req.submit_time,
            total_time_s=now - req.submit_time,
        )
        if seq.release_when_done:
            self._drop_sequence(seq)
        _resolve(req, result=completion)

    def _fail(self, req: _Request, exc: BaseException) -> None:
        req.done = True
        self._counts["failed"] += 1
        seq = req.seq
        if seq is not None and seq.request is req:
            seq.request = None
            if seq.slot is not None:
                self._active[seq.slot] = False
            self._drop_sequence(seq)  # its history and cache are half-written
        _resolve(req, exc=exc)

    def _cancel(self, req: _Request) -> None:
        if req.done:
            return
        if req in self._waiting:
            self._waiting.remove(req)
        if req in self._prefilling:
            self._prefilling.remove(req)
        if req.seq is None:  # cancelled before it was accepted
            req.done = True
            return
        self._fail(req, asyncio.CancelledError())

    def _drop_sequence(self, seq: _Sequence) -> None:
        if seq.slot is not None:
            self._active[seq.slot] = False
            self._slot_seq[seq.slot] = None
            seq.slot = None
        self._sequences.pop(seq.id, None)
