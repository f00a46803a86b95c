"""`Batch` (fixed-shape arrays of one micro-batch) and the host-side builder that makes them.

Sequences of any length are padded to a few *length buckets* (powers of two, or multiples of a
step, up to `max_seq_len`) and micro-batches to a few *row buckets* (powers of two up to
`micro_batch_size`), so a run with varied lengths compiles the train step only a few times.
With packing, several sequences share a row (first-fit decreasing); `segment_ids` keep their
attention apart and positions restart per segment.

A sequence of L tokens trains on L - 1 positions: inputs are ids[:-1], targets ids[1:], and the
loss mask / behaviour logprobs / versions are those of the targets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

__all__ = ["Batch", "HostSequence", "MicroBatch", "build_micro_batches", "seq_bucket",
           "row_bucket"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    """One micro-batch as fixed-shape arrays (NumPy on the host, jax.Array on device).

    All token arrays are [B, T]; position t holds the input token t and the target t + 1 of
    its sequence. Optional fields are None when the step does not use them.
    """

    input_ids: np.ndarray
    """[B, T] int32 model inputs (0 on padding)."""
    target_ids: np.ndarray
    """[B, T] int32 next tokens (the ones whose logprob is trained)."""
    loss_mask: np.ndarray
    """[B, T] float32 1 on trained targets (model-generated tokens), 0 elsewhere."""
    segment_ids: np.ndarray
    """[B, T] int32 1.. per sequence in the row, 0 on padding."""
    positions: np.ndarray
    """[B, T] int32 position inside its sequence (restarts per segment)."""
    behaviour_logprobs: np.ndarray | None = None
    """[B, T] float32 logprob of each target under the policy that sampled it."""
    versions: np.ndarray | None = None
    """[B, T] int32 policy version that produced each target (-1 where untrained)."""
    advantages: np.ndarray | None = None
    """[B, T] float32 advantages (0 where untrained)."""
    returns: np.ndarray | None = None
    """[B, T] float32 value targets (advantage='gae')."""
    old_values: np.ndarray | None = None
    """[B, T] float32 value predictions before the update (advantage='gae')."""
    proximal_logprobs: np.ndarray | None = None
    """[B, T] float32 logprobs under the policy at the start of the update (separate pass)."""
    ref_logprobs: np.ndarray | None = None
    """[B, T] float32 logprobs under the frozen reference policy (kl_coef > 0)."""

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    def replace(self, **changes) -> "Batch":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostSequence:
    """One sequence to train on (a trajectory, or an SFT example), as host arrays of length L."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray | None = None
    versions: np.ndarray | None = None

    @property
    def num_positions(self) -> int:
        return max(int(self.token_ids.shape[0]) - 1, 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MicroBatch:
    """A host `Batch` plus where each of its tokens came from."""

    batch: Batch
    sample_ids: np.ndarray
    """[B, T] int32 index of the sequence in the step's list (-1 on padding)."""
    token_index: np.ndarray
    """[B, T] int32 position of the target inside that sequence's trained positions."""

    @property
    def num_trained_tokens(self) -> int:
        return int(self.batch.loss_mask.sum())


def seq_bucket(n: int, *, min_len: int, max_len: int, multiple: int = 0) -> int:
    """Padded length for n positions: a power of two (multiple=0) or a multiple, capped."""
    n = max(n, min_len)
    if multiple > 0:
        b = -(-n // multiple) * multiple
    else:
        b = 1 << (n - 1).bit_length()
    return min(max(b, min_len), max_len)


def row_bucket(n: int, *, max_rows: int, multiple: int = 1) -> int:
    """Padded row count: the next power of two >= n (and a multiple of `multiple`), <= max."""
    b = 1 << (max(n, 1) - 1).bit_length()
    b = min(b, max_rows)
    b = max(b, n)
    return -(-b // multiple) * multiple


def _rows(n: int, total: int, micro_batch_size: int, multiple: int) -> int:
    """Row bucket of a micro-batch of n rows out of `total`. When the step has several, the
    remainder is padded to at least half a micro-batch: its rows then take one of two shapes
    (micro_batch_size or half of it) instead of any power of two, each one a compilation."""
    if total > micro_batch_size:
        n = max(n, -(-micro_batch_size // 2))
    return row_bucket(n, max_rows=micro_batch_size, multiple=multiple)


def _first_fit_decreasing(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for r, space in enumerate(free):
            if lengths[i] <= space:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(row_len - lengths[i])
    return rows


def _fill(rows: list[list[int]], seqs: Sequence[HostSequence], b: int, t: int,
          with_rl: bool) -> MicroBatch:
    ids = np.zeros((b, t), np.int32)
    tgt = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), np.float32)
    seg = np.zeros((b, t), np.int32)
    pos = np.zeros((b, t), np.int32)
    lp = np.zeros((b, t), np.float32)
    ver = np.full((b, t), -1, np.int32)
    sid = np.full((b, t), -1, np.int32)
    tix = np.zeros((b, t), np.int32)
    for r, members in enumerate(rows):
        col = 0
        for s, i in enumerate(members, start=1):
            q = seqs[i]
            n = q.num_positions
            sl = slice(col, col + n)
            ids[r, sl] = q.token_ids[:-1]
            tgt[r, sl] = q.token_ids[1:]
            mask[r, sl] = q.loss_mask[1:]
            seg[r, sl] = s
            pos[r, sl] = np.arange(n)
            sid[r, sl] = i
            tix[r, sl] = np.arange(n)
            if with_rl:
                lp[r, sl] = q.logprobs[1:]
                ver[r, sl] = q.versions[1:]
            col += n
    ver = np.where(mask > 0, ver, -1)
    batch = Batch(input_ids=ids, target_ids=tgt, loss_mask=mask, segment_ids=seg, positions=pos,
                  behaviour_logprobs=lp if with_rl else None, versions=ver if with_rl else None)
    return MicroBatch(batch=batch, sample_ids=sid, token_index=tix)


def build_micro_batches(seqs: Sequence[HostSequence], *, micro_batch_size: int, max_seq_len: int,
                        min_seq_bucket: int = 64, seq_bucket_multiple: int = 0,
                        pack: bool = False, pack_length: int = 512, row_multiple: int = 1,
                        with_rl: bool = True) -> list[MicroBatch]:
    """Lays sequences out as bucketed micro-batches.

    Args:
      seqs: sequences already cut to at most max_seq_len + 1 tokens; those with fewer than 2
        tokens are left out (nothing to predict).
      micro_batch_size: maximum rows per micro-batch.
      max_seq_len, min_seq_bucket, seq_bucket_multiple: length buckets (see `seq_bucket`).
      pack: several sequences per row.
      pack_length: target row length when packing.
      row_multiple: row counts are multiples of this (the data-parallel mesh size).
      with_rl: fill behaviour logprobs and versions (False for SFT).

    Returns:
      Micro-batches; unpacked ones are sorted by length so each gets a tight length bucket.
    """
    keep = [i for i, q in enumerate(seqs) if q.num_positions > 0]
    if not keep:
        return []
    lengths = {i: seqs[i].num_positions for i in keep}
    too_long = [i for i in keep if lengths[i] > max_seq_len]
    if too_long:
        raise ValueError(f"sequence {too_long[0]} has {lengths[too_long[0]]} positions > "
                         f"max_seq_len={max_seq_len}; cut it first (the trainers do)")
    bucket = lambda n: seq_bucket(n, min_len=min_seq_bucket, max_len=max_seq_len,  # noqa: E731
                                  multiple=seq_bucket_multiple)
    out: list[MicroBatch] = []
    if pack:
        total = sum(lengths.values())
        longest = max(lengths.values())
        t = bucket(max(longest, min(pack_length, total)))
        rows = _first_fit_decreasing([lengths[i] for i in keep], t)
        rows = [[keep[j] for j in row] for row in rows]
        for start in range(0, len(rows), micro_batch_size):
            chunk = rows[start:start + micro_batch_size]
            b = _rows(len(chunk), len(rows), micro_batch_size, row_multiple)
            out.append(_fill(chunk, seqs, b, t, with_rl))
        return out
    order = sorted(keep, key=lambda i: -lengths[i])
    for start in range(0, len(order), micro_batch_size):
        chunk = order[start:start + micro_batch_size]
        t = bucket(lengths[chunk[0]])
        b = _rows(len(chunk), len(order), micro_batch_size, row_multiple)
        out.append(_fill([[i] for i in chunk], seqs, b, t, with_rl))
    return out
