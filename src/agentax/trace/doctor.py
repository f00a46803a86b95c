"""`agentax doctor`: explain a run from its trace, metrics and config.

    from agentax.trace import doctor
    report = doctor.analyze("runs/my-run")
    print(doctor.format_report(report))

`agentax doctor RUN_DIR --timeline` also plots the report to RUN_DIR/timeline.png.
"""

from agentax.trace._doctor import DoctorReport, Latency, StageTime, analyze, read_knobs
from agentax.trace._format import format_report

__all__ = ["DoctorReport", "Latency", "StageTime", "analyze", "format_report", "read_knobs"]
