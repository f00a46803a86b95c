"""LoRA via nnx.LoRALinear: starts as the base model, trains only adapters, merges exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentax.train import LoRAConfig, RLTrainer
from agentax.train._lora import apply_lora, lora_paths, merge_lora
from tests.train.conftest import MICRO, base_config, make_groups, make_model

IDS = (jnp.arange(24, dtype=jnp.int32)[None] * 7) % 250


def test_apply_lora_selects_by_name_and_leaves_outputs_unchanged():
    base = make_model(0)
    want = base(IDS)
    lora = make_model(0)
    cfg = LoRAConfig(rank=4, targets=(r"attn/(q|v)_proj",))
    assert [p[-1] for p in lora_paths(lora, cfg)] == ["q_proj", "v_proj"] * MICRO.num_layers
    apply_lora(lora, cfg, rngs=nnx.Rngs(1))
    assert isinstance(lora.layers[0].attn.q_proj, nnx.LoRALinear)
    assert type(lora.layers[0].attn.k_proj) is nnx.Linear
    np.testing.assert_allclose(lora(IDS), want, atol=1e-6)  # lora_b starts at zero
    with pytest.raises(ValueError, match="match no linear layer"):
        apply_lora(make_model(0), LoRAConfig(targets=("qkv",)), rngs=nnx.Rngs(0))


def test_lora_trainer_trains_adapters_only_and_merge_matches():
    model = make_model(0)
    trainer = RLTrainer(model, base_config(lora=LoRAConfig(rank=4)))
    full = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert 0 < trainer.num_params() < full // 4
    rest_before = [np.asarray(x) for x in jax.tree.leaves(trainer._rest)]
    for seed in range(2):
        assert not trainer.step(make_groups(seed=seed)).skipped
    for x, y in zip(rest_before, jax.tree.leaves(trainer._rest)):
        np.testing.assert_array_equal(x, np.asarray(y))  # base weights frozen
    lora_b = trainer._params["model"]["layers"][0]["attn"]["q_proj"]["lora"]["lora_b"]
    assert np.abs(np.asarray(lora_b.value)).max() > 0  # adapters moved
    merged = trainer.export_model()  # a plain Transformer with W + A @ B
    assert type(merged.layers[0].attn.q_proj) is nnx.Linear
    lora_logits = trainer.model(IDS)
    assert np.abs(np.asarray(lora_logits - model(IDS))).max() > 1e-4  # it learned something
    np.testing.assert_allclose(merged(IDS), lora_logits, atol=2e-5)
    # merge_lora on the raw state gives the same tree as the plain model.
    plain = merge_lora(nnx.state(trainer.model, nnx.Param))
    assert jax.tree.structure(plain) == jax.tree.structure(nnx.state(model, nnx.Param))
