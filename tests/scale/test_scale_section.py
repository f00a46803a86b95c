"""The `scale` section of the run config: its checks, and requests Ray cannot place failing at
start-up with one line naming the resource (before any model is built)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agentax.config import ConfigError
from agentax.run import RunConfig, ScaleConfig, as_config, train


def test_off_by_default_so_nothing_changes_for_existing_recipes():
    scale = RunConfig().scale
    assert scale == ScaleConfig() and not scale.enabled
    assert as_config("calculator").scale == ScaleConfig()


@pytest.mark.parametrize("overrides, message", [
    (["scale.engine_replicas=2"], "scale.engine_replicas=2 needs Ray, but scale.ray is empty"),
    (["scale.env_workers=8"], "scale.env_workers=8 needs Ray"),
    (["scale.ray=local"], "nothing runs in Ray: set scale.engine_replicas=N"),
    (["scale.ray=nowhere", "scale.env_workers=1"], "scale.ray='nowhere': give ''"),
    (["scale.ray=auto", "scale.engine_replicas=-1"], "scale.engine_replicas must be >= 0"),
    (["scale.ray=auto", "scale.engine_replicas=1", "scale.gpus_per_replica=-1"],
     "scale.gpus_per_replica must be >= 0"),
    (["scale.ray=auto", "scale.env_workers=1", "scale.env_resources={sandbox: 0}"],
     "scale.env_resources.sandbox=0"),
    (["scale.ray=auto", "scale.env_workers=1", "scale.env_resources={sandbox: lots}"],
     "scale.env_resources"),
    (["scale.ray=auto", "scale.env_workers=1", "scale.start_timeout_s=0"],
     "scale.start_timeout_s must be > 0"),
    (["scale.engine_replica=2"], "Did you mean 'engine_replicas'"),
])
def test_bad_values_say_what_to_change(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        as_config(None, overrides)


@pytest.mark.parametrize("address", ["local", "auto", "10.0.0.1:6379", "ray://head:10001"])
def test_addresses_are_accepted(address):
    cfg = as_config(None, [f"scale.ray={address}", "scale.engine_replicas=4",
                           "scale.gpus_per_replica=1", "scale.env_workers=64",
                           "scale.env_resources={sandbox: 1}"])
    assert cfg.scale.enabled and cfg.scale.env_resources == {"sandbox": 1.0}


def test_import_agentax_and_a_scale_config_do_not_import_ray():
    code = ("import sys, agentax, agentax.run; "
            "agentax.run.as_config(None, ['scale.ray=auto', 'scale.engine_replicas=2']); "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- on a local Ray


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


FAST = ["sft.steps=0", "run.steps=1", "tracing.console=false"]


@pytest.mark.ray
@pytest.mark.parametrize("overrides, message", [
    (["scale.engine_replicas=1", "scale.gpus_per_replica=1"],
     r"asks Ray for GPU=1 in all \(scale.engine_replicas x 1 = 1\), but the cluster has 0"),
    (["scale.env_workers=2", "scale.env_resources={sandbox: 1}"],
     r"asks Ray for sandbox=2 in all \(scale.env_workers x 2 = 2\), but the cluster has 0"),
    # Each one fits, all of them do not.
    (["scale.env_workers=8", "scale.env_cpus=0.5", "scale.engine_replicas=1"],
     r"CPU=5 in all \(scale.engine_replicas x 1 = 1, scale.env_workers x 8 = 4\), but the "
     "cluster has 2"),
])
def test_a_request_the_cluster_cannot_place_fails_at_start_naming_the_resource(
        ray_cluster, tmp_path, overrides, message):
    t = time.monotonic()
    with pytest.raises(ConfigError, match=message):
        train(None, tmp_path / "run", quiet=True,
              overrides=[*FAST, "scale.ray=auto", *overrides])
    assert time.monotonic() - t < 60
    # Nothing was placed, and the cluster the run joined (ours) is still connected.
    assert ray_cluster.is_initialized()
    assert ray_cluster.available_resources().get("CPU") == 2


def test_the_kuberay_example_runs_agentax_train_with_a_valid_scale_section():
    """examples/kuberay_rayjob.yaml needs nothing but the installed package: its entrypoint is
    `agentax train` on a shipped recipe, its config is valid, and its groups offer what the
    scale section asks for."""
    import shlex
    from pathlib import Path

    import yaml

    from agentax.recipes import RECIPES

    job = yaml.safe_load((Path(__file__).parents[2] / "examples" / "kuberay_rayjob.yaml")
                         .read_text())["spec"]
    argv = shlex.split(job["entrypoint"])
    assert argv[:2] == ["agentax", "train"] and argv[2] in RECIPES
    scale = as_config(argv[2], argv[3:]).scale
    assert scale.ray == "auto" and scale.engine_replicas == 4
    groups = {g["groupName"]: g for g in job["rayClusterSpec"]["workerGroupSpecs"]}
    gpus = int(groups["engines"]["template"]["spec"]["containers"][0]["resources"]["limits"]
               ["nvidia.com/gpu"]) * groups["engines"]["replicas"]
    assert scale.engine_replicas * scale.gpus_per_replica <= gpus
    sandboxes = groups["sandboxes"]
    offered = yaml.safe_load(yaml.safe_load(sandboxes["rayStartParams"]["resources"]))
    assert scale.env_workers * scale.env_resources["sandbox"] <= \
        offered["sandbox"] * sandboxes["replicas"]
    head = job["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]
    assert head["num-cpus"] == "0" and head["num-gpus"] == "0"  # the trainer's node


@pytest.mark.ray
def test_resources_other_work_holds_are_reported_not_refused(ray_cluster):
    """A request the cluster could place, but whose resources are busy now, starts (its actors
    wait); the run warns with what it asked for and what is free."""
    from agentax.run._scale import RayLayout

    @ray_cluster.remote(num_cpus=1.5)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()
    ray_cluster.get(holder.ready.remote(), timeout=60)
    deadline = time.monotonic() + 30
    while ray_cluster.available_resources().get("CPU", 0) > 0.5 and time.monotonic() < deadline:
        time.sleep(0.1)
    layout = RayLayout(as_config(None, ["scale.ray=auto", "scale.env_workers=2",
                                        "scale.env_cpus=0.5"]))
    try:
        assert layout.busy == {"CPU": (1.0, 0.5)} and layout.pool is not None
    finally:
        layout.shutdown()
        ray_cluster.kill(holder)
    assert ray_cluster.is_initialized()  # not this layout's connection to close
