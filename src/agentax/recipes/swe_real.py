"""The swe_real recipe's parts: SWE-bench-format tasks made from real packages' own test suites.

The instances (`INSTANCES_FILE`, written by scripts/make_swe_tasks.py) plant one bug in one
function of a small pure-Python package (`PACKAGES`: inflection, parse, cachetools) and are
scored as SWE-bench scores (`agentax.envs.score_patch`): the named FAIL_TO_PASS tests of the
package's own suite must pass again and the PASS_TO_PASS sample must still pass. Each
repository snapshot is the package's sdist, fetched once by scripts/setup.sh into the sdist
cache (`sdist_cache_dir()`); nothing is downloaded when the recipe runs.

The environment is `SWEBenchEnvironment` with the repository tools; the demonstrator applies
each instance's gold fix with `replace_in_file` (sometimes a near miss) and answers. At the
byte model's size this shows the loop end to end, not learning: the bugs need reading real
code, which a 0.3M-parameter model cannot do.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentax.envs import RepoSnapshots, SWEBenchEnvironment, SWEInstance, load_swe_instances, swebench_tasks
from agentax.recipes.swe_tiny import CompactSWEAgent
from agentax.records import Message, Task, ToolCall

__all__ = ["INSTANCES_FILE", "PACKAGES", "demos", "instances", "make_agent", "make_env", "sdist_cache_dir",
           "snapshots", "tasks"]

INSTANCES_FILE = Path(__file__).parent / "data" / "swe_real.jsonl"
"""The shipped instances."""

_PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest --no-header -rA --tb=no -p no:cacheprovider -o addopts="

PACKAGES: tuple[dict[str, Any], ...] = (
    {"package": "inflection", "requirement": "inflection==0.5.1", "snapshot": "inflection-0.5.1.tar.gz",
     "package_dirs": ["inflection"], "test_cmd": _PYTEST},
    {"package": "parse", "requirement": "parse==1.22.4", "snapshot": "parse-1.22.4.tar.gz",
     "package_dirs": ["parse"], "test_cmd": _PYTEST},
    {"package": "cachetools", "requirement": "cachetools==8.0.2", "snapshot": "cachetools-8.0.2.tar.gz",
     "package_dirs": ["src/cachetools"], "environment_setup": "export PYTHONPATH=$PWD/src", "test_cmd": _PYTEST},
)
"""The packages the instances come from: pinned sdists (scripts/setup.sh fetches them) whose own
tests run with pytest in about a second each."""

SDIST_CACHE_ENV = "AGENTAX_SDIST_CACHE"


def sdist_cache_dir() -> Path:
    """Where scripts/setup.sh puts the sdists: $AGENTAX_SDIST_CACHE, else ~/.cache/agentax/sdists."""
    env = os.environ.get(SDIST_CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentax" / "sdists"


def snapshots() -> RepoSnapshots:
    """Snapshots of the shipped instances: the sdists in the cache."""
    return RepoSnapshots(search_dirs=[sdist_cache_dir()])


def instances() -> list[SWEInstance]:
    """The shipped instances.

    Raises:
      FileNotFoundError: an sdist they need is not in the cache (says how to fetch it)."""
    insts = load_swe_instances(INSTANCES_FILE)
    cache = sdist_cache_dir()
    missing = sorted({i.snapshot for i in insts if not (cache / i.snapshot).is_file()})
    if missing:
        reqs = " ".join(p["requirement"] for p in PACKAGES if p["snapshot"] in missing)
        raise FileNotFoundError(
            f"the swe_real tasks need the sdists {missing} in {cache}; run scripts/setup.sh or "
            f"`pip download --no-deps --no-binary :all: -d {cache} {reqs}`")
    return insts


def make_env(**kwargs: Any) -> SWEBenchEnvironment:
    """`SWEBenchEnvironment` over the sdist cache (kwargs: max_steps, sandbox_config, ...)."""
    return SWEBenchEnvironment(snapshots=snapshots(), **kwargs)


def make_agent(*, list_tools: bool = False, system_prompt: str | None = "") -> CompactSWEAgent:
    """The built-in `SWEAgent` (optionally without the tool list in the prompt: bytes are tokens;
    `system_prompt` None keeps `SWEAgent`'s workflow prompt)."""
    return CompactSWEAgent(list_tools=list_tools, system_prompt=system_prompt)


def tasks(*, num_train: int, num_eval: int, seed: int, instructions: bool = False,
          packages: Sequence[str] | None = None) -> tuple[list[Task], list[Task]]:
    """The shipped instances as issue prompts; a seeded shuffle, the first `num_eval` held out.

    `instructions`: put `swebench_tasks`' instructions before the issue (a real checkpoint reads
    them; for the byte-level model every byte is a token). `packages`: only these packages'
    instances (names from `PACKAGES`; None: all)."""
    insts = instances()
    if packages is not None:
        known = {p["package"] for p in PACKAGES}
        unknown = sorted(set(packages) - known)
        if unknown:
            raise ValueError(f"unknown packages {unknown}; the instances come from {sorted(known)}")
        insts = [i for i in insts if i.repo.removeprefix("pypi/") in set(packages)]
    random.Random(seed).shuffle(insts)
    evals, train = insts[:num_eval], insts[num_eval:]
    if num_train:
        train = train[:num_train]
    kw = {} if instructions else {"instructions": ""}
    return swebench_tasks(train, **kw), swebench_tasks(evals, **kw)


def _fix(inst: SWEInstance) -> tuple[str, str, str]:
    """(path, old, new) of a one-hunk gold patch: its changed lines, anchored on the context
    line before them (so a pure insertion has text to replace)."""
    lines = inst.patch.splitlines()
    path = lines[0].split(" b/", 1)[1]
    body = lines[lines.index(next(x for x in lines if x.startswith("@@"))) + 1:]
    body = [x for x in body if not x.startswith("\\")]
    changed = [i for i, x in enumerate(body) if x[:1] in "+-"]
    start = max(changed[0] - 1, 0)
    span = body[start:changed[-1] + 1]
    old = [x[1:] for x in span if x[:1] in " -"]
    new = [x[1:] for x in span if x[:1] in " +"]
    return path, "\n".join(old), "\n".join(new)


def demos(train_tasks: Sequence[Task], n: int, seed: int, *, right_rate: float = 0.7) -> list[list[Message]]:
    """The gold fix as one `replace_in_file` (with probability `right_rate`), else a no-op edit."""
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        task = train_tasks[i % len(train_tasks)]
        path, old, new = _fix(SWEInstance.from_row(task.meta["swe_instance"]))
        right = rng.random() < right_rate
        call = ToolCall(name="replace_in_file", id=f"call_{i}",
                        arguments={"path": path, "old": old, "new": new if right else old})
        convs.append([
            Message(role="user", content=task.prompt),
            Message(role="assistant", content="", tool_calls=(call,)),
            Message(role="tool", content=f"Replaced 1 occurrence in {path}", name="replace_in_file",
                    tool_call_id=call.id),
            Message(role="assistant", content="Fixed."),
        ])
    return convs
