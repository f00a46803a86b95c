"""The live console view of `agentax train`: a progress bar plus the latest metrics.

When stderr is not a terminal (a log file, CI, `nohup`), a live bar would show nothing until
the end; the view prints plain lines instead, one per step but at most one every
`PLAIN_EVERY_S` seconds (and always the last step's), with the same figures.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any, Mapping

__all__ = ["ConsoleView", "log_lines", "print_warning", "warn_line"]

PLAIN_EVERY_S = 2.0


def warn_line(text: str) -> None:
    """A warning as plain stderr text, in the one format of every CLI warning."""
    print(f"warning: {text}", file=sys.stderr, flush=True)


def print_warning(console: Any, text: str) -> None:
    """A warning on a rich console: `warning: ...` (yellow on a terminal); printed even when
    the console is quiet (`-q` silences progress, not what went wrong)."""
    from rich.markup import escape

    if console.quiet:
        warn_line(text)
    else:
        console.print(f"[yellow]warning[/yellow]: {escape(text)}")


class _LineFormatter(logging.Formatter):
    """`warning: message`: the library's log records in the CLI's format."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


@contextlib.contextmanager
def log_lines() -> Iterator[None]:
    """While a command runs, agentax's log warnings and errors print as `warning: ...` /
    `error: ...` like the CLI's own, not in whatever format an imported library gave the root
    logger (`WARNING:agentax.rollout._collector:...`)."""
    logger = logging.getLogger("agentax")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_LineFormatter())
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


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
        self.description, self.total_steps = description, total_steps
        self.plain = not self.console.is_terminal
        self._t0 = time.monotonic()
        self._last_plain = float("-inf")

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
        if self.plain:
            now = time.monotonic()
            last = self.total_steps is not None and step + 1 >= self.total_steps
            if last or now - self._last_plain >= PLAIN_EVERY_S:
                self._last_plain = now
                total = f"/{self.total_steps}" if self.total_steps is not None else ""
                self.console.print(f"{self.description} {step + 1}{total}  "
                                   f"{now - self._t0:.1f}s  {self.line(metrics)}",
                                   markup=False, highlight=False, soft_wrap=True)
            return
        if not self._started:
            self.progress.start()
            self._started = True
        self.progress.update(self._task, completed=step + 1, metrics=self.line(metrics))

    def close(self) -> None:
        if self._started:
            self.progress.stop()
            self._started = False
