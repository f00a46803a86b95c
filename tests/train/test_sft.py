"""SFTTrainer: masked cross-entropy on rendered multi-turn chats, bucketed and jitted."""

from __future__ import annotations

import numpy as np
import pytest

from agentax.text import ByteTokenizer
from agentax.train import SFTTrainer, TrainerConfig, sft_examples
from tests.train.conftest import make_model

SFT_CONFIG = TrainerConfig(learning_rate=1e-2, micro_batch_size=8, min_seq_bucket=32,
                           max_seq_len=128, pack=True, pack_length=128)


def _chats(n):
    out = []
    for i in range(n):
        a, b = i % 7, (i * 3) % 5
        out.append([
            {"role": "user", "content": f"{a}+{b}?"},
            {"role": "assistant", "content": f"{a + b}"},
            {"role": "user", "content": f"{a}*{b}?"},
            {"role": "assistant", "content": f"{a * b}"},
        ])
    return out


def test_sft_learns_assistant_turns_of_rendered_chats():
    examples = sft_examples(ByteTokenizer(), _chats(8))
    assert all(e.assistant_mask.sum() > 0 for e in examples)
    trainer = SFTTrainer(make_model(0), SFT_CONFIG)
    history = trainer.fit(examples, batch_size=8, num_steps=30, log_every=10, log=None)
    losses = [h["loss"] for h in history]
    assert losses[-1] < 0.5 * losses[0]
    assert trainer.step_count == 30 and trainer.num_skipped_steps == 0
    assert trainer.data_position == 240
    assert trainer.compiles_by_kernel["accumulate_grads"] == 1  # one bucketed shape


def test_sft_accepts_pairs_and_rejects_bad_examples():
    trainer = SFTTrainer(make_model(0), SFT_CONFIG)
    ids = np.arange(40) % 250
    mask = np.r_[np.zeros(20), np.ones(20)]
    m = trainer.step([(ids, mask)] * 3)
    assert m.num_tokens == 60 and np.isfinite(m.to_dict()["loss"])
    with pytest.raises(ValueError, match="no examples"):
        trainer.step([])
    with pytest.raises(ValueError, match="no SFT example has a trained token"):
        trainer.step([(ids, np.zeros(40))])
    with pytest.raises(ValueError, match="equal length"):
        trainer.step([(ids, mask[:10])])
    with pytest.raises(TypeError, match="SFT example"):
        trainer.step(["hello"])
