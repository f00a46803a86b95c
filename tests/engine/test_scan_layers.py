"""The engine's kernels run a deep model's layers as one scan over weights and a KV cache held
stacked (`EngineConfig.scan_layers`): the same tokens as the unrolled kernels (prefix
sharing, continuations, in-place weight publication, Gemma-like layers of different windows
and RoPE), and a decode kernel whose size does not grow with depth."""

from __future__ import annotations

import asyncio
import dataclasses

import jax
import numpy as np
from flax import nnx

from agentax.engine import Engine, EngineConfig
from agentax.engine._kernels import ModelDef
from agentax.engine._runner import lower_decode
from agentax.models import PAGE, ModelConfig, StackedKV, Transformer, plan_layer_stack
from agentax.records import SamplingParams

DEEP = ModelConfig.tiny(num_layers=6)
GEMMA_LIKE = ModelConfig.tiny(num_layers=6, sliding_window=24, rope_local_theta=1000.0,
                              layer_types=("sliding", "sliding", "full") * 2,
                              attn_logit_softcap=20.0)
def _engine_config(scan, **kw):
    return EngineConfig(max_slots=4, max_seq_len=96, prefill_chunk=32, scan_layers=scan, **kw)


def _prompts():
    rng = np.random.default_rng(7)
    shared = rng.integers(0, 256, size=2 * PAGE).tolist()  # two full pages, shared
    return ([shared + rng.integers(0, 256, size=n).tolist() for n in (5, 9, 12)]
            + [rng.integers(0, 256, size=n).tolist() for n in (3, 40)])


async def _episodes(engine, prompts):
    """First turns (greedy and seeded sampling), then a continuation of every sequence."""
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0, max_tokens=12, seed=i)
              for i in range(len(prompts))]
    first = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params)))
    more = await asyncio.gather(*(
        engine.generate([1, 2, 3, i], sp, sequence_id=c.sequence_id)
        for i, (c, sp) in enumerate(zip(first, params))))
    return [(c.token_ids.tolist(), c.logprobs) for c in first + more]


def _run(model, scan, prompts=None):
    with Engine(model, _engine_config(scan)) as engine:
        assert engine._runner.scanned is scan
        out = asyncio.run(_episodes(engine, prompts or _prompts()))
        return out, engine.stats()


def test_scanned_engine_decodes_the_unrolled_engines_tokens():
    model = Transformer(DEEP, rngs=nnx.Rngs(0))
    unrolled, _ = _run(model, False)
    scanned, stats = _run(model, True)
    assert stats.prefix_hit_tokens > 0  # the shared prompt pages were shared
    for (tok_u, lp_u), (tok_s, lp_s) in zip(unrolled, scanned, strict=True):
        assert tok_s == tok_u
        np.testing.assert_allclose(lp_s, lp_u, atol=2e-5)
    assert len({t for toks, _ in scanned for t in toks}) > 10  # not one repeated token


def test_auto_scans_deep_models_only():
    deep = Engine(Transformer(DEEP, rngs=nnx.Rngs(0)), _engine_config("auto"))
    shallow = Engine(Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0)), _engine_config("auto"))
    try:
        assert deep._runner.scanned and not shallow._runner.scanned
        assert isinstance(deep._runner.cache, StackedKV)
        assert deep._runner.cache.k.shape[0] == DEEP.num_layers
        assert deep.kv_cache_bytes == shallow.kv_cache_bytes * DEEP.num_layers // 4
    finally:
        deep.shutdown()
        shallow.shutdown()


def test_layers_of_different_windows_scan():
    model = Transformer(GEMMA_LIKE, rngs=nnx.Rngs(1))
    prompts = [list(range(1, 60)), list(range(100, 130)), [5, 6, 7]]  # past the 24 window
    unrolled, _ = _run(model, False, prompts)
    scanned, _ = _run(model, True, prompts)
    for (tok_u, lp_u), (tok_s, lp_s) in zip(unrolled, scanned, strict=True):
        assert tok_s == tok_u
        np.testing.assert_allclose(lp_s, lp_u, atol=2e-5)
    with Engine(model, _engine_config("auto")) as engine:  # windows and RoPE as scanned data
        assert engine._runner.scanned and engine._runner.unrolled_reason is None


def test_in_place_publication_writes_the_stacked_buffers_and_decodes_the_new_weights():
    model, other = (Transformer(DEEP, rngs=nnx.Rngs(s)) for s in (0, 1))
    prompts = _prompts()
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    engine = Engine(model, _engine_config(True))
    try:
        before = [c.token_ids.tolist() for c in engine.generate_batch(prompts, greedy)]
        compiles = engine.num_compiles
        built = [w.unsafe_buffer_pointer() for w in engine._weights]
        engine.update_weights(nnx.state(other), 1, in_place=True)
        assert [w.unsafe_buffer_pointer() for w in engine._weights] == built
        published = [c.token_ids.tolist() for c in engine.generate_batch(prompts, greedy)]
        engine.update_weights(nnx.state(model), 2, in_place=True)
        assert [w.unsafe_buffer_pointer() for w in engine._weights] == built
        back = [c.token_ids.tolist() for c in engine.generate_batch(prompts, greedy)]
        engine.update_weights(nnx.state(other), 3)  # not in place: packed into new buffers
        swapped = [c.token_ids.tolist() for c in engine.generate_batch(prompts, greedy)]
        assert engine.num_compiles == compiles
    finally:
        engine.shutdown()
    with Engine(other, _engine_config(False)) as fresh:
        expected = [c.token_ids.tolist() for c in fresh.generate_batch(prompts, greedy)]
    assert published == expected and swapped == expected
    assert back == before and published != before


def test_packing_round_trips_the_model_leaves():
    model = Transformer(DEEP, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    model_def = ModelDef(graphdef, treedef, plan_layer_stack(model))
    packed = model_def.pack(leaves)
    assert len(packed) == len(leaves) - (DEEP.num_layers - 1) * len(model_def.stack.layer_index)
    for a, b in zip(model_def.unpack(packed), leaves, strict=True):
        np.testing.assert_array_equal(a, b)


def _decode_hlo_ops(num_layers: int, scan: bool) -> int:
    """Ops of the decode kernel lowered on abstract arrays (nothing allocated)."""
    text = lower_decode(dataclasses.replace(DEEP, num_layers=num_layers),
                        _engine_config(scan)).as_text()
    return sum(1 for line in text.splitlines() if " = " in line)


def test_the_scanned_decode_kernel_does_not_grow_with_depth():
    scanned = [_decode_hlo_ops(n, True) for n in (6, 12)]
    unrolled = [_decode_hlo_ops(n, False) for n in (6, 12)]
    assert scanned[1] == scanned[0]
    assert unrolled[1] > 1.6 * unrolled[0]
    assert scanned[0] < unrolled[0]


def test_top_logprobs_scores_with_the_stacked_weights():
    from agentax.serve._scoring import top_logprobs

    model = Transformer(DEEP, rngs=nnx.Rngs(0))
    got = {}
    for scan in (False, True):
        with Engine(model, _engine_config(scan)) as engine:
            got[scan] = top_logprobs(engine, np.arange(1, 20), np.arange(30, 36), 1.0, 3)
    for row_u, row_s in zip(got[False], got[True], strict=True):
        assert [t for t, _ in row_s] == [t for t, _ in row_u]
        np.testing.assert_allclose([v for _, v in row_s], [v for _, v in row_u], atol=1e-5)


def test_the_in_place_write_into_stacked_buffers_allocates_nothing():
    """XLA's memory analysis of the in-place write (a bfloat16 engine, a float32 master) at
    Qwen3-0.6B shapes, lowered on abstract arrays: each layer's leaf goes into the donated
    stack. (A `jnp.stack` of the cast leaves allocated 1.68 x the weights there; at the tiny
    model's shapes XLA CPU wrote even that in place.)"""
    from jax.sharding import SingleDeviceSharding

    from agentax.engine._kernels import weight_writer

    cfg = dataclasses.replace(ModelConfig.qwen3_0_6b(), dtype="bfloat16", param_dtype="bfloat16")
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    shapes, treedef = jax.tree.flatten(state)
    model_def = ModelDef(graphdef, treedef, plan_layer_stack(model))
    old = jax.eval_shape(model_def.pack, shapes)
    new = [jax.ShapeDtypeStruct(x.shape, np.float32) for x in shapes]
    place = SingleDeviceSharding(jax.devices()[0])
    mem = weight_writer(model_def, [place] * len(old)).lower(old, new).compile().memory_analysis()
    weights = sum(x.size * x.dtype.itemsize for x in old)
    assert mem.alias_size_in_bytes == weights  # every stacked buffer written in place
    assert mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes \
        <= 0.01 * weights
