"""SFTTrainer: masked cross-entropy on rendered multi-turn chats, bucketed and jitted."""

from __future__ import annotations

import numpy as np
import pytest

from agentax.text import ByteTokenizer
from agentax.train import SFTTrainer, TrainerConfig, sft_examples
from agentax.train._batch import _first_fit_decreasing
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


def _pairs(lengths):
    return [(np.arange(n) % 250, np.ones(n)) for n in lengths]


def test_take_by_count_cycles_from_the_data_position():
    trainer = SFTTrainer(make_model(0), SFT_CONFIG)
    data = _pairs([10, 20, 30])
    trainer.data_position = 2
    assert [len(e[0]) for e in trainer.take(data, batch_size=4)] == [30, 10, 20, 30]
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        trainer.take(data)


def test_take_by_tokens_fills_one_fixed_shape():
    rng = np.random.default_rng(0)
    # Like the demo's mix: long tool-using chats and short direct answers (positions = len - 1).
    lengths = [int(rng.choice([rng.integers(95, 113), rng.integers(40, 46)])) for _ in range(400)]
    data = _pairs(lengths)
    trainer = SFTTrainer(make_model(0), SFT_CONFIG)  # rows of 128, 8 per micro-batch
    counts = []
    for _ in range(6):
        batch = trainer.take(data, batch_tokens=8 * 128)
        k = len(batch)
        start = trainer.data_position
        positions = [n - 1 for n in lengths[start:start + k + 1]]
        assert len(_first_fit_decreasing(positions[:k], 128)) <= 8
        # Maximal: the next example no longer packs into the 8 rows.
        assert len(_first_fit_decreasing(positions, 128)) > 8
        m = trainer.step(batch)
        assert m.num_micro_batches == 1 and m.num_positions == 8 * 128
        counts.append(k)
    assert trainer.data_position == sum(counts)
    assert trainer.compiles_by_kernel["accumulate_grads"] == 1
    # An example longer than a row still goes, alone.
    assert len(trainer.take(_pairs([129, 20]), batch_tokens=128)) == 1


def test_take_by_tokens_needs_packing_and_a_whole_row():
    data = _pairs([10, 20])
    with pytest.raises(ValueError, match="less than one row of 128"):
        SFTTrainer(make_model(0), SFT_CONFIG).take(data, batch_tokens=100)
    unpacked = TrainerConfig(learning_rate=1e-2, max_seq_len=128, min_seq_bucket=32)
    with pytest.raises(ValueError, match="set pack=True"):
        SFTTrainer(make_model(0), unpacked).take(data, batch_tokens=256)
