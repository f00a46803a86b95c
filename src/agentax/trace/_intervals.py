"""Interval arithmetic on (start_ns, end_ns) pairs: unions, overlaps, binned utilisation."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np


def merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint union of intervals."""
    out: list[list[int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def length(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length of the union of intervals."""
    return sum(e - s for s, e in merge(intervals))


def binned_concurrency(intervals: Sequence[tuple[int, int]], t0: int, bin_ns: int,
                       bins: int) -> np.ndarray:
    """Average number of active intervals in each of `bins` bins starting at `t0`."""
    acc = np.zeros(bins, dtype=np.float64)
    for start, end in intervals:
        s, e = (start - t0) / bin_ns, (end - t0) / bin_ns
        s, e = max(s, 0.0), min(e, float(bins))
        if e <= s:
            continue
        first, last = int(s), min(int(np.ceil(e)) - 1, bins - 1)
        acc[first:last + 1] += 1.0  # whole bins, then take off what the ends miss
        acc[first] -= s - first
        acc[last] -= last + 1 - e
    return acc


def step_series_stats(samples: Sequence[tuple[int, float]], t0: int, t1: int
                      ) -> tuple[float, Sequence[tuple[int, int, float]]]:
    """Time-weighted mean of a counter (a step function) over [t0, t1], and its pieces."""
    pieces = []
    for i, (ts, value) in enumerate(samples):
        nxt = samples[i + 1][0] if i + 1 < len(samples) else t1
        s, e = max(ts, t0), min(nxt, t1)
        if e > s:
            pieces.append((s, e, value))
    total = sum(e - s for s, e, _ in pieces)
    mean = sum((e - s) * v for s, e, v in pieces) / total if total else 0.0
    return mean, pieces
