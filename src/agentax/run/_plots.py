"""The run's plots: learning curves (every per-episode rate the task reports, per RL step) and
the doctor's stage timeline.

A step (or an evaluation) that does not report a metric leaves a gap in its curve: the
metric is absent there, not 0 and not the last value (`series`; `aggregate` in _evaluate.py
says when a step reports one).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentax.trace import TIMELINE_FILENAME, names
from agentax.trace.doctor import DoctorReport, analyze

__all__ = ["plot_curves", "render_timeline_png", "series"]

_SKIP = ("phase", "step", "policy_version", "episodes", "wall_s", "success_trained", "reward",
         "reward_trained", "staleness", "staleness_mean", "traj_per_s", "train_s",
         "trainer_wait_s", "loss", "entropy", "kl", "grad_norm", "skipped", "turns",
         "parse_errors")


def _rates(records: Sequence[dict[str, Any]]) -> list[str]:
    """Per-episode metrics whose values all lie in [0, 1] (success first)."""
    found: list[str] = []
    for r in records:
        for k, v in r.items():
            if k not in _SKIP and k not in found and isinstance(v, (int, float)):
                found.append(k)
    keep = [k for k in found
            if all(0.0 <= r[k] <= 1.0 for r in records if isinstance(r.get(k), (int, float)))]
    return sorted(keep, key=lambda k: (k != "success", k))


def series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[Any], list[float]]:
    """(steps, values) over every row, NaN where a row lacks `key`: the curve has a gap at a
    step that did not report the metric, not a line drawn across it (nor a 0)."""
    values = [float(r[key]) if isinstance(r.get(key), (int, float)) else math.nan for r in rows]
    return [r["step"] for r in rows], values


def plot_curves(history: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Plots the sampled per-step rates (success and the environment's own) and held-out
    evaluations of the same rates; with SFT rows (a warm start), the SFT loss beside them.

    Args:
      history: metrics records (as written to metrics.jsonl).
      path: the PNG to write.
    Returns:
      The path written.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rl = [r for r in history if r.get("phase") == "rl"]
    evals = [r for r in history if str(r.get("phase", "")).startswith("eval")]
    sft = [r for r in history if r.get("phase") == "sft" and "sft/loss" in r]
    if sft:
        fig, (ax_sft, ax) = plt.subplots(1, 2, figsize=(10.5, 4), dpi=110,
                                         gridspec_kw={"width_ratios": [1, 2]})
        ax_sft.plot([r["step"] for r in sft], [r["sft/loss"] for r in sft], "-o", markersize=3)
        ax_sft.set_xlabel("SFT step")
        ax_sft.set_ylabel("loss")
        ax_sft.set_yscale("log" if min(r["sft/loss"] for r in sft) > 0 else "linear")
        ax_sft.grid(alpha=0.3)
        ax_sft.set_title("SFT warm start")
    else:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    rates = _rates(rl)
    for i, name in enumerate(rates):
        # Small markers: a step that reports the metric between two that do not stays visible.
        ax.plot(*series(rl, name), "-", marker=".", markersize=3,
                color=colors[i % len(colors)], label=f"{name} (sampled, training)")
    for mode, marker, style in (("greedy", "o", "--"), ("sampled", "s", ":")):
        rows = [r for r in evals if f"eval/{mode}/episodes" in r]  # the evaluations of `mode`
        for i, name in enumerate(rates or ["success"]):
            key = f"eval/{mode}/{name}"
            if any(key in r for r in rows):
                ax.plot(*series(rows, key), marker, linestyle=style,
                        color=colors[i % len(colors)], alpha=0.8,
                        label=f"{name} (held-out, {mode})")
    ax.set_xlabel("RL step (policy version)")
    ax.set_ylabel("rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")
    else:  # an SFT-only run (run.steps=0, no evaluation): nothing to plot here
        ax.text(0.5, 0.5, "no RL steps or evaluations", ha="center", va="center",
                transform=ax.transAxes, color="gray")
    ax.set_title("agentax: per-episode rates during RL")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


_ROLLOUT = (names.MODEL_CALL, names.ENV_RESET, names.ENV_STEP, names.TOOL_CALL, names.REWARD)
_TRAINER = (names.TRAIN_STEP, names.WEIGHT_PUBLISH, names.TRAINER_WAIT)
_STALLS = (names.STALENESS_WAIT, names.PRODUCER_BLOCKED)
_ENGINE = (names.ENGINE_ACTIVE_SLOTS, names.ENGINE_WAITING, names.QUEUE_DEPTH)


def render_timeline_png(report_or_run_dir: DoctorReport | str | os.PathLike,
                        path: str | os.PathLike | None = None) -> str:
    """Plot what each stage was doing over time.

    Panels: episodes by activity (mean concurrent spans per bin), trainer busy/waiting,
    producer stalls, engine slots / waiting / queue depth counters.

    Args:
      report_or_run_dir: a `DoctorReport` or a run directory to analyze.
      path: output PNG (default: RUN_DIR/timeline.png).
    Returns:
      The path written.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

    report = report_or_run_dir if isinstance(report_or_run_dir, DoctorReport) \
        else analyze(report_or_run_dir)
    path = os.fspath(path) if path is not None else os.path.join(report.run_dir,
                                                                TIMELINE_FILENAME)
    series = report.timeline
    n = len(next(iter(series.values()))) if series else 1
    t = np.arange(n) * report.timeline_bin_s
    groups = [("episodes (concurrent spans)", _ROLLOUT, True),
              ("trainer (fraction of bin)", _TRAINER, True),
              ("producer stalls", _STALLS, True),
              ("engine / queue counters", _ENGINE, False)]
    groups = [g for g in groups if any(k in series for k in g[1])]
    fig, axes = plt.subplots(max(len(groups), 1), 1, figsize=(11, 2.3 * max(len(groups), 1)),
                             sharex=True, squeeze=False)
    for ax, (title, keys, stacked) in zip(axes[:, 0], groups):
        present = [k for k in keys if k in series]
        if stacked:
            ax.stackplot(t, *[np.asarray(series[k]) for k in present], labels=present, alpha=0.85,
                         step="post")
        else:
            for k in present:
                ax.step(t, series[k], where="post", label=k)
        ax.set_title(title, fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right", ncol=len(present))
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since start of trace")
    fig.suptitle(f"{report.bottleneck}: {report.verdict}"[:160], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
