"""`agentax train` with the Ray layout from a config file, on a local Ray cluster it starts:
engines in `RayEngineReplica` actors, environments in a `RayEnvPool`; and a replica killed
and an environment actor killed with `ray.kill` mid-run, after which the run still finishes
with every episode accounted."""

from __future__ import annotations

import json
import os

import pytest

ray = pytest.importorskip("ray")

from agentax.cli import main  # noqa: E402
from agentax.run import Hook, StepInfo, train  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# The embedded demo, shrunk (no SFT, 2 groups of 2 a step, no sampled evaluation), with the
# scale section: what a cluster recipe adds to its YAML.
CONFIG = """\
sft: {steps: 0}
tasks: {num_train: 64, num_eval: 2}
pipeline: {group_size: 2, groups_per_step: 2, max_concurrency: 4, filters: []}
engine: {max_slots: 4}
eval: {max_concurrency: 4, greedy: false, samples: 0}
tracing: {console: false, plots: false, doctor: false}
scale:
  ray: local
  engine_replicas: {replicas}
  cpus_per_replica: 0.25
  env_workers: 2
  env_cpus: 0.25
"""


def _config(tmp_path, replicas: int):
    path = tmp_path / "cluster.yaml"
    path.write_text(CONFIG.replace("{replicas}", str(replicas)))
    return path


def _balanced(summary: dict) -> dict:
    acc = summary["accounting"]
    assert acc["in_flight"] == 0, acc
    assert acc["started"] == acc["trained"] + sum(acc["filtered"].values()) \
        + sum(acc["failed"].values()), acc
    return acc


@pytest.fixture(autouse=True)
def _no_usage_stats(monkeypatch):
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")


def test_agentax_train_runs_the_ray_layout_from_a_config_file(tmp_path, capsys):
    status = main(["train", str(_config(tmp_path, 1)), "run.steps=2",
                   f"run.runs_dir={tmp_path}", "run.name=ray"])
    assert status == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["rl_steps"] == 2
    acc = _balanced(summary)
    assert acc["trained"] == 2 * 2 * 2
    scale = summary["scale"]
    # Every model call went to the replica actor, every episode's environment to the pool.
    assert scale["engines"]["replicas"] == 1 and scale["engines"]["routed"][0] > 0
    assert scale["engines"]["down"] == [] and scale["engines"]["committed_version"] == 2
    # (episodes the run cancelled at its end may never have reached an environment)
    assert scale["envs"]["episodes"] >= acc["trained"] and scale["envs"]["actor_deaths"] == 0
    assert "engine" not in summary  # no engine in the trainer's process
    assert not ray.is_initialized()  # the run started its Ray and shut it down


def test_a_replica_and_an_env_actor_killed_mid_run_leave_the_books_balanced(tmp_path, monkeypatch):
    import agentax.scale

    pools: list = []

    class SeenPool(agentax.scale.RayEnvPool):  # the run's pool, for its actors' handles
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pools.append(self)

    monkeypatch.setattr(agentax.scale, "RayEnvPool", SeenPool)
    killed: list[int] = []

    def kill_actors(info: StepInfo) -> None:
        if not killed:  # after step 1, with step 2's episodes in flight
            ray.kill(ray.get_actor("agentax-engine-1"), no_restart=True)
            env_actors = pools[0].actor_handles(leased_only=True) or pools[0].actor_handles()
            ray.kill(env_actors[0], no_restart=True)
            killed.append(info.step)

    result = train(_config(tmp_path, 2), tmp_path / "kill", quiet=True,
                   overrides=["run.steps=4"], hooks=[Hook(kill_actors)])
    assert killed == [1] and result.steps == 4
    acc = _balanced(dict(result.summary))
    assert acc["trained"] == 4 * 2 * 2  # every step trained its groups
    scale = result.summary["scale"]
    engines, envs = scale["engines"], scale["envs"]
    # The last version reached the live replica (its engine swaps it in at its next step).
    assert engines["down"] == [1] and engines["committed_version"] == 4
    assert engines["routed"][0] > 0 and engines["routed"][1] > 0
    # The killed environment actor was found dead (mid-episode: that episode is counted as
    # env_error; before one: the reset retried on a fresh actor) and replaced.
    assert envs["actor_deaths"] >= 1 and envs["actors_replaced"] >= 1, envs
    assert acc["failed"].get("env_error", 0) + envs["reset_retries"] >= 1, (acc, envs)
    assert not ray.is_initialized()
    assert os.path.isdir(tmp_path / "kill" / "checkpoints" / "step_4")
