"""The CLI's presentation of a run: the live console view and the doctor's timeline plot."""

from __future__ import annotations

import io

from rich.console import Console

from agentax.cli._console import ConsoleView
from agentax.cli._plots import render_timeline_png
from agentax.trace import MetricsLogger, Tracer, names
from agentax.trace.doctor import analyze


def test_console_view_shows_progress_and_chosen_metrics(tmp_path):
    buf = io.StringIO()
    view = ConsoleView(total_steps=3, keys=("loss", "reward"),
                       console=Console(file=buf, force_terminal=False, width=120))
    with MetricsLogger(tmp_path, console=view) as logger:
        for step in range(3):
            logger.log(step, {"loss": 1.5 / (step + 1), "reward": step, "note": "x"})
    text = buf.getvalue()
    assert "loss=0.5" in text and "reward=2" in text and "3/3" in text
    assert "note" not in text
    assert ConsoleView.format_value(1e-5) == "1.00e-05" and ConsoleView.format_value(0.25) == "0.25"


def test_timeline_png_of_a_traced_run(tmp_path):
    now = [10**9]
    tracer = Tracer(clock=lambda: now[0])
    tracer.start(tmp_path)
    for step in range(4):
        with tracer.span(names.MODEL_CALL, track=names.episode_track(step)):
            now[0] += 20_000_000
        tracer.counter(names.ENGINE_WAITING, step)
        with tracer.span(names.TRAIN_STEP, track=names.TRAINER_TRACK):
            now[0] += 10_000_000
    tracer.close()
    report = analyze(tmp_path)
    assert {names.MODEL_CALL, names.TRAIN_STEP, names.ENGINE_WAITING} <= set(report.timeline)
    path = render_timeline_png(report)
    assert path == str(tmp_path / "timeline.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert render_timeline_png(tmp_path, tmp_path / "t.png") == str(tmp_path / "t.png")
