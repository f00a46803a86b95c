"""Tasks made from real packages: the mutation generator, and the shipped instances scored as
SWE-bench scores (gold resolves, empty does not, a patch that plants another bug fails)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from agentax.envs import RepoSnapshots, load_swe_instances, score_patch, score_patches
from agentax.envs._swe_mutate import find_mutations, make_instances, unified_diff
from agentax.recipes import swe_real
from agentax.tools import SandboxUnavailableError, check_sandbox_available

DATA = Path(__file__).resolve().parents[1] / "data" / "swebench"

SOURCE = '''\
def clip(x, lo, hi):
    """Docstring stays."""
    if x < lo:
        return lo
    total = x + 1
    return min(total - 1, hi) if True else None
'''


def _need_sandbox():
    try:
        check_sandbox_available()
    except SandboxUnavailableError as e:  # pragma: no cover - depends on the host
        pytest.skip(f"sandbox unavailable: {e}")


def _need_sdists():
    try:
        return swe_real.instances()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_find_mutations_covers_the_four_kinds_and_each_one_parses():
    muts = find_mutations("m.py", SOURCE)
    kinds = {m.kind for m in muts}
    assert kinds == {"swap_operator", "off_by_one", "remove_branch", "change_constant"}
    changed = {m.kind: [a for a, b in zip(SOURCE.splitlines(), m.mutated.splitlines()) if a != b]
               for m in muts if m.kind != "remove_branch"}
    assert any("x <= lo" in m.mutated for m in muts)
    assert any("x - 1" in m.mutated for m in muts) and any("x + 2" in m.mutated for m in muts)
    assert any("if False else" in m.mutated for m in muts)
    assert all(len(lines) == 1 for lines in changed.values())  # one line each: a one-hunk diff
    removed = [m for m in muts if m.kind == "remove_branch"]
    assert len(removed) == 1 and "if x < lo" not in removed[0].mutated and "return lo" not in removed[0].mutated
    for m in muts:
        ast.parse(m.mutated)
        assert '"""Docstring stays."""' in m.mutated and m.function == "clip"


def test_unified_diff_round_trips_through_patch(tmp_path):
    import subprocess
    new = SOURCE.replace("x < lo", "x <= lo")
    (tmp_path / "m.py").write_text(SOURCE)
    subprocess.run(["patch", "-p1", "-d", str(tmp_path)], input=unified_diff("m.py", SOURCE, new).encode(),
                   check=True, capture_output=True)
    assert (tmp_path / "m.py").read_text() == new


def test_make_instances_keeps_only_validated_mutations(tmp_path):
    """The generator on the hand-written repository snapshot (offline, a few candidates)."""
    _need_sandbox()
    snaps = RepoSnapshots(search_dirs=[DATA], cache_dir=tmp_path / "cache")
    insts = asyncio.run(make_instances(
        package="minicalc", snapshot="minicalc", snapshots=snaps, package_dirs=["minicalc"],
        test_cmd=swe_real._PYTEST, max_instances=2, max_candidates=8, seed=1, log=lambda s: None))
    assert 1 <= len(insts) <= 2
    for inst in insts:
        assert inst.FAIL_TO_PASS and not set(inst.FAIL_TO_PASS) & set(inst.PASS_TO_PASS)
        assert inst.snapshot_patch and inst.patch.startswith("diff --git a/minicalc/")
        base = snaps.path(inst)  # the sdist-like source with the bug planted
        assert (base / inst.extra["file"]).read_text() != (DATA / "minicalc" / inst.extra["file"]).read_text()
    gold, empty = asyncio.run(score_patches([(insts[0], insts[0].patch), (insts[0], "")], snapshots=snaps))
    assert gold.resolved and not empty.resolved


def test_shipped_instances_are_well_formed():
    insts = load_swe_instances(swe_real.INSTANCES_FILE)
    assert len(insts) >= 50 and swe_real.INSTANCES_FILE.stat().st_size < 1_000_000
    packages = {i.repo for i in insts}
    assert packages == {f"pypi/{p['package']}" for p in swe_real.PACKAGES}
    for inst in insts:
        assert inst.FAIL_TO_PASS and inst.PASS_TO_PASS and inst.snapshot_patch and not inst.test_patch
        assert inst.extra["mutation"] in {"swap_operator", "off_by_one", "remove_branch", "change_constant"}
    assert len({i.extra["mutation"] for i in insts}) >= 3


def _mutated_again(insts, snaps):
    """(instance, patch) pairs: a patch that fixes the instance's bug but plants another
    instance's bug in the same file, one that breaks a test this instance names."""
    out = []
    for a in insts:
        named = set(a.FAIL_TO_PASS) | set(a.PASS_TO_PASS)
        for b in insts:
            if b is not a and b.extra["file"] == a.extra["file"] and set(b.FAIL_TO_PASS) & named:
                f = a.extra["file"]
                out.append((a, unified_diff(f, (snaps.path(a) / f).read_text(), (snaps.path(b) / f).read_text())))
                break
    return out


def _check(insts, tmp_path):
    snaps = RepoSnapshots(search_dirs=[swe_real.sdist_cache_dir()], cache_dir=tmp_path / "cache")
    again = _mutated_again(insts, snaps)
    items = [(i, i.patch) for i in insts] + [(i, "") for i in insts] + again
    scores = asyncio.run(score_patches(items, snapshots=snaps, concurrency=2))
    n = len(insts)
    gold, empty, other = scores[:n], scores[n:2 * n], scores[2 * n:]
    assert [s.instance_id for s in gold if not s.resolved] == []
    assert [s.instance_id for s in empty if s.resolved] == []
    assert [s.instance_id for s in other if s.resolved] == []
    return len(other)


def test_a_handful_of_shipped_instances_score_as_generated(tmp_path):
    _need_sandbox()
    insts = _need_sdists()
    pick = []
    for p in swe_real.PACKAGES:
        pick += [i for i in insts if i.repo == f"pypi/{p['package']}"][:1]
    assert len(pick) == 3
    _check(pick, tmp_path)


# The evidence for "gold resolves, empty does not" on every shipped instance. It once failed in a
# loaded slow stage: the mutated-again patch that planted RRCache.__delitem__'s bug resolved,
# because RRCache evicts with random.choice and that bug fails its tests only in some runs. That
# instance is gone, and the generator now keeps a mutation only if 3 runs fail the same tests.
# It stays a manual check (`pytest -m manual tests/envs/test_swe_mutate.py`) for its length:
# 80 s alone, 295 s on a 2-core host at load average ~10-15 (~170 sandboxed test runs).
@pytest.mark.slow
@pytest.mark.manual
def test_every_shipped_instance_gold_resolves_empty_and_mutated_again_do_not(tmp_path):
    _need_sandbox()
    insts = _need_sdists()
    assert _check(insts, tmp_path) >= 10


def test_missing_sdist_names_the_command_that_fetches_it(tmp_path, monkeypatch):
    monkeypatch.setenv(swe_real.SDIST_CACHE_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="scripts/setup.sh"):
        swe_real.instances()
    inst = load_swe_instances(swe_real.INSTANCES_FILE)[0]
    with pytest.raises(FileNotFoundError, match="not found"):
        asyncio.run(score_patch(inst, inst.patch, snapshots=swe_real.snapshots()))
