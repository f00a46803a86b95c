"""A new user's own web task, from the docs and `agentax.demos` alone (issue 62's acceptance).

The test runs the module docs/environments.md shows ("Your own page, start to finish"): a
local HTML page of three buttons whose labels come from the URL (which labels, and which one
the instruction names, vary with the task's seed), a `UrlSite` that scores the first click,
tasks, and a noisy warm start recorded with `agentax.demos.click_target` through the user's
own `BrowserEnvironment` and `CompactWebAgent`; then `agentax train its.yaml` runs SFT and
async GRPO with `pipeline.filters` at its default. The goal: held-out sampled success >= 0.9,
or >= 2x the warm start's, within 5 minutes on 2 cores.

The config below: 200 demonstrations at 30% noise recorded in Chromium, SFT 500 steps (the
imitator finds the named label's id between steps ~200 and ~300; fewer leave it confidently
wrong on some pages, and GRPO then gets all-equal groups), GRPO at lr 2e-3 for 14 steps (4
groups of 8), and a held-out evaluation that is sampled only, twice on each of 48 pages: the
criterion is on sampled success, and 96 sampled episodes bound it tighter than the 48 greedy
+ 48 sampled of before, at the same cost. Measured (seeds 0, 1 and 2, a shared 2-core
host): held-out sampled success 82.3% -> 93.8% and 82.3% -> 94.8% (seed 0, twice), 77.1% ->
92.7% (seed 1), 74.0% -> 96.9% (seed 2); 470-541 CPU-seconds a run (Python, Chromium and its
driver together). On two idle cores (load ~2 at the start): 81.2% -> 100%, 328 s of wall time
(recording 43 s, SFT 72 s, the evaluations 24 s, RL 187 s): 28 s over the goal, hence
`manual` still.

Where the time goes: browser episodes. An RL step keeps only groups whose rewards differ, and
from ~0.9 success most groups of 8 are all right, so a step starts 90-270 episodes (1,648
over the 14 steps of the seed-0 run: 316 of its 483 CPU-seconds; SFT 96, the 200 recordings
30, the two evaluations 36). More RL steps did not help: with 20 (the earlier config),
training success swung between 0.74 and 0.97 and one seed-0 run ended at 89.6%, below the
bound.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentax.cli import main
from agentax.envs import BrowserUnavailableError, check_browser_available

try:
    check_browser_available()
except BrowserUnavailableError as e:  # pragma: no cover - depends on the host
    pytest.skip(f"browser unavailable: {e}", allow_module_level=True)

DOCS = Path(__file__).parents[2] / "docs" / "environments.md"


def _module_from_the_docs() -> str:
    """The user's module exactly as docs/environments.md shows it (so the two cannot drift)."""
    text = DOCS.read_text()
    section = text[text.index("**Your own page, start to finish.**"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


CONFIG = """
run:
  steps: 14
env:
  factory: my_buttons:make_env
agent:
  factory: my_buttons:make_agent
tasks:
  factory: my_buttons:tasks
  num_train: 2000
  num_eval: 48
sft:
  demos: my_buttons:demos
  demos_kwargs: {noise: 0.3}
  num_demos: 200
  steps: 500
  batch_size: 16
  batch_tokens: 0
  learning_rate: 0.003
  warmup_steps: 10
  schedule: constant
  pack_length: 128
sampling:
  temperature: 1.0
  max_tokens: 10
collector:
  max_turns: 2
  max_episode_tokens: 224
engine:
  max_slots: 32
  max_seq_len: 256
  prefill_chunk: 64
  min_prefill_bucket: 32
  decode_steps_per_call: 8
trainer:
  advantage: grpo
  learning_rate: 0.002
  micro_batch_size: 32
  max_seq_len: 256
  min_seq_bucket: 128
  seq_bucket_multiple: 64
  off_policy: tis
  is_cap: 2.0
pipeline:
  mode: async
  max_staleness: 1
  group_size: 8
  groups_per_step: 4
  max_concurrency: 16
eval:
  greedy: false
  samples: 2
  max_concurrency: 16
tracing:
  console: false
"""


@pytest.mark.slow
@pytest.mark.timeout(450)  # above its own 300 s assertion: a slow host fails with the time
@pytest.mark.manual  # 328 s on two idle cores, over the 300 s goal (see the docstring)
def test_a_users_own_three_button_page_learns(tmp_path, monkeypatch, capsys):
    import time

    (tmp_path / "my_buttons.py").write_text(_module_from_the_docs())
    (tmp_path / "its.yaml").write_text(CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    start = time.monotonic()
    status = main(["train", str(tmp_path / "its.yaml"), f"run.runs_dir={tmp_path}",
                   "run.name=buttons"])
    wall = time.monotonic() - start
    assert status == 0, capsys.readouterr().err[-3000:]
    run = tmp_path / "buttons"
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["pipeline"]["filters"] == [
        "all_equal_rewards"]  # the default
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    assert after["eval/sampled/episodes"] == 96  # 48 pages, sampled twice
    b, a = before["eval/sampled/success"], after["eval/sampled/success"]
    assert b < 0.9, f"the warm start is already near perfect ({b:.3f}): demos too clean"
    assert a >= 0.9 or a >= 2 * b, f"sampled: {b:.3f} -> {a:.3f}"
    assert wall <= 300, f"{wall:.0f} s (the goal: 5 minutes on two idle cores)"
