"""agentax.trace: always-on RL tracing (spans, counters, flows -> Perfetto), metrics, doctor.

Imports nothing from agentax. Standard names are in `agentax.trace.names`; the run analysis
(`agentax doctor`) is in `agentax.trace.doctor`. See docs/tracing.md.
"""

from agentax.trace import names
from agentax.trace._files import CONFIG_FILENAME, METRICS_FILENAME, TIMELINE_FILENAME, TRACE_FILENAME
from agentax.trace._metrics import MetricsLogger, read_metrics
from agentax.trace._reader import (InstantRecord, SpanRecord, TraceData, iter_packets, read_trace,
                                   trace_segments)
from agentax.trace._tracer import (DeviceSpan, Span, ThreadTrack, Tracer, block_until_ready,
                                   get_tracer, set_enabled, traced)

__all__ = [
    "CONFIG_FILENAME", "METRICS_FILENAME", "TIMELINE_FILENAME", "TRACE_FILENAME",
    "DeviceSpan", "InstantRecord", "MetricsLogger", "Span", "SpanRecord",
    "ThreadTrack", "TraceData", "Tracer", "block_until_ready", "get_tracer", "iter_packets",
    "names", "read_metrics", "read_trace", "set_enabled", "trace_segments", "traced",
]
