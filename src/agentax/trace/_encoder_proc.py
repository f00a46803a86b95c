"""The trace encoder process: reads batches of raw events on stdin, appends Perfetto to a file.

Encoding (`PacketEncoder`, ~2.7 us per event) is most of what tracing costs; on a machine
with few cores its CPU time is taken from the traced program's event loop whether or not it
holds the GIL. The traced process therefore only turns events into plain values and
`marshal`s them (~0.3 us per event); this process, started by `agentax.trace._output`, does
the encoding, at a lower priority.

Wire format. Parent -> child (stdin): frames of a little-endian u32 length and a `marshal`ed
list of rows ``(kind, start_ns, end_ns, track, name, args_or_value, flow_out, flow_in)`` made
of builtins only (`to_plain`); end of input ends the process. Child -> parent (the fd that was
stdout): after each batch is written and flushed, ``<QQQ`` (batches done, file size, CPU ns
of this process); one ``(0, 0, cpu)`` when it is ready to encode. It imports only the encoder (not the `agentax` package: `BOOTSTRAP`), so
it starts in about the time numpy and the perfetto protos take to import.
"""

from __future__ import annotations

import json
import marshal
import os
import struct
import sys
import time

from agentax.trace._tracer import COUNTER, ThreadTrack

FRAME = struct.Struct("<I")
ACK = struct.Struct("<QQQ")
_PLAIN = frozenset({str, int, float, bool, type(None)})

# Run with `python -c BOOTSTRAP SRC_ROOT PATH PID PROCESS_NAME NICE`: registers empty
# `agentax` / `agentax.trace` packages so that importing the encoder runs only its modules.
BOOTSTRAP = """\
import os, sys, types
root = sys.argv[1]
sys.path.insert(0, root)
for name in ("agentax", "agentax.trace"):
    module = types.ModuleType(name)
    module.__path__ = [os.path.join(root, *name.split("."))]
    sys.modules[name] = module
from agentax.trace._encoder_proc import main
main(sys.argv[2:])
"""


def to_plain(batch: list) -> list:
    """Buffer entries as rows `marshal` can write; the encoder makes the same bytes of them.

    Thread tracks become plain ``(tid, name)`` tuples (`from_plain` restores them); rows whose
    track is a string or None (nearly all) are passed as they are.
    """
    return [e if e.__class__ is tuple and (e[3].__class__ is str or e[3] is None)
            else _plain_row(e) for e in batch]


def _plain_row(e) -> tuple:
    if e.__class__ is not tuple:  # a finished Span
        e = e.record()
    track = e[3]
    if track is not None and track.__class__ is not str:
        track = (int(track.tid), str(track.name)) if isinstance(track, ThreadTrack) \
            else str(track)
    return (e[0], e[1], e[2], track, e[4], e[5], e[6], e[7])


def sanitize(rows: list) -> list:
    """Rows of `to_plain` with every value `marshal` cannot write replaced by one that encodes
    to the same bytes (the slow path, for args holding numpy scalars, enums or objects)."""
    return [(int(k), _time(s), _time(e), t, _text(n),
             float(p) if k == COUNTER else (_args(p) if p is not None else None),
             tuple(int(f) for f in fo), tuple(int(f) for f in fi))
            for k, s, e, t, n, p, fo, fi in rows]


def _time(value) -> int | float:
    return value if value.__class__ in (int, float) else int(value)


def _text(value):
    return str.__str__(value) if isinstance(value, str) else value


def _args(args) -> dict:
    return {_text(k): _arg(v) for k, v in args.items()}


def _arg(value):
    """A builtin that `PacketEncoder` encodes exactly as it encodes `value`."""
    if value.__class__ in _PLAIN:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    try:
        return json.dumps(value, default=str)  # what the encoder writes for other values
    except (TypeError, ValueError):
        return repr(value)


def dumps(batch: list) -> bytes:
    """One frame (length + marshal) of buffer entries."""
    rows = to_plain(batch)
    try:
        payload = marshal.dumps(rows)
    except ValueError:  # an unmarshallable value somewhere: convert the batch, slowly
        payload = marshal.dumps(sanitize(rows))
    return FRAME.pack(len(payload)) + payload


def from_plain(rows: list) -> list:
    """Rows of `to_plain` with thread tracks restored."""
    return [r if r[3].__class__ is not tuple else
            (r[0], r[1], r[2], ThreadTrack(*r[3]), r[4], r[5], r[6], r[7]) for r in rows]


def _read_exact(stream, n: int) -> bytes | None:
    data = stream.read(n)
    if len(data) < n:
        return None  # end of input (a partial frame means the parent died mid-write)
    return data


def main(argv: list[str]) -> None:
    """Encode frames from stdin into `path` until stdin ends; acknowledge each batch."""
    path, pid, process_name, nice = argv[0], int(argv[1]), argv[2], int(argv[3])
    ack_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints go to stderr, not into the acknowledgements
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
    from agentax.trace._writer import PacketEncoder

    encoder = PacketEncoder(pid=pid, process_name=process_name)
    stdin = os.fdopen(0, "rb", buffering=1 << 20)
    done = 0
    with open(path, "ab") as out:
        os.write(ack_fd, ACK.pack(0, 0, time.process_time_ns()))  # ready
        while True:
            head = _read_exact(stdin, FRAME.size)
            payload = head and _read_exact(stdin, FRAME.unpack(head)[0])
            if payload is None:
                break
            out.write(encoder.encode(from_plain(marshal.loads(payload))))
            out.flush()
            done += 1
            os.write(ack_fd, ACK.pack(done, out.tell(), time.process_time_ns()))
    # Everything is written and closed: skip the interpreter's teardown (tens of ms of
    # freeing numpy and protobuf modules), which the traced process's close() would wait for.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
