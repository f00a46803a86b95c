"""`render_timeline_png`: stage utilisation over time as a PNG (matplotlib, Agg backend)."""

from __future__ import annotations

import os

from agentax.trace import names
from agentax.trace._doctor import DoctorReport, analyze
from agentax.trace._files import TIMELINE_FILENAME

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
