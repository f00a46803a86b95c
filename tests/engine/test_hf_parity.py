"""The engine's greedy output equals `transformers` greedy generation with the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import make_hf_model, random_prompts

from agentax.engine import Engine, EngineConfig
from agentax.models import load_pretrained
from agentax.records import SamplingParams


@pytest.mark.parametrize(
    "family", ["qwen2", "qwen3", pytest.param("llama", marks=pytest.mark.slow)]
)
def test_engine_greedy_matches_transformers_generate(family, tmp_path):
    hf = make_hf_model(family)
    hf.save_pretrained(tmp_path)
    model = load_pretrained(tmp_path)
    rng = np.random.default_rng(3)
    prompts = random_prompts(rng, 5, 1, 41)  # 5 requests on 3 slots, up to 3 prefill chunks
    lengths = [10, 4, 10, 7, 10]
    config = EngineConfig(max_slots=3, max_seq_len=64, prefill_chunk=16)
    with Engine(model, config) as engine:
        outs = engine.generate_batch(
            prompts, [SamplingParams(temperature=0.0, max_tokens=n) for n in lengths]
        )
    for prompt, n, out in zip(prompts, lengths, outs):
        with torch.no_grad():
            ids = torch.tensor([prompt])  # explicit mask: HF would treat id 0 (= pad) as padding
            ids = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                              do_sample=False)
        assert out.token_ids.tolist() == ids[0, len(prompt):].tolist()
