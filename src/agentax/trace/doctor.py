"""`agentax doctor`: explain a run from its trace, metrics and config.

    from agentax.trace import doctor
    report = doctor.analyze("runs/my-run")
    print(doctor.format_report(report))
    doctor.render_timeline_png(report)          # runs/my-run/timeline.png
"""

from agentax.trace._doctor import DoctorReport, Latency, StageTime, analyze, read_knobs
from agentax.trace._format import format_report
from agentax.trace._timeline import render_timeline_png

__all__ = ["DoctorReport", "Latency", "StageTime", "analyze", "format_report", "read_knobs",
           "render_timeline_png"]
