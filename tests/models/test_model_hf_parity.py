"""agentax vs `transformers` on tiny random Llama / Qwen2 / Qwen3 / Gemma 3 checkpoints.

Each case is saved by transformers, loaded with `load_pretrained`, and compared: float32 logits
(plain, left-padded, packed), greedy continuations through the KV-cache path, and the way back
through `save_pretrained`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from models_helpers import (
    HF_CASES,
    VOCAB,
    ax_greedy,
    ax_logits,
    hf_greedy,
    hf_logits,
    make_hf_model,
)

from agentax.models import load_pretrained, save_pretrained
from agentax.models._layers import positions_from_segments

B, T = 2, 40
TOL = 1e-4


@pytest.fixture(scope="module", params=sorted(HF_CASES))
def case(request, tmp_path_factory):
    """(name, HF model, agentax model loaded from the HF checkpoint, token ids [B, T])."""
    name = request.param
    hf = make_hf_model(name)
    path = tmp_path_factory.mktemp(f"hf_{name}")
    hf.save_pretrained(path)
    ids = np.random.default_rng(0).integers(0, VOCAB, (B, T))
    return name, hf, load_pretrained(path), ids


def test_config_is_read_as_written(case):
    name, hf, model, _ = case
    c, h = model.config, hf.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (
        h.num_hidden_layers, h.num_attention_heads, h.num_key_value_heads,
        getattr(h, "head_dim", None) or h.hidden_size // h.num_attention_heads,
    )
    assert c.tie_word_embeddings == h.tie_word_embeddings
    assert (model.lm_head is None) == h.tie_word_embeddings
    if name == "qwen2":
        assert c.layer_types == ("full", "sliding") and c.sliding_window == 8
    if name == "gemma3":
        assert c.rope_local_theta == 1e3 and c.rope_scaling.kind == "linear"


def test_logits_match(case):
    _, hf, model, ids = case
    ref = hf_logits(hf, ids)
    out = ax_logits(model, ids)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, atol=TOL, rtol=0)


def test_greedy_continuation_matches_generate(case):
    _, hf, model, ids = case
    prompt = ids[:, :8]
    want = hf_greedy(hf, prompt, 32)
    got = ax_greedy(model, prompt, 32)
    np.testing.assert_array_equal(got, want)


def test_left_padding_matches(case):
    _, hf, model, ids = case
    mask = np.ones((B, T), np.int64)
    mask[0, :7] = 0  # row 0 is left-padded by 7, row 1 is full
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    ref = hf_logits(hf, ids, attention_mask=mask, position_ids=positions)
    out = ax_logits(model, ids, positions=positions, mask=mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(out[real], ref[real], atol=TOL, rtol=0)


def test_packed_row_equals_separate_rows(case):
    _, hf, model, ids = case
    a, b = ids[1, :15], ids[1, 15:35]  # two sequences and 5 padding tokens in one row
    seg = np.zeros((B, T), np.int32)
    seg[0] = 1
    seg[1, :15], seg[1, 15:35] = 1, 2
    packed = ids.copy()
    out = ax_logits(model, packed, positions=np.asarray(positions_from_segments(seg)),
                    segment_ids=seg)
    np.testing.assert_allclose(out[1, :15], hf_logits(hf, a[None])[0], atol=TOL, rtol=0)
    np.testing.assert_allclose(out[1, 15:35], hf_logits(hf, b[None])[0], atol=TOL, rtol=0)


def test_save_pretrained_loads_in_transformers(case, tmp_path):
    _, _, model, ids = case
    save_pretrained(model, tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert back.dtype == torch.float32
    np.testing.assert_allclose(hf_logits(back.eval(), ids), ax_logits(model, ids), atol=TOL, rtol=0)


def test_bf16_checkpoint(tmp_path):
    """A bf16 checkpoint loads as bf16 by default, and exactly (upcast) with dtype='float32'."""
    hf = make_hf_model("qwen3").to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    ids = np.random.default_rng(1).integers(0, VOCAB, (B, T))

    model = load_pretrained(tmp_path)
    assert model.config.dtype == model.config.param_dtype == "bfloat16"
    assert model.embed.embedding[...].dtype == np.dtype("bfloat16")
    # the float32 reference reads the same bf16 file (casting `hf` back would also round its
    # RoPE inv_freq buffer to bf16)
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ref = hf_logits(hf32, ids)
    out16 = ax_logits(model, ids)
    assert np.isfinite(out16).all()
    assert np.abs(out16 - ref).max() < 0.05 * np.abs(ref).max()
    assert (out16.argmax(-1) == ref.argmax(-1)).mean() > 0.9

    model32 = load_pretrained(tmp_path, dtype="float32")
    assert model32.layers[0].mlp.up_proj.kernel[...].dtype == np.float32
    np.testing.assert_allclose(ax_logits(model32, ids), ref, atol=TOL, rtol=0)
