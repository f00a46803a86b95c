"""The run's learning curves as a PNG: success and tool-use rate per RL step."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_curves"]


def plot_curves(history: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Plots sampled training success / tool use per step and held-out greedy evaluations.

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
    if rl:
        steps = [r["step"] for r in rl]
        ax.plot(steps, [r["success"] for r in rl], "-", color="tab:blue",
                label="success (all sampled episodes)")
        ax.plot(steps, [r["tool_rate"] for r in rl], "-", color="tab:orange",
                label="tool use (all sampled episodes)")
    for mode, marker in (("greedy", "o"), ("sampled", "s")):
        pts = [(r["step"], r[f"eval/{mode}/success"], r[f"eval/{mode}/tool_rate"])
               for r in evals if f"eval/{mode}/success" in r]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color="tab:green"
                    if mode == "greedy" else "tab:purple", linestyle="--",
                    label=f"held-out success ({mode})")
            ax.plot([p[0] for p in pts], [p[2] for p in pts], marker, color="tab:red"
                    if mode == "greedy" else "tab:brown", linestyle=":", alpha=0.7,
                    label=f"held-out tool use ({mode})")
    ax.set_xlabel("RL step (policy version)")
    ax.set_ylabel("rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("agentax: success and tool use during RL")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
