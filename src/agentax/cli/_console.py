"""The live console view of `agentax train`: a progress bar plus the latest metrics."""

from __future__ import annotations

from typing import Any, Mapping


class ConsoleView:
    """A compact live view: one progress bar plus the latest few metrics on one line.

    Args:
      total_steps: the progress bar's total (None: no total, a spinner-like bar).
      keys: metrics to show, in order (None: the first `max_keys` logged).
      console: a `rich.console.Console` (default: stderr).
      max_keys: how many metrics fit on the line.
    """

    def __init__(self, *, total_steps: int | None = None, keys: tuple[str, ...] | None = None,
                 console: Any = None, max_keys: int = 6, description: str = "train") -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.keys = keys
        self.max_keys = max_keys
        self.console = console or Console(stderr=True)
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                 TextColumn("{task.fields[metrics]}"), console=self.console,
                                 transient=False)
        self._task = self.progress.add_task(description, total=total_steps, metrics="")
        self._started = False

    @staticmethod
    def format_value(value: Any) -> str:
        if isinstance(value, float):
            if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
                return f"{value:.2e}"
            return f"{value:.4g}"
        return str(value)

    def line(self, metrics: Mapping[str, Any]) -> str:
        """The metrics text shown next to the bar."""
        keys = self.keys or [k for k in metrics if k not in ("step", "time")][: self.max_keys]
        return "  ".join(f"{k}={self.format_value(metrics[k])}" for k in keys if k in metrics)

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Show that step `step` (0-based) finished with these metrics."""
        if not self._started:
            self.progress.start()
            self._started = True
        self.progress.update(self._task, completed=step + 1, metrics=self.line(metrics))

    def close(self) -> None:
        if self._started:
            self.progress.stop()
            self._started = False
