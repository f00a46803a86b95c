from minicalc.ranges import clamp, overlaps
from minicalc.stats import mean, median

__all__ = ["clamp", "mean", "median", "overlaps"]
