"""File names inside a run directory that the tracer, the metrics logger and the doctor share."""

TRACE_FILENAME = "trace.perfetto-trace"
TRACE_FILENAME_ALT = "trace.pftrace"
METRICS_FILENAME = "metrics.jsonl"
CONFIG_FILENAME = "config.yaml"
TIMELINE_FILENAME = "timeline.png"
