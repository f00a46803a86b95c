"""The run's learning curves as a PNG: every per-episode rate the task reports, per RL step."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_curves"]

_SKIP = ("phase", "step", "policy_version", "episodes", "wall_s", "success_trained", "reward",
         "reward_trained", "staleness", "staleness_mean", "traj_per_s", "train_s",
         "trainer_wait_s", "loss", "entropy", "kl", "grad_norm", "skipped", "turns",
         "parse_errors")


def _rates(records: Sequence[dict[str, Any]]) -> list[str]:
    """Per-episode metrics whose values all lie in [0, 1] (success first)."""
    names: list[str] = []
    for r in records:
        for k, v in r.items():
            if k not in _SKIP and k not in names and isinstance(v, (int, float)):
                names.append(k)
    keep = [k for k in names
            if all(0.0 <= r[k] <= 1.0 for r in records if isinstance(r.get(k), (int, float)))]
    return sorted(keep, key=lambda k: (k != "success", k))


def plot_curves(history: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Plots the sampled per-step rates (success and the environment's own) and held-out
    evaluations of the same rates.

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
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = _rates(rl)
    for i, name in enumerate(names):
        ax.plot([r["step"] for r in rl if name in r], [r[name] for r in rl if name in r], "-",
                color=colors[i % len(colors)], label=f"{name} (sampled, training)")
    for mode, marker, style in (("greedy", "o", "--"), ("sampled", "s", ":")):
        for i, name in enumerate(names or ["success"]):
            key = f"eval/{mode}/{name}"
            pts = [(r["step"], r[key]) for r in evals if key in r]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, linestyle=style,
                        color=colors[i % len(colors)], alpha=0.8,
                        label=f"{name} (held-out, {mode})")
    ax.set_xlabel("RL step (policy version)")
    ax.set_ylabel("rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("agentax: per-episode rates during RL")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
