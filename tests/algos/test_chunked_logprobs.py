"""Chunked LM-head statistics: equal to the full-logits computation (values and gradients),
equal trainer steps with and without chunks, and no [N, V] buffer in the compiled kernel."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentax import algos
from agentax.models import Transformer
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, SFTTrainer, TrainerConfig, sft_examples
from agentax.train._step import StepOptions, score_tokens
from tests.train.conftest import MICRO, base_config, make_groups, make_model


def _head(tie: bool, softcap: float | None):
    cfg = dataclasses.replace(MICRO, tie_word_embeddings=tie, final_logit_softcap=softcap)
    graphdef, params, rest = nnx.split(Transformer(cfg, rngs=nnx.Rngs(3)), nnx.Param, ...)
    return graphdef, params, rest


def _inputs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(n, MICRO.hidden_size)), jnp.float32)
    targets = rng.integers(0, MICRO.vocab_size, n)
    mask = (rng.random(n) < 0.6).astype(np.float32)
    mask[n // 3: n // 3 + 9] = 0.0  # a hole longer than a chunk
    return hidden, targets, mask


def _stats_fn(graphdef, rest, targets, mask, chunk, entropy_grad=True):
    """(params, hidden) -> (weighted masked sum of logp and entropy, stats)."""
    w = jnp.asarray(np.random.default_rng(1).uniform(0.5, 1.5, len(targets)), jnp.float32)

    def f(params, hidden):
        head = nnx.merge(graphdef, params, rest).logits
        kw = dict(entropy=True, entropy_grad=entropy_grad, correct=True)
        if chunk:
            s = algos.chunked_token_stats(hidden, targets, mask, head, chunk=chunk, **kw)
        else:
            s = algos.full_token_stats(hidden, targets, mask, head, **kw)
        return jnp.sum(mask * w * (s["logp"] + 0.3 * s["entropy"])), s

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))


@pytest.mark.parametrize("tie,softcap", [(True, None), (False, None), (True, 5.0), (False, 5.0)])
@pytest.mark.parametrize("n,chunk", [(37, 8), (37, 64), (40, 8)])
def test_chunked_stats_and_gradients_equal_the_full_logits(tie, softcap, n, chunk):
    graphdef, params, rest = _head(tie, softcap)
    hidden, targets, mask = _inputs(n)
    # Make some argmax hits: a target equal to the full logits' argmax.
    full_logits = nnx.merge(graphdef, params, rest).logits(hidden)
    targets[::3] = np.asarray(jnp.argmax(full_logits, -1))[::3]
    targets = jnp.asarray(targets, jnp.int32)
    (v_ref, s_ref), g_ref = _stats_fn(graphdef, rest, targets, mask, 0)(params, hidden)
    (v, s), g = _stats_fn(graphdef, rest, targets, mask, chunk)(params, hidden)
    assert int(np.sum(mask)) > chunk or chunk > n  # trailing chunks hold no loss position
    np.testing.assert_allclose(v, v_ref, rtol=1e-5, atol=1e-5)
    on = mask > 0
    for k in ("logp", "entropy"):
        np.testing.assert_allclose(np.asarray(s[k])[on], np.asarray(s_ref[k])[on],
                                   rtol=1e-5, atol=1e-5)
        assert np.all(np.asarray(s[k])[~on] == 0.0)
    np.testing.assert_array_equal(np.asarray(s["correct"]), np.asarray(s_ref["correct"]) & on)
    assert 0 < int(np.sum(np.asarray(s["correct"]))) < int(on.sum())
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    head_grad = g[0]["embed"]["embedding"] if tie else g[0]["lm_head"]["kernel"]
    assert float(jnp.abs(head_grad[...]).sum()) > 0
    assert np.all(np.asarray(g[1])[~on] == 0.0)


def test_one_chunk_is_the_full_computation_bit_for_bit():
    """A chunk that holds every position runs the full path's operations: the byte-model
    recipes' runs reproduce the full-logits trainer exactly (values and gradients)."""
    graphdef, params, rest = _head(False, None)
    hidden, targets, mask = _inputs(37)
    targets = jnp.asarray(targets, jnp.int32)
    (v_ref, s_ref), g_ref = _stats_fn(graphdef, rest, targets, mask, 0)(params, hidden)
    (v, s), g = _stats_fn(graphdef, rest, targets, mask, 64)(params, hidden)
    on = mask > 0
    assert float(v) == float(v_ref)
    np.testing.assert_array_equal(np.asarray(s["logp"])[on], np.asarray(s_ref["logp"])[on])
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        np.testing.assert_array_equal(a, b)


def test_stop_gradient_entropy_and_empty_mask():
    graphdef, params, rest = _head(True, None)
    hidden, targets, mask = _inputs(37)
    targets = jnp.asarray(targets, jnp.int32)
    (_, s), g = _stats_fn(graphdef, rest, targets, mask, 8, entropy_grad=False)(params, hidden)
    (_, s_ref), g_ref = _stats_fn(graphdef, rest, targets, mask, 0, entropy_grad=False)(
        params, hidden)
    np.testing.assert_allclose(s["entropy"] * mask, s_ref["entropy"] * mask, rtol=1e-5,
                               atol=1e-5)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):  # the logp term only
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    empty = np.zeros_like(mask)
    (v, s), g = _stats_fn(graphdef, rest, targets, empty, 8)(params, hidden)
    assert float(v) == 0.0 and all(not np.any(np.asarray(x)) for x in s.values())
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(g))


def _temp_bytes(n: int, chunk: int, *, d: int = 1024, v: int = 151_936) -> int:
    """Compiled temp memory of value_and_grad (head weights and hidden) of the token stats."""
    def f(w_vd, hidden_nd, targets_n, mask_n):
        def head(h):
            return jnp.einsum("...d,vd->...v", h, w_vd.astype(h.dtype),
                              preferred_element_type=jnp.float32)
        kw = dict(entropy=True, entropy_grad=False)
        if chunk:
            s = algos.chunked_token_stats(hidden_nd, targets_n, mask_n, head, chunk=chunk, **kw)
        else:
            s = algos.full_token_stats(hidden_nd, targets_n, mask_n, head, **kw)
        return jnp.sum(mask_n * s["logp"]) + jnp.sum(mask_n * s["entropy"])

    args = (jax.ShapeDtypeStruct((v, d), jnp.float32), jax.ShapeDtypeStruct((n, d), jnp.bfloat16),
            jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((n,), jnp.float32))
    compiled = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_compiled_memory_has_no_positions_by_vocab_buffer():
    """Qwen3-0.6B's head (V=151,936, D=1024) on 4,096 bf16 positions, chunks of 1,024.

    One float32 [4096, V] logits buffer is 2.49 GB and the full computation's temp is
    ~7.5 GB (CPU). The chunked temp (~2.2 GB on CPU) is per-chunk buffers, [1024, V] float32
    logits and their cotangent (0.62 GB each), a bf16 copy of the head weights for the
    backward pass (0.31 GB) and the float32 [V, D] weight-gradient accumulator (0.62 GB):
    none grows with the number of positions, which 4x more positions show.
    """
    full = _temp_bytes(4096, 0)
    small, large = _temp_bytes(4096, 1024), _temp_bytes(16_384, 1024)
    one_logits = 4096 * 151_936 * 4
    assert full > 2 * one_logits
    assert small < 2.5e9 and small < full / 3
    # 12,288 more positions: O(N * D) more (hidden, its gradient, indices; ~0.1 GB), where
    # one more [12288, V] float32 buffer would be 7.5 GB.
    assert large - small < 0.25e9


# ---------------------------------------------------------------- trainer level


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _chunks_of(trainer, positions: int):
    """Chunks of exactly `positions` (the byte vocabulary would make one chunk of a batch)."""
    trainer._opts = trainer._opts._replace(logits_chunk=positions)
    return trainer


def _assert_same_rl_steps(cfg: TrainerConfig, num_steps: int = 2):
    full = RLTrainer(make_model(0), dataclasses.replace(cfg, logits_chunk=0))
    chunked = _chunks_of(RLTrainer(make_model(0), cfg), 16)
    for i in range(num_steps):
        groups = make_groups(seed=20 + i)
        a, b = full.step(groups), chunked.step(groups)
        assert a.num_tokens == b.num_tokens and not a.skipped and not b.skipped
        for key in ("loss", "pg_loss", "entropy", "kl", "approx_kl", "advantage_abs_mean"):
            assert getattr(b, key) == pytest.approx(getattr(a, key), rel=1e-4, abs=1e-5), key
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
        assert a.extra.keys() == b.extra.keys()
        for key in a.extra:
            assert b.extra[key] == pytest.approx(a.extra[key], rel=1e-4, abs=1e-5), key
    # Adam turns float noise in a near-zero gradient into up to ~lr; 1e-4 is 1% of lr.
    for x, y in zip(_leaves(full._params), _leaves(chunked._params)):
        np.testing.assert_allclose(x, y, atol=1e-4)
    return a, b


def test_rl_step_with_chunks_equals_full_logits():
    a, _ = _assert_same_rl_steps(base_config(), num_steps=1)
    assert a.entropy > 0


@pytest.mark.slow  # ~25 s of compiles; the default suite keeps the plain RL and SFT equalities
def test_rl_scoring_passes_with_chunks_equal_full_logits():
    # Proximal logprobs and values (ppo_epochs=2), reference logprobs for the KL loss, and
    # an entropy bonus with gradient.
    cfg = base_config(advantage="gae", advantage_kwargs={"gamma": 1.0, "lam": 0.95},
                      kl_coef=0.1, ppo_epochs=2, off_policy="decoupled", is_cap=5.0,
                      entropy_coef=1e-2)
    a, _ = _assert_same_rl_steps(cfg)
    assert a.kl > 0 and "is_weight_mean" in a.extra
    # Reference logprobs in the reward (compute_advantages, seen in the advantages),
    # proximal logprobs recomputed.
    cfg = base_config(advantage="reinforce_pp", kl_coef=0.1, kl_in_reward=True,
                      recompute_proximal=True)
    _assert_same_rl_steps(cfg, num_steps=1)


def test_score_tokens_with_chunks_equals_full_logits_at_loss_positions():
    trainer = RLTrainer(make_model(0), base_config())
    trainer.step(make_groups(seed=30))  # a policy that differs from the initial one
    _, seqs, *_ = trainer._sequences(make_groups(seed=31))
    for mb in trainer._micro_batches(seqs, with_rl=True):
        b = trainer._put(mb.batch)
        args = (trainer._graphdefs, trainer._params, trainer._rest, b)
        full, _ = score_tokens(*args, opts=StepOptions(logits_chunk=0))
        chunked, _ = score_tokens(*args, opts=StepOptions(logits_chunk=16))
        on = np.asarray(mb.batch.loss_mask) > 0
        np.testing.assert_allclose(np.asarray(chunked)[on], np.asarray(full)[on], atol=1e-5)
        assert np.all(np.asarray(chunked)[~on] == 0.0)


def test_sft_step_with_chunks_equals_full_logits():
    chats = [[{"role": "user", "content": f"{i}+{i}?"},
              {"role": "assistant", "content": f"{2 * i}"}] for i in range(8)]
    examples = sft_examples(ByteTokenizer(), chats)
    cfg = TrainerConfig(learning_rate=1e-2, micro_batch_size=8, min_seq_bucket=32,
                        max_seq_len=128, pack=True, pack_length=128)
    full = SFTTrainer(make_model(0), dataclasses.replace(cfg, logits_chunk=0))
    chunked = _chunks_of(SFTTrainer(make_model(0), cfg), 16)
    for _ in range(3):
        a, b = full.step(examples).to_dict(), chunked.step(examples).to_dict()
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["accuracy"] == pytest.approx(a["accuracy"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert a["accuracy"] > 0
    for x, y in zip(_leaves(full._params), _leaves(chunked._params)):
        np.testing.assert_allclose(x, y, atol=1e-4)


def test_a_chunk_holds_more_positions_of_a_small_vocabulary():
    cfg = TrainerConfig()
    assert StepOptions.from_config(cfg, vocab_size=151_936).logits_chunk == 1024
    assert StepOptions.from_config(cfg, vocab_size=256).logits_chunk == 1024 * 512
    assert StepOptions.from_config(dataclasses.replace(cfg, logits_chunk=0),
                                   vocab_size=256).logits_chunk == 0
