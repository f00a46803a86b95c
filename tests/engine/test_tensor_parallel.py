"""The engine sharded over 8 fake CPU devices (tensor parallelism) against one device: the
same tokens, 1/8 of the KV cache per device, and a publish that compiles nothing.

Runs in a subprocess: the device count must be set before JAX is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.compile_flags import fast_compile_xla_flags

SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
    import dataclasses
    import jax, numpy as np
    from flax import nnx
    from agentax.engine import Engine, EngineConfig
    from agentax.models import ModelConfig, Transformer, make_mesh
    from agentax.records import SamplingParams

    assert len(jax.devices()) == 8
    cfg = ModelConfig.tiny(num_heads=8, num_kv_heads=8, head_dim=16)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, int(n)).tolist() for n in rng.integers(3, 60, 6)]
    prompts += [prompts[0]] * 3  # a group: shared pages on the paged engines
    base = EngineConfig(max_slots=4, max_seq_len=96, prefill_chunk=32)

    def run(engine):
        greedy = engine.generate_batch(prompts, SamplingParams(temperature=0.0, max_tokens=12))
        sampled = engine.generate_batch(
            prompts, [SamplingParams(temperature=1.0, max_tokens=12, seed=i)
                      for i in range(len(prompts))])
        return [c.token_ids.tolist() for c in greedy + sampled]

    # float32: the sharded reductions round as one device's do (in bfloat16 the partial sums
    # of a row-parallel matmul are rounded before they are added: tokens may differ).
    for paged in ("auto", 256):
        config = dataclasses.replace(base, kv_cache_tokens=paged)
        with Engine(model, config) as one:
            want = run(one)
        # Both ways to ask for it: the config's device count, or a mesh.
        engine = (Engine(model, dataclasses.replace(config, tensor_parallel=8)) if paged == 256
                  else Engine(model, config, mesh=make_mesh(tensor=8)))
        with engine:
            assert engine.mesh is not None and engine.mesh.shape["tensor"] == 8
            assert run(engine) == want, paged
            assert engine.kv_cache_bytes_per_device * 8 == engine.kv_cache_bytes
            weights = engine._weights
            total = sum(w.nbytes for w in weights)
            on_one = sum(w.addressable_shards[0].data.nbytes for w in weights)
            assert on_one < total / 3, (on_one, total)  # norms stay replicated

    # A deep model: the sharded engines hold its layers stacked and scan them (scan_layers
    # "auto"): each stacked weight takes its layer's sharding behind an unsharded layer axis,
    # the stacked cache its kv-head sharding; in-place publications keep that layout.
    deep_cfg = dataclasses.replace(cfg, num_layers=6)
    deep, deep_other = (Transformer(deep_cfg, rngs=nnx.Rngs(s)) for s in (2, 3))
    for paged in (256,):
        config = dataclasses.replace(base, kv_cache_tokens=paged)
        with Engine(deep, dataclasses.replace(config, scan_layers=False)) as one:
            want = run(one)
        with Engine(deep, dataclasses.replace(config, tensor_parallel=8)) as engine:
            assert engine._runner.scanned
            assert run(engine) == want, ("deep", paged)
            assert engine.kv_cache_bytes_per_device * 8 == engine.kv_cache_bytes
            weights = engine._weights
            total = sum(w.nbytes for w in weights)
            on_one = sum(w.addressable_shards[0].data.nbytes for w in weights)
            assert on_one < total / 3, (on_one, total)
            compiled, layout = engine.num_compiles, [w.sharding for w in weights]
            engine.update_weights(nnx.split(deep_other)[1], 1, in_place=True)
            assert run(engine) != want
            engine.update_weights(nnx.split(deep)[1], 2, in_place=True)
            assert run(engine) == want
            assert engine.num_compiles == compiled
            assert [w.sharding for w in engine._weights] == layout

    # A bfloat16 engine receives a trainer's float32 master weights: cast to its dtype and put
    # on its sharding, so the kernels compiled for the first weights serve them.
    bf16 = dataclasses.replace(cfg, dtype="bfloat16", param_dtype="bfloat16")
    master = Transformer(cfg, rngs=nnx.Rngs(1))
    with Engine(Transformer(bf16, rngs=nnx.Rngs(0)),
                dataclasses.replace(base, tensor_parallel=8, kv_cache_tokens=256)) as engine:
        before = run(engine)
        compiled = engine.num_compiles
        engine.update_weights(nnx.split(master)[1], version=1)
        after = run(engine)
        assert engine.num_compiles == compiled, (engine.num_compiles, compiled)
        assert all(w.dtype == jax.numpy.bfloat16 for w in engine._weights)
        assert after != before  # the new weights decide
    # A Placement with an engine on 4 devices of its own: the model goes onto the engine's
    # mesh, and publishing reshards the trainer's (here: its data mesh's) weights onto it.
    import time
    from agentax.pipeline import Placement
    from agentax.models import shard_params

    placement = Placement.split(jax.devices(), engine_devices=4)
    assert placement.engine_mesh.shape["tensor"] == 4 and len(placement.trainer_mesh.devices.flat) == 4
    engine_devices = set(placement.engine_mesh.devices.flat)
    with Engine(model, dataclasses.replace(base, kv_cache_tokens=256)) as one:
        one.update_weights(nnx.split(master)[1], version=1)
        want_master = run(one)

    class Trainer:  # what the publisher reads: the trainer's params on its own mesh
        def params_for_engine(self):
            return shard_params(nnx.split(master)[1], placement.trainer_mesh)

    with Engine(placement.engine_model(model), dataclasses.replace(base, kv_cache_tokens=256),
                mesh=placement.engine_mesh) as engine:
        run(engine)
        compiled = engine.num_compiles
        placement.publisher()(Trainer(), engine, 1)
        deadline = time.time() + 30
        while engine.policy_version != 1 and time.time() < deadline:
            run(engine)  # the swap lands between two decode calls
        assert engine.policy_version == 1
        assert run(engine) == want_master
        assert engine.num_compiles == compiled
        assert all(set(w.sharding.device_set) == engine_devices for w in engine._weights)
        # In place (what the pipeline does with an agentax trainer): written into the
        # engine's own shards, the same layout, so again nothing of the engine recompiles.
        layout = [w.sharding for w in engine._weights]
        for version in (2, 3):
            engine.update_weights(Trainer().params_for_engine(), version, in_place=True)
        assert engine.policy_version == 3 and run(engine) == want_master
        assert engine.num_compiles == compiled
        assert [w.sharding for w in engine._weights] == layout

    try:
        Engine(Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0)),
               dataclasses.replace(base, tensor_parallel=8))
    except ValueError as err:
        assert "num_kv_heads=2 is not divisible by 8" in str(err), err
    else:
        raise AssertionError("a tensor-parallel size that does not divide kv heads was taken")
    print("TP-OK")
    """
)


@pytest.mark.slow  # mostly compiling (8 fake devices compile every kernel again): it compiles
# with the fast-compile flags, ~80 s alone on 2 cores
def test_tensor_parallel_engine_equals_one_device(tmp_path):
    script = tmp_path / "tp.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "XLA_FLAGS": fast_compile_xla_flags()}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "TP-OK" in out.stdout
