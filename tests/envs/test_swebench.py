"""SWE-bench-format instances: loading, snapshots (directory, git mirror, archive), scoring in the
real sandbox as SWE-bench does, and `SWEBenchEnvironment` with the built-in `SWEAgent`."""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from agentax.agents import SWEAgent
from agentax.envs import (RepoSnapshots, SWEBenchEnvironment, SWEInstance, load_swe_instances, parse_pytest_log,
                          score_patch, score_patches, swebench_tasks)
from agentax.records import TrajectoryStatus
from agentax.tools import Sandbox, SandboxUnavailableError, check_sandbox_available

DATA = Path(__file__).resolve().parents[1] / "data" / "swebench"
INSTANCES = DATA / "instances.jsonl"


def _need_sandbox():
    try:
        check_sandbox_available()
    except SandboxUnavailableError as e:  # pragma: no cover - depends on the host
        pytest.skip(f"sandbox unavailable: {e}")


@pytest.fixture
def snapshots(tmp_path):
    return RepoSnapshots(cache_dir=tmp_path / "cache")


def test_loader_reads_swebench_rows_with_encoded_and_plain_lists():
    insts = load_swe_instances(INSTANCES)
    assert [i.instance_id for i in insts] == ["minicalc__median-even", "minicalc__clamp-upper",
                                              "minicalc__overlap-touching"]
    median = insts[0]
    assert median.FAIL_TO_PASS == ("tests/test_stats.py::test_median_even",)  # was a JSON string
    assert len(insts[1].FAIL_TO_PASS) == 2 and insts[1].FAIL_TO_PASS[0].endswith("[10-10]")
    assert median.extra == {"version": "0.1", "created_at": "2024-01-01T00:00:00Z", "hints_text": ""}
    assert Path(median.snapshot) == DATA / "minicalc"  # relative to the JSONL's folder
    assert SWEInstance.from_row(json.loads(json.dumps(median.to_row()))) == median


@pytest.mark.parametrize("row, message", [
    ({"instance_id": "x", "repo": "r", "problem_statement": "p", "patch": ""}, r"missing field\(s\) \['FAIL_TO_PASS'"),
    ({"FAIL_TO_PASS": "not json"}, "JSON-encoded list"),
    ({"FAIL_TO_PASS": [1, 2]}, "list of test ids"),
    ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS is empty"),
    ({"patch": 3}, "'patch' must be a string"),
    ({"timeout_s": -1}, "positive number"),
])
def test_loader_names_the_line_and_field_of_a_bad_row(tmp_path, row, message):
    good = json.loads(INSTANCES.read_text().splitlines()[0])
    bad = row if "instance_id" in row else {**good, **row}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=message) as info:
        load_swe_instances(path)
    assert f"{path}:3" in str(info.value)


def test_loader_rejects_broken_json_and_repeated_ids(tmp_path):
    line = INSTANCES.read_text().splitlines()[0]
    (tmp_path / "a.jsonl").write_text(line + "\n{oops\n")
    with pytest.raises(ValueError, match="a.jsonl:2: not valid JSON"):
        load_swe_instances(tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text(line + "\n" + line + "\n")
    with pytest.raises(ValueError, match="repeats line 1"):
        load_swe_instances(tmp_path / "b.jsonl")


def test_parse_pytest_log_reads_the_rA_summary():
    log = ("=== short test summary info ===\nPASSED t.py::a\nPASSED t.py::b[1 - 2]\n"
           "FAILED t.py::c - AssertionError: x - y\nERROR t.py::b[1 - 2] - teardown\nXFAIL t.py::d - why\n"
           "SKIPPED [1] t.py:3: no\n")
    assert parse_pytest_log(log) == {"t.py::a": "PASSED", "t.py::b[1 - 2]": "ERROR", "t.py::c": "FAILED",
                                     "t.py::d": "XFAIL"}


def test_gold_resolves_and_empty_does_not_on_the_hand_written_instances(snapshots):
    _need_sandbox()
    insts = load_swe_instances(INSTANCES)
    items = [(i, i.patch) for i in insts] + [(i, "") for i in insts]
    scores = asyncio.run(score_patches(items, snapshots=snapshots, concurrency=3))
    gold, empty = scores[:3], scores[3:]
    assert [s.status for s in gold] == ["resolved"] * 3, [s.log_tail for s in gold]
    assert [s.status for s in empty] == ["unresolved"] * 3
    for inst, s in zip(insts, empty):
        assert not any(s.fail_to_pass.values()) and all(s.pass_to_pass.values()), inst.instance_id


def test_a_patch_that_breaks_a_passing_test_misses_or_does_not_apply_is_not_resolved(snapshots):
    _need_sandbox()
    inst = load_swe_instances(INSTANCES)[0]  # median
    src = (DATA / "minicalc" / "minicalc" / "stats.py").read_text()
    fixed_but_breaks_mean = src.replace("    return ordered[mid]\n", "    if len(ordered) % 2 == 0:\n"
                                        "        return (ordered[mid - 1] + ordered[mid]) / 2\n    return ordered[mid]\n"
                                        ).replace("sum(values) / len(values)", "sum(values) / (len(values) + 1)")
    diff = "".join(difflib.unified_diff(src.splitlines(True), fixed_but_breaks_mean.splitlines(True),
                                        "a/minicalc/stats.py", "b/minicalc/stats.py"))
    s = asyncio.run(score_patch(inst, diff, snapshots=snapshots))
    assert s.status == "unresolved" and all(s.fail_to_pass.values())
    assert s.pass_to_pass["tests/test_stats.py::test_mean"] is False
    wrong = inst.patch.replace("(ordered[mid - 1] + ordered[mid]) / 2", "ordered[mid - 1]")
    s = asyncio.run(score_patch(inst, wrong, snapshots=snapshots))
    assert s.status == "unresolved" and s.fail_to_pass == {"tests/test_stats.py::test_median_even": False}
    s = asyncio.run(score_patch(inst, "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n"
                                      "@@ -1 +1 @@\n-x\n+y\n", snapshots=snapshots))
    assert s.status == "patch_failed" and not s.resolved


def test_edited_tests_are_reset_before_the_test_patch(snapshots):
    """An agent that rewrites the test file cannot make the hidden test pass."""
    _need_sandbox()
    inst = load_swe_instances(INSTANCES)[0]
    base = snapshots.path(inst)

    async def go():
        from agentax.envs import evaluate_in_sandbox
        with Sandbox(workdir=base) as sb:
            sb.write_file("tests/test_stats.py", "def test_median_even():\n    pass\n")
            return await evaluate_in_sandbox(sb, inst, base)

    s = asyncio.run(go())
    assert not s.resolved and s.fail_to_pass == {"tests/test_stats.py::test_median_even": False}
    assert (base / "tests/test_stats.py").read_text().startswith("import pytest")  # snapshot untouched


def test_git_mirror_and_archive_sources(tmp_path, snapshots):
    _need_sandbox()
    inst = load_swe_instances(INSTANCES)[2]
    mirror = tmp_path / "mirror"
    shutil.copytree(DATA / "minicalc", mirror)
    git = ["git", "-C", str(mirror), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(mirror)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "base"], check=True)
    commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (mirror / "minicalc" / "ranges.py").write_text("broken = True\n")  # later work, not the base
    subprocess.run(git + ["commit", "-qam", "later"], check=True)
    from_git = dataclasses.replace(inst, snapshot="", base_commit=commit)
    snaps = RepoSnapshots({"example/minicalc": mirror}, cache_dir=tmp_path / "cache")
    assert "return a[0] < b[1]" in (snaps.path(from_git) / "minicalc" / "ranges.py").read_text()
    assert asyncio.run(score_patch(from_git, from_git.patch, snapshots=snaps)).resolved
    with pytest.raises(ValueError, match="has no commit"):
        snaps.path(dataclasses.replace(from_git, base_commit="0" * 40))
    with pytest.raises(FileNotFoundError, match="no snapshot of repo"):
        RepoSnapshots().path(from_git)

    # An sdist-like archive with one top folder, and a snapshot_patch that plants the bug.
    with tarfile.open(tmp_path / "minicalc-0.1.tar.gz", "w:gz") as t:
        t.add(DATA / "minicalc", arcname="minicalc-0.1")
    fixed = dataclasses.replace(inst, snapshot="minicalc-0.1.tar.gz")
    snaps = RepoSnapshots(search_dirs=[tmp_path], cache_dir=tmp_path / "cache2")
    first = snaps.path(fixed)
    assert (first / "minicalc" / "stats.py").is_file() and snaps.path(fixed) == first  # cached
    with pytest.raises(FileNotFoundError, match="scripts/setup.sh"):
        RepoSnapshots().path(fixed)


def test_per_instance_timeout(snapshots):
    _need_sandbox()
    inst = dataclasses.replace(load_swe_instances(INSTANCES)[0], environment_setup="sleep 30", timeout_s=2.0)
    s = asyncio.run(score_patch(inst, inst.patch, snapshots=snapshots))
    assert s.status == "timeout" and not s.resolved and s.elapsed_s < 25


def call(name, **args):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


def test_swe_agent_resolves_an_instance_in_the_environment(episode, snapshots):
    _need_sandbox()
    inst = load_swe_instances(INSTANCES)[2]  # overlap-touching
    (task,) = swebench_tasks([inst])
    env = SWEBenchEnvironment(snapshots=snapshots)
    agent = SWEAgent()
    replies = [call("search", pattern="def overlaps"),
               call("replace_in_file", path="minicalc/ranges.py", old="a[0] < b[1] and b[0] < a[1]",
                    new="a[0] <= b[1] and b[0] <= a[1]"),
               call("run_tests"), "Touching ranges overlap now."]
    traj, last, _ = episode(env, agent, replies, task)
    assert traj.status is TrajectoryStatus.OK and traj.reward == 1.0
    assert last.info["resolved"] and last.info["fail_to_pass_passed"] == 1
    tool_out = [m.content for m in agent.messages if m.role == "tool"]
    assert "minicalc/ranges.py" in tool_out[0] and "passed" in tool_out[2]

    unfixed = episode(SWEBenchEnvironment(snapshots=snapshots), SWEAgent(), ["Done."], task)
    assert unfixed.traj.reward == 0.0 and unfixed.last.info["swe_status"] == "unresolved"
