"""Mixed precision and one trainer state: float32 master weights under a bfloat16 model, what
the engine receives, LoRA merges in float32, released trainers, `trainer.mesh`, and loading a
checkpoint straight into a mesh."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from agentax.engine import Engine, EngineConfig
from agentax.records import SamplingParams
from agentax.models import Transformer
from agentax.train import LoRAConfig, RLTrainer, SFTTrainer
from agentax.train import _base
from agentax.train._lora import apply_lora, merge_lora
from tests.train.conftest import MICRO, base_config, make_groups, make_model
from tests.compile_flags import fast_compile_xla_flags

ROOT = Path(__file__).resolve().parents[2]
BF16 = dataclasses.replace(MICRO, dtype="bfloat16", param_dtype="bfloat16")


def _bf16_model(seed: int = 0, num_layers: int = MICRO.num_layers) -> Transformer:
    return Transformer(dataclasses.replace(BF16, num_layers=num_layers), rngs=nnx.Rngs(seed))


def _floats(tree) -> list[np.ndarray]:
    return [np.asarray(x, np.float32) for x in jax.tree.leaves(tree)]


def _changed_fraction(trainer, groups) -> float:
    before = _floats(trainer._params)
    assert not trainer.step(groups).skipped
    after = _floats(trainer._params)
    return sum(int((a != b).sum()) for a, b in zip(before, after)) / sum(a.size for a in before)


def test_fp32_master_keeps_the_small_updates_a_bf16_master_rounds_away(caplog, monkeypatch):
    # One RL step at an RL learning rate: Adam moves every weight by ~1e-6, far below half a
    # bfloat16 ulp (~0.2-0.4 % of the weight).
    model, groups = _bf16_model(), make_groups(seed=1)
    master = RLTrainer(model, base_config(learning_rate=1e-6))
    assert _changed_fraction(master, groups) >= 0.99
    monkeypatch.setattr(_base, "_warned_bf16_master", False)
    with caplog.at_level(logging.WARNING, logger="agentax.train._base"):
        rounded = RLTrainer(model, base_config(learning_rate=1e-6, master_dtype="bfloat16"))
    assert "master_dtype" in caplog.text and "float32" in caplog.text
    assert {x.dtype for x in jax.tree.leaves(rounded._params)} == {jnp.dtype(jnp.bfloat16)}
    assert _changed_fraction(rounded, groups) < 0.05  # measured 0.4 %


def test_master_moments_and_accumulator_are_fp32_while_the_forward_runs_in_bf16():
    trainer = SFTTrainer(_bf16_model(), base_config())
    f32 = jnp.dtype(jnp.float32)
    assert {x.dtype for x in jax.tree.leaves(trainer._params)} == {f32}
    moments = [x for x in jax.tree.leaves(trainer._opt_state) if x.ndim > 0]  # not the counts
    assert moments and {x.dtype for x in moments} == {f32}
    assert {x.dtype for x in jax.tree.leaves(trainer._acc)} == {f32}
    graphdef = trainer._graphdefs.model
    work = nnx.merge(graphdef, trainer._params["model"], trainer._rest)
    assert work.config.dtype == "bfloat16"
    ids = jnp.zeros((1, 8), jnp.int32)
    hidden = jax.eval_shape(lambda: work.hidden(ids, jnp.arange(8)[None], None))
    assert hidden.dtype == jnp.bfloat16  # the float32 weights are cast at use
    # What leaves the trainer is in the model's own dtype.
    assert {x.dtype for x in jax.tree.leaves(trainer.params_for_engine())} == \
        {jnp.dtype(jnp.bfloat16)}
    exported = trainer.export_model()
    assert exported.config == BF16
    assert {x.dtype for x in jax.tree.leaves(nnx.state(exported))} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(trainer.params_for_engine(jnp.float32))} == {f32}


def test_lora_base_stays_bf16_and_merges_in_fp32():
    trainer = RLTrainer(_bf16_model(), base_config(lora=LoRAConfig(rank=2)))
    assert {x.dtype for x in jax.tree.leaves(trainer._rest)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(trainer._params)} == {jnp.dtype(jnp.float32)}

    model = _bf16_model()
    apply_lora(model, LoRAConfig(rank=2, targets=("q_proj",)), rngs=nnx.Rngs(1))
    q = model.layers[0].attn.q_proj
    d_in, d_out = q.kernel.shape
    q.lora.lora_a[...] = jnp.full((d_in, 2), 1e-3, jnp.float32)
    q.lora.lora_b[...] = jnp.full((2, d_out), 5e-3, jnp.float32)  # delta = 1e-5 everywhere
    state = nnx.state(model, nnx.Param)
    w = np.asarray(q.kernel[...], np.float32)
    big = np.abs(w) >= 0.01  # half a bf16 ulp there is >= 3e-5 > the delta
    assert big.mean() > 0.5
    exact = merge_lora(state, jnp.float32)["layers"][0]["attn"]["q_proj"]["kernel"][...]
    assert exact.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(exact) - w, 1e-5, rtol=1e-2)
    rounded = merge_lora(state)["layers"][0]["attn"]["q_proj"]["kernel"][...]
    assert rounded.dtype == jnp.bfloat16  # the kernel's own dtype: the delta is lost there
    np.testing.assert_array_equal(np.asarray(rounded, np.float32)[big], w[big])


def test_a_bf16_engine_gets_bf16_weights_from_an_fp32_master_without_recompiling():
    from agentax.pipeline import Placement

    model = _bf16_model()
    engine = Engine(model, EngineConfig(max_slots=2, max_seq_len=64, prefill_chunk=16))
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=6)
        engine.generate_batch([[1, 2, 3]], greedy)
        compiles = engine.num_compiles
        trainer = RLTrainer(model, base_config(learning_rate=1e-3))
        trainer.step(make_groups(seed=1))
        master = trainer.params_for_engine(jnp.float32)  # float32 through the engine's path
        engine.update_weights(master, 1)
        after = engine.generate_batch([[1, 2, 3]], greedy)[0]
        assert after.versions.tolist() == [1] * len(after.versions)
        weights = engine._weights
        assert {w.dtype for w in weights} == {jnp.dtype(jnp.bfloat16)}
        for w, m in zip(weights, jax.tree.leaves(master)):
            np.testing.assert_array_equal(np.asarray(w), np.asarray(m.astype(jnp.bfloat16)))
        Placement.colocated().publisher()(trainer, engine, 2)  # the pipeline's publisher
        engine.generate_batch([[1, 2, 3]], greedy)
        assert {w.dtype for w in engine._weights} == {jnp.dtype(jnp.bfloat16)}
        assert engine.num_compiles == compiles  # same dtypes, same placement: no recompile
    finally:
        engine.shutdown()


@pytest.mark.parametrize("num_layers", [1, 6])
def test_an_in_place_publication_writes_into_the_engines_own_buffers_without_recompiling(
        num_layers):
    """The pipeline's publisher writes a float32 master into a bfloat16 engine's buffers (one
    donated kernel): from the second publication on the buffers stay where they are, nothing
    compiles, the engine decodes exactly as a fresh engine over the same weights, and the
    model the engine was built from is never donated. 6 layers: the engine holds them stacked
    (scanned kernels), packed at construction, so even the first write is in place."""
    from agentax.pipeline import Placement

    model = _bf16_model(num_layers=num_layers)
    first_leaf = jax.tree.leaves(nnx.state(model))[0]
    engine = Engine(model, EngineConfig(max_slots=2, max_seq_len=64, prefill_chunk=16))
    assert engine._runner.scanned == (num_layers >= 5)
    publish = Placement.colocated().publisher()
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    try:
        engine.generate_batch([[1, 2, 3]], greedy)
        compiles = engine.num_compiles
        built = [w.unsafe_buffer_pointer() for w in engine._weights]
        trainer = RLTrainer(model, base_config(learning_rate=1e-2))
        pointers, writes = [], []
        for version in (1, 2, 3):
            trainer.step(make_groups(seed=version))
            publish(trainer, engine, version)  # returns once written: the next step may donate
            pointers.append([w.unsafe_buffer_pointer() for w in engine._weights])
            writes.append(engine._runner._writer._cache_size())
            master = trainer.params_for_engine(jnp.float32)
            leaves = engine._runner.model_def.unpack(engine._weights)  # stacked: sliced
            for w, m in zip(leaves, jax.tree.leaves(master), strict=True):
                assert w.dtype == jnp.bfloat16
                np.testing.assert_array_equal(np.asarray(w), np.asarray(m.astype(jnp.bfloat16)))
        assert pointers[1] == pointers[2]  # written in place
        if engine._runner.scanned:  # packed by the engine: its own from the start
            assert built == pointers[0]
        assert writes[1] == writes[2]  # the write kernel compiled once, at the first write
        out = engine.generate_batch([[1, 2, 3]], greedy)[0]
        assert out.versions.tolist() == [3] * len(out.versions)
        assert engine.num_compiles == compiles  # no engine kernel recompiled
        np.asarray(first_leaf)  # the model's own arrays were copied, not donated
    finally:
        engine.shutdown()
    fresh = Engine(trainer.export_model(), EngineConfig(max_slots=2, max_seq_len=64,
                                                        prefill_chunk=16))
    try:
        np.testing.assert_array_equal(fresh.generate_batch([[1, 2, 3]], greedy)[0].token_ids,
                                      out.token_ids)
    finally:
        fresh.shutdown()


def test_an_in_place_publication_to_a_stopped_engine_raises():
    from agentax.engine import EngineClosed

    model = _bf16_model()
    engine = Engine(model, EngineConfig(max_slots=2, max_seq_len=64, prefill_chunk=16))
    engine.shutdown()
    with pytest.raises(EngineClosed):
        engine.update_weights(nnx.state(model), 1, in_place=True)


def test_a_released_trainer_precompiles_from_shapes_and_steps_after_load_weights():
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **_: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    # kl_coef > 0: the reference snapshot is freed and rebuilt too. clip_eps_low is unique
    # to this test, so no other test compiled these kernels.
    cfg = base_config(kl_coef=0.1, clip_eps_low=0.137)
    trainer = RLTrainer(make_model(0), cfg)
    state = jax.tree.leaves((trainer._params, trainer._opt_state, trainer._acc,
                             trainer._ref[1]))
    trainer.release()
    assert trainer.released and all(x.is_deleted() for x in state)
    with pytest.raises(RuntimeError, match="load_weights"):
        trainer.step(make_groups(seed=9))
    trainer.precompile(make_groups(seed=8))
    later = make_model(3)
    trainer.load_weights(later)
    before = len(compiles)
    m = trainer.step(make_groups(seed=9))
    assert len(compiles) == before  # the step ran on the kernels compiled from shapes
    direct = RLTrainer(later, cfg).step(make_groups(seed=9))
    assert m.kl == direct.kl == 0.0
    assert (m.loss, m.grad_norm) == (direct.loss, direct.grad_norm)


def test_export_with_release_hands_over_the_weights_and_frees_the_rest():
    trainer = SFTTrainer(make_model(0), base_config())
    optimizer = jax.tree.leaves((trainer._opt_state, trainer._acc))
    params = jax.tree.leaves(trainer._params)
    want = trainer.export_model()
    model = trainer.export_model(release=True)
    assert trainer.released and all(x.is_deleted() for x in optimizer)
    handed = {id(x) for x in jax.tree.leaves(nnx.state(model))}
    assert handed == {id(x) for x in params}  # float32 model: no copy was made
    ids = jnp.arange(12, dtype=jnp.int32)[None]
    np.testing.assert_array_equal(model(ids), want(ids))


def _subprocess(script: str, *args: str, devices: int) -> dict:
    flags = fast_compile_xla_flags(f"--xla_force_host_platform_device_count={devices}")
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
               PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


LOAD_SCRIPT = textwrap.dedent("""
    import json, sys, jax, numpy as np
    from flax import nnx
    from agentax.models import load_pretrained, save_pretrained
    from agentax.train import RLTrainer, make_mesh, param_sharding_fn
    from agentax.train._sharding import param_shardings
    from tests.train.conftest import base_config, make_model
    save_pretrained(make_model(0), sys.argv[1])
    mesh = make_mesh(fsdp=2, tensor=2)
    model = load_pretrained(sys.argv[1], shardings=param_sharding_fn(mesh))
    plain = load_pretrained(sys.argv[1])
    state, want = nnx.state(model), param_shardings(nnx.state(model), mesh)
    out = {"placed": all(x.sharding == s for x, s in zip(jax.tree.leaves(state),
                                                          jax.tree.leaves(want))),
           "equal": all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state),
                                                             jax.tree.leaves(nnx.state(plain))))}
    q = model.layers[0].attn.q_proj.kernel[...]
    out["q_spec"] = str(q.sharding.spec)
    out["q_shards"] = sorted({tuple(s.data.shape) for s in q.addressable_shards})
    out["q_shape"] = list(q.shape)
    trainer = RLTrainer(model, base_config(), mesh=mesh)
    t = trainer._params["model"]["layers"][0]["attn"]["q_proj"]["kernel"][...]
    out["trainer_spec"] = str(t.sharding.spec)
    print("RESULT " + json.dumps(out))
""")


def test_loading_places_each_tensor_straight_into_its_sharding(tmp_path):
    out = _subprocess(LOAD_SCRIPT, str(tmp_path / "ckpt"), devices=4)
    assert out["placed"] and out["equal"]
    assert out["q_spec"] == out["trainer_spec"] == str(P("fsdp", "tensor"))
    d_in, d_out = out["q_shape"]
    assert out["q_shards"] == [[d_in // 2, d_out // 2]]  # each device holds only its quarter


CLI_SCRIPT = textwrap.dedent("""
    import json, sys, jax
    import agentax.run._rl as rl_phase
    import agentax.run._sft as sft_phase
    from agentax.cli import main
    from tests.cli.test_commands import TINY
    seen = {}
    sft_run, rl_run = sft_phase.SFTPhase.run, rl_phase.RLPhase.run

    def spy_sft_run(self, model):
        trainer = sft_run(self, model)
        seen["sft"] = trainer
        seen["sft_optimizer"] = jax.tree.leaves((trainer._opt_state, trainer._acc))
        return trainer

    def spy_rl(self):
        trainer, engine = self.trainer, self.engine
        tree = (trainer._params, trainer._rest, trainer._opt_state, trainer._acc)
        seen["state"] = sum(x.nbytes for x in jax.tree.leaves(tree))
        seen["live"] = sum(x.nbytes for x in jax.live_arrays())
        seen["model"] = sum(x.nbytes for x in engine._weights)
        seen["cache"] = engine._runner.kv_cache_bytes
        q = trainer._params["model"]["layers"][0]["attn"]["q_proj"]["kernel"][...]
        seen["rl_devices"] = len(q.sharding.device_set)
        return rl_run(self)

    sft_phase.SFTPhase.run, rl_phase.RLPhase.run = spy_sft_run, spy_rl
    status = main(["train", *TINY, f"run.runs_dir={sys.argv[1]}", "run.name=mesh",
                   "trainer.mesh.fsdp=2", "tracing.plots=false", "tracing.doctor=false"])
    sft = seen.pop("sft")
    out = {"status": status, "sft_released": sft.released, "sft_mesh": dict(sft.mesh.shape),
           "sft_optimizer_freed": all(x.is_deleted() for x in seen.pop("sft_optimizer")),
           **seen}
    print("RESULT " + json.dumps(out))
""")


def test_cli_trains_on_trainer_mesh_with_one_trainer_state(tmp_path):
    out = _subprocess(CLI_SCRIPT, str(tmp_path / "runs"), devices=2)
    assert out["status"] == 0
    assert out["sft_mesh"] == {"data": 1, "fsdp": 2, "tensor": 1} and out["rl_devices"] == 2
    assert out["sft_released"] and out["sft_optimizer_freed"]
    # Besides the RL trainer's state and the KV cache, only copies of the model are alive
    # (the engine's, the exported SFT weights, the start model until the engine swaps it);
    # a second trainer state (4 model sizes here: weights, 2 moments, accumulator) is not.
    others = out["live"] - out["state"] - out["cache"]
    assert others < 5 * out["model"], out


def test_trainer_mesh_larger_than_the_devices_is_a_config_error(tmp_path, capsys):
    from agentax.cli import main

    status = main(["train", "trainer.mesh.fsdp=64", f"run.runs_dir={tmp_path}", "run.name=x",
                   "tracing.console=false"])
    err = capsys.readouterr().err
    assert status == 2
    assert "trainer.mesh" in err and "xla_force_host_platform_device_count" in err
