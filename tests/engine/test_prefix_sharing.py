"""Prefix sharing on the paged cache: the scheduler's page bookkeeping against a fake device
(no JAX: hypothesis drives random share / continue / release / evict / weight-update
sequences), then the real engine's tokens with sharing on and off."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from agentax.engine._config import PAGE, EngineConfig
from agentax.engine._requests import _Request
from agentax.engine._scheduler import Scheduler
from agentax.records import SamplingParams

SHARED = EngineConfig(max_slots=4, max_seq_len=96, prefill_chunk=32, min_prefill_bucket=8,
                      decode_steps_per_call=4, kv_cache_tokens=256)


def request(ids, max_tokens=4, sequence_id=None, seed=0):
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed)
    return _Request(ids=np.asarray(ids, np.int32), params=params, sequence_id=sequence_id,
                    loop=None, future=None, submit_time=time.perf_counter())


class FakeDevice:
    """What a paged cache holds: per page and offset, the (token, version) whose K/V the
    kernels wrote there. Runs the scheduler's plans the way the runner does (copies first)."""

    def __init__(self, sched: Scheduler):
        self.sched = sched
        self.cells = np.full((sched.config.kv_pages, PAGE, 2), -1, np.int64)
        self.version = 0

    def _copies(self):
        for src, dst in self.sched.pool.take_copies():
            self.cells[dst] = self.cells[src]

    def _put(self, seq, pos, token):
        """A kernel's write: only ever to a page its sequence alone holds and no prefix
        entry names (a shared or indexed page is immutable: copy on write)."""
        page = seq.pages[pos // PAGE]
        assert self.sched.pool.refs[page] == 1 and page not in self.sched.pool.key_of, (
            f"sequence {seq.id} writes position {pos} into shared page {page}")
        self.cells[page, pos % PAGE] = (token, self.version)

    def _write(self, seq, start, end):
        for pos in range(start, end):
            self._put(seq, pos, seq.tokens[pos])

    def step(self, rng: np.random.Generator) -> None:
        """One engine iteration: admit, copies, every prefill plan, one decode call."""
        sched = self.sched
        sched.version = self.version
        sched.admit()
        self._copies()
        for plan in sched.plan_prefill():
            starts = [(req.seq, req.seq.cached) for req, _ in plan.rows]
            # What the kernel writes: each row's chunk at its positions, through its pages.
            for (req, n), (seq, start) in zip(plan.rows, starts):
                self._write(seq, start, start + n)
            r = len(plan.slots_r)
            sched.finish_prefill(plan, rng.integers(0, 50, r), np.zeros(r), self.version)
        plan = sched.plan_decode()
        if plan is None:
            return
        s, n = sched.config.max_slots, plan.steps
        before = {slot: (seq, seq.cached) for slot, seq in enumerate(sched.slot_seq)
                  if seq is not None and sched.active[slot]}
        tokens = rng.integers(0, 50, (s, n)).astype(np.int32)
        counts = np.where(sched.active, np.minimum(n, sched.remaining), 0).astype(np.int32)
        # A decode step writes the K/V of the token it feeds: the pending one, then the
        # sampled ones but the last.
        for slot, (seq, start) in before.items():
            fed = [int(sched.tok[slot])] + tokens[slot, : counts[slot] - 1].tolist()
            for j, tok in enumerate(fed):
                self._put(seq, start + j, tok)
        sched.finish_decode(plan, tokens, np.zeros((s, n)), counts, self.version)

    def check(self) -> None:
        """Every live sequence reads back exactly its own tokens at every cached position,
        computed under weights the version bound allows for what was shared."""
        sched = self.sched
        sched.pool.check()
        for seq in sched.sequences.values():
            for pos in range(min(seq.cached, len(seq.tokens))):
                token, _ = self.cells[seq.pages[pos // PAGE], pos % PAGE]
                assert token == seq.tokens[pos], (seq.id, pos)
        for key, entry in sched.pool.index.items():  # an entry names the page it describes
            assert [int(t) for t in self.cells[entry.page, :, 0]] == list(entry.tokens)


def test_a_group_prefills_its_prompt_once_and_samples_from_shared_pages():
    sched = Scheduler(SHARED)
    device = FakeDevice(sched)
    rng = np.random.default_rng(0)
    prompt = list(range(1, 41))  # 2 full pages + 8 tokens
    group = [request(prompt, seed=i) for i in range(4)]
    for req in group:
        sched.accept(req)
    device.step(rng)  # the first prefills its first chunk; the others wait for its pages
    assert [r.seq.slot is not None for r in group] == [True, False, False, False]
    assert sched.counts["prefill_tokens"] == 32
    while any(not r.done for r in group):
        device.step(rng)
        device.check()
    assert sched.counts["prefill_tokens"] == 40 + 3 * 8
    assert [r.result.cached_prompt_tokens for r in group] == [0, 32, 32, 32]
    assert sched.counts["prefix_hit_tokens"] == 96
    pages = [r.seq.pages[:2] for r in group]
    assert all(p == pages[0] for p in pages)  # the same two pages, held four times
    assert [sched.pool.refs[p] for p in pages[0]] == [4, 4]
    assert sched.pages_used() < 4 * 3  # unique pages: 2 shared + 1 own each


def test_a_prompt_on_a_page_boundary_copies_its_last_page_and_refeeds_one_token():
    sched = Scheduler(SHARED)
    device = FakeDevice(sched)
    rng = np.random.default_rng(1)
    prompt = list(range(1, 33))  # exactly 2 pages
    first = request(prompt)
    sched.accept(first)
    while not first.done:
        device.step(rng)
    second = request(prompt)
    sched.accept(second)
    sched.admit()
    assert second.seq.cached == 31 and second.pending == [32]
    assert second.seq.pages[0] == first.seq.pages[0] != second.seq.pages[1]
    assert sched.pool.copies == [(first.seq.pages[1], second.seq.pages[1])]
    while not second.done:
        device.step(rng)
        device.check()
    assert second.result.cached_prompt_tokens == 31


def test_reuse_respects_the_version_bound():
    for bound, hit in ((0, 0), (1, 32)):
        sched = Scheduler(dataclasses.replace(SHARED, prefix_version_bound=bound))
        device = FakeDevice(sched)
        rng = np.random.default_rng(2)
        prompt = list(range(1, 41))
        a = request(prompt)
        sched.accept(a)
        while not a.done:
            device.step(rng)
        device.version = 1  # new weights
        b = request(prompt)
        sched.accept(b)
        while not b.done:
            device.step(rng)
            device.check()
        assert b.result.cached_prompt_tokens == hit, bound
        if bound == 0:  # b's prefill, under version 1, replaced the stale entries
            assert {e.version for e in sched.pool.index.values()} == {1}


def test_sharing_off_prefills_everything():
    sched = Scheduler(dataclasses.replace(SHARED, prefix_sharing=False))
    device = FakeDevice(sched)
    rng = np.random.default_rng(3)
    group = [request(list(range(1, 41))) for _ in range(3)]
    for req in group:
        sched.accept(req)
    while any(not r.done for r in group):
        device.step(rng)
    assert sched.counts["prefill_tokens"] == 120 and not sched.pool.index


PREFIXES = [list(range(1, 33)), list(range(1, 17)) + [99] * 16, list(range(50, 90))]
new_op = st.tuples(st.just("new"), st.integers(0, 2), st.integers(0, 20), st.integers(1, 12))
step_op = st.tuples(st.just("step"), st.integers(1, 3))
op = st.one_of(
    new_op, new_op, step_op, step_op,
    st.tuples(st.just("continue"), st.integers(0, 50), st.integers(1, 20), st.integers(1, 12)),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("weights"), st.just(0)),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=10, max_size=60), bound=st.integers(0, 1),
       pages=st.sampled_from([8, 16, 64]))
def test_copy_on_write_never_corrupts_a_sibling(ops, bound, pages):
    """Random sequences of shared prompts, continuations, releases, cancellations, evictions
    (a small pool) and weight updates: every sequence always reads back its own tokens, and
    every index entry describes its page."""
    config = dataclasses.replace(SHARED, kv_cache_tokens=pages * PAGE,
                                 prefix_version_bound=bound)
    sched = Scheduler(config)
    device = FakeDevice(sched)
    rng = np.random.default_rng(0)
    requests: list[_Request] = []
    for kind, *args in ops:
        if kind == "new":
            which, extra, max_tokens = args
            ids = PREFIXES[which] + list(range(200, 200 + extra))
            requests.append(request(ids, max_tokens=max_tokens))
            sched.accept(requests[-1])
        elif kind == "continue" and requests:
            done = [r for r in requests if r.done and r.result is not None]
            if done:
                prev = done[args[0] % len(done)]
                seq = sched.sequences.get(prev.result.sequence_id)
                if seq is not None and seq.request is None and \
                        len(seq.tokens) + args[1] < config.max_seq_len - args[2]:
                    requests.append(request([7] * args[1], max_tokens=args[2],
                                            sequence_id=prev.result.sequence_id))
                    sched.accept(requests[-1])
        elif kind == "release" and requests:
            r = requests[args[0] % len(requests)]
            if r.result is not None:
                sched.release(r.result.sequence_id)
        elif kind == "cancel" and requests:
            sched.cancel(requests[args[0] % len(requests)])
        elif kind == "step":
            for _ in range(args[0]):
                device.step(rng)
                device.check()
        elif kind == "weights":
            device.version += 1
    for _ in range(200):  # everything left runs to the end
        if all(r.done for r in requests):
            break
        device.step(rng)
        device.check()
    assert all(r.done for r in requests)
    assert not sched._inflight


# ---------------------------------------------------------------------- the real engine


def _groups(engine, prompts, n, params_of):
    """Each prompt's group of `n` samples submitted together, as a GRPO group is."""
    import asyncio

    async def go():
        return await asyncio.gather(*(engine.generate(p, params_of(i, j))
                                      for i, p in enumerate(prompts) for j in range(n)))

    return asyncio.run(go())


def test_shared_prefixes_generate_the_tokens_of_unshared_ones(model):
    """Groups of 6 samples of a 40-token prompt and of a 32-token one (page boundary: copy on
    write), greedy and seeded: the same tokens with sharing on and off, for a fraction of
    the prefill."""
    from engine_helpers import CFG, random_prompts

    from agentax.engine import Engine

    rng = np.random.default_rng(7)
    prompts = random_prompts(rng, 1, 40, 41) + random_prompts(rng, 1, 32, 33)

    def params_of(i, j):
        return SamplingParams(temperature=0.0 if j < 2 else 1.0, max_tokens=12, seed=j)

    outs, stats = {}, {}
    for sharing in (True, False):
        config = dataclasses.replace(CFG, kv_cache_tokens=512, prefix_sharing=sharing)
        with Engine(model, config) as engine:
            outs[sharing] = _groups(engine, prompts, 6, params_of)
            stats[sharing] = engine.stats()
    assert ([c.token_ids.tolist() for c in outs[True]]
            == [c.token_ids.tolist() for c in outs[False]])
    assert [c.cached_prompt_tokens for c in outs[True]] == [0] + [32] * 5 + [0] + [31] * 5
    assert stats[False].prefill_tokens == 6 * (40 + 32)
    assert stats[True].prefill_tokens == 40 + 5 * 8 + 32 + 5 * 1
    assert stats[True].prefix_hit_tokens == 5 * 32 + 5 * 31


def test_no_kv_is_shared_across_a_weight_update_when_the_bound_is_zero(model):
    from engine_helpers import CFG

    from agentax.engine import Engine

    prompt = list(range(3, 43))
    params = SamplingParams(temperature=0.0, max_tokens=4)
    with Engine(model, dataclasses.replace(CFG, kv_cache_tokens=512)) as engine:
        first = engine.generate_batch([prompt], params)[0]
        again = engine.generate_batch([prompt], params)[0]
        engine.update_weights(nnx_state(model), version=1)
        after = engine.generate_batch([prompt, prompt], params)
    assert (first.cached_prompt_tokens, again.cached_prompt_tokens) == (0, 32)
    # The first request under version 1 prefills everything; the second shares its pages.
    assert sorted(c.cached_prompt_tokens for c in after) == [0, 32]
    assert all(c.versions.tolist() == [1] * 4 for c in after)
    assert after[0].token_ids.tolist() == first.token_ids.tolist()  # the same weights


def nnx_state(model):
    from flax import nnx

    return nnx.split(model)[1]
