"""A new user's own web task, from the docs and `agentax.demos` alone (issue 62's acceptance).

The test runs the module docs/environments.md shows ("Your own page, start to finish"): a
local HTML page of three buttons whose labels come from the URL (which labels, and which one
the instruction names, vary with the task's seed), a `UrlSite` that scores the first click,
tasks, and a noisy warm start recorded with `agentax.demos.click_target` through the user's
own `BrowserEnvironment` and `CompactWebAgent`; then `agentax train its.yaml` runs SFT and
async RL with `pipeline.filters` at its default. The goal: held-out sampled success >= 0.9,
or >= 2x the warm start's, within 5 minutes on 2 cores.

The config below: 200 demonstrations at 30% noise recorded in Chromium, SFT 500 steps (the
imitator finds the named label's id between steps ~200 and ~300; fewer leave it confidently
wrong on some pages, and RL then gets all-equal groups), then Dr. GRPO at lr 2e-3 (4 groups
of 8 a step) for at most 20 steps, ended early once the latest 256 training episodes
succeeded at 95% (`pipeline.stop_success`), and a held-out evaluation that is sampled only,
twice on each of 48 pages. docs/environments.md has the measured runs.

Why the early stop: near 0.98 training success most groups of 8 are all right and dropped, so
a late step starts 200-600 episodes to find four that differ; that is where a fixed step count
spent its time. Why Dr. GRPO (no division by the group's reward std; a group of 7 right and 1
wrong gives plain GRPO's wrong sample a -2.5 advantage): with plain GRPO at this learning rate,
of three runs one collapsed at step 13 and ended at 44.8%, and another fell to 19% training
success mid-run before recovering.

Measured (held-out sampled success; docs/environments.md has each run): six runs, seeds 0-3,
all >= 0.9 (92.7-97.9%). Five stopped early, after steps 6-12; those timed on two idle cores
took 189-223 s. One seed-0 run never had a window at 95% (its training success fell to 8% at
step 13 and recovered), ran all 20 steps and took 384 s. Hence `manual` still: most runs meet
the time, not all, and under CI another test shares the two cores.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

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
  steps: 20
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
  advantage: dr_grpo
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
  stop_success: 0.95
eval:
  greedy: false
  samples: 2
  max_concurrency: 16
tracing:
  console: false
"""


@pytest.mark.slow
@pytest.mark.timeout(600)  # above its own 300 s assertion: a slow run fails with the time
@pytest.mark.manual  # most runs take 190-225 s on two idle cores; one of six took 384 s
def test_a_users_own_three_button_page_learns(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_buttons.py").write_text(_module_from_the_docs())
    (tmp_path / "its.yaml").write_text(CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    start = time.monotonic()
    status = main(["train", str(tmp_path / "its.yaml"), f"run.runs_dir={tmp_path}",
                   "run.name=buttons"])
    wall = time.monotonic() - start
    assert status == 0, capsys.readouterr().err[-3000:]
    run = tmp_path / "buttons"
    assert yaml.safe_load((run / "config.yaml").read_text())["pipeline"]["filters"] == [
        "all_equal_rewards"]  # the default
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    assert after["eval/sampled/episodes"] == 96  # 48 pages, sampled twice
    b, a = before["eval/sampled/success"], after["eval/sampled/success"]
    assert b < 0.9, f"the warm start is already near perfect ({b:.3f}): demos too clean"
    assert a >= 0.9 or a >= 2 * b, f"sampled: {b:.3f} -> {a:.3f}"
    assert wall <= 300, f"{wall:.0f} s (the goal: 5 minutes on two idle cores)"
