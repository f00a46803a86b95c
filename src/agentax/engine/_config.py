"""`EngineConfig` and `EngineStats`: how the generation engine is sized, and what it counts."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["EngineConfig", "EngineStats", "PAGE"]

PAGE = 16
"""Positions per page of the engine's KV cache (`EngineConfig.kv_cache_tokens`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Size and scheduling knobs of `Engine`. Every field is read by the engine."""

    max_slots: int = 16
    """Number of sequences decoded together (rows of a decode call; a sequence's KV lives in
    its pages, not in its slot)."""
    max_seq_len: int = 1024
    """Tokens one slot holds (prompt + all turns + generated); the last one is never fed."""
    prefill_chunk: int = 128
    """Longest prefill chunk; prompts are fed in chunks of at most this many tokens."""
    min_prefill_bucket: int = 16
    """Shortest prefill chunk shape; chunk shapes are powers of two from this to prefill_chunk."""
    max_prefill_rows: int = 0
    """Most requests prefilled together in one jitted call; 0 means max_slots.

    Row counts are padded to a power of two (capped at this value), so prefill compiles once
    per (row bucket, chunk bucket) pair that the traffic needs."""
    prefill_token_budget: int = 0
    """Bucketed prefill tokens (rows x chunk, as if in one call) of the rows prefilled between
    two decode calls; 0 means no limit beyond max_prefill_rows x prefill_chunk. An iteration
    always takes at least one row, so a lower budget trades refill speed for steadier decode
    latency."""
    decode_steps_per_call: int = 8
    """Decode steps fused into one jitted call (an on-device loop with on-device stop checks).

    8 measured fastest on CPU (docs/engine.md): one host round trip per 8 tokens per slot;
    a slot that finishes mid-call idles for the rest of that call."""
    max_stop_ids: int = 8
    """Capacity of the per-slot stop-id table (eos ids + SamplingParams.stop_ids)."""
    max_sequences: int = 65536
    """Parked sequences kept on the host; past this the least recently used one is forgotten."""
    kv_cache_tokens: int | Literal["auto"] = "auto"
    """KV positions the cache holds for all sequences together, as a pool of 16-token pages
    (the engine's only KV layout), so held memory follows the tokens: a sequence holds the
    pages its tokens fill (while a request runs, also those its max_tokens may fill); a
    finished one keeps its pages but not its slot, so parked conversations are bounded by
    pages, not max_slots. A request waits until its pages are free (parked sequences are
    evicted for them, least recently continued first). "auto": max_slots x the pages of one
    sequence of max_seq_len (every slot can run a whole one at once). A number: at least
    max_seq_len - 1. 0 is an error (it meant one row per slot, a layout that is gone: "auto"
    takes the same memory, up to a page per slot)."""
    prefix_sharing: bool = True
    """Requests whose prompts start with the same full 16-token pages
    share those pages instead of prefilling them again (a group's samples, a system prompt
    and tool list repeated across episodes). Pages a prefill wrote are indexed by their
    tokens and everything before them; a shared page is never written (copy on write for the
    one page a prompt ending on a page boundary must rewrite). Requests submitted together
    with the same prompt wait for the first one's prefill, then share it. Off: every prompt
    is prefilled."""
    prefix_version_bound: int = 0
    """How many policy versions shared KV may lag the engine's current weights: K/V computed
    under version v is reused only while `current - v <= prefix_version_bound` (0: only KV of
    the current weights, so a shared prompt is exactly what a fresh prefill would compute)."""
    tensor_parallel: int = 1
    """Devices the engine is sharded over (tensor parallelism): attention heads, MLP columns
    and rows and the vocabulary by the trainer's partition rules, the KV cache by kv heads, so
    each device holds about 1/N of the weights and of the cache. The N devices from the
    model's first one (or the mesh given to `Engine`). num_kv_heads must divide by N."""
    scan_layers: bool | Literal["auto"] = "auto"
    """Run the decoder layers in the engine's kernels as one `lax.scan` over weights and a KV
    cache held stacked along a layer axis (packed once per weight version), so kernel size
    and compile time do not grow with depth. "auto": for models of SCAN_AUTO_MIN_LAYERS (5)
    layers or more whose layers can be stacked (otherwise unrolled, logged why). True: scan
    or raise why not."""
    cache_dtype: str | None = None
    """KV-cache dtype; None uses the model's compute dtype."""
    precompile: bool = False
    """Compile every kernel shape (decode once; prefill per row bucket x chunk bucket; the
    copy-on-write page copies) when the engine starts, in its step thread (requests queue meanwhile), so
    that no request waits for a compilation later. Off: shapes compile the first time traffic
    needs them."""
    idle_wait_s: float = 0.05
    """How long the step thread sleeps when there is nothing to do (it is woken on new work)."""

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"EngineConfig: {msg}")

        need(self.max_slots >= 1, f"max_slots must be >= 1, got {self.max_slots}")
        need(self.max_seq_len >= 2, f"max_seq_len must be >= 2, got {self.max_seq_len}")
        need(
            self.min_prefill_bucket >= 1 and _is_pow2(self.min_prefill_bucket),
            f"min_prefill_bucket must be a power of two, got {self.min_prefill_bucket}",
        )
        need(
            _is_pow2(self.prefill_chunk) and self.prefill_chunk >= self.min_prefill_bucket,
            f"prefill_chunk must be a power of two >= min_prefill_bucket "
            f"({self.min_prefill_bucket}), got {self.prefill_chunk}",
        )
        need(self.prefill_token_budget >= 0, "prefill_token_budget must be >= 0")
        need(self.max_prefill_rows >= 0, "max_prefill_rows must be >= 0 (0 = max_slots)")
        need(self.decode_steps_per_call >= 1, "decode_steps_per_call must be >= 1")
        need(self.max_stop_ids >= 1, "max_stop_ids must be >= 1")
        need(self.max_sequences >= self.max_slots, "max_sequences must be >= max_slots")
        need(self.scan_layers in (True, False, "auto"),
             f"scan_layers must be True, False or 'auto', got {self.scan_layers!r}")
        need(self.tensor_parallel >= 1,
             f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        need(self.prefix_version_bound >= 0,
             f"prefix_version_bound must be >= 0, got {self.prefix_version_bound}")
        need(self.kv_cache_tokens != 0,
             "kv_cache_tokens=0 (one cache row per slot) is no longer supported: the KV cache "
             "is always paged; use 'auto' (the pages of max_slots sequences of max_seq_len, "
             "the rows' memory) or a number of positions")
        need(self.kv_cache_tokens == "auto" or (
            isinstance(self.kv_cache_tokens, int) and not isinstance(self.kv_cache_tokens, bool)
            and self.kv_cache_tokens >= self.max_seq_len - 1),
             f"kv_cache_tokens={self.kv_cache_tokens!r} cannot hold one sequence of max_seq_len="
             f"{self.max_seq_len}: set it to 'auto' (pages for max_slots x max_seq_len) or "
             f">= {self.max_seq_len - 1}")

    @property
    def kv_pages(self) -> int:
        """Pages of the KV cache (`kv_cache_tokens` with "auto" resolved: max_slots x the
        pages of the max_seq_len - 1 positions a sequence may write)."""
        if self.kv_cache_tokens == "auto":
            return self.max_slots * -(-(self.max_seq_len - 1) // PAGE)
        return -(-self.kv_cache_tokens // PAGE)

    @property
    def prefill_buckets(self) -> tuple[int, ...]:
        """The chunk lengths prefill compiles for (powers of two)."""
        out, b = [], self.min_prefill_bucket
        while b <= self.prefill_chunk:
            out.append(b)
            b *= 2
        return tuple(out)

    @property
    def prefill_rows(self) -> int:
        """Most rows of one prefill call."""
        return min(self.max_prefill_rows or self.max_slots, self.max_slots)

    @property
    def prefill_row_buckets(self) -> tuple[int, ...]:
        """Row counts prefill compiles for: powers of two below prefill_rows, then prefill_rows."""
        out, r = [], 1
        while r < self.prefill_rows:
            out.append(r)
            r *= 2
        return (*out, self.prefill_rows)

    @property
    def token_budget(self) -> int:
        """Bucketed tokens (rows x chunk, as if in one call) one iteration's prefill may take."""
        return self.prefill_token_budget or self.prefill_rows * self.prefill_chunk

    def kernel_shapes(self) -> list[tuple]:
        """Every kernel shape traffic can meet (what `precompile` compiles): ("decode",), and
        ("prefill", rows, chunk) per row bucket and chunk bucket (attention reads each row's
        own pages, so no span is compiled in), and with prefix sharing ("copy", n), the
        copy-on-write page copies, per power of two up to max_slots. Its length is the
        engine's compilation count at most."""
        # Copy-on-write page copies: one per sequence admitted, padded to a power of two.
        copies = [("copy", 1 << i) for i in range((self.max_slots - 1).bit_length() + 1)] \
            if self.prefix_sharing else []
        return [("decode",)] + [("prefill", rows, chunk)
                                for rows in self.prefill_row_buckets
                                for chunk in self.prefill_buckets] + copies

    def row_bucket(self, rows: int) -> int:
        return next(b for b in self.prefill_row_buckets if b >= rows)

    def chunk_bucket(self, tokens: int) -> int:
        return next(b for b in self.prefill_buckets if b >= tokens)


def _is_pow2(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineStats:
    """A snapshot of the engine's counters (plain numbers)."""

    active_slots: int
    """Slots holding a request that is prefilling or decoding."""
    parked_slots: int
    """Finished sequences whose pages are kept for a continuation (they hold no slot)."""
    free_slots: int
    waiting_requests: int
    """Requests submitted but not yet given a slot."""
    tokens_per_step: float
    """Tokens generated per decode step in the last decode call (= active slots then)."""
    evictions: int
    """Parked sequences whose cache was dropped to make room (re-prefilled if continued)."""
    total_tokens: int
    """Generated tokens returned in completions."""
    prefill_tokens: int
    """Tokens fed through prefill (re-prefills after eviction included)."""
    steps: int
    """Decode steps run (a decode call runs up to decode_steps_per_call of them)."""
    decode_calls: int
    completed: int
    """Requests resolved with a completion."""
    failed: int
    """Requests resolved with an error (too long, cancelled, engine failure)."""
    num_compiles: int
    policy_version: int
    prefill_calls: int = 0
    """Jitted prefill calls (each feeds one chunk of up to max_prefill_rows requests)."""
    occupancy: float = 0.0
    """Generated tokens over slot-steps run (decode steps x max_slots) since construction."""
    compile_s: float = 0.0
    """Wall time of kernel calls that compiled (precompile included) since construction."""
    first_step_s: float | None = None
    """Seconds from construction to the end of the first decode call (None before it)."""
    kv_pages_used: int = 0
    """Pages of the KV cache held by sequences now."""
    kv_pages_peak: int = 0
    """The most pages held at once since construction."""
    kv_sequences_peak: int = 0
    """The most sequences holding pages at once (running or parked) since construction."""
    prefix_hit_tokens: int = 0
    """Prompt tokens served from shared pages instead of prefilled (`prefix_sharing`)."""
    kv_pages_cached: int = 0
    """Indexed pages nobody holds now: kept for later prompts, reused last when pages run out."""
