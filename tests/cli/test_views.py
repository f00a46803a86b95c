"""The CLI's presentation of a run: the live console view and the doctor's timeline plot."""

from __future__ import annotations

import io

from rich.console import Console

from agentax.run._console import ConsoleView
from agentax.run._plots import render_timeline_png
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


def test_console_view_prints_plain_lines_when_not_a_terminal(monkeypatch):
    # A log file, CI or nohup: one plain line per step (throttled), the last always.
    from agentax.run import _console

    buf = io.StringIO()
    view = ConsoleView(total_steps=5, keys=("success", "reward"), description="rl",
                       console=Console(file=buf, force_terminal=False, width=80))
    assert view.plain
    monkeypatch.setattr(_console, "PLAIN_EVERY_S", 0.0)
    for step in range(3):
        view.update(step, {"success": step / 4, "reward": 0.5})
    monkeypatch.setattr(_console, "PLAIN_EVERY_S", 3600.0)
    view.update(3, {"success": 0.9, "reward": 0.5})  # throttled
    view.update(4, {"success": 1.0, "reward": 0.5})  # the last step: always
    view.close()
    lines = buf.getvalue().splitlines()
    assert [x.split()[1] for x in lines] == ["1/5", "2/5", "3/5", "5/5"], lines
    assert all(x.startswith("rl ") and "reward=0.5" in x for x in lines)
    assert "success=0.5" in lines[2] and "success=1" in lines[3]


def test_console_view_on_a_terminal_keeps_the_live_bar():
    buf = io.StringIO()
    view = ConsoleView(total_steps=2, console=Console(file=buf, force_terminal=True, width=120))
    assert not view.plain


def test_curves_show_the_sft_loss_beside_the_rl_rates(tmp_path):
    from agentax.run._plots import plot_curves
    from matplotlib import image

    rl = [{"phase": "rl", "step": s, "success": s / 4} for s in range(1, 5)]
    sft = [{"phase": "sft", "step": s, "sft/loss": 2.0 / s} for s in range(1, 6)]
    plain = image.imread(plot_curves(rl, tmp_path / "rl.png"))
    both = image.imread(plot_curves(sft + rl, tmp_path / "both.png"))
    assert both.shape[1] > plain.shape[1] * 1.4  # a second panel: the SFT loss


def test_curves_of_an_sft_only_run_plot_without_a_warning(tmp_path):
    import warnings

    from agentax.run._plots import plot_curves

    sft = [{"phase": "sft", "step": s, "sft/loss": 2.0 / s} for s in range(1, 6)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels" among them
        assert plot_curves(sft, tmp_path / "sft.png").stat().st_size > 0


def test_curves_leave_a_gap_where_a_step_did_not_report_a_metric(tmp_path):
    import math

    from agentax.run._plots import plot_curves, series

    rows = [{"phase": "rl", "step": s, "success": 0.5, **({"hole": 0.25} if s in (1, 4) else {})}
            for s in range(1, 5)]
    steps, values = series(rows, "hole")
    assert steps == [1, 2, 3, 4] and values[0] == values[3] == 0.25
    assert math.isnan(values[1]) and math.isnan(values[2])  # a gap, not a line across
    assert plot_curves(rows, tmp_path / "c.png").stat().st_size > 0


def test_every_cli_warning_prints_in_one_format(capsys):
    import logging
    from pathlib import Path

    import agentax.cli
    import agentax.run
    from agentax.run._console import log_lines, print_warning

    # The library's log warnings (a root handler set up by an imported library printed them as
    # `WARNING:agentax.rollout._collector:...`) and the CLI's own, quiet (-q) or not.
    with log_lines():
        logging.getLogger("agentax.rollout._collector").warning("%d episodes cut", 3)
    print_warning(Console(quiet=True), "no RL step for a while; pipeline.filters=[]")
    buf = io.StringIO()
    print_warning(Console(file=buf, force_terminal=False), "resumed [x]")
    assert capsys.readouterr().err.splitlines() == [
        "warning: 3 episodes cut", "warning: no RL step for a while; pipeline.filters=[]"]
    assert buf.getvalue() == "warning: resumed [x]\n"
    assert logging.getLogger("agentax").propagate  # restored after the command
    for path in [*Path(agentax.cli.__file__).parent.glob("*.py"),
                 *Path(agentax.run.__file__).parent.glob("*.py")]:
        if path.name != "_console.py":  # the one place that formats them
            assert "[yellow]warning" not in path.read_text(), path
