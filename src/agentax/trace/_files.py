"""File names inside a run directory that the tracer, the metrics logger and the doctor share."""

TRACE_FILENAME = "trace.perfetto-trace"  # a resume writes trace.1.perfetto-trace, ...
METRICS_FILENAME = "metrics.jsonl"
CONFIG_FILENAME = "config.yaml"
TIMELINE_FILENAME = "timeline.png"
