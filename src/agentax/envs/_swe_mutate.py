"""SWE-smith-style task generation from a real package's source and its own test suite, offline.

Given a package's source tree (an sdist) and the command that runs its tests, `make_instances`
runs the suite in the sandbox, then for candidate mutations of one function at a time
(operator swap, off-by-one, removed branch, changed constant; found with `ast`, applied to the
source text of one expression or statement so the diff stays one hunk) runs the suite again
and keeps a mutation only if some tests that passed now fail, the same tests in every one of
`repeats` runs (a bug whose effect is random makes an instance that scores at random). Each kept mutation becomes a
SWE-bench-format instance: the bug is the instance's `snapshot_patch` (applied to the sdist to
make its base state), FAIL_TO_PASS are the tests it breaks, PASS_TO_PASS a sample of the rest,
and the gold `patch` is the reverse diff. An instance is kept only after the same scoring as
any SWE-bench instance (`score_patch`) finds that the gold patch resolves it and the empty
patch does not.

After SWE-smith (Yang et al., 2025, "SWE-smith: Scaling Data for Software Engineering Agents"),
which also makes bugs by procedural AST modifications and keeps those that break tests; it runs
in per-repository Docker images and writes issue texts with a language model. Here the
sandbox replaces Docker, and the issue text is a template naming the failing tests and the
first failure message.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import difflib
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from agentax.envs._swebench import SCORING_SANDBOX, parse_pytest_log, score_patch, test_command
from agentax.envs._swebench_data import RepoSnapshots, SWEInstance
from agentax.tools import Sandbox, SandboxConfig

__all__ = ["Mutation", "find_mutations", "make_instances", "unified_diff"]

_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
    ast.IsNot: ast.Is, ast.And: ast.Or, ast.Or: ast.And, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mutation:
    """One bug planted in one function of one file."""

    path: str
    """File, relative to the repository root."""
    function: str
    """Qualified name of the function changed."""
    kind: str
    """"swap_operator", "off_by_one", "remove_branch" or "change_constant"."""
    line: int
    original: str
    """The file's text before."""
    mutated: str
    """The file's text with the bug."""


def unified_diff(path: str, old: str, new: str) -> str:
    """A git-style unified diff of one file (what `git apply` and `patch -p1` read)."""
    lines = list(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return f"diff --git a/{path} b/{path}\n" + "".join(out)


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")

    yield from visit(tree, "")


def _replace_span(lines: list[str], node: ast.AST, text: str) -> str | None:
    if node.lineno != node.end_lineno:  # one-line expressions only: a one-hunk diff
        return None
    i = node.lineno - 1
    line = lines[i]
    raw = line.encode()
    new = (raw[:node.col_offset].decode() + text + raw[node.end_col_offset:].decode())
    return "".join(lines[:i] + [new] + lines[i + 1:])


def _candidates(func: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> Iterator[tuple[str, int, str]]:
    """(kind, line, mutated source) for each mutation of `func`'s body."""
    body_nodes = [n for stmt in func.body for n in ast.walk(stmt)]
    for node in body_nodes:
        if isinstance(node, ast.BinOp) and any(isinstance(v, (ast.JoinedStr, ast.Constant)) and isinstance(
                getattr(v, "value", ""), str) for v in (node.left, node.right)):
            continue  # "a" + s -> "a" - s is a TypeError at once, not a bug worth a task
        if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in _SWAPS:
            copy = ast.parse(ast.unparse(node), mode="eval").body
            copy.op = _SWAPS[type(node.op)]()
            out = _replace_span(lines, node, ast.unparse(copy))
            if out:
                yield "swap_operator", node.lineno, out
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _SWAPS:
            copy = ast.parse(ast.unparse(node), mode="eval").body
            copy.ops = [_SWAPS[type(node.ops[0])]()]
            out = _replace_span(lines, node, ast.unparse(copy))
            if out:
                yield "swap_operator", node.lineno, out
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            out = _replace_span(lines, node, repr(not node.value))
            if out:
                yield "change_constant", node.lineno, out
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out = _replace_span(lines, node, repr(node.value + 1))
            if out:
                yield "off_by_one", node.lineno, out
        elif isinstance(node, ast.Constant) and type(node.value) is float:
            out = _replace_span(lines, node, repr(node.value * 2 if node.value else 1.0))
            if out:
                yield "change_constant", node.lineno, out
    for parent in [func, *[n for n in body_nodes if hasattr(n, "body")]]:
        for field in ("body", "orelse"):
            block = getattr(parent, field, None)
            if not isinstance(block, list) or len(block) < 2:
                continue
            for stmt in block:
                if isinstance(stmt, ast.If) and not stmt.orelse and lines[stmt.lineno - 1][:stmt.col_offset].isspace():
                    after = lines[stmt.end_lineno - 1].encode()[stmt.end_col_offset:].decode()
                    if after.strip():
                        continue
                    yield "remove_branch", stmt.lineno, "".join(lines[:stmt.lineno - 1] + lines[stmt.end_lineno:])


def find_mutations(path: str, source: str) -> list[Mutation]:
    """Every candidate mutation of the functions in one Python file (in source order); each
    mutated text parses. String constants (docstrings among them) are left alone."""
    tree = ast.parse(source)
    lines = source.splitlines(True)
    out: list[Mutation] = []
    seen: set[str] = set()
    for name, func in _functions(tree):
        for kind, line, mutated in _candidates(func, lines):
            if mutated == source or mutated in seen:
                continue
            try:
                ast.parse(mutated)
            except SyntaxError:
                continue
            seen.add(mutated)
            out.append(Mutation(path=path, function=name, kind=kind, line=line, original=source, mutated=mutated))
    return out


def _source_files(root: Path, package_dirs: Sequence[str]) -> list[str]:
    files = []
    for d in package_dirs:
        base = root / d
        paths = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for p in paths:
            rel = p.relative_to(root).as_posix()
            if "test" in Path(rel).name or "/tests/" in f"/{rel}" or "conftest" in rel:
                continue
            files.append(rel)
    return files


async def _run_suite(base: Path, template: SWEInstance, changed: tuple[str, str] | None,
                     config: SandboxConfig) -> tuple[dict[str, str], str]:
    loop = asyncio.get_running_loop()
    sandbox = await loop.run_in_executor(None, lambda: Sandbox(config, workdir=base))
    try:
        if changed is not None:
            sandbox.write_file(*changed)
        # -vv: the summary keeps each failure's whole message (for the issue text)
        verbose = dataclasses.replace(template, test_cmd=f"{template.test_cmd} -vv")
        r = await sandbox.run_bash(f"{{ {test_command(verbose)}\n}} > .agentax_gen.log 2>&1",
                                   timeout_s=template.timeout_s)
        log = sandbox.read_file(".agentax_gen.log", max_bytes=16 * 2**20)
        if r.timed_out:
            return {}, log
        return parse_pytest_log(log), log
    finally:
        sandbox.close()


def _problem_statement(package: str, failing: Sequence[str], log: str) -> str:
    first = next((line for line in log.splitlines() if line.startswith(f"FAILED {failing[0]}")), "")
    message = first.split(" - ", 1)[1].strip() if " - " in first else ""
    shown = ", ".join(f"`{t}`" for t in failing[:3]) + (f" and {len(failing) - 3} more" if len(failing) > 3 else "")
    text = f"A regression in {package}: {len(failing)} test(s) of its own suite now fail: {shown}."
    if message:
        text += f"\n\nThe first failure says: {message[:300]}"
    return text + "\n\nFind the bug in the library's code (not in the tests) and fix it."


async def make_instances(
    *,
    package: str,
    snapshot: str,
    snapshots: RepoSnapshots,
    package_dirs: Sequence[str],
    environment_setup: str = "",
    test_cmd: str,
    max_instances: int,
    max_candidates: int = 400,
    max_fail_to_pass: int = 25,
    pass_to_pass: int = 15,
    concurrency: int = 2,
    seed: int = 0,
    timeout_s: float = 120.0,
    repeats: int = 3,
    config: SandboxConfig = SCORING_SANDBOX,
    log: Callable[[str], None] = print,
) -> list[SWEInstance]:
    """Validated SWE-bench-format instances from mutations of one package's source.

    Args:
      package: the package's name (the instances' `repo` is "pypi/<package>").
      snapshot: the source archive's name, found through `snapshots.search_dirs`.
      snapshots: prepares the source tree.
      package_dirs: files or folders (relative to the tree) whose functions may be mutated.
      environment_setup / test_cmd: how the package's tests run (stored in each instance).
      max_instances: stop after this many kept instances.
      max_candidates: mutations tried at most (in a seeded random order).
      max_fail_to_pass: skip mutations that break more tests than this (keeps rows small).
      pass_to_pass: PASS_TO_PASS tests sampled per instance.
      concurrency: sandboxes at once.
      seed: the order in which candidates are tried and the PASS_TO_PASS sample.
      repeats: runs of the unmodified suite and of each mutated one. Only tests that pass in
        every unmodified run are used, and a mutation is kept only when every run fails the
        same tests: a bug whose effect is random (cachetools' RRCache evicts with
        `random.choice`, so a broken `__delitem__` fails `test_getsizeof_subclass` only in some
        runs) makes an instance whose empty patch sometimes resolves.
    """
    template = SWEInstance(instance_id=f"{package}__template", repo=f"pypi/{package}", problem_statement="",
                           patch="", FAIL_TO_PASS=("-",), snapshot=snapshot, environment_setup=environment_setup,
                           test_cmd=test_cmd, timeout_s=timeout_s)
    base = snapshots.path(template)
    repeats = max(1, repeats)
    baselines = [(await _run_suite(base, template, None, config))[0] for _ in range(repeats)]
    passing = sorted(t for t in baselines[0] if all(b.get(t) == "PASSED" for b in baselines))
    if not passing:
        raise RuntimeError(f"{package}: no test passes on the unmodified source; check test_cmd / environment_setup")
    log(f"{package}: {len(passing)} tests pass on the unmodified source")
    rng = random.Random(seed)
    by_kind: dict[str, list[Mutation]] = {}
    for f in _source_files(base, package_dirs):
        for m in find_mutations(f, (base / f).read_text()):
            by_kind.setdefault(m.kind, []).append(m)
    for group in by_kind.values():
        rng.shuffle(group)
    # Interleave the kinds (off-by-one candidates outnumber the others several times over).
    candidates = [g[i] for i in range(max(map(len, by_kind.values()), default=0)) for g in by_kind.values()
                  if i < len(g)][:max_candidates]
    kept: list[SWEInstance] = []
    gate = asyncio.Semaphore(concurrency)
    done = asyncio.Event()

    async def attempt(m: Mutation) -> SWEInstance | None:
        async with gate:
            if done.is_set():
                return None
            statuses, out = await _run_suite(base, template, (m.path, m.mutated), config)
            failing = [t for t in passing if statuses.get(t) not in ("PASSED", "XFAIL")]
            if not failing or len(failing) > max_fail_to_pass or not statuses:
                return None
            for _ in range(repeats - 1):
                again, _ = await _run_suite(base, template, (m.path, m.mutated), config)
                if not again or [t for t in passing if again.get(t) not in ("PASSED", "XFAIL")] != failing:
                    log(f"  dropped {package}__{m.function}__{m.kind}__L{m.line}: its failing tests vary between runs")
                    return None
            rest = [t for t in passing if t not in failing]
            p2p = sorted(random.Random(f"{seed}/{m.path}/{m.line}").sample(rest, min(pass_to_pass, len(rest))))
            inst = dataclasses.replace(
                template, instance_id=f"{package}__{m.function}__{m.kind}__L{m.line}",
                problem_statement=_problem_statement(package, failing, out),
                patch=unified_diff(m.path, m.mutated, m.original),
                snapshot_patch=unified_diff(m.path, m.original, m.mutated),
                FAIL_TO_PASS=tuple(failing), PASS_TO_PASS=tuple(p2p),
                extra={"mutation": m.kind, "function": m.function, "file": m.path})
            gold = await score_patch(inst, inst.patch, snapshots=snapshots, sandbox_config=config)
            empty = await score_patch(inst, "", snapshots=snapshots, sandbox_config=config)
            if not gold.resolved or empty.resolved:
                log(f"  dropped {inst.instance_id}: gold {gold.status}, empty {empty.status}")
                return None
            if len(kept) < max_instances:
                kept.append(inst)
                log(f"  kept {inst.instance_id} ({len(failing)} FAIL_TO_PASS) [{len(kept)}/{max_instances}]")
            if len(kept) >= max_instances:
                done.set()
            return inst

    await asyncio.gather(*(attempt(m) for m in candidates))
    ids: set[str] = set()
    unique = []
    for inst in kept:  # two mutations on one line: keep the first
        if inst.instance_id not in ids:
            ids.add(inst.instance_id)
            unique.append(inst)
    return unique
