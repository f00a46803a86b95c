"""config_from_hf / config_to_hf: both config.json layouts, family defaults, rejected fields,
and the presets against the published checkpoints' config.json."""

from __future__ import annotations

import dataclasses
import json

import pytest
import transformers
from published_configs import GEMMA3_1B, LLAMA3_2_1B, PUBLISHED, QWEN3_0_6B

from agentax.models import ModelConfig, RopeScaling, config_from_hf, config_to_hf

_CLASSES = {
    "llama": transformers.LlamaConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
    "gemma3_text": transformers.Gemma3TextConfig,
}


def hf_normalised(config_json: dict) -> dict:
    """What transformers 5 writes after reading `config_json` (rope_parameters layout)."""
    kwargs = {k: v for k, v in config_json.items() if k not in ("model_type", "transformers_version")}
    return _CLASSES[config_json["model_type"]](**kwargs).to_dict()


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_config_gives_preset(name):
    config_json, _ = PUBLISHED[name]
    assert config_from_hf(config_json) == ModelConfig.preset(name)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_old_and_new_layouts_agree(name):
    """rope_theta/rope_scaling/rope_local_base_freq files == their transformers-5 rewrite."""
    config_json, _ = PUBLISHED[name]
    new = hf_normalised(config_json)
    assert "rope_parameters" in new and "rope_theta" not in new
    assert config_from_hf(new) == config_from_hf(config_json)


@pytest.mark.parametrize("name", sorted(PUBLISHED) + ["tiny", "small"])
def test_config_to_hf_round_trips_through_transformers(name):
    config = ModelConfig.preset(name)
    hf = config_to_hf(config)
    assert config_from_hf(hf) == dataclasses.replace(
        config, dtype=config.param_dtype
    )
    assert config_from_hf(hf_normalised(hf)) == config_from_hf(hf)


@pytest.mark.parametrize("model_type", sorted(_CLASSES))
def test_missing_keys_take_the_transformers_defaults(model_type):
    minimal = dict(model_type=model_type, vocab_size=100, hidden_size=64, intermediate_size=96,
                   num_hidden_layers=7, num_attention_heads=4)
    if model_type.startswith("qwen"):  # their default of 32 kv heads needs 32 query heads
        minimal["num_key_value_heads"] = 2
    assert config_from_hf(minimal) == config_from_hf(hf_normalised(minimal))


def test_gemma3_layers_and_rope():
    c = config_from_hf(GEMMA3_1B)
    assert c.layer_types[:6] == ("sliding",) * 5 + ("full",)
    assert c.layer_rope(0) == (10000.0, None) and c.layer_rope(5) == (1000000.0, None)
    # Gemma 3 4B style: linear scaling on global layers only (old layout)
    c = config_from_hf({**GEMMA3_1B, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert c.layer_rope(5) == (1e6, RopeScaling(kind="linear", factor=8.0))
    assert c.layer_rope(0) == (1e4, None)


def test_gemma3_conditional_generation_text_config():
    outer = {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                        "intermediate_size": 10240, "num_hidden_layers": 34,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
        "mm_tokens_per_image": 256, "boi_token_index": 255999, "eoi_token_index": 256000,
        "image_token_index": 262144, "initializer_range": 0.02, "torch_dtype": "bfloat16",
    }
    c = config_from_hf(outer)
    assert (c.family, c.hidden_size, c.num_layers, c.sliding_window) == ("gemma3", 2560, 34, 1024)
    assert c.vocab_size == 262208 and c.num_heads == 8 and c.param_dtype == "bfloat16"
    assert c.rope_scaling == RopeScaling(kind="linear", factor=8.0)


def test_qwen_sliding_window_follows_use_sliding_window():
    on = {**QWEN3_0_6B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}
    c = config_from_hf(on)
    assert c.layer_types == ("full",) * 20 + ("sliding",) * 8 and c.sliding_window == 4096
    off = {**on, "use_sliding_window": False}
    assert config_from_hf(off).layer_types is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
         "rope_parameters"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "mrope_section": [1]}},
         "rope_scaling"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"use_mrope": True}, "use_mrope"),
        ({"dtype": "float8_e4m3fn"}, "dtype"),
        ({"some_new_switch": 3}, "some_new_switch"),
        ({"architectures": ["MistralForCausalLM"]}, "MistralForCausalLM"),
    ],
)
def test_unsupported_fields_are_rejected_by_name(change, field):
    with pytest.raises(ValueError, match=field):
        config_from_hf({**LLAMA3_2_1B, **change})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"layer_types": ["chunked_attention"] * 26}, "layer_types"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
    ],
)
def test_gemma3_unsupported_fields_are_rejected(change, field):
    with pytest.raises(ValueError, match=field):
        config_from_hf({**GEMMA3_1B, **change})


def test_non_strict_warns_instead():
    with pytest.warns(UserWarning, match="some_new_switch"):
        c = config_from_hf({**LLAMA3_2_1B, "some_new_switch": 3}, strict=False)
    assert c == ModelConfig.llama3_2_1b()


def test_ignored_fields_do_not_change_the_config():
    noisy = {**QWEN3_0_6B, "attention_dropout": 0.1, "pad_token_id": 7, "use_cache": False,
             "initializer_range": 0.5, "_name_or_path": "x"}
    assert config_from_hf(noisy) == config_from_hf(QWEN3_0_6B)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ModelConfig.tiny(family="llama"), "qk_norm"),
        (ModelConfig.tiny(family="qwen2", qk_norm=False), "qkv_bias"),
        (ModelConfig.gemma3_270m(attn_logit_softcap=30.0), "attn_logit_softcap"),
        (ModelConfig.tiny(family="qwen3", mlp_bias=True), "mlp_bias"),
    ],
)
def test_config_to_hf_rejects_what_the_family_cannot_express(config, field):
    with pytest.raises(ValueError, match=field):
        config_to_hf(config)


_GEMMA3_TINY = dict(
    model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], vocab_size=128,
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=1, head_dim=32, sliding_window=4,
)


@pytest.mark.parametrize("pattern_keys", [
    {"sliding_window_pattern": 2, "_sliding_window_pattern": 3},  # both: the public key wins
    {"_sliding_window_pattern": 2},  # the private key alone sets nothing: default 6
    {"sliding_window_pattern": 3},
    {},
])
def test_gemma3_window_pattern_is_read_as_transformers_reads_it(pattern_keys, tmp_path):
    config_json = {**_GEMMA3_TINY, **pattern_keys}
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    want = tuple("sliding" if t == "sliding_attention" else "full" for t in hf.layer_types)
    assert config_from_hf(config_json).layer_types == want


def test_gemma3_with_both_pattern_keys_matches_transformers_logits(tmp_path):
    """Regression: the private `_sliding_window_pattern` used to win (logits off by ~1)."""
    import numpy as np
    import torch

    from agentax.models import load_pretrained

    config_json = {**_GEMMA3_TINY, "sliding_window_pattern": 2, "_sliding_window_pattern": 4}
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(tmp_path), attn_implementation="eager").eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.15)
    hf.save_pretrained(tmp_path)  # writes layer_types; put the two-key file back
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    ids = np.random.default_rng(0).integers(0, 128, (1, 16))  # longer than the window
    with torch.no_grad():
        want = hf(torch.as_tensor(ids)).logits.numpy()
    got = np.asarray(load_pretrained(tmp_path)(ids))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
