"""`Engine`: continuous-batching generation over a preallocated KV cache, with an asyncio front end.

The engine is three pieces:

* `Scheduler` (`_scheduler.py`, pure Python): sequences, slots, FIFO admission, LRU eviction
  of parked sequences, prefill planning within a token budget, finish reasons and stop strings;
* `Runner` (`_runner.py`): weights, KV cache and the jitted kernels, executing the plans;
* `Engine` (here): the asyncio front end and the background step thread that joins them.

Callers talk to the step thread only through a lock-protected inbox; it answers by resolving
asyncio futures on the caller's loop with `call_soon_threadsafe`. Nothing blocks an event
loop. One iteration of the step thread: drain the inbox, apply staged weights, admit, run the
prefill calls (usually one), run one decode call (`decode_steps_per_call` fused steps).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from agentax._executors import lower_thread_priority
from agentax.engine._config import EngineConfig, EngineStats
from agentax.engine._kernels import compiled_count
from agentax.engine._requests import (
    EngineClosed,
    EngineError,
    PromptTooLong,
    SequenceError,
    TokenChunk,
    _Request,
    _resolve,
)
from agentax.engine._runner import InPlace, Runner
from agentax.engine._scheduler import Scheduler
from agentax.engine._telemetry import Telemetry
from agentax.records import Completion, SamplingParams

__all__ = ["Engine", "EngineError", "EngineClosed", "PromptTooLong", "SequenceError"]

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register  # registered after jax's own exit hooks, so it runs before them
def _shutdown_live_engines() -> None:
    # A daemon step thread still inside a device call when the interpreter finalizes aborts
    # the process ("terminate called ... FATAL: exception not rethrown": the thread is made to
    # exit while it re-takes the GIL in C++). Stop every engine its owner did not shut down.
    for engine in list(_LIVE):
        engine.shutdown()


def _at_low_priority(fn: Callable[[], Any]) -> None:
    """Runs `fn` on a thread of the lowest CPU priority and waits for it (its errors raise
    here): the precompilation overlaps its owner's other work (the CLI's SFT warm start)
    without taking cores from it."""
    errors: list[BaseException] = []

    def run() -> None:
        lower_thread_priority()
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - re-raised on the step thread
            errors.append(err)

    thread = threading.Thread(target=run, name="agentax-engine-precompile", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


class Engine:
    """Continuous-batching generation engine.

    Args:
      model: an `agentax.models.Transformer`.
      config: slots, slot length, prefill chunking, fused decode steps.
      eos_token_ids: ids that end every completion (finish reason EOS).
      tokenizer: anything with `decode(ids) -> str`; needed only for stop strings.
      tracer: an `agentax.trace` tracer; None uses `agentax.trace.get_tracer()`.
      policy_version: version of the initial weights (tagged on every token they produce).
      mesh: a `jax.sharding.Mesh` whose 'tensor' axis the engine is sharded over (tensor
        parallelism; its other axes must be 1, e.g. `agentax.models.make_mesh(tensor=8)`).
        Default: `config.tensor_parallel` devices from the model's first one.

    The engine starts its step thread at construction; call `shutdown()` (or use it as a
    context manager) to stop it; engines still running at interpreter exit are shut down then.
    If the step thread dies, every waiting and later request fails at once with `EngineError`
    (its cause chained); `engine.error` holds the cause.
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
        mesh: Any = None,
    ):
        self._start_time = time.perf_counter()
        self.config = cfg = config or EngineConfig()
        self.model_config = model.config
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        if len(self.eos_token_ids) > cfg.max_stop_ids:
            raise ValueError(
                f"{len(self.eos_token_ids)} eos ids do not fit max_stop_ids={cfg.max_stop_ids}; "
                "raise EngineConfig.max_stop_ids"
            )
        self.tokenizer = tokenizer
        self._compiles_at_start = compiled_count()
        self._runner = Runner(model, cfg, mesh)
        self.kv_cache_bytes = self._runner.kv_cache_bytes
        self._sched = Scheduler(
            cfg, eos_token_ids=self.eos_token_ids,
            decode=tokenizer.decode if tokenizer is not None else None, resolve=_resolve,
        )
        self._sched.version = int(policy_version)
        self._first_step_s: float | None = None

        self._inbox: collections.deque[tuple[str, Any]] = collections.deque()
        self._inbox_lock = threading.Lock()
        self._inbox_submits = 0
        self._wake = threading.Event()
        self._compiled = threading.Event()  # set once precompiling is over (or failed)
        self._paused = False
        self._closing = False
        self._sealed = False
        self._error: BaseException | None = None
        self._telemetry = Telemetry(tracer)

        self._thread = threading.Thread(target=self._run, name="agentax-engine", daemon=True)
        _LIVE.add(self)
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

    async def stream(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        params: SamplingParams | None = None,
        *,
        sequence_id: int | None = None,
    ) -> AsyncIterator[TokenChunk | Completion]:
        """Generates a completion, yielding its tokens as the step thread samples them.

        Same arguments, errors and slot use as `generate`. Yields `TokenChunk`s (the first
        sampled token after the prefill, then up to `EngineConfig.decode_steps_per_call`
        tokens per decode call), then the final `Completion` as the last item: its
        `token_ids` are the chunks' ids concatenated. The step thread never waits for the
        consumer (chunks queue on the caller's loop).

        Closing the iterator early (`break` inside `contextlib.aclosing(engine.stream(...))`,
        or cancelling the task that iterates it) cancels the request: its slot is freed and
        its sequence forgotten, as when a `generate` call is cancelled.
        """
        req = self._make_request(prompt_ids, params, sequence_id)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenChunk | None] = asyncio.Queue()
        req.loop, req.future, req.on_tokens = loop, loop.create_future(), queue.put_nowait
        # resolved after every chunk of the request was queued (call_soon_threadsafe is FIFO)
        req.future.add_done_callback(lambda _: queue.put_nowait(None))
        self._post("submit", req)
        try:
            while (chunk := await queue.get()) is not None:
                yield chunk
            yield req.future.result()
        finally:
            if not req.future.done():
                req.future.cancel()  # the step thread's late result is dropped
                self._post("cancel", req, check=False)
            elif not req.future.cancelled():
                req.future.exception()  # retrieved: no "never retrieved" warning on early close

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

    def update_weights(self, state_or_model: Any, version: int, *, in_place: bool = False,
                       timeout_s: float = 600.0) -> None:
        """Swaps in new weights between two decode calls; in-flight requests continue.

        Tokens sampled afterwards are tagged with `version`. Non-blocking by default: the
        engine keeps the arrays it was given (in its own dtype; a cast makes new ones), or,
        when it holds the layers stacked (`EngineConfig.scan_layers`), packs them into new
        stacked buffers of its own.

        With `in_place=True` it blocks until the step thread, between two calls, has cast the
        new values into the engine's own weight buffers (donated to one small kernel, compiled
        once per source dtype): the engine never holds two versions, and the caller may reuse
        or donate its arrays as soon as this returns (e.g. a trainer's float32 master, passed
        uncast: `RLTrainer.params_for_engine(live=True)`). The first in-place write copies the
        engine's weights once (they may be the model's own arrays; stacked layers are the
        engine's own from the start); from then on none.

        Args:
          state_or_model: a `Transformer` of the same architecture, or its `nnx.State`
            (from `nnx.split(model)`), or the flat list of its parameter leaves.
          version: the policy version of these weights.
          in_place: write into the engine's buffers and wait for it (see above).
          timeout_s: with `in_place`, how long to wait for the step thread.

        Raises:
          EngineError / EngineClosed: (`in_place`) the engine failed or was shut down first.
          TimeoutError: (`in_place`) the step thread did not take the weights in `timeout_s`.
        """
        model_def = self._runner.model_def
        if isinstance(state_or_model, nnx.Module):
            graphdef, state = nnx.split(state_or_model)
            if graphdef != model_def.graphdef:
                raise ValueError("update_weights: the model's structure differs from the engine's")
            leaves, treedef = jax.tree.flatten(state)
        elif isinstance(state_or_model, list):
            leaves, treedef = state_or_model, model_def.treedef
        else:
            leaves, treedef = jax.tree.flatten(state_or_model)
        placed = self._runner.check_and_place(leaves, treedef, cast=not in_place)
        if not in_place:
            self._runner.stage_weights(placed, version)
            self._wake.set()
            return
        if self._error is not None:
            raise EngineError(f"the engine failed: {type(self._error).__name__}: "
                              f"{self._error}") from self._error
        if self._closing:
            raise EngineClosed("the engine is shut down")
        if threading.current_thread() is self._thread:
            raise RuntimeError("update_weights(in_place=True) waits for the engine's step "
                               "thread: call it from another thread (or without in_place)")
        request = InPlace()
        self._runner.stage_weights(placed, version, request)
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        while not request.done.wait(0.05):
            if not self._thread.is_alive():  # died or stopped before taking them
                self._runner.drop_staged("the engine stopped")
            elif time.monotonic() > deadline:
                self._runner.drop_staged("timed out")
                raise TimeoutError(f"update_weights(in_place=True): the engine's step thread did "
                                   f"not take the weights within {timeout_s:g} s")
        if request.failure in (None, "superseded"):
            return
        if self._error is not None:
            raise EngineError(f"the engine failed: {type(self._error).__name__}: "
                              f"{self._error}") from self._error
        raise EngineClosed(f"update_weights(in_place=True): weights not written ({request.failure})")

    def wait_published(self, timeout_s: float | None = None) -> bool:
        """Blocks until weights staged by `update_weights` are swapped in (at the step thread's
        next step); False: `timeout_s` passed, or the engine stopped, first."""
        deadline = time.monotonic() + (float("inf") if timeout_s is None else timeout_s)
        want = self._runner.staged_count
        while self._runner.applied_count < want:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                return False
            self._wake.set()
            time.sleep(0.005)
        return True

    @property
    def mesh(self):
        """The mesh the engine is sharded over (None: one device)."""
        return self._runner.mesh

    @property
    def kv_cache_bytes_per_device(self) -> int:
        """Bytes of the KV cache on each device (`kv_cache_bytes` / the tensor-parallel size)."""
        return self._runner.kv_bytes_per_device()

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine decodes with now."""
        return self._sched.version

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

    @property
    def error(self) -> BaseException | None:
        """Why the step thread died (None while it runs or after a clean shutdown)."""
        return self._error

    @property
    def _weights(self) -> list:
        return self._runner.weights

    def stats(self) -> EngineStats:
        """A snapshot of the counters (cheap; safe from any thread)."""
        sched = self._sched
        busy, parked, free = sched.slot_counts()
        c = sched.counts
        return EngineStats(
            active_slots=busy,
            parked_slots=parked,
            free_slots=free,
            waiting_requests=len(sched.waiting) + self._inbox_submits,
            tokens_per_step=sched.tokens_per_step,
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
            policy_version=self._sched.version,
            compile_s=self._runner.compile_s,
            first_step_s=self._first_step_s,
            kv_pages_used=sched.pages_used(),
            kv_pages_peak=c["kv_pages_peak"],
            kv_sequences_peak=c["kv_sequences_peak"],
            prefix_hit_tokens=c["prefix_hit_tokens"],
            kv_pages_cached=len(sched.pool.lru),
        )

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Blocks until the step thread has compiled every kernel (`precompile=True`; at once
        otherwise) or stopped. True if the engine is compiled and running; False if it stopped
        (shut down or failed) or `timeout` seconds passed first. Lets other work that compiles
        wait for a free core (the CLI compiles its RL trainer's kernels after)."""
        return self._compiled.wait(timeout) and not self._closing

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
        # Checked under the inbox lock: once the step thread has failed what was left, the
        # inbox is sealed, so no request can slip in after it and wait forever.
        with self._inbox_lock:
            if self._error is not None and (check or self._sealed):
                if not check:
                    return
                raise EngineError(
                    f"the engine failed: {type(self._error).__name__}: {self._error}"
                ) from self._error
            if self._closing and (check or self._sealed):
                if not check:
                    return
                raise EngineClosed("the engine is shut down")
            self._inbox.append((kind, item))
            if kind == "submit":
                self._inbox_submits += 1
        self._wake.set()

    # ================================================================== step thread

    def _run(self) -> None:
        try:
            if self.config.precompile:
                _at_low_priority(self._runner.precompile)
            self._compiled.set()
            while True:
                self._wake.clear()
                self._drain_inbox()
                if self._closing:
                    break
                self._runner.apply_staged(lambda v: setattr(self._sched, "version", v))
                if self._paused:
                    self._wake.wait(self.config.idle_wait_s)
                    continue
                self._sched.admit()
                copies = self._sched.pool.take_copies()
                if copies:  # copy-on-write pages, before any kernel writes into them
                    self._runner.copy_pages(copies)
                worked = self._prefill()
                worked = self._decode() or worked
                if not worked:
                    self._wake.wait(self.config.idle_wait_s)
        except BaseException as exc:  # noqa: BLE001 - reported, and fails every request
            # One line: every waiting and later caller gets an EngineError chained to it (the
            # CLI's --debug shows the traceback); the full traceback is logged at debug level.
            log.error("agentax engine step loop failed: %s: %s", type(exc).__name__, exc)
            log.debug("engine step loop failure", exc_info=True)
            self._error = exc
        finally:
            self._closing = True
            self._compiled.set()
            self._runner.drop_staged("the engine stopped")  # an in-place caller returns
            if self._error is not None:
                err: BaseException = EngineError(
                    f"the engine step loop failed: {type(self._error).__name__}: {self._error}"
                )
                err.__cause__ = self._error
            else:
                err = EngineClosed("the engine was shut down before this request finished")
            self._fail_everything(err)

    def _fail_everything(self, err: BaseException) -> None:
        # _closing is set: _post refuses new work from here on, so the inbox only shrinks.
        with self._inbox_lock:
            self._sealed = True
            items = list(self._inbox)
            self._inbox.clear()
            self._inbox_submits = 0
        late = [item for kind, item in items if kind == "submit"]
        self._sched.fail_all(err, extra=late)

    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
            self._inbox_submits = 0
        sched = self._sched
        for kind, item in items:
            if kind == "submit":
                sched.accept(item)
            elif kind == "cancel":
                sched.cancel(item)
            elif kind == "release":
                sched.release(item)

    def _prefill(self) -> bool:
        plans = self._sched.plan_prefill()
        if not plans:
            return False
        # One span per iteration, ending when the first tokens are fetched: the calls are
        # dispatched back to back and run after their dispatch returns, so a span around each
        # dispatch alone would leave the device time out of the trace (the doctor's engine busy).
        with self._telemetry.span("PREFILL", calls=len(plans), rows=sum(len(p.rows) for p in plans),
                                  tokens=sum(p.num_tokens for p in plans)):
            out = [self._runner.prefill(plan, self._sched) for plan in plans]
            needed = [i for i, plan in enumerate(plans) if self._sched.prefill_needs_sample(plan)]
            fetched = dict(zip(needed, jax.device_get([out[i] for i in needed])))
        for i, plan in enumerate(plans):
            token, logprob = fetched.get(i, (None, None))
            self._sched.finish_prefill(plan, token, logprob, self._sched.version)
        return True

    def _decode(self) -> bool:
        plan = self._sched.plan_decode()
        if plan is None:
            return False
        sched = self._sched
        version = sched.version
        # The slot gauges are sampled as the call starts (what it decodes) and, once no row is
        # left decoding, after it: a gauge sampled only after each call showed the call's
        # count one call late and held it while the engine idled (e.g. a sync run's train steps).
        self._telemetry.counters(active=plan.active, waiting=len(sched.waiting),
                                 evictions=sched.counts["evictions"])
        with self._telemetry.span("DECODE_STEP", active=plan.active, steps=plan.steps):
            out_tok, out_lp, counts = self._runner.decode(plan, sched)
        if self._first_step_s is None:
            self._first_step_s = time.perf_counter() - self._start_time
        sched.finish_decode(plan, out_tok, out_lp, counts, version)
        if not sched.active.any():
            self._telemetry.counters(active=0, waiting=len(sched.waiting),
                                     evictions=sched.counts["evictions"])
        return True
