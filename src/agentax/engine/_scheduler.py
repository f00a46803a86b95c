"""The engine's host-side scheduler: sequences, slots, admission, eviction, prefill planning,
and the bookkeeping of sampled tokens (finish reasons, stop strings).

Pure Python and numpy: it imports no JAX, so its tests run in milliseconds and need no
device. It decides *what* runs; the device runner (`_runner.py`) executes its plans:

* `plan_prefill()` -> this iteration's `PrefillPlan`s (rows, tokens, positions, slots) and `finish_prefill(plan, tokens, logprobs)` for each, with the first
  sampled token of each prompt;
* `plan_decode()` -> `DecodePlan` (the packed per-slot state, steps) and
  `finish_decode(plan, tokens, logprobs, counts, version)` with what the device sampled.

Requests are resolved through the `resolve(req, result=..., exc=...)` callback it is given.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentax.engine._config import PAGE, EngineConfig
from agentax.engine._pages import PagePool
from agentax.engine._prefix import PrefixSharing
from agentax.engine._requests import (
    PromptTooLong,
    SequenceError,
    _emit_tokens,
    _Request,
    _Sequence,
)
from agentax.records import Completion, FinishReason

__all__ = ["Scheduler", "PrefillPlan", "DecodePlan"]

_STOP_WINDOW_PER_CHAR = 4
"""Tokens kept before the new ones when searching for a stop string, per character of the
longest stop string: a character is at most 4 UTF-8 bytes, i.e. 4 byte-level tokens."""


@dataclasses.dataclass
class PrefillPlan:
    """One prefill call: R rows (R a row bucket), C tokens each (C a chunk bucket)."""

    rows: list[tuple[_Request, int]]
    """The real rows: each request and how many of its pending tokens this call feeds."""
    tokens_rc: np.ndarray
    positions_rc: np.ndarray
    """Absolute positions; padding carries max_seq_len (writes nothing). Rows are
    right-aligned: each row's last token (after which its next one is sampled) is in the
    last column."""
    slots_r: np.ndarray
    sampling_r: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    """(temperature, top_k, top_p, seed) of each row."""
    num_tokens: int


@dataclasses.dataclass
class DecodePlan:
    """One decode call over every slot."""

    state_4s: np.ndarray
    """[4, S] int32: pending token, its position, active flag, tokens still allowed."""
    steps: int
    active: int


def _unresolved(req: _Request, *, result: Any = None, exc: BaseException | None = None) -> None:
    """The default `resolve`: keeps the outcome on the request (no event loop involved)."""
    req.result, req.error = result, exc


def _prefill_groups(lengths: list[int], config: EngineConfig) -> list[int]:
    """Splits rows of `lengths` tokens (longest first) into consecutive prefill calls: the
    sizes of the groups that minimise the padded tokens of all calls (each padded to its row
    bucket and the chunk bucket of its longest row) plus `prefill_chunk` tokens per call.

    On CPU a padding token costs as much as a real one and a call about one full row more
    (tiny model, 64-token rows: 3.4 / 5.8 / 10.0 / 17.3 / 30.2 ms for 2 / 4 / 8 / 16 / 32
    rows), so 9 rows run as 8 + 1 rather than 16, and 32 prompts of 16..64 tokens as a call
    of 64-token rows and one of 32-token rows. Group sizes tried: row buckets, and the rest.
    """
    n = len(lengths)
    best, size_at = [0] * (n + 1), [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        chunk = config.chunk_bucket(lengths[i])
        best[i] = -1
        for size in sorted({n - i, *(b for b in config.prefill_row_buckets if b < n - i)},
                           reverse=True):  # on a tie, fewer calls
            cost = config.row_bucket(size) * chunk + config.prefill_chunk + best[i + size]
            if best[i] < 0 or cost < best[i]:
                best[i], size_at[i] = cost, size
    sizes, i = [], 0
    while i < n:
        sizes.append(size_at[i])
        i += size_at[i]
    return sizes


def pages_for(tokens: int) -> int:
    """Pages that hold `tokens` positions."""
    return -(-tokens // PAGE)


class Scheduler(PrefixSharing):
    """Host state of the engine: who sits in which slot, what runs next, what finished.

    It also owns the KV cache's pages (`EngineConfig.kv_cache_tokens`): a request is
    admitted once the pages its sequence may fill are reserved (`_reserve`), and
    `page_table[slot]` lists the pages of the sequence in that slot, in position order. A
    finished sequence keeps its pages but not its slot (slots are decode rows; a continuation
    takes any free one), so parked conversations are bounded by pages, not by max_slots.

    Args:
      config: the engine's sizes.
      eos_token_ids: ids that end every completion.
      decode: `ids -> str` (the tokenizer's decode); needed only for stop strings.
      resolve: called once per request with `result=` a Completion or `exc=` an error.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        eos_token_ids: Sequence[int] = (),
        decode: Callable[[list[int]], str] | None = None,
        resolve: Callable[..., None] = _unresolved,
    ):
        self.config = cfg = config
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        self._decode_text = decode
        self._resolve = resolve
        s = cfg.max_slots
        # Per-slot decode inputs (the host mirror of what the device decodes with).
        self.tok = np.zeros(s, np.int32)
        self.pos = np.zeros(s, np.int32)
        self.active = np.zeros(s, bool)
        self.remaining = np.zeros(s, np.int32)
        self.temperature = np.ones(s, np.float32)
        self.top_k = np.zeros(s, np.int32)
        self.top_p = np.ones(s, np.float32)
        self.seed = np.zeros(s, np.uint32)
        self.stop_table = np.full((s, cfg.max_stop_ids), -1, np.int32)
        self.sampling_version = 0
        """Bumped whenever a slot's sampling settings or stop ids change (runner re-sends)."""
        self.slot_seq: list[_Sequence | None] = [None] * s
        self.pool = PagePool(cfg.kv_pages, sharing=cfg.prefix_sharing,
                             version_bound=cfg.prefix_version_bound)
        self.version = 0
        """The policy version the engine decodes with now (prefix reuse is checked against it)."""
        self.page_table = np.zeros((s, pages_for(cfg.max_seq_len)), np.int32)
        self.table_version = 0
        """Bumped whenever `page_table` changes (the runner re-sends it)."""
        self.holders = 0
        """Sequences holding pages now (running or parked)."""
        self._inflight: dict[int, _Request] = {}
        """Prefix keys being prefilled now -> the request prefilling them."""

        self.sequences: collections.OrderedDict[int, _Sequence] = collections.OrderedDict()
        self._next_sequence_id = 1
        self._use_clock = 0
        self.waiting: collections.deque[_Request] = collections.deque()
        self.prefilling: collections.deque[_Request] = collections.deque()
        self.counts: collections.Counter = collections.Counter()
        self.tokens_per_step = 0.0

    # ------------------------------------------------------------------ inbox

    def accept(self, req: _Request) -> None:
        """Attaches a submitted request to its (new or continued) sequence and queues it."""
        t_max = self.config.max_seq_len
        if req.sequence_id is None:
            seq = _Sequence(id=self._next_sequence_id, tokens=[])
            self._next_sequence_id += 1
            self.sequences[seq.id] = seq
            self._forget_old_sequences()
        else:
            seq = self.sequences.get(req.sequence_id)
            if seq is None:
                return self.fail(req, SequenceError(
                    f"unknown sequence_id {req.sequence_id}: it was released, cancelled, or "
                    f"forgotten (EngineConfig.max_sequences={self.config.max_sequences})"
                ))
            if seq.request is not None:
                return self.fail(req, SequenceError(
                    f"sequence {seq.id} already has a request in flight; await it first"
                ))
            if len(seq.tokens) + req.ids.size >= t_max:
                return self.fail(req, PromptTooLong(
                    f"sequence {seq.id} holds {len(seq.tokens)} tokens; {req.ids.size} more "
                    f"leave no room in a slot of max_seq_len={t_max}"
                ))
            self.sequences.move_to_end(seq.id)
        req.seq = seq
        seq.request = req
        seq.tokens.extend(int(i) for i in req.ids)
        self.waiting.append(req)

    def cancel(self, req: _Request) -> None:
        if req.done:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.prefilling:
            self.prefilling.remove(req)
        if req.seq is None:  # cancelled before it was accepted
            req.done = True
            return
        self.fail(req, asyncio.CancelledError())

    def release(self, sequence_id: int) -> None:
        seq = self.sequences.get(sequence_id)
        if seq is None:
            return
        if seq.request is not None:
            seq.release_when_done = True
        else:
            self._drop_sequence(seq)

    def _forget_old_sequences(self) -> None:
        while len(self.sequences) > self.config.max_sequences:
            for seq in self.sequences.values():
                if seq.request is None:
                    self._drop_sequence(seq)
                    break
            else:
                return

    # ------------------------------------------------------------------ admission

    def admit(self) -> None:
        """Gives waiting requests a free slot and their pages, FIFO; a parked continuation
        keeps its pages (what they hold is not prefilled again). A request that cannot have
        its slot or its pages stops admission until they are freed (FIFO)."""
        for req in list(self.waiting):
            seq = req.seq
            if self._waits_for_prefix(req):
                continue
            slot = self._find_slot()
            if slot is None:
                return  # FIFO: later requests wait behind this one
            seq.slot = slot
            if not seq.pages:  # a parked sequence keeps what its pages hold
                seq.cached = 0
                self._attach_prefix(req)
            self.slot_seq[slot] = seq
            if not self._reserve(req):
                self.slot_seq[slot] = None  # keeps no slot while it waits
                seq.slot = None
                return
            self.waiting.remove(req)
            self._start(req)

    def _find_slot(self) -> int | None:
        """A free slot (a slot is held only while a request runs in it), or None."""
        return next((slot for slot, seq in enumerate(self.slot_seq) if seq is None), None)

    def _evict(self, seq: _Sequence) -> None:
        """Drops a sequence's cache (slot and pages); continued, it is prefilled again."""
        if seq.slot is not None:
            self.slot_seq[seq.slot] = None
        seq.slot, seq.cached = None, 0
        self._free_pages(seq, 0)
        self.counts["evictions"] += 1

    def _free_pages(self, seq: _Sequence, keep: int) -> None:
        if len(seq.pages) > keep:
            for page in seq.pages[keep:]:
                self.pool.drop(page)
            del seq.pages[keep:], seq.keys[keep:]
            self.holders -= not seq.pages

    @property
    def free_pages(self) -> list[int]:
        """Pages nobody holds and no prefix entry names."""
        return self.pool.free

    def _reserve(self, req: _Request) -> bool:
        """Gives `req`'s sequence (which was just given a slot) the pages of
        every position the request may write, evicting caches that no running request needs:
        parked sequences (the least recently continued first: `sequences` is kept in that
        order, so the scan stops at the first), then those of requests waiting behind (they
        wait anyway, and are prefilled again when admitted). False if that is not enough."""
        seq = req.seq
        written = min(len(seq.tokens) + req.params.max_tokens - 1, self.config.max_seq_len - 1)
        need = pages_for(written) - len(seq.pages)
        while self.pool.available() < need:
            parked = next((q for q in self.sequences.values() if q.request is None and q.pages),
                          None)
            if parked is not None:
                self._evict(parked)
                continue
            behind = [q.seq for q in reversed(self.waiting) if q.seq is not seq and q.seq.pages]
            if not behind:
                return False
            self._evict(behind[0])
        if need > 0:
            self.holders += not seq.pages
            seq.pages.extend(self.pool.take() for _ in range(need))
            c = self.counts
            c["kv_pages_peak"] = max(c["kv_pages_peak"], self.pages_used())
            c["kv_sequences_peak"] = max(c["kv_sequences_peak"], self.holders)
        self.page_table[seq.slot, : len(seq.pages)] = seq.pages
        self.table_version += 1
        return True

    def pages_used(self) -> int:
        """Pages held by sequences."""
        return self.pool.used()

    def _start(self, req: _Request) -> None:
        seq, slot, p = req.seq, req.seq.slot, req.params
        req.admit_time = time.perf_counter()
        req.pending = seq.tokens[seq.cached:]
        req.prefill_start = seq.cached
        self._mark_inflight(req)
        self.temperature[slot] = p.temperature
        self.top_k[slot] = p.top_k
        self.top_p[slot] = p.top_p
        self.seed[slot] = p.seed & 0xFFFFFFFF
        self.stop_table[slot] = -1
        self.stop_table[slot, : len(req.stop_set)] = sorted(req.stop_set)
        self.active[slot] = False
        self.sampling_version += 1
        self.prefilling.append(req)

    # ------------------------------------------------------------------ prefill

    def plan_prefill(self) -> list[PrefillPlan]:
        """This iteration's prefill calls: the first requests waiting for prefill (FIFO), one
        row each of at most `prefill_chunk` tokens, within the token budget; empty when
        nothing waits. The rows go to one call, or to several when that pads less
        (`_prefill_groups`: 9 rows run as 8 + 1, not 16; short prompts share a call of
        short rows)."""
        if not self.prefilling:
            return []
        cfg = self.config
        rows: list[tuple[_Request, int]] = []
        chunk = 0
        for req in self.prefilling:
            n = min(len(req.pending), cfg.prefill_chunk)
            c = max(chunk, cfg.chunk_bucket(n))
            if rows and cfg.row_bucket(len(rows) + 1) * c > cfg.token_budget:
                break
            rows.append((req, n))
            chunk = c
            if len(rows) == cfg.prefill_rows:
                break
        rows.sort(key=lambda row: -row[1])  # one iteration's calls: their order is free
        sizes = _prefill_groups([n for _, n in rows], cfg)
        plans, first = [], 0
        for size in sizes:
            plans.append(self._prefill_call(rows[first: first + size]))
            first += size
        return plans

    def _prefill_call(self, rows: list[tuple[_Request, int]]) -> PrefillPlan:
        cfg = self.config
        r, t_max = cfg.row_bucket(len(rows)), cfg.max_seq_len
        chunk = cfg.chunk_bucket(max(n for _, n in rows))
        tokens = np.zeros((r, chunk), np.int32)
        positions = np.full((r, chunk), t_max, np.int32)  # padding writes nothing
        slots = np.zeros(r, np.int32)
        for i, (req, n) in enumerate(rows):
            seq = req.seq
            tokens[i, chunk - n:] = req.pending[:n]
            positions[i, chunk - n:] = np.arange(seq.cached, seq.cached + n)
            slots[i] = seq.slot
        sampling = (self.temperature[slots], self.top_k[slots], self.top_p[slots],
                    self.seed[slots])
        return PrefillPlan(
            rows=rows, tokens_rc=tokens, positions_rc=positions, slots_r=slots,
            sampling_r=sampling, num_tokens=sum(n for _, n in rows),
        )

    def finish_prefill(self, plan: PrefillPlan, tokens_r=None, logprobs_r=None,
                       version: int = 0) -> None:
        """Advances the rows of a prefill call; rows whose prompt is done get their first
        sampled token (`tokens_r`/`logprobs_r` are needed only if `prefill_needs_sample`)."""
        self.counts["prefill_calls"] += 1
        self.counts["prefill_tokens"] += plan.num_tokens
        self.counts["prefill_padded_tokens"] += plan.tokens_rc.size
        for req, n in plan.rows:
            del req.pending[:n]
            req.seq.cached += n
            if self.pool.sharing:
                req.prefill_version = min(version, req.prefill_version
                                          if req.prefill_version is not None else version)
                self._register_pages(req)
        if not any(not req.pending for req, _ in plan.rows):
            return
        self.prefilling = collections.deque(q for q in self.prefilling if q.pending)
        for i, (req, _) in enumerate(plan.rows):
            if req.pending or req.done:
                continue
            seq, slot = req.seq, req.seq.slot
            if not self.record(req, tokens_r[i: i + 1], logprobs_r[i: i + 1], version):
                self.pos[slot] = seq.cached
                self.tok[slot] = seq.tokens[-1]
                self.remaining[slot] = req.params.max_tokens - len(req.out_tokens)
                self.active[slot] = True

    @staticmethod
    def prefill_needs_sample(plan: PrefillPlan) -> bool:
        """Whether a row of this call ends its prompt (its sampled token must be fetched)."""
        return any(len(req.pending) == n for req, n in plan.rows)

    # ------------------------------------------------------------------ decode

    def plan_decode(self) -> DecodePlan | None:
        """The next decode call over every slot; None when no slot is decoding."""
        if not self.active.any():
            return None
        state = np.stack([self.tok, self.pos, self.active.astype(np.int32), self.remaining])
        return DecodePlan(state_4s=state, steps=self.config.decode_steps_per_call,
                          active=int(self.active.sum()))

    def finish_decode(self, plan: DecodePlan, tokens_sn: np.ndarray, logprobs_sn: np.ndarray,
                      counts_s: np.ndarray, version: int) -> None:
        """Appends what a decode call sampled: `counts_s[s]` tokens of row s of `tokens_sn`."""
        n_steps = int(counts_s.max())
        c = self.counts
        c["decode_calls"] += 1
        c["steps"] += n_steps
        c["slot_steps"] += n_steps * len(self.tok)
        c["decode_tokens"] += int(counts_s.sum())
        self.tokens_per_step = float(counts_s.sum()) / max(n_steps, 1)
        emitted = np.flatnonzero(counts_s)
        self.pos[emitted] += counts_s[emitted]
        self.remaining[emitted] -= counts_s[emitted]
        for slot in emitted:
            n = int(counts_s[slot])
            seq = self.slot_seq[slot]
            seq.cached += n
            if self.record(seq.request, tokens_sn[slot, :n], logprobs_sn[slot, :n], version):
                continue
            self.tok[slot] = seq.tokens[-1]

    # ------------------------------------------------------------------ completion

    def record(self, req: _Request, tokens, logprobs, version: int) -> bool:
        """Appends sampled tokens to a request; finishes it if they end it. True if finished."""
        seq = req.seq
        n_before = len(req.out_tokens)
        tokens = np.asarray(tokens).tolist()  # Python ints, in one call
        req.out_tokens.extend(tokens)
        req.out_logprobs.extend(np.asarray(logprobs).tolist())
        req.out_versions.extend([version] * len(tokens))
        seq.tokens.extend(tokens)
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
        if req.on_tokens is not None and len(req.out_tokens) > n_before:
            _emit_tokens(req, n_before)  # streamed (Engine.stream) before it is resolved
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
        """Output tokens up to and including the one completing a stop string (None: no stop).

        Incremental: only the new tokens and a window before them (enough tokens to hold the
        longest stop string) are decoded, so the cost per call does not grow with the output.
        """
        stops = req.params.stop_strings
        out = req.out_tokens
        window = _STOP_WINDOW_PER_CHAR * max(map(len, stops)) + 4
        start = max(0, n_before - window)
        if not any(s in self._decode_text(out[start:]) for s in stops):
            return None
        for k in range(n_before + 1, len(out) + 1):
            text = self._decode_text(out[start:k])
            if any(s in text for s in stops):
                return k
        return len(out)

    def _finish(self, req: _Request, reason: FinishReason) -> None:
        seq = req.seq
        now = time.perf_counter()
        req.done = True
        seq.request = None
        self._clear_inflight(req)
        self._use_clock += 1
        seq.last_used = self._use_clock
        if seq.slot is not None:  # parked in its pages; the slot is free
            self.active[seq.slot] = False
            self._free_pages(seq, pages_for(seq.cached))  # the unused part of its reservation
            self.slot_seq[seq.slot] = None
            seq.slot = None
        self.counts["completed"] += 1
        self.counts["total_tokens"] += len(req.out_tokens)
        completion = Completion(
            token_ids=np.asarray(req.out_tokens, np.int32),
            logprobs=np.asarray(req.out_logprobs, np.float32),
            versions=np.asarray(req.out_versions, np.int32),
            finish_reason=reason,
            prompt_len=int(req.ids.size),
            cached_prompt_tokens=req.cached_prompt_tokens,
            sequence_id=seq.id,
            queue_time_s=(req.admit_time or now) - req.submit_time,
            total_time_s=now - req.submit_time,
        )
        if seq.release_when_done:
            self._drop_sequence(seq)
        self._resolve(req, result=completion)

    def fail(self, req: _Request, exc: BaseException) -> None:
        """Resolves one request with an error; its half-written sequence is forgotten."""
        req.done = True
        self._clear_inflight(req)
        self.counts["failed"] += 1
        seq = req.seq
        if seq is not None and seq.request is req:
            seq.request = None
            if seq.slot is not None:
                self.active[seq.slot] = False
            self._drop_sequence(seq)
        self._resolve(req, exc=exc)

    def fail_all(self, err: BaseException, extra: Sequence[_Request] = ()) -> None:
        """Fails every request not yet resolved (waiting, prefilling, decoding, and `extra`)."""
        pending = list(self.waiting) + list(extra) + list(self.prefilling)
        pending += [q.request for q in self.slot_seq if q is not None and q.request is not None]
        for req in pending:
            if not req.done:
                self.fail(req, err)
        self.waiting.clear()
        self.prefilling.clear()

    def _drop_sequence(self, seq: _Sequence) -> None:
        if seq.slot is not None:
            self.active[seq.slot] = False
            self.slot_seq[seq.slot] = None
            seq.slot = None
        self._free_pages(seq, 0)
        self.sequences.pop(seq.id, None)

    # ------------------------------------------------------------------ counters

    def slot_counts(self) -> tuple[int, int, int]:
        """(busy slots, parked sequences, free slots). A parked sequence (a finished turn
        whose pages are kept for its continuation) holds no slot."""
        busy = sum(1 for q in self.slot_seq if q is not None)
        parked = sum(1 for q in self.sequences.values() if q.request is None and q.pages)
        return busy, parked, len(self.slot_seq) - busy
