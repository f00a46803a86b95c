"""The host-side scheduler alone: admission, slots and pages, LRU eviction, prefill planning,
finish reasons and stop strings. No JAX, no device: the tests drive it with made-up sampled tokens."""

from __future__ import annotations

import collections

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agentax.engine._config import EngineConfig
from agentax.engine._requests import PromptTooLong, SequenceError, _Request
from agentax.engine._scheduler import Scheduler
from agentax.records import FinishReason, SamplingParams

CFG = EngineConfig(max_slots=3, max_seq_len=512, prefill_chunk=32, min_prefill_bucket=8,
                   decode_steps_per_call=4)


def request(ids, params=None, sequence_id=None, eos=()):
    params = params or SamplingParams(temperature=0.0, max_tokens=4)
    stop = frozenset(eos) | frozenset(params.stop_ids)
    return _Request(ids=np.asarray(ids, np.int32), params=params, sequence_id=sequence_id,
                    loop=None, future=None, submit_time=time.perf_counter(), stop_set=stop)


def prefill_all(sched, token=7):
    """Runs prefill plans until none is left, sampling `token` after every prompt."""
    plans = []
    while iteration := sched.plan_prefill():
        for plan in iteration:
            r = len(plan.slots_r)
            sched.finish_prefill(plan, np.full(r, token), np.zeros(r), version=0)
        plans += iteration
    return plans


def decode(sched, token_of_slot):
    """One decode call in which each active slot samples `token_of_slot(slot, step)`."""
    plan = sched.plan_decode()
    s, n = sched.config.max_slots, plan.steps
    tokens = np.array([[token_of_slot(i, j) for j in range(n)] for i in range(s)], np.int32)
    counts = np.where(sched.active, np.minimum(n, sched.remaining), 0).astype(np.int32)
    sched.finish_decode(plan, tokens, np.zeros((s, n)), counts, version=1)
    return plan


def test_fifo_admission_fills_free_slots_then_waits():
    sched = Scheduler(CFG)
    reqs = [request([i + 1] * (i + 2)) for i in range(5)]
    for r in reqs:
        sched.accept(r)
    sched.admit()
    assert [r.seq.slot for r in reqs[:3]] == [0, 1, 2]
    assert list(sched.waiting) == reqs[3:] and sched.slot_counts() == (3, 0, 0)
    [plan] = sched.plan_prefill()
    # One call, one row per request, padded to the row and chunk buckets.
    assert plan.tokens_rc.shape == (3, 8) and plan.num_tokens == 2 + 3 + 4
    # Longest first, right-aligned (each prompt's last token in the last column); padding
    # writes nothing.
    assert [req for req, _ in plan.rows] == reqs[2::-1]
    assert plan.positions_rc[2, :6].tolist() == [CFG.max_seq_len] * 6
    assert plan.positions_rc[0, 4:].tolist() == [0, 1, 2, 3]
    assert plan.tokens_rc[1, 5:].tolist() == [2, 2, 2]


def test_long_prompts_are_chunked_within_the_token_budget():
    cfg = EngineConfig(max_slots=4, max_seq_len=512, prefill_chunk=32, min_prefill_bucket=8,
                       prefill_token_budget=32)
    sched = Scheduler(cfg)
    reqs = [request(list(range(100))), request([1, 2, 3])]
    for r in reqs:
        sched.accept(r)
    sched.admit()
    plans = prefill_all(sched)
    # 100 tokens in chunks of 32; the budget (32 bucketed tokens) leaves room for one row of
    # 32, then for two rows of 8: the last 4 tokens and the short prompt share a call.
    assert [p.num_tokens for p in plans] == [32, 32, 32, 4 + 3]
    assert [p.tokens_rc.shape for p in plans] == [(1, 32)] * 3 + [(2, 8)]
    assert reqs[0].seq.cached == 100 and sched.active.tolist() == [True, True, False, False]
    assert sched.pos[0] == 100 and sched.tok[0] == 7  # sampled token pending at position 100


def test_prefill_rows_go_to_the_calls_that_pad_least():
    cfg = EngineConfig(max_slots=32, max_seq_len=512, prefill_chunk=32, min_prefill_bucket=8)
    sched = Scheduler(cfg)
    lengths = [20, 5, 30, 7, 12, 25, 9, 31, 6]  # 9 rows: one call of 16 x 32 would pad 7 rows
    for i, n in enumerate(lengths):  # distinct prompts: none waits to share another's pages
        sched.accept(request([i + 1] * n))
    sched.admit()
    plans = sched.plan_prefill()
    # Rows of up to 32, 16 and 8 tokens: 128 + 32 + 32 padded tokens and 3 x 32 per call
    # (288) against 16 x 32 + 32 (544) as one call.
    assert [p.tokens_rc.shape for p in plans] == [(4, 32), (2, 16), (4, 8)]
    assert [sorted(req.ids.size for req, _ in p.rows) for p in plans] == [
        [20, 25, 30, 31], [9, 12], [5, 6, 7]]
    for p in plans:
        sched.finish_prefill(p, np.full(len(p.slots_r), 7), np.zeros(len(p.slots_r)))
    assert sched.active.sum() == 9 and not sched.prefilling
    from agentax.engine._scheduler import _prefill_groups
    # Equal rows: one call unless padding costs more than the extra calls (a call = a row).
    assert [_prefill_groups([32] * n, cfg) for n in (2, 3, 5, 6, 7, 9, 12, 24, 25)] == [
        [2], [3], [4, 1], [4, 2], [7], [8, 1], [8, 4], [16, 8], [16, 8, 1]]


def test_decode_plan_packs_each_slot_state():
    sched = Scheduler(CFG)
    for n in (10, 64):
        sched.accept(request([1] * n, SamplingParams(temperature=0.0, max_tokens=100)))
    sched.admit()
    prefill_all(sched)
    plan = sched.plan_decode()
    # Pending token, its position, active flag, tokens still allowed (the prefill sampled one).
    assert plan.state_4s[:, :2].tolist() == [[7, 7], [10, 64], [1, 1], [99, 99]]
    assert plan.active == 2 and plan.steps == 4 and plan.state_4s[2, 2] == 0
    decode(sched, lambda s, j: 5)
    assert sched.plan_decode().state_4s[:, :2].tolist() == [[5, 5], [14, 68], [1, 1], [95, 95]]


def test_finish_reasons_eos_stop_id_length_and_slot_full():
    cfg = EngineConfig(max_slots=4, max_seq_len=20, prefill_chunk=16, decode_steps_per_call=4)
    sched = Scheduler(cfg, eos_token_ids=(2,))
    reqs = [
        request([1], SamplingParams(max_tokens=50), eos=(2,)),
        request([1], SamplingParams(max_tokens=50, stop_ids=(3,)), eos=(2,)),
        request([1], SamplingParams(max_tokens=3), eos=(2,)),
        request([1] * 15, SamplingParams(max_tokens=50), eos=(2,)),
    ]
    for r in reqs:
        sched.accept(r)
    sched.admit()
    prefill_all(sched, token=9)
    # The device stops a slot on a stop id; the scheduler sees the counts it returns.
    rows = {0: [9, 2, 9, 9], 1: [9, 9, 3, 9], 2: [9, 9, 9, 9], 3: [9, 9, 9, 9]}
    plan = sched.plan_decode()
    counts = np.array([2, 3, 2, 4], np.int32)
    sched.finish_decode(plan, np.array([rows[i] for i in range(4)]), np.zeros((4, 4)), counts, 1)
    reasons = [r.result.finish_reason for r in reqs]
    assert reasons == [FinishReason.EOS, FinishReason.STOP, FinishReason.LENGTH,
                       FinishReason.SLOT_FULL]
    assert [r.result.token_ids.tolist() for r in reqs[:3]] == [[9, 9, 2], [9, 9, 9, 3], [9, 9, 9]]
    assert reqs[3].result.num_tokens == 5 and reqs[0].result.versions.tolist() == [0, 1, 1]
    # Parked: each keeps its pages, no slot.
    assert not sched.active.any() and sched.slot_counts() == (0, 4, 4)


def test_lru_eviction_and_continuation_of_a_parked_sequence():
    # 3 pages of 16 positions; each sequence here fits in one.
    cfg = EngineConfig(max_slots=3, max_seq_len=32, prefill_chunk=32, min_prefill_bucket=8,
                       decode_steps_per_call=4, kv_cache_tokens=48)
    sched = Scheduler(cfg)
    first = [request([i + 1, i + 2]) for i in range(3)]
    for r in first:
        sched.accept(r)
    sched.admit()
    prefill_all(sched)
    while sched.active.any():
        decode(sched, lambda s, j: 40 + s)
    ids = [r.result.sequence_id for r in first]
    assert not sched.free_pages and sched.slot_counts() == (0, 3, 3)
    # Continue sequence 2 first and sequence 0 next: sequence 1 becomes least recently used.
    for sid in (ids[2], ids[0]):
        cont = request([50], sequence_id=sid)
        sched.accept(cont)
        sched.admit()
        assert cont.seq.slot is not None and sched.counts["evictions"] == 0
        assert cont.pending == [cont.seq.tokens[-2], 50]  # the last sampled token + the new one
        prefill_all(sched)
        while sched.active.any():
            decode(sched, lambda s, j: 60)
    newcomer = request([9, 9, 9])
    sched.accept(newcomer)
    sched.admit()
    assert newcomer.seq.slot is not None and sched.counts["evictions"] == 1
    assert first[1].seq.pages == [] and first[0].seq.pages and first[2].seq.pages
    # The evicted sequence's history stays: continuing it re-prefills everything.
    back = request([70], sequence_id=ids[1])
    sched.accept(back)
    sched.admit()  # evicts the least recently used parked one (sequence 2)
    assert back.seq.slot is not None and back.pending == first[1].seq.tokens
    assert sched.counts["evictions"] == 2 and first[2].seq.pages == [] and first[0].seq.pages


def test_errors_cancel_release_and_fail_all():
    sched = Scheduler(CFG)
    sched.accept(bad := request([1], sequence_id=999))
    assert isinstance(bad.error, SequenceError) and "unknown sequence_id 999" in str(bad.error)
    a = request([1, 2])
    sched.accept(a)
    sched.admit()
    prefill_all(sched)
    sched.accept(busy := request([3], sequence_id=a.seq.id))
    assert isinstance(busy.error, SequenceError) and "in flight" in str(busy.error)
    while sched.active.any():
        decode(sched, lambda s, j: 4)
    sched.accept(long := request(list(range(CFG.max_seq_len)), sequence_id=a.result.sequence_id))
    assert isinstance(long.error, PromptTooLong)
    sched.release(a.result.sequence_id)
    assert sched.slot_counts() == (0, 0, 3) and a.result.sequence_id not in sched.sequences
    b, c = request([5]), request([6])
    for r in (b, c):
        sched.accept(r)
    sched.admit()
    sched.cancel(b)
    assert b.done and sched.counts["failed"] == 4 and sched.slot_counts() == (1, 0, 2)
    boom = RuntimeError("device lost")
    sched.fail_all(boom)
    assert c.error is boom and not sched.waiting and not sched.prefilling


class CountingDecoder:
    """A byte-level decode that counts how many tokens it was asked to decode."""

    def __init__(self):
        self.decoded = 0

    def __call__(self, ids):
        self.decoded += len(ids)
        return bytes(ids).decode("utf-8", errors="replace")


def test_stop_strings_are_found_incrementally():
    text = ("abcdefgh" * 300 + "STOP" + "tail" * 4).encode()
    dec = CountingDecoder()
    sched = Scheduler(EngineConfig(max_slots=1, max_seq_len=4096, decode_steps_per_call=8),
                      decode=dec)
    req = request([1], SamplingParams(max_tokens=4000, stop_strings=("STOP",)))
    sched.accept(req)
    sched.admit()
    prefill_all(sched, token=text[0])
    i = 1
    while sched.active.any():
        decode(sched, lambda s, j: text[i + j])
        i += 8
    out = req.result
    assert out.finish_reason == FinishReason.STOP
    assert bytes(out.token_ids.tolist()).endswith(b"hSTOP") and out.num_tokens == 2404
    # Linear work: each call decodes its 8 new tokens and a bounded window before them
    # (re-decoding the whole output every call would be ~2400^2 / 16 = 360k tokens).
    assert dec.decoded < 40 * out.num_tokens


def test_scheduler_and_these_tests_import_no_jax():
    here = Path(__file__).parent
    code = (
        "import sys; sys.path.insert(0, %r); import test_scheduler as t\n"
        "for name in dir(t):\n"
        "    if name.startswith('test_') and 'import_no_jax' not in name: getattr(t, name)()\n"
        "assert 'jax' not in sys.modules, 'the scheduler imported jax'\n"
        "import agentax.engine\n"
        "assert 'jax' not in sys.modules, 'agentax.engine imported jax eagerly'\n"
        "print('ok')\n" % str(here)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# ---------------------------------------------------------------------- paged cache

PAGED = EngineConfig(max_slots=4, max_seq_len=64, prefill_chunk=32, min_prefill_bucket=8,
                     decode_steps_per_call=4, kv_cache_tokens=64)


def finish_all(sched, token=5):
    prefill_all(sched, token)
    while sched.active.any():
        decode(sched, lambda s, j: token)


def assert_pages_consistent(sched):
    """Each page is held as often as sequences list it; free, cached and held pages add up."""
    sched.pool.check()
    held = collections.Counter(p for seq in sched.sequences.values() for p in seq.pages)
    assert all(sched.pool.refs[p] == n for p, n in held.items())
    assert set(held) == {p for p, n in enumerate(sched.pool.refs) if n}
    assert (len(held) + len(sched.free_pages) + len(sched.pool.lru)
            == sched.config.kv_pages)
    assert sched.holders == sum(1 for seq in sched.sequences.values() if seq.pages)
    for seq in sched.sequences.values():
        if seq.slot is not None:  # running: its slot's row of the table lists its pages
            assert sched.page_table[seq.slot, : len(seq.pages)].tolist() == seq.pages


def test_paged_admission_reserves_pages_waits_fifo_and_keeps_only_what_was_written():
    sched = Scheduler(PAGED)  # 4 pages of 16 positions
    a = request([1] * 10, SamplingParams(max_tokens=10))  # may write 10 + 9 positions: 2 pages
    b = request([2] * 20, SamplingParams(max_tokens=20))  # 20 + 19: 3 pages
    c = request([3], SamplingParams(max_tokens=4))  # 1 page, but it queues behind b
    for r in (a, b, c):
        sched.accept(r)
    sched.admit()
    assert len(a.seq.pages) == 2 and sched.pages_used() == 2
    assert list(sched.waiting) == [b, c] and b.seq.slot is None and c.seq.slot is None
    assert_pages_consistent(sched)
    finish_all(sched)
    # a wrote 10 + 9 positions and keeps their 2 pages, parked, without a slot; b's 3 evict it.
    assert a.result.num_tokens == 10 and len(a.seq.pages) == 2 and a.seq.slot is None
    assert sched.slot_counts() == (0, 1, 4)
    sched.admit()
    assert sched.counts["evictions"] == 1 and a.seq.pages == [] and a.seq.slot is None
    assert len(b.seq.pages) == 3 and len(c.seq.pages) == 1 and not sched.waiting
    assert_pages_consistent(sched)
    finish_all(sched)
    # c used 1 + 3 positions of its page; b 20 + 19 of its 3. A release frees them.
    assert sched.pages_used() == 4 and sched.counts["kv_pages_peak"] == 4
    sched.release(c.result.sequence_id)
    assert sched.pages_used() == 3
    assert_pages_consistent(sched)


def test_paged_parked_sequences_hold_pages_not_slots():
    sched = Scheduler(PAGED)  # 4 slots, 4 pages
    first = [request([i + 1] * 3, SamplingParams(max_tokens=2)) for i in range(4)]
    for r in first:
        sched.accept(r)
    sched.admit()
    finish_all(sched)
    assert sched.slot_counts() == (0, 4, 4) and sched.holders == 4
    # Two new conversations: slots are free, pages are not (LRU parked ones go) ...
    more = [request([9], SamplingParams(max_tokens=2)) for _ in range(2)]
    for r in more:
        sched.accept(r)
    sched.admit()
    assert sched.counts["evictions"] == 2 and first[0].seq.pages == [] == first[1].seq.pages
    finish_all(sched)
    # ... and a parked one continues on whatever slot is free, its cache intact.
    cont = request([7], SamplingParams(max_tokens=2), sequence_id=first[3].seq.id)
    sched.accept(cont)
    sched.admit()
    assert cont.pending == cont.seq.tokens[-2:] and cont.seq.cached == 4
    assert sched.page_table[cont.seq.slot, 0] == cont.seq.pages[0]
    assert_pages_consistent(sched)
    finish_all(sched)
    assert cont.result.num_tokens == 2 and sched.counts["evictions"] == 2


def test_paged_continuations_that_cannot_both_fit_do_not_deadlock():
    sched = Scheduler(PAGED)
    first = [request([i + 1] * 20, SamplingParams(max_tokens=4)) for i in range(2)]
    for r in first:
        sched.accept(r)
    sched.admit()
    finish_all(sched)
    assert [len(r.seq.pages) for r in first] == [2, 2] and not sched.free_pages
    # Both continue and each needs a third page: neither is parked (both have a request), so
    # the first evicts the cache of the one waiting behind it, which is prefilled again later.
    conts = [request([9] * 10, SamplingParams(max_tokens=10), sequence_id=r.seq.id)
             for r in first]
    for r in conts:
        sched.accept(r)
    sched.admit()
    assert len(conts[0].seq.pages) == 3 and conts[1].seq.slot is None
    assert list(sched.waiting) == [conts[1]] and sched.counts["evictions"] == 1
    assert_pages_consistent(sched)
    finish_all(sched)
    sched.admit()  # now the first is parked: evicted for the second
    # Prefilled again, but for its first full page, which its first prefill indexed.
    assert conts[1].seq.cached == 16 and conts[1].cached_prompt_tokens == 16
    assert conts[1].pending == conts[1].seq.tokens[16:] and len(conts[1].seq.pages) == 3
    assert sched.counts["evictions"] == 2
    finish_all(sched)
    assert [r.result.num_tokens for r in conts] == [10, 10]
    assert_pages_consistent(sched)


def test_paged_cache_must_hold_one_whole_sequence():
    with pytest.raises(ValueError, match="kv_cache_tokens=40 cannot hold one sequence"):
        EngineConfig(max_seq_len=64, kv_cache_tokens=40)
    assert EngineConfig(max_seq_len=64, kv_cache_tokens=63).kv_pages == 4
    # "auto" (the default): max_slots x max_seq_len positions
    assert EngineConfig(max_slots=3, max_seq_len=64).kv_pages == 12
    assert EngineConfig(max_slots=3, max_seq_len=64, kv_cache_tokens="auto").kv_pages == 12
    # 0 meant one cache row per slot, a layout that is gone: an error that says what to do.
    with pytest.raises(ValueError, match="kv_cache_tokens=0 .* no longer supported.*'auto'"):
        EngineConfig(kv_cache_tokens=0)
    with pytest.raises(ValueError, match="'auto' \\(pages for max_slots x max_seq_len\\)"):
        EngineConfig(max_seq_len=64, kv_cache_tokens=-1)


def test_paged_cancel_release_and_failure_return_every_page():
    sched = Scheduler(PAGED)
    running = request([1] * 20, SamplingParams(max_tokens=20))  # 3 pages
    parked = request([2] * 5, SamplingParams(max_tokens=2))
    sched.accept(parked)
    sched.admit()
    finish_all(sched)
    sched.accept(running)
    sched.admit()
    prefill_all(sched)
    decode(sched, lambda s, j: 3)
    assert sched.pages_used() == 4 and sched.holders == 2
    sched.cancel(running)  # mid-decode: its sequence and its 3 pages go
    assert sched.pages_used() == 1 and sched.slot_counts() == (0, 1, 4)
    assert_pages_consistent(sched)
    cont = request([4], SamplingParams(max_tokens=30), sequence_id=parked.result.sequence_id)
    sched.accept(cont)
    sched.admit()
    assert sched.pages_used() == 3
    sched.fail_all(RuntimeError("device lost"))
    assert sched.pages_used() == 0 and sched.holders == 0 and not sched.sequences
    assert_pages_consistent(sched)
