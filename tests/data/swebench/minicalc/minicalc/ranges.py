"""Closed numeric ranges."""


def clamp(x, lo, hi):
    """`x` limited to the closed range [lo, hi]."""
    if lo > hi:
        raise ValueError(f"empty range [{lo}, {hi}]")
    if x < lo:
        return lo
    if x >= hi:
        return hi - 1
    return x


def overlaps(a, b):
    """Whether the closed ranges a = (lo, hi) and b share a point."""
    return a[0] < b[1] and b[0] < a[1]
