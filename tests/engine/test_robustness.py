"""Finish reasons, errors, cancellation, shutdown, a failing step loop, and compile counts."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from engine_helpers import CFG, random_prompts, reference_greedy, run

from agentax.engine import Engine, EngineClosed, EngineConfig, EngineError, PromptTooLong
from agentax.records import FinishReason, SamplingParams
from agentax.text import ByteTokenizer

PROMPT = [72, 101, 108, 108, 111]


def test_stop_id_eos_and_stop_string_end_the_completion(model):
    free = reference_greedy(model, PROMPT, 24)
    tok = ByteTokenizer()
    # Pick a token whose first occurrence is not at index 0, and a substring of the output.
    k = next(i for i, t in enumerate(free) if i > 2 and t not in free[:i])
    engine = Engine(model, CFG, eos_token_ids=(free[k],), tokenizer=tok)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=24)
        by_eos = engine.generate_batch([PROMPT], params)[0]
        assert by_eos.token_ids.tolist() == free[: k + 1]
        assert by_eos.finish_reason == FinishReason.EOS

        j = next(i for i, t in enumerate(free) if i > 1 and t not in free[:i] and t != free[k])
        by_stop = engine.generate_batch([PROMPT], SamplingParams(
            temperature=0.0, max_tokens=24, stop_ids=(free[j],)))[0]
        end = min(j, k) + 1
        assert by_stop.token_ids.tolist() == free[:end]
        assert by_stop.finish_reason == (FinishReason.STOP if j < k else FinishReason.EOS)
    finally:
        engine.shutdown()
    # A stop string made of the decoded tokens 1..3: the completion ends at token 3.
    stop = tok.decode(free[1:4])
    first = next(n for n in range(1, 25) if stop in tok.decode(free[:n]))
    with Engine(model, CFG, tokenizer=tok) as engine:
        by_string = engine.generate_batch([PROMPT], SamplingParams(
            temperature=0.0, max_tokens=24, stop_strings=(stop,)))[0]
    assert by_string.token_ids.tolist() == free[:first]
    assert by_string.finish_reason == FinishReason.STOP
    assert by_string.logprobs.shape == by_string.versions.shape == (first,)


def test_slot_full_and_too_long_prompts_fail_only_their_request(engine):
    t_max = CFG.max_seq_len
    near_full = list(range(1, t_max - 4))  # 91 tokens: room for 5 generated ones

    async def scenario():
        too_long = engine.generate(list(range(t_max)), SamplingParams(temperature=0.0))
        fine = engine.generate(near_full, SamplingParams(temperature=0.0, max_tokens=50))
        results = await asyncio.gather(too_long, fine, return_exceptions=True)
        full = results[1]
        more = await asyncio.gather(
            engine.generate([1, 2], SamplingParams(), sequence_id=full.sequence_id),
            return_exceptions=True,
        )
        return results[0], full, more[0]

    too_long, full, more = run(scenario())
    assert isinstance(too_long, PromptTooLong) and "max_seq_len" in str(too_long)
    assert full.finish_reason == FinishReason.SLOT_FULL
    assert full.num_tokens == t_max - len(near_full)
    assert isinstance(more, PromptTooLong)


def test_bad_requests_raise_errors_that_say_what_to_fix(engine):
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        run(engine.generate([1], SamplingParams(stop_strings=("x",))))
    with pytest.raises(ValueError, match=r"prompt_ids must lie in \[0, 272\)"):
        run(engine.generate([1, 999]))
    with pytest.raises(ValueError, match="unknown sequence_id"):
        run(engine.generate([1], sequence_id=12345))

    async def busy():
        first = await engine.generate([1], SamplingParams(max_tokens=1))
        a = engine.generate([2], SamplingParams(max_tokens=30), sequence_id=first.sequence_id)
        b = engine.generate([3], SamplingParams(max_tokens=1), sequence_id=first.sequence_id)
        return await asyncio.gather(a, b, return_exceptions=True)

    ok, err = run(busy())
    assert ok.num_tokens == 30 and isinstance(err, ValueError) and "in flight" in str(err)


def test_cancelling_a_request_frees_its_slot_for_a_waiting_one(engine):
    long = SamplingParams(temperature=1.0, max_tokens=CFG.max_seq_len)

    async def scenario():
        hogs = [asyncio.create_task(engine.generate([i + 1], long)) for i in range(CFG.max_slots)]
        while engine.stats().active_slots < CFG.max_slots:
            await asyncio.sleep(0.001)
        engine.pause()  # the hogs stay in their slots (a paused engine still takes its inbox)
        waiter = asyncio.create_task(engine.generate([7], SamplingParams(max_tokens=2)))
        await asyncio.sleep(0.05)
        assert not waiter.done() and engine.stats().waiting_requests == 1
        hogs[0].cancel()  # handled before the next admission: the waiter takes its slot
        await asyncio.sleep(0.05)
        engine.resume()
        out = await asyncio.wait_for(waiter, timeout=60)
        engine.pause()
        for h in hogs[1:]:
            h.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
        engine.resume()
        await asyncio.sleep(0.2)
        return out

    out = run(scenario())
    assert out.num_tokens == 2 and out.queue_time_s > 0
    stats = engine.stats()
    assert stats.active_slots == 0 and stats.failed == CFG.max_slots  # cancelled, counted
    # Only the waiter's sequence stays parked, in its pages: it holds no slot.
    assert stats.free_slots == CFG.max_slots and stats.parked_slots == 1


def test_shutdown_fails_pending_requests(engine):
    async def scenario():
        engine.pause()
        tasks = [asyncio.create_task(engine.generate([1, 2])) for _ in range(3)]
        await asyncio.sleep(0.05)
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = run(scenario())
    assert all(isinstance(r, EngineClosed) for r in results)
    with pytest.raises(EngineClosed):
        run(engine.generate([1]))


_EXIT_MID_DECODE = """
import asyncio
from flax import nnx
from agentax.engine import Engine, EngineConfig
from agentax.models import ModelConfig, Transformer
from agentax.records import SamplingParams
model = Transformer(ModelConfig.tiny(num_layers=1, hidden_size=64, intermediate_size=128,
                                     num_heads=2, num_kv_heads=1, head_dim=32), rngs=nnx.Rngs(0))
engine = Engine(model, EngineConfig(max_slots=2, max_seq_len=128, prefill_chunk=64))
params = SamplingParams(max_tokens=120)
async def main():
    await engine.generate([1, 2, 3], params)  # compiles every shape the requests below use
    for _ in range(256):  # seconds of decoding on two slots
        asyncio.ensure_future(engine.generate([1, 2, 3], params))
    await asyncio.sleep(0.3)
asyncio.run(main())
print("leaving with requests in flight", flush=True)
"""


def test_exiting_without_shutdown_mid_decode_exits_cleanly():
    # The step thread is a daemon: left inside a device call while the interpreter finalizes,
    # it aborted the process (SIGABRT, "terminate called ... exception not rethrown") — 5 of 5
    # runs before the engine shut itself down at exit.
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _EXIT_MID_DECODE], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "leaving with requests in flight" in proc.stdout


def test_a_failing_step_loop_fails_pending_requests_and_refuses_new_work(engine):
    def broken_decode():
        raise RuntimeError("device on fire")

    engine._decode = broken_decode  # the next decode call raises inside the step thread

    async def scenario():
        return await asyncio.gather(
            engine.generate([1, 2]), engine.generate([3]), return_exceptions=True
        )

    results = run(scenario())
    assert all(isinstance(r, EngineError) for r in results)
    assert "device on fire" in str(results[0])
    assert isinstance(results[0].__cause__, RuntimeError)
    with pytest.raises(EngineError, match="device on fire"):
        run(engine.generate([1]))


def test_a_model_that_cannot_run_fails_every_waiting_caller_at_once():
    import jax

    from agentax.models import ModelConfig, Transformer

    from flax import nnx

    broken = Transformer(ModelConfig.tiny(num_layers=1), rngs=nnx.Rngs(0))
    broken.layers[0].mlp.act = "no_such_activation"  # the kernels fail while tracing
    engine = Engine(broken, CFG)
    try:
        async def scenario():
            calls = [engine.generate([1, 2, 3]) for _ in range(6)]
            return await asyncio.wait_for(
                asyncio.gather(*calls, return_exceptions=True), timeout=60)

        results = run(scenario())
        assert all(isinstance(r, EngineError) for r in results), results
        assert "KeyError" in str(results[0]) and "no_such_activation" in str(results[0])
        assert isinstance(results[0].__cause__, KeyError)
        assert isinstance(engine.error, KeyError)
        with pytest.raises(EngineError, match="no_such_activation"):
            run(engine.generate([1]))
    finally:
        engine.shutdown()
    del jax


def test_200_random_requests_compile_a_handful_of_times(model):
    # A shape no other test uses, so this engine's compilations are its own.
    config = EngineConfig(max_slots=6, max_seq_len=80, prefill_chunk=32, decode_steps_per_call=4)
    rng = np.random.default_rng(0)
    prompts = random_prompts(rng, 200, 1, 70)
    params = [
        SamplingParams(
            temperature=float(rng.choice([0.0, 0.8, 1.0])), top_k=int(rng.integers(0, 5)),
            top_p=float(rng.choice([1.0, 0.9])), max_tokens=int(rng.integers(1, 8)), seed=i,
        )
        for i in range(200)
    ]
    with Engine(model, config) as engine:
        outs = engine.generate_batch(prompts, params)
        assert [o.num_tokens for o in outs] == [p.max_tokens for p in params]
        # One decode shape, and at most one prefill shape per (row bucket, chunk bucket).
        shapes = len(config.prefill_buckets) * len(config.prefill_row_buckets)
        assert config.prefill_row_buckets == (1, 2, 4, 6)
        assert 2 <= engine.num_compiles <= shapes + 1
        assert engine.stats().completed == 200
        assert engine.stats().compile_s > 0 and engine.stats().first_step_s > 0


def test_prefill_budget_bounds_the_rows_of_one_call():
    config = EngineConfig(max_slots=32, prefill_chunk=64, max_prefill_rows=12,
                          prefill_token_budget=256)
    assert config.prefill_rows == 12 and config.prefill_row_buckets == (1, 2, 4, 8, 12)
    assert config.row_bucket(5) == 8 and config.chunk_bucket(17) == 32
    assert config.token_budget == 256
    assert EngineConfig(max_slots=4).token_budget == 4 * 128  # default: rows x chunk
    with pytest.raises(ValueError, match="max_prefill_rows"):
        EngineConfig(max_prefill_rows=-1)


def test_compilation_cache_keeps_compiled_kernels_on_disk(tmp_path):
    import subprocess
    import sys

    code = (
        "import jax, jax.numpy as jnp\n"
        "from agentax.engine import enable_compilation_cache\n"
        f"enable_compilation_cache({str(tmp_path / 'jax')!r})\n"
        "print(float(jax.jit(lambda x: (x * 3).sum())(jnp.ones(7))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "21.0"
    assert any((tmp_path / "jax").iterdir())  # an entry a second run loads instead of compiling
