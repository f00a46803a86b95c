"""load_pretrained / save_pretrained: sharding, agentax-initialised round trips, errors that
name the tensor, and the presets' parameter counts."""

from __future__ import annotations

import json
import types

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from models_helpers import VOCAB, ax_logits, hf_logits, make_hf_model
from published_configs import PUBLISHED
from safetensors.numpy import load_file, save_file

from agentax.models import ModelConfig, Transformer, config_to_hf, load_pretrained, save_pretrained
from agentax.models._params import hf_param_table


def _params(model) -> dict:
    return {p: np.asarray(v.value) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _assert_same_params(a, b):
    pa, pb = _params(a), _params(b)
    assert pa.keys() == pb.keys()
    for path in pa:
        np.testing.assert_array_equal(pa[path], pb[path], err_msg=str(path))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A random untied Llama checkpoint (single file), and the HF model that wrote it."""
    hf = make_hf_model("llama")
    path = tmp_path_factory.mktemp("llama")
    hf.save_pretrained(path)
    return path, hf


def test_sharded_hf_checkpoint_loads(llama_dir, tmp_path):
    path, hf = llama_dir
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    _assert_same_params(load_pretrained(tmp_path), load_pretrained(path))


def test_save_pretrained_shards_and_transformers_loads_them(llama_dir, tmp_path):
    path, hf = llama_dir
    model = load_pretrained(path)
    save_pretrained(model, tmp_path, max_shard_bytes=30_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (tmp_path / "model.safetensors").exists()
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"]) == set(hf.state_dict())
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    for name, tensor in back.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), hf.state_dict()[name].numpy(), err_msg=name)
    _assert_same_params(load_pretrained(tmp_path), model)
    # saving again unsharded leaves one checkpoint in the directory
    save_pretrained(model, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("model*")) == ["model.safetensors"]


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig.tiny(),  # Qwen3 layout, byte vocabulary, tied
        ModelConfig.tiny(
            family="gemma3", norm_plus_one=True, post_norms=True, embed_scale=True,
            hidden_act="gelu_tanh", query_scale=0.125, num_layers=3, sliding_window=6,
            layer_types=("sliding", "full", "sliding"), rope_local_theta=100.0,
            final_logit_softcap=20.0,
        ),
    ],
    ids=["tiny-qwen3", "tiny-gemma3"],
)
def test_agentax_initialised_model_round_trips_through_transformers(config, tmp_path):
    model = Transformer(config, rngs=nnx.Rngs(3))
    # random norm weights too, so a swapped norm cannot pass
    for i, (path, var) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.Param))):
        if path[-1] == "weight":
            key = jax.random.fold_in(jax.random.key(0), i)
            var.value = var.value + 0.1 * jax.random.normal(key, var.value.shape)
    save_pretrained(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, 20))
    np.testing.assert_allclose(hf_logits(hf.eval(), ids), ax_logits(model, ids), atol=1e-4, rtol=0)
    _assert_same_params(load_pretrained(tmp_path), model)


def test_gemma3_conditional_generation_checkpoint_loads_text_model(tmp_path):
    """A Gemma3ForConditionalGeneration file (transformers-5 names): the text tower loads and
    the vision tensors are skipped."""
    hf = make_hf_model("gemma3")
    hf.save_pretrained(tmp_path / "text")
    tensors = load_file(tmp_path / "text" / "model.safetensors")
    mm = tmp_path / "mm"
    mm.mkdir()
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
    renamed["model.vision_tower.vision_model.post_layernorm.weight"] = np.ones(8, np.float32)
    renamed["model.multi_modal_projector.mm_input_projection_weight"] = np.ones((8, 64), np.float32)
    save_file(renamed, mm / "model.safetensors", metadata={"format": "pt"})
    text_config = json.loads((tmp_path / "text" / "config.json").read_text())
    outer = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
             "text_config": text_config, "vision_config": {"hidden_size": 8},
             "mm_tokens_per_image": 256}
    (mm / "config.json").write_text(json.dumps(outer))
    _assert_same_params(load_pretrained(mm), load_pretrained(tmp_path / "text"))


# ---------------------------------------------------------------------------- errors


def _rewrite(path, change):
    tensors = load_file(path / "model.safetensors")
    change(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture
def qwen3_dir(tmp_path):
    make_hf_model("qwen3").save_pretrained(tmp_path)
    return tmp_path


def test_missing_tensor_is_named(qwen3_dir):
    _rewrite(qwen3_dir, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(ValueError, match=r"lacks tensor 'model\.layers\.1\.self_attn\.k_norm\.weight'"):
        load_pretrained(qwen3_dir)


def test_unexpected_tensor_is_named(qwen3_dir):
    _rewrite(qwen3_dir, lambda t: t.update({"model.layers.0.mlp.gate_proj.bias": np.zeros(96, np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.mlp\.gate_proj\.bias'"):
        load_pretrained(qwen3_dir)


def test_shape_mismatch_is_named(qwen3_dir):
    config = json.loads((qwen3_dir / "config.json").read_text())
    config["intermediate_size"] = 128
    (qwen3_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight' has shape"):
        load_pretrained(qwen3_dir)


def test_unknown_architecture_is_named(qwen3_dir):
    config = json.loads((qwen3_dir / "config.json").read_text())
    config["architectures"] = ["MixtralForCausalLM"]
    (qwen3_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported architecture 'MixtralForCausalLM'"):
        load_pretrained(qwen3_dir)


def test_missing_files_are_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(ModelConfig.tiny())))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="convert them to safetensors"):
        load_pretrained(tmp_path)


def test_tied_checkpoint_may_carry_lm_head(tmp_path):
    """transformers ignores lm_head.weight beside tied embeddings; so does agentax."""
    hf = make_hf_model("qwen2")
    hf.save_pretrained(tmp_path)
    _rewrite(tmp_path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].copy()}))
    model = load_pretrained(tmp_path)
    assert model.lm_head is None
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 40))
    np.testing.assert_allclose(ax_logits(model, ids), hf_logits(hf, ids), atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------- presets


def _count(config: ModelConfig) -> int:
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts(name):
    """eval_shape counts == published counts == a meta-device transformers model's count."""
    config_json, published = PUBLISHED[name]
    config = ModelConfig.preset(name)
    assert _count(config) == published
    hf_config = transformers.AutoConfig.for_model(
        **{k: v for k, v in config_json.items() if k != "transformers_version"}
    )
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert sum(p.numel() for p in hf.parameters()) == published
    assert len(hf_param_table(config)) == len(hf.state_dict()) - config.tie_word_embeddings


def test_qwen3_0_6b_non_embedding_count():
    config = ModelConfig.qwen3_0_6b()
    assert _count(config) - config.vocab_size * config.hidden_size == 440_467_456  # "0.44B"


def test_tiny_stays_tiny():
    assert _count(ModelConfig.tiny()) < 2_000_000
    assert _count(ModelConfig.small()) < 30_000_000


def _hf_greedy(path, prompt, steps):
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    ids = torch.as_tensor(prompt)
    with torch.no_grad():
        out = hf.eval().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
                                 do_sample=False)
    return out[0, prompt.shape[1]:].tolist()


def test_exported_checkpoint_makes_transformers_generate_stop_at_eos(tmp_path):
    model = Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(3))
    prompt = np.random.default_rng(0).integers(0, 256, (1, 6))
    # Without a tokenizer nothing says where a turn ends: generate runs to max_new_tokens.
    save_pretrained(model, tmp_path / "bare")
    free = _hf_greedy(tmp_path / "bare", prompt, 12)
    assert len(free) == 12
    end = free[3]  # call the 4th greedy token "end of turn"; generate must stop right after it
    tokenizer = types.SimpleNamespace(eos_token_ids=(end, 271), bos_token_id=None, pad_token_id=0)
    save_pretrained(model, tmp_path / "ids", tokenizer=tokenizer)
    assert json.loads((tmp_path / "ids" / "config.json").read_text())["eos_token_id"] == [end, 271]
    assert _hf_greedy(tmp_path / "ids", prompt, 12) == free[: free.index(end) + 1]


def test_save_pretrained_writes_a_tokenizers_ids_and_keeps_generation_settings(tmp_path):
    from agentax.text import ByteTokenizer

    tok = ByteTokenizer()
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    save_pretrained(Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0)), tmp_path, tokenizer=tok)
    ids = {"bos_token_id": None, "eos_token_id": list(tok.eos_token_ids),
           "pad_token_id": tok.pad_token_id}
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation == {"temperature": 0.7, **ids}
    config = json.loads((tmp_path / "config.json").read_text())
    assert {k: config[k] for k in ids} == ids
    loaded = transformers.GenerationConfig.from_pretrained(tmp_path)
    assert loaded.eos_token_id == list(tok.eos_token_ids) and loaded.temperature == 0.7
