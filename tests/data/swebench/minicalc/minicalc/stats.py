"""Averages of a non-empty sequence of numbers."""


def mean(values):
    """Arithmetic mean."""
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values):
    """Middle value of the sorted values (mean of the two middle ones for an even count)."""
    if not values:
        raise ValueError("median of an empty sequence")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid]
