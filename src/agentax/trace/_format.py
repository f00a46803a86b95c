"""Plain-text rendering of a `DoctorReport` (what `agentax doctor RUN_DIR` prints)."""

from __future__ import annotations

from agentax.trace._doctor import DoctorReport
from agentax.trace._verdict import pct


def _pct(x: float | None) -> str:
    return f"{pct(x, 1):>6}"


def format_report(report: DoctorReport) -> str:
    """The report as text: stages, utilisation, latencies, staleness, verdict."""
    lines = [f"agentax doctor: {report.run_dir}",
             f"wall time {report.wall_s:.2f} s, {report.episodes} episodes, "
             f"{report.train_steps} train steps, {report.metrics_records} metrics records", ""]
    lines.append("Wall time by stage          active    share   summed  count")
    for st in report.stages:
        lines.append(f"  {st.name:<22} {st.active_s:9.2f} s {_pct(st.active_fraction)} "
                     f"{st.total_s:8.1f} s {st.count:6d}")
    lines += ["", "Utilisation",
              f"  engine busy            {_pct(report.engine_busy_fraction)}"
              f"   all slots full {_pct(report.engine_full_fraction)}",
              "  engine mean active     " + ("   n/a" if report.engine_mean_active is None
                                             else f"{report.engine_mean_active:6.1f}")
              + "   mean waiting   " + ("   n/a" if report.engine_mean_waiting is None
                                        else f"{report.engine_mean_waiting:6.1f}"),
              f"  trainer busy           {_pct(report.trainer_busy_fraction)}"
              f"   waiting for groups {_pct(report.trainer_wait_fraction)}",
              f"  environment-bound      {_pct(report.env_bound_fraction)}"
              "   (only env/tool/reward work running)"]
    if report.training_slowdown is not None:
        lines.append(f"  decode step while training {report.training_slowdown:5.2f}x"
                     "   (p50, over decode steps with no train step running)")
    if report.host:
        lines.append("  host                   " + ", ".join(f"{k}={v}" for k, v in
                                                          report.host.items()))
    if report.episode_time_shares:
        shares = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(
            report.episode_time_shares.items(), key=lambda kv: -kv[1]))
        lines.append(f"  episode time           {shares}")
    lines += ["", "Latency (s)                  count      p50      p95      p99      max"]
    for lat in report.latencies:
        lines.append(f"  {lat.name:<22} {lat.count:8d} {lat.p50_s:8.3f} {lat.p95_s:8.3f} "
                     f"{lat.p99_s:8.3f} {lat.max_s:8.3f}")
    lines += ["", "Staleness (versions behind: count)"]
    if report.staleness:
        total = sum(report.staleness.values())
        lines += [f"  {k:>3}: {v:6d}  {100 * v / total:5.1f}%" for k, v in report.staleness.items()]
    else:
        lines.append("  no staleness samples")
    knobs = ", ".join(f"{k}={v}" for k, v in report.knobs.items())
    lines += ["", f"Knobs: {knobs}", "", f"Bottleneck: {report.bottleneck}",
              f"Verdict: {report.verdict}", f"Suggestion: {report.suggestion}"]
    lines += [f"Note: {n}" for n in report.notes]
    return "\n".join(lines)
