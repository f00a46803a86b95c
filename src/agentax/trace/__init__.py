"""agentax.trace: always-on RL tracing (spans, counters, flows -> Perfetto), metrics, doctor.

Imports nothing from agentax. Standard names are in `agentax.trace.names`; the run analysis
(`agentax doctor`) is in `agentax.trace.doctor`.
"""

from agentax.trace import names
from agentax.trace._files import (CONFIG_FILENAME, METRICS_FILENAME, TIMELINE_FILENAME,
                                  TRACE_FILENAME, TRACE_FILENAME_ALT)
from agentax.trace._reader import InstantRecord, SpanRecord, TraceData, iter_packets, read_trace
from agentax.trace._tracer import Span, ThreadTrack, Tracer, get_tracer, set_enabled, traced
from agentax.trace._writer import PacketEncoder, PerfettoWriter

__all__ = [
    "CONFIG_FILENAME", "METRICS_FILENAME", "TIMELINE_FILENAME", "TRACE_FILENAME",
    "TRACE_FILENAME_ALT", "InstantRecord", "PacketEncoder", "PerfettoWriter", "Span",
    "SpanRecord", "ThreadTrack", "TraceData", "Tracer", "get_tracer", "iter_packets", "names",
    "read_trace", "set_enabled", "traced",
]
