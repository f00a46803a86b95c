"""Transcripts: a miniature demo run keeps its episodes, `agentax show` prints them, and the HTML
page renders them in a real (headless) browser."""

from __future__ import annotations

import shutil
import subprocess
import types

import numpy as np
import pytest

from agentax.cli import main
from agentax.cli._show import parse_steps, printable
from agentax.run._transcripts import Transcripts, _chosen, read_transcripts
from agentax.records import Group, Trajectory, TrajectoryStatus
from tests.cli.test_commands import TINY

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step miniature demo run that keeps every trained episode, plus what the trainer was
    given (captured at `RLTrainer.step`): (run_dir, {(step, group, sample): (tokens, reward)})."""
    from agentax.train import RLTrainer

    trained: dict[tuple[int, str, int], tuple[int, int, int, float]] = {}
    original = RLTrainer.step

    def step(self, groups):
        k = 1 + len({key[0] for key in trained})
        limit = self.config.max_seq_len + 1
        for g in groups:
            for t in g.trajectories:
                trained[(k, g.group_id, t.sample_index)] = (
                    t.num_tokens, t.num_generated, int(t.loss_mask[:limit].sum()), t.reward)
        return original(self, groups)

    runs = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RLTrainer, "step", step)
        status = main(["train", *TINY, "run.steps=2", f"run.runs_dir={runs}", "run.name=t",
                       "tracing.transcripts_fraction=1", "tracing.eval_transcripts=2", "-q"])
    assert status == 0
    return runs / "t", trained


def test_transcripts_hold_the_trained_episodes_and_each_evaluations_first(run):
    run_dir, trained = run
    records = read_transcripts(run_dir)
    train = [r for r in records if r["phase"] == "train"]
    # Every trained episode (fraction 1), with the trainer's token counts and rewards.
    assert {(r["step"], r["group_id"], r["sample_index"]) for r in train} == set(trained)
    for r in train:
        total, generated, in_loss, reward = trained[(r["step"], r["group_id"], r["sample_index"])]
        assert r["tokens"] == {"prompt": total - generated, "completion": generated,
                               "trained": in_loss, "total": total}
        assert r["reward"] == reward and r["success"] == (reward > 0)
        assert r["segment"] == 0 and len(r["group_rewards"]) == 2
        assert r["policy_versions"] and max(r["policy_versions"]) < r["step"]
        assert r["messages"][0]["role"] == "user" and r["messages"][1]["role"] == "assistant"
        turn = r["turns"][0]
        assert turn["completion_tokens"] > 0 and turn["raw"] and "action" in turn
    # The first 2 episodes of each evaluation and mode: the same tasks before and after RL.
    evals = [(r["phase"], r["mode"], r["step"], r["task_id"]) for r in records
             if r["phase"] != "train"]
    tasks = [e[3] for e in evals[:2]]
    assert evals == [(p, m, s, t) for p, s in (("eval_before", 0), ("eval_after", 2))
                     for m in ("greedy", "sampled") for t in tasks]
    assert all(r["tokens"]["trained"] == 0 for r in records if r["phase"] != "train")


def test_show_prints_and_filters_the_episodes(run, capsys):
    run_dir, trained = run
    assert main(["show", str(run_dir), "--limit", "100"]) == 0
    out = capsys.readouterr().out
    assert out.count("train · step ") == len(trained) and out.count("eval_before (") == 4
    assert "  user: What is " in out and "  assistant [" in out
    assert "\x1b" not in out  # plain text off a terminal (and no model bytes driving it)

    assert main(["show", str(run_dir), "--eval", "--step", "2"]) == 0
    headers = [x for x in capsys.readouterr().out.splitlines() if " · step " in x]
    assert len(headers) == 4 and all(h.startswith("eval_after (") for h in headers)

    assert main(["show", str(run_dir), "--train", "--step", ":1", "--failure",
                 "--reward-max", "0", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("train · step 1 ") and "(the last 1 of " in out

    assert main(["show", str(run_dir), "--reward-min", "5"]) == 0
    assert "no episode of the " in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["show", "/nonexistent/run"], "is not a run directory"),
    (["show", "RUN", "--step", "x"], "give a step N or a range A:B"),
    (["show", "RUN", "--limit", "0"], "--limit 0"),
])
def test_show_rejects_bad_input_in_one_line(run, capsys, args, needle):
    args = [str(run[0]) if a == "RUN" else a for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_show_says_when_a_run_has_no_transcripts_yet(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("run:\n  steps: 1\n")
    assert main(["show", str(tmp_path)]) == 2
    assert "no transcripts.jsonl yet" in capsys.readouterr().err


def test_html_page_is_self_contained(run, capsys):
    run_dir, trained = run
    assert main(["show", str(run_dir), "--html"]) == 0
    assert "wrote " in capsys.readouterr().out
    text = (run_dir / "transcripts.html").read_text()
    assert "data:image/png;base64," in text  # curves.png, inline
    assert "Bottleneck:" in text  # the doctor's report (RUN_DIR/doctor.txt)
    assert "http://" not in text and "https://" not in text and "<link" not in text
    assert text.count("</script>") == 2  # the episodes' JSON cannot close its script early


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH to open the HTML page in: "
                    "install it (Debian, as root: `apt-get install -y chromium`; "
                    "scripts/setup.sh does) to run this check")
def test_html_page_renders_and_filters_episodes_in_a_real_browser(run, tmp_path):
    run_dir, trained = run
    out = tmp_path / "page.html"
    assert main(["show", str(run_dir), "--html", str(out)]) == 0
    records = read_transcripts(run_dir)

    def dom(fragment: str = "") -> str:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
             f"{out.resolve().as_uri()}{fragment}"],
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    page = dom()
    # The episodes exist only as JSON until the page's script renders them.
    assert page.count('<details class="episode') == len(records)
    assert f"{len(records)} of {len(records)} episodes" in page
    assert "What is " in page.split('id="episodes"')[1]
    train = sum(r["phase"] == "train" for r in records)
    page = dom("#phase=train&step_max=1")
    shown = sum(r["phase"] == "train" and r["step"] <= 1 for r in records)
    assert page.count('<details class="episode') == shown and 0 < shown < train
    # Episodes open collapsed; #open=1 opens every one (what "expand all" does).
    assert page.count('open=""') == 0
    page = dom("#phase=train&step_max=1&open=1")
    assert page.count('<details class="episode') == page.count('open=""') == shown


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH to open the HTML page in")
def test_html_page_expands_and_collapses_all_episodes(run, tmp_path):
    """The "expand all" / "collapse all" buttons, clicked in a real browser; a filter change
    keeps the choice."""
    playwright = pytest.importorskip("playwright.sync_api")
    run_dir, _ = run
    out = tmp_path / "page.html"
    assert main(["show", str(run_dir), "--html", str(out)]) == 0
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(out.resolve().as_uri())
            opened = "() => [...document.querySelectorAll('#episodes details')].map(d => d.open)"
            states = page.evaluate(opened)
            assert states and not any(states)
            page.click("#expand-all")
            assert all(page.evaluate(opened))
            page.select_option("#f-phase", "train")  # re-rendered by the filter: still open
            states = page.evaluate(opened)
            assert states and all(states)
            page.click("#collapse-all")
            assert not any(page.evaluate(opened))
        finally:
            browser.close()


def _traj(group: str, sample: int, reward: float = 0.0) -> Trajectory:
    n = 4
    return Trajectory(task_id="t", token_ids=np.arange(n, dtype=np.int32),
                      loss_mask=np.array([0, 0, 1, 1], np.int8), logprobs=np.zeros(n, np.float32),
                      versions=np.array([-1, -1, 3, 3], np.int32), reward=reward,
                      status=TrajectoryStatus.OK, group_id=group, sample_index=sample)


def test_a_write_error_warns_once_and_the_run_goes_on(tmp_path):
    warnings: list[str] = []
    transcripts = Transcripts(tmp_path / "gone", tokenizer=None, fraction=1.0, eval_first=1,
                              seed=0, warn=warnings.append)
    group = Group(group_id="g0", task_id="t", trajectories=(_traj("g0", 0), _traj("g0", 1)))
    transcripts.trained(1, [group])
    transcripts.trained(2, [group])
    transcripts.close()
    assert len(warnings) == 1 and "cannot write transcripts" in warnings[0]


def test_the_sample_is_the_configured_share_and_the_same_on_every_run(tmp_path):
    trajs = [_traj(f"g{i}", j) for i in range(500) for j in range(4)]
    chosen = [t for t in trajs if _chosen(7, t, 0.1)]
    assert 0.08 < len(chosen) / len(trajs) < 0.12
    assert chosen == [t for t in trajs if _chosen(7, t, 0.1)]
    assert not any(_chosen(7, t, 0.0) for t in trajs)
    # a resumed run appends: records of both segments stay
    for segment in (0, 2):
        tok = types.SimpleNamespace(decode=lambda ids, skip_special_tokens: "")
        t = Transcripts(tmp_path, tok, fraction=1.0, eval_first=0, seed=0, segment=segment)
        t.trained(segment + 1, [Group(group_id="g0", task_id="t", trajectories=(_traj("g0", 0),))])
        t.close()
    assert [(r["segment"], r["step"]) for r in read_transcripts(tmp_path)] == [(0, 1), (2, 3)]


def test_step_ranges_and_printable_text():
    assert parse_steps("3") == (3, 3) and parse_steps("2:5") == (2, 5)
    assert parse_steps(":4") == (None, 4) and parse_steps("4:") == (4, None)
    assert printable("a\x1b[2Jb\nc\td") == "a\\x1b[2Jb\nc\td"


def test_a_black_box_agents_return_value_is_shown_last():
    from agentax.cli._show import conversation

    record = {"messages": [{"role": "user", "content": "q"}], "agent_returned": "str: 825"}
    assert conversation(record)[-1] == ("agent", "returned: its final answer, not a reward", "str: 825")
    assert len(conversation({"messages": [{"role": "user", "content": "q"}]})) == 1
