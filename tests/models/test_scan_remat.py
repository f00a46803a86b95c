"""The full-sequence forward under `lax.scan` and remat: values and gradients equal the unrolled
loop without remat (Qwen3 and Gemma 3 layouts: per-layer windows and RoPE as scanned data,
soft-caps, packed segments), layers of different structure fall back to the loop, and the
compiled step does not grow with depth."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentax.models import ModelConfig, Transformer

QWEN = ModelConfig.tiny(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=3,
                        num_heads=4, num_kv_heads=2, head_dim=8)
GEMMA = ModelConfig.tiny(
    family="gemma3", vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=4, num_heads=4,
    num_kv_heads=1, head_dim=16, norm_plus_one=True, post_norms=True, embed_scale=True,
    hidden_act="gelu_tanh", sliding_window=4, rope_local_theta=1e3, rope_theta=1e5,
    layer_types=("sliding", "full", "sliding", "sliding"), attn_logit_softcap=20.0,
    final_logit_softcap=15.0, query_scale=0.3)
T = 21
SEG = np.array([[1] * T, [1] * 7 + [2] * 9 + [0] * 5], np.int32)


def _randomised(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """A model whose every weight (norms included) is random, so a layer mixed up with
    another, or a norm skipped, changes the output."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


def _loss_and_grads(model: Transformer, **options):
    graphdef, state = nnx.split(model)
    ids = jnp.asarray(np.random.default_rng(1).integers(0, model.config.vocab_size, (2, T)),
                      jnp.int32)
    weights = jax.random.normal(jax.random.key(2), (2, T, model.config.vocab_size))

    @jax.jit
    def loss(state):
        logits = nnx.merge(graphdef, state)(ids, segment_ids_bt=jnp.asarray(SEG), **options)
        return jnp.sum(jnp.where(SEG[..., None] > 0, logits * weights, 0.0))

    value, grads = jax.value_and_grad(loss)(state)
    return value, jax.tree.leaves(grads)


@pytest.mark.parametrize("cfg,remat", [
    (GEMMA, "full"), (QWEN, "save_dots"),
    pytest.param(QWEN, "full", marks=pytest.mark.slow),
    pytest.param(GEMMA, "save_dots", marks=pytest.mark.slow)], ids=lambda x: getattr(x, "family", x))
def test_scanned_remat_gradients_equal_the_unrolled_loop(cfg, remat):
    model = _randomised(cfg)
    ref_value, ref_grads = _loss_and_grads(model, scan=False, remat="none", attention="dense")
    value, grads = _loss_and_grads(model, scan=True, remat=remat, attention="blocked",
                                   attention_block=8)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * float(jnp.abs(r).max()) + 1e-6)


def test_the_window_and_rope_of_each_layer_reach_the_scan():
    """Giving every layer layer 0's window and RoPE changes the output: the scan reads them
    per layer (a scan that used layer 0's for all would pass the test above only by luck)."""
    model = _randomised(GEMMA)
    ids = jnp.arange(2 * T, dtype=jnp.int32).reshape(2, T) % GEMMA.vocab_size
    scanned = model.hidden(ids, scan=True, attention="blocked")
    unrolled = model.hidden(ids, scan=False, attention="dense")
    np.testing.assert_allclose(scanned, unrolled, atol=2e-5)
    all_sliding = dataclasses.replace(GEMMA, layer_types=("sliding",) * 4)
    other = nnx.merge(nnx.split(Transformer(all_sliding))[0], nnx.state(model))
    assert float(jnp.abs(other.hidden(ids, scan=True) - scanned).max()) > 1e-3


def test_layers_of_different_structure_fall_back_to_the_loop():
    from agentax.train import LoRAConfig
    from agentax.train._lora import apply_lora
    model = _randomised(QWEN)
    apply_lora(model, LoRAConfig(rank=2, targets=(r"layers/1/attn/q_proj",)), rngs=nnx.Rngs(3))
    ref_value, ref_grads = _loss_and_grads(model, scan=False, remat="none", attention="dense")
    value, grads = _loss_and_grads(model, scan=True, remat="full", attention="blocked")
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * float(jnp.abs(r).max()) + 1e-6)


def _dots_in_compiled_grad(num_layers: int, scan: bool) -> int:
    cfg = ModelConfig.tiny(vocab_size=97, hidden_size=32, intermediate_size=48,
                           num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=8)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg)))
    ids = jax.ShapeDtypeStruct((1, 64), jnp.int32)

    def loss(state, ids):
        return jnp.sum(nnx.merge(graphdef, state).hidden(ids, scan=scan, remat="full") ** 2)

    text = jax.jit(jax.grad(loss)).lower(state, ids).compile().as_text()
    return text.count(" dot(")


def test_the_compiled_step_does_not_grow_with_depth():
    assert _dots_in_compiled_grad(2, scan=True) == _dots_in_compiled_grad(6, scan=True)
    assert _dots_in_compiled_grad(6, scan=False) > _dots_in_compiled_grad(2, scan=False)


def test_auto_remat_and_scan_follow_the_shapes():
    """'auto' keeps every activation of a small problem and runs a shallow model unrolled;
    a real model at a real length recomputes and scans; explicit choices pass through."""
    from agentax.models import config_from_hf
    from agentax.models._transformer import REMAT_AUTO_BYTES, resolve_layer_options, \
        saved_activation_bytes
    from tests.models.published_configs import QWEN3_0_6B

    assert resolve_layer_options(QWEN, 2, 64, "dense", "auto", "auto", 4) == ("none", False)
    real = config_from_hf(QWEN3_0_6B)
    assert saved_activation_bytes(real, 1, 4096, "blocked", 2) > REMAT_AUTO_BYTES
    assert resolve_layer_options(real, 1, 4096, "blocked", "auto", "auto", 2) == ("full", True)
    assert resolve_layer_options(real, 1, 64, "dense", "auto", "auto", 2)[0] == "none"
    assert resolve_layer_options(QWEN, 2, 64, "dense", "save_dots", False, 4) == \
        ("save_dots", False)
