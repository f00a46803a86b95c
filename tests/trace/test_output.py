"""The out-of-process writer: same bytes as the in-process encoder, flush, exit and fallbacks."""

import enum
import logging
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import agentax.trace._output as output
from agentax.trace import PacketEncoder, Tracer, names, read_trace
from agentax.trace._tracer import COUNTER, INSTANT, SPAN, ThreadTrack


class Color(enum.IntEnum):
    RED = 1


class Mode(str, enum.Enum):
    FAST = "fast"


def _batches() -> list[list[tuple]]:
    """Recorded events with every kind of track and arg value the slow path must convert."""
    thread = ThreadTrack(4242, "worker")
    odd_args = {"np_float": np.float64(0.25), "np_int": np.int64(7), "enum": Color.RED,
                "str_enum": Mode.FAST, "obj": types.SimpleNamespace(a=1), "big": 2**70,
                "list": [1, 2]}
    out = []
    for b in range(3):
        batch = []
        for i in range(40):
            t = 10**12 * (b + 1) + 1000 * i
            batch.append((SPAN, t, t + 500, names.episode_track(i % 5), names.ENV_STEP,
                          {"turn": i, "ok": i % 2 == 0, "r": i / 3}, (), ()))
            batch.append((SPAN, t + 100, t + 200, thread, names.MODEL_CALL, None, (), ()))
            batch.append((COUNTER, t, t, None, names.ENGINE_ACTIVE_SLOTS, float(i), (), ()))
        batch.append((SPAN, t, t + 900, names.TRAINER_TRACK, names.TRAIN_STEP,
                      types.MappingProxyType({"v": b}), (b + 1,), (np.int64(b + 7),)))
        batch.append((INSTANT, t, t, "collector", "note", odd_args, (), ()))
        out.append(batch)
    return out


def _write(tmp_path, writer: str, batches) -> bytes:
    tracer = Tracer()
    path = tracer.start(tmp_path / writer, flush_interval_s=60, process_name="p",
                        writer=writer)
    assert tracer._writer.writer == writer
    for batch in batches:
        tracer._events.extend(batch)
        tracer.flush()  # one encode per batch, as below
        assert tracer.stats()["buffered"] == 0
    assert os.path.getsize(path) == tracer.stats()["bytes"]  # flush: it is in the file
    tracer.close()
    with open(path, "rb") as f:
        return f.read()


def test_process_writer_writes_the_in_process_encoders_bytes(tmp_path):
    batches = _batches()
    encoder = PacketEncoder(process_name="p")
    expected = b"".join(encoder.encode(list(batch)) for batch in batches)
    assert _write(tmp_path, "process", batches) == expected
    assert _write(tmp_path, "thread", batches) == expected
    data = read_trace(tmp_path / "process" / "trace.perfetto-trace")
    note = data.instants[0]
    assert note.args["np_float"] == 0.25 and note.args["enum"] == 1
    assert note.args["str_enum"] == "fast" and note.args["np_int"] == '"7"'  # as json
    assert {"worker (4242)", names.TRAINER_TRACK} <= set(data.tracks)


def _spans(tracer: Tracer, name: str, n: int) -> None:
    for i in range(n):
        with tracer.span(name, track=names.episode_track(i % 3), args={"i": i}):
            pass


def test_dead_encoder_process_falls_back_without_losing_events(tmp_path, caplog):
    tracer = Tracer()
    path = tracer.start(tmp_path, flush_interval_s=60)
    _spans(tracer, "before", 100)
    tracer.flush()
    sink = tracer._writer._sink
    sink._proc.kill()
    sink._proc.wait()
    _spans(tracer, "after", 100)
    with caplog.at_level(logging.WARNING, logger="agentax.trace"):
        tracer.flush()
    assert "encoding in the traced process" in caplog.text
    assert tracer._writer.writer == "thread"
    _spans(tracer, "last", 50)
    tracer.close()
    data = read_trace(path)
    assert [len(data.spans_named(n)) for n in ("before", "after", "last")] == [100, 100, 50]
    assert sorted(s.args["i"] for s in data.spans_named("after")) == list(range(100))
    assert tracer.stats()["written"] == 250


@pytest.mark.parametrize("broken", ["no python executable", "child import fails"])
def test_encoder_process_that_cannot_start_falls_back(tmp_path, caplog, monkeypatch, broken):
    if broken == "no python executable":
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    else:  # the child starts, but its import of the encoder fails
        monkeypatch.setattr(output, "_SRC_ROOT", str(tmp_path / "no-such-src"))
    tracer = Tracer()
    with caplog.at_level(logging.WARNING, logger="agentax.trace"):
        path = tracer.start(tmp_path, flush_interval_s=60)
    assert "cannot start the trace encoder process" in caplog.text
    assert tracer._writer.writer == "thread"
    _spans(tracer, "x", 20)
    tracer.close()
    assert len(read_trace(path).spans_named("x")) == 20


def test_unknown_writer_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="unknown trace writer 'fork'"):
        Tracer().start(tmp_path, writer="fork")


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_exiting_interpreter_writes_the_tail(tmp_path, writer):
    script = textwrap.dedent(f"""
        from agentax.trace import Tracer
        tracer = Tracer()
        tracer.start({str(tmp_path)!r}, flush_interval_s=60, writer={writer!r})
        for i in range(3000):
            with tracer.span("tail", args={{"i": i}}):
                pass
        # no close(): the atexit hook must write the buffered events and end the child
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    data = read_trace(tmp_path / "trace.perfetto-trace")
    assert sorted(s.args["i"] for s in data.spans_named("tail")) == list(range(3000))
