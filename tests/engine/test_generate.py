"""Greedy correctness, continuation, eviction, batch invariance and weight versions."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import threading
import time

import numpy as np
from flax import nnx

from agentax.engine import Engine, EngineConfig
from agentax.engine._runner import Runner
from agentax.models import ModelConfig, Transformer
from agentax.records import FinishReason, SamplingParams

from engine_helpers import CFG, random_prompts, reference_greedy, run

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def test_concurrent_greedy_matches_full_sequence_reference(engine, model):
    rng = np.random.default_rng(1)
    # 7 requests on 4 slots: some wait; prompts up to 70 tokens span 3 prefill chunks.
    prompts = random_prompts(rng, 7, 1, 71)
    max_tokens = [12, 3, 9, 12, 1, 7, 12]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens]
    outs = engine.generate_batch(prompts, params)
    for prompt, m, out in zip(prompts, max_tokens, outs):
        assert out.token_ids.tolist() == reference_greedy(model, prompt, m)
        assert out.finish_reason == FinishReason.LENGTH
        assert out.prompt_len == len(prompt)
        assert out.logprobs.shape == out.versions.shape == (m,)
        assert np.all(out.logprobs <= 0) and np.all(np.isfinite(out.logprobs))
    stats = engine.stats()
    assert stats.completed == 7 and stats.total_tokens == sum(max_tokens)
    assert stats.active_slots == 0 and stats.free_slots == CFG.max_slots  # batch released
    # Prefill fed several requests per call: fewer calls than prompt chunks.
    chunks = sum(-(-len(p) // CFG.prefill_chunk) for p in prompts)
    assert stats.prefill_tokens == sum(map(len, prompts))
    assert 1 <= stats.prefill_calls < chunks
    assert 0 < stats.occupancy <= 1


def test_greedy_logprob_is_log_softmax_of_logits(engine, model):
    prompt = [5, 9, 200, 13]
    out = engine.generate_batch([prompt], SamplingParams(temperature=0.0, max_tokens=3))[0]
    ids = prompt + out.token_ids.tolist()
    logits = np.asarray(model(np.asarray([ids]))[0], np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    logp -= logits.max(-1, keepdims=True)
    want = [logp[len(prompt) - 1 + i, t] for i, t in enumerate(out.token_ids)]
    np.testing.assert_allclose(out.logprobs, want, atol=2e-5)


def test_continuation_equals_one_long_request(engine, model):
    p1, p2, p3 = [11, 12, 13, 14, 15], [40, 41, 42], [7] * 40  # p3 spans two chunks

    async def turns():
        c1 = await engine.generate(p1, GREEDY)
        c2 = await engine.generate(p2, GREEDY, sequence_id=c1.sequence_id)
        c3 = await engine.generate(p3, GREEDY, sequence_id=c2.sequence_id)
        return c1, c2, c3

    c1, c2, c3 = run(turns())
    assert c1.sequence_id == c2.sequence_id == c3.sequence_id
    assert c2.prompt_len == 3 and c3.prompt_len == 40
    history = p1 + c1.token_ids.tolist() + p2 + c2.token_ids.tolist() + p3
    assert c3.token_ids.tolist() == reference_greedy(model, history, 12)
    long = engine.generate_batch([history], GREEDY)[0]
    assert long.token_ids.tolist() == c3.token_ids.tolist()
    # Only the new tokens (plus the one pending generated token) were prefilled on turns 2, 3.
    stats = engine.stats()
    assert stats.evictions == 0
    assert stats.prefill_tokens == len(p1) + (1 + len(p2)) + (1 + len(p3)) + len(history)


def test_eviction_and_reprefill_give_the_same_tokens(model):
    first = [[i + 1, i + 2, i + 3] for i in range(CFG.max_slots)]
    # 8 pages: the parked sequences hold one each, each newcomer reserves three.
    engine = Engine(model, dataclasses.replace(CFG, kv_cache_tokens=128))

    async def scenario():
        c1 = await asyncio.gather(*(engine.generate(p, GREEDY) for p in first))
        # All four are parked now; four new sequences evict every one of them.
        await asyncio.gather(*(engine.generate([99, i] + [i] * 20, GREEDY)
                               for i in range(CFG.max_slots)))
        again = await engine.generate([50, 51], GREEDY, sequence_id=c1[0].sequence_id)
        return c1[0], again

    try:
        c1, again = run(scenario())
        assert engine.stats().evictions >= CFG.max_slots
    finally:
        engine.shutdown()
    history = first[0] + c1.token_ids.tolist() + [50, 51]
    assert again.token_ids.tolist() == reference_greedy(model, history, 12)


def test_release_forgets_the_sequence(engine):
    async def scenario():
        c = await engine.generate([1, 2, 3], GREEDY)
        assert engine.stats().parked_slots == 1
        engine.release(c.sequence_id)
        await asyncio.sleep(0.2)
        assert engine.stats().parked_slots == 0
        try:
            await engine.generate([4], GREEDY, sequence_id=c.sequence_id)
        except ValueError as exc:
            return str(exc)

    assert "unknown sequence_id" in run(scenario())


def test_sampling_does_not_depend_on_batch_company(engine):
    params = SamplingParams(temperature=1.0, max_tokens=20, seed=1234)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    alone = engine.generate_batch([prompt], params)[0]
    rng = np.random.default_rng(7)
    crowd = random_prompts(rng, 9, 1, 60)
    outs = engine.generate_batch(
        crowd[:5] + [prompt] + crowd[5:],
        [SamplingParams(temperature=1.0, max_tokens=int(rng.integers(1, 30)), seed=i)
         for i in range(5)] + [params]
        + [SamplingParams(temperature=0.7, top_k=20, seed=i) for i in range(4)],
    )
    assert outs[5].token_ids.tolist() == alone.token_ids.tolist()
    # Not bitwise: in a crowd the prompt is prefilled in a wider chunk shape (rounding only).
    np.testing.assert_allclose(outs[5].logprobs, alone.logprobs, atol=1e-5)
    # And different seeds give different samples.
    other = engine.generate_batch([prompt], SamplingParams(temperature=1.0, max_tokens=20, seed=9))
    assert other[0].token_ids.tolist() != alone.token_ids.tolist()


def test_weight_update_mid_flight_tags_versions(model):
    other = Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(5))
    engine = Engine(model, CFG, policy_version=3)
    try:
        async def scenario():
            task = asyncio.create_task(
                engine.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=60))
            )
            while engine.stats().total_tokens == 0 and engine.stats().steps < 3:
                await asyncio.sleep(0.001)
            engine.update_weights(other, version=4)
            return await task

        out = run(scenario())
        v = out.versions.tolist()
        assert v[0] == 3 and v[-1] == 4 and 4 in v
        switch = v.index(4)
        assert v == [3] * switch + [4] * (len(v) - switch)  # monotone, one switch
        assert engine.policy_version == 4
        # Before the switch: the old weights' greedy tokens; after it the new weights decide
        # (attending to the KV cache the old weights wrote, as in-flight requests do).
        old = reference_greedy(model, [1, 2, 3], 60)
        assert out.token_ids[:switch].tolist() == old[:switch]
        assert out.token_ids[switch:].tolist() != old[switch:]
        # Idle, the swap waits for the step thread's next turn; wait_published for it.
        engine.update_weights(model, version=5)
        assert engine.wait_published(30.0) and engine.policy_version == 5
    finally:
        engine.shutdown()
    engine.update_weights(other, version=6)  # never swapped in: the engine is shut down
    assert not engine.wait_published(1.0) and engine.policy_version == 5


def test_precompiled_engine_generates_without_compiling(model, monkeypatch):
    # Shapes no other test uses: the kernels are module-level, shared by equal shapes.
    config = EngineConfig(max_slots=5, max_seq_len=72, prefill_chunk=16, precompile=True)
    prompts = random_prompts(np.random.default_rng(4), 3, 3, 40)
    seen = []  # (thread, its nice value) of the precompilation
    precompile = Runner.precompile

    def spy(self):
        seen.append((threading.current_thread().name,
                     os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return precompile(self)

    monkeypatch.setattr(Runner, "precompile", spy)
    with Engine(model, config) as engine:
        assert engine.wait_compiled(timeout=300)
        # Compiled on a thread of its own at the lowest CPU priority (Linux: a thread's own
        # nice value); the step thread that decodes keeps the process's.
        assert [name for name, _ in seen] == ["agentax-engine-precompile"]
        if sys.platform.startswith("linux"):
            assert seen[0][1] == 19
            assert (os.getpriority(os.PRIO_PROCESS, engine._thread.native_id)
                    == os.getpriority(os.PRIO_PROCESS, 0))
        compiled = engine.num_compiles
        # Decode once, prefill per row and chunk bucket, page copies per power of two.
        assert compiled == len(config.kernel_shapes()) == 1 + len(config.prefill_buckets) * len(
            config.prefill_row_buckets) + (config.max_slots - 1).bit_length() + 1
        outs = engine.generate_batch(prompts, SamplingParams(temperature=0.0, max_tokens=20))
        assert engine.num_compiles == compiled  # every shape it used was compiled ahead
        for prompt, out in zip(prompts, outs):  # and compiling wrote nothing to the cache
            assert out.token_ids.tolist() == reference_greedy(model, prompt, 20, pad_to=72)
    assert not engine.wait_compiled()  # a stopped engine: at once, nothing to wait for
    with Engine(model, CFG) as plain:  # nothing to compile ahead: ready once it runs
        assert plain.wait_compiled(timeout=30) and plain.num_compiles == 0


def test_engine_compiles_one_decode_kernel_whatever_the_lengths(model):
    """Paged attention takes no span: long and short sequences, prefilled in several chunks
    and decoded over growing lengths, run on the precompiled kernels (decode once, prefill per
    row and chunk bucket) and match the reference."""
    config = EngineConfig(max_slots=3, max_seq_len=160, prefill_chunk=32,
                          decode_steps_per_call=4, precompile=True)
    assert config.kv_pages == 3 * 160 // 16
    assert config.kernel_shapes() == [("decode",)] + [
        ("prefill", r, c) for r in (1, 2, 3) for c in (16, 32)] + [
        ("copy", n) for n in (1, 2, 4)]
    rng = np.random.default_rng(3)
    prompts = random_prompts(rng, 4, 3, 90)
    with Engine(model, config) as engine:
        assert engine.wait_compiled(timeout=300)
        compiled = engine.num_compiles
        assert compiled == len(config.kernel_shapes())
        outs = engine.generate_batch(prompts, SamplingParams(temperature=0.0, max_tokens=40))
        for prompt, out in zip(prompts, outs):
            assert out.token_ids.tolist() == reference_greedy(model, prompt, 40, pad_to=160)
        assert engine.num_compiles == compiled


def test_small_page_pool_generates_what_a_large_one_does(engine, model):
    """Six 3-turn conversations on 4 slots, greedy and sampled: a cache of 128 positions
    (8 pages; "auto" holds 24) must evict and re-prefill more, and give the same tokens."""
    paged = Engine(model, dataclasses.replace(CFG, kv_cache_tokens=128))
    rng = np.random.default_rng(5)
    prompts = random_prompts(rng, 6, 2, 40)

    async def conversations(eng):
        async def one(i):
            seq, history, outs = None, [], []
            for turn in range(3):
                ids = prompts[i] if turn == 0 else prompts[(i + turn) % 6][:5]
                params = SamplingParams(temperature=1.0 if i % 2 else 0.0,
                                        max_tokens=4 + 2 * i, seed=10 * i + turn)
                out = await eng.generate(ids, params, sequence_id=seq)
                seq = out.sequence_id
                history += ids + out.token_ids.tolist()
                outs.append(out.token_ids.tolist())
            return outs, history

        return await asyncio.gather(*(one(i) for i in range(6)))

    try:
        got = run(conversations(paged))
        stats = paged.stats()
    finally:
        paged.shutdown()
    assert got == run(conversations(engine))
    for i in range(0, 6, 2):  # greedy ones: the last turn against the full-sequence reference
        (*_, last), history = got[i]
        assert last == reference_greedy(model, history[: len(history) - len(last)], len(last))
    cfg = model.config
    assert paged.kv_cache_bytes == 2 * cfg.num_layers * 128 * cfg.num_kv_heads * cfg.head_dim * 4
    assert stats.evictions > engine.stats().evictions and 0 < stats.kv_pages_peak <= 8


def test_prefill_spans_cover_the_fetch_of_first_tokens(model, monkeypatch):
    """A prefill iteration's span ends after its first tokens are fetched: the calls run after
    their dispatch returns, so a span around the dispatch alone left their device time out of
    the trace (the doctor's engine busy fraction read 68 % instead of 83 % on the demo)."""
    import jax

    from agentax.engine import _engine
    from agentax.trace import Tracer, names
    from agentax.trace._tracer import SPAN

    fetched_at, device_get = [], jax.device_get

    def timed_device_get(x):
        out = device_get(x)
        fetched_at.append(time.perf_counter_ns())
        return out

    monkeypatch.setattr(_engine.jax, "device_get", timed_device_get)
    tracer = Tracer()
    eng = Engine(model, CFG, tracer=tracer)
    try:
        prompts = random_prompts(np.random.default_rng(1), 7, 1, 71)
        eng.generate_batch(prompts, [SamplingParams(temperature=0.0, max_tokens=5)] * 7)
        stats = eng.stats()
    finally:
        eng.shutdown()
    spans = [e for e in tracer.take_events() if e[0] == SPAN]
    prefill = [e for e in spans if e[4] == names.PREFILL]
    assert sum(e[5]["calls"] for e in prefill) == stats.prefill_calls
    assert sum(e[5]["tokens"] for e in prefill) == stats.prefill_tokens == sum(map(len, prompts))
    assert len([e for e in spans if e[4] == names.DECODE_STEP]) == stats.decode_calls
    for _, start, end, *_ in prefill:
        assert any(start <= t <= end for t in fetched_at), "a prefill span ended before its fetch"


def test_active_slots_gauge_reads_each_call_and_zero_when_idle(model):
    """`engine_active_slots` reads, from each decode call's start, the rows that call decodes,
    and 0 once no row is left; sampled after each call, it showed a call's count one call late
    and held the last one while the engine idled (an idle engine counted as busy by the
    doctor's mean active and all-slots-full time)."""
    from agentax.trace import Tracer, names
    from agentax.trace._tracer import COUNTER, SPAN

    tracer = Tracer()
    eng = Engine(model, dataclasses.replace(CFG, decode_steps_per_call=2), tracer=tracer,
                 eos_token_ids=())
    try:
        for seed in (1, 2):  # two bursts of 5 requests on 4 slots, the engine idle in between
            prompts = random_prompts(np.random.default_rng(seed), 5, 4, 30)
            eng.generate_batch(prompts, [SamplingParams(temperature=0.0, max_tokens=7)] * 5)
    finally:
        eng.shutdown()
    events = tracer.take_events()
    gauge = [(e[1], e[5]) for e in events if e[0] == COUNTER and e[4] == names.ENGINE_ACTIVE_SLOTS]
    decode = [e for e in events if e[0] == SPAN and e[4] == names.DECODE_STEP]
    for _, start, end, _, _, args, *_ in decode:  # the reading during each call is its rows
        assert [v for t, v in gauge if t <= start][-1] == args["active"]
        assert not [v for t, v in gauge if start < t <= end]
    # Per burst: 4 rows decode, none between their end and the 5th request's prefill, 1 row.
    assert [v for _, v in gauge] == [4.0, 0.0, 1.0, 0.0] * 2
