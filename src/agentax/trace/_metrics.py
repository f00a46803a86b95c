"""Metrics sinks: a JSONL stream (always), TensorBoard (optional), a console view (optional).

One `MetricsLogger.log(step, {...})` call writes one JSON line
``{"step": 12, "time": 1712345678.9, "loss": 0.41, ...}`` and forwards numbers to the other
sinks. The JSONL file is what `agentax doctor` reads back.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping

from agentax.trace._files import METRICS_FILENAME


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    try:  # numpy / jax scalars
        item = value.item()
    except (AttributeError, ValueError, TypeError):
        return str(value)
    return _jsonable(item)


class MetricsLogger:
    """Writes metrics to `RUN_DIR/metrics.jsonl` and optionally TensorBoard and the console.

    Args:
      path: a run directory (file `metrics.jsonl` inside) or a `.jsonl` file path.
      tensorboard: also write TensorBoard event files (needs `tensorboardX`) to this dir,
        or to `RUN_DIR/tensorboard` when True.
      console: a view with `update(step, record)` and `close()` to update on every `log` (the
        CLI passes its progress bar).
    """

    def __init__(self, path: str | os.PathLike, *, tensorboard: bool | str = False,
                 console: Any = None) -> None:
        path = os.fspath(path)
        if not path.endswith(".jsonl"):
            path = os.path.join(path, METRICS_FILENAME)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self._file = open(path, "a", encoding="utf-8")
        self.console = console
        self._tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError as err:
                raise ImportError("MetricsLogger(tensorboard=...) needs tensorboardX: "
                                  "pip install 'agentax[tensorboard]'") from err
            tb_dir = tensorboard if isinstance(tensorboard, str) else os.path.join(
                os.path.dirname(path), "tensorboard")
            self._tb = SummaryWriter(tb_dir)

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Write one record; returns it (with `step` and wall-clock `time`)."""
        record = {"step": int(step), "time": time.time()}
        record.update({str(k): _jsonable(v) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key not in ("step", "time") and isinstance(value, (int, float)) \
                        and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, int(step))
        if self.console is not None:
            self.console.update(int(step), record)
        return record

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self.console is not None:
            self.console.close()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: object) -> bool:
        self.close()
        return False


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a metrics JSONL file (a run dir or the file); a torn last line is skipped."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILENAME)
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a blank or torn line
                continue
    return records
