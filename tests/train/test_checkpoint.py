"""Orbax checkpoints: resuming reproduces the uninterrupted run; mismatches are clear errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agentax.models import ModelConfig, Transformer, load_pretrained
from agentax.train import LoRAConfig, RLTrainer, latest_checkpoint_step
from tests.train.conftest import base_config, make_groups, make_model


def test_resume_gives_the_same_next_steps(tmp_path):
    batches = [make_groups(seed=20 + i) for i in range(3)]
    run = RLTrainer(make_model(0), base_config())
    run.step(batches[0])
    path = run.save_checkpoint(tmp_path)
    assert path.name == "step_1" and latest_checkpoint_step(tmp_path) == 1
    want = [run.step(b) for b in batches[1:]]

    resumed = RLTrainer(make_model(0), base_config())
    assert resumed.restore_checkpoint(tmp_path) == 1
    assert (resumed.policy_version, resumed.step_count, resumed.data_position) == (1, 1, 2)
    got = [resumed.step(b) for b in batches[1:]]
    for a, b in zip(want, got):
        assert (a.loss, a.grad_norm, a.policy_version) == (b.loss, b.grad_norm, b.policy_version)
    for x, y in zip(jax.tree.leaves(run._params), jax.tree.leaves(resumed._params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_checkpoint_from_another_model_is_rejected(tmp_path):
    RLTrainer(make_model(0), base_config()).save_checkpoint(tmp_path)
    other = Transformer(ModelConfig.tiny(num_layers=1, hidden_size=48, intermediate_size=64,
                                         num_heads=2, num_kv_heads=1, head_dim=16))
    with pytest.raises(ValueError, match="hidden_size: checkpoint=32 trainer=48"):
        RLTrainer(other, base_config()).restore_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="lora"):
        RLTrainer(make_model(0), base_config(lora=LoRAConfig(rank=4))).restore_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        RLTrainer(make_model(0), base_config()).restore_checkpoint(tmp_path / "missing")


def test_export_to_hugging_face_safetensors(tmp_path):
    trainer = RLTrainer(make_model(0), base_config())
    trainer.step(make_groups(seed=30))
    trainer.export_pretrained(tmp_path / "hf")
    assert list((tmp_path / "hf").glob("*.safetensors"))
    loaded = load_pretrained(tmp_path / "hf")
    ids = np.arange(16, dtype=np.int32)[None]
    np.testing.assert_allclose(loaded(ids), trainer.export_model()(ids), atol=1e-5)
