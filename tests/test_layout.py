"""Guards on the repository layout that keep the test suite and the layers healthy.

The layers and the rule that imports run downward are described in docs/design.md.
"""

from __future__ import annotations

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "agentax"


def test_test_module_basenames_are_unique():
    # tests/ folders have no __init__.py: two modules with one basename break collection.
    names = collections.Counter(
        p.name for p in (ROOT / "tests").rglob("*.py") if p.name not in ("conftest.py", "__init__.py")
    )
    assert [n for n, c in names.items() if c > 1] == []


LAYER = {
    "_aio": 0, "_executors": 0,
    "trace": 1, "config": 1, "records": 1, "contracts": 1,
    "models": 2, "text": 2,
    "agents": 3, "envs": 3, "tools": 3, "rewards": 3,
    "engine": 4, "algos": 4,
    "rollout": 5, "train": 5, "serve": 5, "demos": 5,
    "pipeline": 6, "scale": 6,
    "recipes": 7,
    "run": 8,
    "cli": 9,
    "__init__": 10, "__main__": 10,
}


def test_every_package_and_module_has_a_layer():
    found = {p.name.removesuffix(".py") for p in SRC.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert sorted(found - set(LAYER)) == [], "give each new package a layer in LAYER (docs/design.md)"


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentax."):
            yield node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("agentax."):
                    yield alias.name.split(".")[1]


# Same-layer imports allowed by docs/design.md, as (importer, imported).
SAME_LAYER_ALLOWED = {
    ("agents", "envs"), ("agents", "tools"), ("agents", "rewards"), ("envs", "tools"),
    ("envs", "rewards"), ("rewards", "tools"), ("scale", "pipeline"), ("records", "config"),
    ("contracts", "records"),
}


def test_imports_only_point_downward():
    bad = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).parts
        own = rel[0].removesuffix(".py")
        if own not in LAYER:
            continue
        for target in _imports(path):
            if target in LAYER and target != own and LAYER[target] >= LAYER[own] \
                    and (own, target) not in SAME_LAYER_ALLOWED:
                bad.append(f"{'/'.join(rel)} imports agentax.{target}")
    assert bad == []
    trace_imports = [t for p in (SRC / "trace").rglob("*.py") for t in _imports(p) if t != "trace"]
    assert trace_imports == []


# A package reaches another only through its public names (its __init__'s __all__), so the
# private `_x.py` modules can change freely. The exceptions, each a pair built as one piece:
PRIVATE_IMPORTS_ALLOWED = {
    ("agents/_frozen_lake.py", "agentax.envs._gym"),  # the agent speaks its environment's format
    # The CLI's process-wide signal handlers and warning lines are the run's own (one
    # `Interrupted`, one `warning:` format whether a run stops in `train` or in a command).
    ("cli/_main.py", "agentax.run._signals"),
    ("cli/_main.py", "agentax.run._console"),
    ("cli/_serve.py", "agentax.run._signals"),
}


def test_packages_import_each_other_through_public_names():
    bad = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        own = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for module in modules:
                parts = module.split(".")
                if parts[0] != "agentax" or len(parts) < 3 or parts[1] == own:
                    continue
                if any(p.startswith("_") for p in parts[2:]) and \
                        (rel.as_posix(), module) not in PRIVATE_IMPORTS_ALLOWED:
                    bad.append(f"{rel.as_posix()} imports {module}")
    assert bad == [], "import the public name from the package instead (see docs/design.md)"


def test_nothing_cites_a_file_outside_the_repository():
    import re

    outside = re.compile("DESIGN" r"\.md|\.\./shared|CONVENTIONS" r"\.md")  # split: not a hit itself
    texts = [p for d in ("src", "tests", "docs", "examples", "benchmarks", "scripts", ".ci")
             for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".sh", "")]
    bad = [str(p.relative_to(ROOT)) for p in texts + [ROOT / "README.md"]
           if outside.search(p.read_text(errors="ignore"))]
    assert bad == [], "cite docs/design.md (or another file in the repository) instead"
    links = [(p, m) for p in (ROOT / "docs").glob("*.md")
             for m in re.findall(r"\]\(([\w./-]+\.md)\)", p.read_text())]
    broken = [f"{p.name} -> {m}" for p, m in links if not (p.parent / m).exists()]
    assert broken == []


MAX_TRACKED_BYTES = 1_000_000
BINARY_SUFFIXES = (".whl", ".tar.gz", ".zip", ".so", ".pyc", ".npz", ".npy", ".safetensors", ".bin", ".pt", ".msgpack")


def test_no_large_or_build_files_are_tracked():
    import subprocess

    try:
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True,
                                 timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as e:  # not a git checkout (an sdist)
        import pytest
        pytest.skip(f"not a git checkout: {e}")
    big = [f"{p} ({(ROOT / p).stat().st_size} bytes)" for p in tracked
           if p and (ROOT / p).is_file() and (ROOT / p).stat().st_size > MAX_TRACKED_BYTES]
    built = [p for p in tracked if p.endswith(BINARY_SUFFIXES)]
    assert big == [] and built == [], "keep wheels, builds, weights and files over 1 MB out of git"


MAX_SOURCE_LINES = 600


def test_no_source_file_is_past_600_lines():
    """A module past 600 lines is split (a mixin, a helper module), not grown."""
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in (ROOT / "src").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_SOURCE_LINES]
    assert long == [], "split these modules"


def test_lint_finds_no_errors():
    """ruff with the project's config (pyproject.toml [tool.ruff]): bugs such as undefined or
    unused names, not style."""
    import shutil
    import subprocess
    import sys

    import pytest

    ruff = shutil.which("ruff") or str(pathlib.Path(sys.executable).parent / "ruff")
    if not pathlib.Path(ruff).exists():
        pytest.skip("ruff is not installed (it is in the test extras)")
    r = subprocess.run([ruff, "check", "--no-cache", "src", "tests", "benchmarks", "examples", "scripts"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
