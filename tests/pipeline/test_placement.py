"""Colocated and disaggregated placement on fake CPU devices (run in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.compile_flags import fast_compile_xla_flags

SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
    import jax
    from flax import nnx
    from agentax.agents import ModelAgent
    from agentax.engine import Engine, EngineConfig
    from agentax.envs import TaskEnvironment
    from agentax.models import ModelConfig, Transformer
    from agentax.pipeline import Pipeline, PipelineConfig, Placement
    from agentax.records import SamplingParams, Task
    from agentax.rollout import Collector, CollectorConfig
    from agentax.text import ByteTokenizer
    from agentax.train import RLTrainer, TrainerConfig

    kind = sys.argv[1]
    devices = jax.devices()
    assert len(devices) == 8, devices
    if kind == "disaggregated":
        placement = Placement.split(devices[:5])
    else:
        placement = Placement.colocated()
    cfg = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                           num_kv_heads=1, head_dim=32)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    tok = ByteTokenizer()
    with placement.engine_scope():
        engine = Engine(placement.engine_model(model),
                        EngineConfig(max_slots=8, max_seq_len=128, prefill_chunk=64),
                        eos_token_ids=tok.eos_token_ids, tokenizer=tok)
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=8,
                                             max_seq_len=128, min_seq_bucket=64),
                        mesh=placement.trainer_mesh)
    reward = lambda task, resp: sum(c in "aeiou" for c in resp) / max(len(resp), 1)
    collector = Collector(engine, tok, lambda: TaskEnvironment(reward), lambda: ModelAgent(),
                          SamplingParams(temperature=1.0, max_tokens=8),
                          CollectorConfig(max_turns=1, max_episode_tokens=100))
    tasks = [Task(id=f"t{i}", prompt=f"Say {i}.") for i in range(4)]
    config = PipelineConfig(mode="async", max_staleness=1, group_size=2, groups_per_step=2,
                            max_concurrency=8, filters=())
    result = Pipeline(collector, trainer, engine, tasks, config,
                      publish=placement.publisher()).run(2)
    import time
    deadline = time.time() + 30  # publication lands between two engine steps: wait for it
    while engine.policy_version != 2 and time.time() < deadline:
        time.sleep(0.01)
    engine_devices = set()
    for leaf in jax.tree.leaves(engine._weights):
        engine_devices |= set(leaf.devices())
    trainer_devices = set()
    for leaf in jax.tree.leaves(trainer.params_for_engine()):
        trainer_devices |= set(leaf.devices())
    engine.shutdown()
    assert engine.policy_version == 2, engine.policy_version
    assert engine_devices == {placement.engine_device}, engine_devices
    if kind == "disaggregated":
        assert placement.engine_device not in trainer_devices
        assert len(trainer_devices) == 4, trainer_devices
    else:
        assert trainer_devices == {placement.engine_device}, trainer_devices
    assert result.accounting.trained == 8
    print("PLACEMENT-OK", kind, sorted(d.id for d in trainer_devices), placement.engine_device.id)
    """
)


@pytest.mark.parametrize("kind", ["colocated", pytest.param(
    "disaggregated", marks=pytest.mark.slow)])  # 15 s each: the second in CI's slow stage
def test_placement_runs_pipeline_and_publishes_to_engine_devices(kind, tmp_path):
    script = tmp_path / "placement.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "XLA_FLAGS": fast_compile_xla_flags()}
    out = subprocess.run([sys.executable, str(script), kind], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "PLACEMENT-OK" in out.stdout
