"""The run's reporter (console, metrics.jsonl, trace, timings) and metrics.jsonl readers."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from agentax.run._config import RunConfig
from agentax.run._console import ConsoleView, print_warning
from agentax.run._transcripts import Transcripts
from agentax.train import is_main_process
from agentax.trace import MetricsLogger, get_tracer

__all__ = ["Reporter", "logged_phase", "phase_rows", "process_count", "process_index", "report_eval",
           "say_always"]


class Reporter:
    """Console lines, metrics.jsonl, the trace writer and the timing of one run.

    With several processes, process 0 writes the run directory and the console; process i > 0
    keeps its own metrics, trace and transcripts under RUN_DIR/process_<i> (`out_dir`) and
    prints nothing."""

    def __init__(self, cfg: RunConfig, run_dir: Path, *, quiet: bool = False):
        from rich.console import Console

        self.cfg, self.run_dir = cfg, run_dir
        self.main = is_main_process()
        self.out_dir = run_dir if self.main else run_dir / f"process_{process_index()}"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()
        # soft_wrap: a long line (a run directory, an error) stays one line in a log file
        self.console = Console(stderr=True, quiet=quiet or not self.main, highlight=False,
                               soft_wrap=True)
        self.metrics = MetricsLogger(self.out_dir, tensorboard=cfg.tracing.tensorboard)
        self.tracer = get_tracer()
        if cfg.tracing.enabled:
            # The process tracer buffers while no file is open: what an earlier run or library
            # call in this process recorded is not this run's (it showed up as phantom episodes).
            self.tracer.take_events()
            self.tracer.start(self.out_dir)
        self.history: list[dict[str, Any]] = []
        self.timings: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def say(self, text: str) -> None:
        self.console.print(text)

    def warn(self, text: str) -> None:
        """`warning: text`, like every warning of the CLI (also with -q)."""
        print_warning(self.console, text)

    def transcripts(self, tokenizer, *, segment: int = 0) -> Transcripts:
        """The run's transcript writer (RUN_DIR/transcripts.jsonl; tracing.*transcripts*)."""
        t = self.cfg.tracing
        return Transcripts(self.out_dir, tokenizer, fraction=t.transcripts_fraction,
                           eval_first=t.eval_transcripts, seed=self.cfg.run.seed,
                           segment=segment, max_seq_len=self.cfg.trainer.max_seq_len,
                           warn=self.warn)

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        record = self.metrics.log(step, {**metrics, "wall_s": round(self.elapsed(), 3)})
        self.history.append(record)
        return record

    def view(self, total: int, keys: tuple[str, ...], description: str) -> ConsoleView | None:
        if not self.cfg.tracing.console or self.console.quiet:
            return None
        return ConsoleView(total_steps=total, keys=keys, console=self.console,
                           description=description)

    def close(self) -> None:
        self.metrics.close()
        if self.cfg.tracing.enabled:
            self.tracer.close()


def say_always(rep: Reporter, text: str) -> None:
    """A line that `-q` does not silence (plain stderr); process 0's only."""
    if not rep.main:
        return
    if rep.console.quiet:
        print(text, file=sys.stderr, flush=True)
    else:
        rep.say(text)


def phase_rows(run_dir: Path) -> dict[str, list[dict]]:
    """metrics.jsonl's rows by phase (a resume cut it back to its checkpoint first)."""
    out: dict[str, list[dict]] = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a line torn by a kill: not a row
                    continue
                if isinstance(row, dict):
                    out.setdefault(str(row.get("phase", "")), []).append(row)
    return out


def logged_phase(run_dir: Path, phase: str) -> bool:
    """Whether metrics.jsonl has a row of `phase`."""
    return bool(phase_rows(run_dir).get(phase))


def process_index() -> int:
    import jax
    return jax.process_index()


def process_count() -> int:
    import jax
    return jax.process_count()


def report_eval(rep: Reporter, step: int, label: str, results: list, transcripts: Transcripts
                ) -> dict:
    """Prints and logs an evaluation (phase `eval_<label>`, or `eval`) and keeps its first
    episodes' transcripts."""
    out: dict[str, float] = {}
    for r in results:
        rep.say(f"[bold]eval {label}[/bold] {r.line()}")
        out.update(r.to_metrics())
    phase = f"eval_{label}" if label else "eval"
    rep.log(step, {"phase": phase, "policy_version": results[0].policy_version
                   if results else 0, **out})
    transcripts.evaluated(phase, step, results)
    return out
