"""Host-side batch building: buckets, the next-token shift, packing with segment ids."""

from __future__ import annotations

import numpy as np
import pytest

from agentax.train._batch import HostSequence, build_micro_batches, row_bucket, seq_bucket


def _seq(n, n_gen, start=0):
    ids = np.arange(start, start + n, dtype=np.int32)
    mask = np.r_[np.zeros(n - n_gen), np.ones(n_gen)].astype(np.float32)
    return HostSequence(token_ids=ids, loss_mask=mask, logprobs=-ids.astype(np.float32),
                        versions=np.full(n, 3, np.int32))


@pytest.mark.parametrize("n,multiple,expected", [
    (1, 0, 16), (16, 0, 16), (17, 0, 32), (100, 0, 128), (1000, 0, 512),
    (17, 48, 48), (49, 48, 96), (500, 48, 512),
])
def test_seq_bucket(n, multiple, expected):
    assert seq_bucket(n, min_len=16, max_len=512, multiple=multiple) == expected


@pytest.mark.parametrize("n,max_rows,multiple,expected", [
    (1, 8, 1, 1), (3, 8, 1, 4), (5, 8, 1, 8), (8, 8, 1, 8), (3, 8, 4, 4), (1, 8, 4, 4),
    (5, 6, 1, 6),
])
def test_row_bucket(n, max_rows, multiple, expected):
    assert row_bucket(n, max_rows=max_rows, multiple=multiple) == expected


def test_unpacked_rows_shift_targets_and_sort_by_length():
    seqs = [_seq(5, 2), _seq(40, 10, start=100), _seq(9, 4, start=50)]
    mbs = build_micro_batches(seqs, micro_batch_size=2, max_seq_len=64, min_seq_bucket=16)
    assert [mb.batch.shape for mb in mbs] == [(2, 64), (1, 16)]
    first = mbs[0].batch
    # Row 0 is the longest sequence: inputs ids[:-1], targets ids[1:], masks of the targets.
    np.testing.assert_array_equal(first.input_ids[0, :39], np.arange(100, 139))
    np.testing.assert_array_equal(first.target_ids[0, :39], np.arange(101, 140))
    assert first.loss_mask[0].sum() == 10 and first.loss_mask[0, 29:39].all()
    np.testing.assert_array_equal(first.behaviour_logprobs[0, :39], -np.arange(101, 140))
    assert (first.versions[0][first.loss_mask[0] > 0] == 3).all()
    assert (first.versions[0][first.loss_mask[0] == 0] == -1).all()
    assert first.segment_ids[0, :39].tolist() == [1] * 39 and first.segment_ids[0, 39:].sum() == 0
    np.testing.assert_array_equal(mbs[0].sample_ids[:, 0], [1, 2])
    assert mbs[1].sample_ids[0, 0] == 0


def test_packing_keeps_sequences_apart_and_counts_every_token():
    seqs = [_seq(n, n // 2, start=10 * i) for i, n in enumerate([30, 20, 12, 9, 5, 33])]
    mbs = build_micro_batches(seqs, micro_batch_size=8, max_seq_len=64, min_seq_bucket=16,
                              pack=True, pack_length=64)
    total_positions = sum(s.num_positions for s in seqs)
    assert len(mbs) == 1 and mbs[0].batch.shape[1] == 64
    b = mbs[0].batch
    assert (b.segment_ids > 0).sum() == total_positions
    assert b.shape[0] < len(seqs)  # several sequences share a row
    # Each segment holds exactly one sequence, positions restart at 0.
    for r in range(b.shape[0]):
        for s in set(b.segment_ids[r].tolist()) - {0}:
            sel = b.segment_ids[r] == s
            assert len(set(mbs[0].sample_ids[r, sel].tolist())) == 1
            np.testing.assert_array_equal(b.positions[r, sel], np.arange(sel.sum()))
    assert b.loss_mask.sum() == sum(s.loss_mask[1:].sum() for s in seqs)


def test_varied_lengths_give_few_shapes():
    rng = np.random.default_rng(0)
    shapes = set()
    for _ in range(200):
        seqs = [_seq(int(n), 1) for n in rng.integers(2, 500, int(rng.integers(1, 20)))]
        for mb in build_micro_batches(seqs, micro_batch_size=8, max_seq_len=512):
            shapes.add(mb.batch.shape)
    # 4 row buckets (1, 2, 4, 8) x 4 length buckets (64 ... 512).
    assert len(shapes) <= 16


def test_remainder_of_a_step_is_at_least_half_a_micro_batch():
    """A step of several micro-batches pads its remainder to half a micro-batch, so its rows
    take two shapes (8 and 4 here) whatever the count, instead of every power of two."""
    for n, expected in [(17, [8, 8, 4]), (19, [8, 8, 4]), (22, [8, 8, 8]), (3, [4])]:
        for pack in (False, True):
            seqs = [_seq(40, 5, start=i) for i in range(n)]
            mbs = build_micro_batches(seqs, micro_batch_size=8, max_seq_len=64,
                                      min_seq_bucket=16, pack=pack, pack_length=64)
            assert [mb.batch.shape[0] for mb in mbs] == expected, (n, pack)
            assert sum(int(mb.batch.loss_mask.sum()) for mb in mbs) == 5 * n  # padding is inert


def test_too_long_and_empty_sequences():
    assert build_micro_batches([_seq(1, 0)], micro_batch_size=2, max_seq_len=16,
                               min_seq_bucket=16) == []
    with pytest.raises(ValueError, match="max_seq_len"):
        build_micro_batches([_seq(40, 2)], micro_batch_size=2, max_seq_len=16, min_seq_bucket=16)
