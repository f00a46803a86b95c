"""Fault injection on real `agentax` processes: kills, signals, NaNs, bad inputs.

Every fault is injected into a real `agentax train` child process (a miniature demo run on
the CPU: no SFT, no evaluation episodes), and the run directory is checked afterwards:

* kill -9 while Orbax writes the last checkpoint, once it is complete under its temporary
  name, and at an arbitrary moment mid-run; SIGINT and SIGTERM during RL. Each is followed by
  the documented resume (`agentax train RUN_DIR`). The run "ended correctly" when the resume
  continued from the newest complete checkpoint, finished, and metrics.jsonl holds every RL
  step exactly once; `data_lost` counts RL rows missing or duplicated and complete
  checkpoints that disappeared.
* NaN weights: the run must stop with one line, before any checkpoint.
* Runs that cannot make progress (an environment whose reset always raises, an engine
  thread that dies, model calls that all time out): `agentax train` must end within 60 s
  (start-up and compilation included) with a non-zero exit and one `run stopped` line.
* Sandbox attacks: five forked children each holding 100 MiB under a 256 MiB sandbox,
  12 x 4 MB files under a 16 MiB disk quota, and a nested user namespace mounting a tmpfs of
  its own to write 40 MB past that quota; contained when the host never sees more.
* User code that breaks inside episodes (tests/faults/faulty_user_code.py): a factory that
  raises, sync steps that hang for good, an environment that swallows cancellation, one that
  blocks the event loop, groups that are all filtered out. Each must stop the run with one
  `run stopped` line and exit 1 within 60 s of its start, leaving a checkpoint to resume from
  (the blocked loop cannot checkpoint: it must only exit).
* User code that hangs at start-up (tests/faults/faulty_user_code.py): the probe
  environment's close sleeping for good (async), blocking for good (sync) or ignoring
  cancellation, with the default limits. Each must stop the run with one line naming the call
  and exit 1 within 60 s of its start.
* A synchronous environment whose steps hang for good in 10 % of the calls (8 env threads):
  the run must train every RL step and exit 0, the hung episodes counted as timeouts, the
  episode books balanced; `data_lost` counts the RL steps missing.
* Signals at the edges: SIGTERM right after config.yaml is written (SFT warm start ahead),
  SIGINT twice in the first seconds of a resume (`python -m agentax`, imports included),
  SIGTERM while user code blocks the loop. Each must exit 128 + N with one line; the first
  is resumed and must end with the pre-RL evaluation and every RL step once.
* Disk full (a real 6 MiB tmpfs; skipped where the host cannot mount one): the save refused
  before writing, and Orbax failing mid-write. One line, exit 1, no temporary directory, and
  the run resumes once there is room.
* `agentax serve` under load (tests/faults/serve_signal.py: a long call, two calls queued
  behind it on its session, four sessions calling back to back, a new session right after
  the signal) gets SIGTERM (and, in the full run, SIGINT): it must exit 143 / 130, every call
  answered with a 200 or a 503 `server_shutting_down`; `data_lost` counts the calls lost.
* `max_exit_s`: the slowest of the stops above (from the process start for runs that stop on
  their own, from the signal for signals).
* A path race (tests/tools/sandbox_race.py): sandboxed code swaps a directory and a file of
  its workdir for links to host folders, /proc/self/root and another sandbox's workdir while
  the host reads, writes, edits, lists, removes, renames and copies out paths inside them
  (10 s per operation; 1 s with --quick); survived when no host file was created or changed
  and no host byte was read.
* Bad inputs (tests/faults/fault_helpers.py `bad_inputs`): each must be answered by exactly
  one `agentax CMD: error:` line with a non-zero exit and no traceback. The full run starts a
  process per input; --quick calls `agentax.cli.main` in this process.

The baseline is the same run without a fault: a fault "survives" when the run directory ends
up as a fault-free run would have left it (same RL steps, each once).

Usage: python benchmarks/faults.py [--quick]. The last line is the JSON of the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.faults.fault_helpers import (  # noqa: E402
    TINY,
    user_fault,
    bad_inputs,
    checkpoint_dirs,
    error_lines,
    rl_steps,
    run,
    send,
    start,
    wait_for_rl_step,
)


def _complete(run_dir: Path) -> set[str]:
    return {d for d in checkpoint_dirs(run_dir) if d.startswith("step_")}


def _check(run_dir: Path, steps: int, before: set[str]) -> tuple[bool, int, str]:
    """(ended correctly, data lost, note) once the resumed run has finished."""
    rows = rl_steps(run_dir)
    want = list(range(1, steps + 1))
    lost = sum(abs(rows.count(s) - 1) for s in want) + len(before - _complete(run_dir))
    ok = rows == want and lost == 0
    return ok, lost, f"rl rows {rows}"


def _args(root: Path, name: str, steps: int, every: int) -> list[str]:
    return ["train", *TINY, f"run.runs_dir={root}", f"run.name={name}", f"run.steps={steps}",
            f"run.checkpoint_every={every}"]


def fault_kill_in_save(root: Path, point: str) -> dict:
    """kill -9 during the last checkpoint's save, then resume."""
    run_dir = root / f"kill_{point}"
    killed = run(_args(root, run_dir.name, 2, 1), kill_at=f"{point}:2")
    before = _complete(run_dir)
    resumed = run(["train", str(run_dir)])
    ok, lost, note = _check(run_dir, 2, before)
    ok = ok and killed.returncode == -signal.SIGKILL and resumed.returncode == 0 \
        and "resumed from step 1" in resumed.stderr
    return {"kind": f"kill -9 during save ({point})", "ok": ok, "data_lost": lost, "note": note}


def fault_kill_mid_run(root: Path) -> dict:
    """kill -9 at an arbitrary moment (after RL step 2 is logged), then resume."""
    run_dir = root / "kill_mid"
    proc = start(_args(root, run_dir.name, 4, 2))
    reached = wait_for_rl_step(proc, run_dir, 3)
    code, _, _ = send(proc, signal.SIGKILL)
    before = _complete(run_dir)
    resumed = run(["train", str(run_dir)])
    ok, lost, note = _check(run_dir, 4, before)
    ok = ok and reached and code == -signal.SIGKILL and resumed.returncode == 0
    return {"kind": "kill -9 mid-run", "ok": ok, "data_lost": lost, "note": note}


def fault_signal(root: Path, sig: signal.Signals) -> dict:
    """SIGINT / SIGTERM during RL: exit 128+N with one line and a checkpoint; then resume."""
    run_dir = root / f"sig_{sig.name}"
    proc = start(_args(root, run_dir.name, 40, 0))
    reached = wait_for_rl_step(proc, run_dir, 1)
    t0 = time.perf_counter()
    code, _, err = send(proc, sig)
    exit_s = time.perf_counter() - t0
    stopped = rl_steps(run_dir)
    k = stopped[-1] if stopped else 0
    before = _complete(run_dir)
    saved = f"step_{k}" in before
    last = (error_lines(err) or [""])[-1]
    resumed = run(["train", str(run_dir), f"run.steps={k + 1}"])
    ok, lost, note = _check(run_dir, k + 1, before)
    ok = ok and reached and code == 128 + sig and saved and "Traceback" not in err \
        and last.startswith("agentax train: stopped at RL step") and resumed.returncode == 0
    return {"kind": f"{sig.name} during RL", "ok": ok, "data_lost": lost,
            "exit_s": round(exit_s, 1), "note": f"stopped at {k}; {note}"}


def fault_nan(root: Path) -> dict:
    """NaN weights: one line, non-zero exit, no RL row and no checkpoint."""
    import jax.numpy as jnp
    from flax import nnx

    from agentax.cli import RunConfig
    from agentax.models import Transformer, save_pretrained

    model = Transformer(RunConfig().model, rngs=nnx.Rngs(0))
    w = model.final_norm.weight
    w.value = jnp.full_like(w.value, jnp.nan)
    save_pretrained(model, root / "nan_model")
    run_dir = root / "nan"
    result = run([*_args(root, "nan", 3, 1), f"init.model_path={root / 'nan_model'}",
                  "init.tokenizer=byte"])
    last = (error_lines(result.stderr) or [""])[-1]
    ok = result.returncode not in (0, None) and "Traceback" not in result.stderr \
        and "on_nonfinite" in last and not _complete(run_dir) and rl_steps(run_dir) == []
    return {"kind": "NaN loss", "ok": ok, "data_lost": 0, "note": last[:80]}


def fault_stops(root: Path, kind: str, name: str, *, overrides=(), fault: str = "") -> dict:
    """A run that cannot make progress: one `run stopped` line, non-zero exit, within 60 s."""
    t0 = time.perf_counter()
    result = run([*_args(root, name, 40, 0), *overrides], fault=fault, timeout=600)
    wall = time.perf_counter() - t0
    lines = [x for x in error_lines(result.stderr) if x.startswith("agentax train: error")]
    ok = result.returncode not in (0, None) and "Traceback" not in result.stderr \
        and len(lines) == 1 and "run stopped" in lines[0] and wall <= 60
    return {"kind": kind, "ok": ok, "data_lost": 0, "exit_s": round(wall, 1),
            "note": f"exit {result.returncode} after {wall:.0f} s: "
                    f"{(lines or [result.stderr.strip()[-90:]])[-1][:90]}"}


def _one_stop_line(stderr: str) -> list[str]:
    return [x for x in error_lines(stderr) if x.startswith("agentax train:")]


def fault_user_code(root: Path, kind: str, env_name: str, *overrides: str,
                    resumable: bool = True) -> dict:
    """Faulty user code inside episodes: one line, exit 1, within 60 s, a checkpoint."""
    name = f"user_{env_name}"
    t0 = time.perf_counter()
    result = run([*_args(root, name, 40, 0), *user_fault(env_name), *overrides], timeout=600)
    wall = time.perf_counter() - t0
    lines = _one_stop_line(result.stderr)
    saved = _complete(root / name)
    ok = (result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr
          and "never retrieved" not in result.stderr and wall <= 60
          and (not resumable or "step_0" in saved))
    return {"kind": kind, "ok": ok, "data_lost": 0, "exit_s": round(wall, 1),
            "note": f"exit {result.returncode} after {wall:.0f} s, checkpoints {sorted(saved)}: "
                    f"{(lines or [result.stderr.strip()[-90:]])[-1][:90]}"}


def _phases(run_dir: Path) -> list[str]:
    path = run_dir / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line).get("phase"))
        except ValueError:
            continue
    return out


def fault_sigterm_after_config(root: Path) -> dict:
    """SIGTERM as soon as config.yaml exists (SFT ahead); the resume must lose nothing."""
    run_dir = root / "sig_config"
    args = ["train", *[a for a in TINY if not a.startswith("sft.")], "sft.steps=20",
            "run.steps=2", f"run.runs_dir={root}", "run.name=sig_config", "eval.samples=1"]
    proc = start(args)
    while not (run_dir / "config.yaml").exists() and proc.poll() is None:
        time.sleep(0.02)
    t0 = time.perf_counter()
    code, _, err = send(proc, signal.SIGTERM)
    exit_s = time.perf_counter() - t0
    resumed = run(["train", str(run_dir), "-q"])
    rows, phases = rl_steps(run_dir), _phases(run_dir)
    lost = sum(abs(rows.count(s) - 1) for s in (1, 2)) + abs(phases.count("eval_before") - 1)
    ok = (code == 143 and len(_one_stop_line(err)) == 1 and "Traceback" not in err
          and resumed.returncode == 0 and lost == 0)
    return {"kind": "SIGTERM right after config.yaml", "ok": ok, "data_lost": lost,
            "exit_s": round(exit_s, 1),
            "note": f"exit {code}; resumed: rl rows {rows}, eval_before x{phases.count('eval_before')}"}


def fault_sigint_in_resume(root: Path) -> dict:
    """SIGINT 0.3 s and 2 s into a resume (`python -m agentax`: imports, start-up)."""
    run_dir = root / "sig_resume"
    first = run(_args(root, run_dir.name, 2, 1))
    codes, lines_ok, worst = [], True, 0.0
    for delay in (0.3, 2.0):
        proc = start(["train", str(run_dir), "run.steps=40"], entry=True)
        time.sleep(delay)
        t0 = time.perf_counter()
        code, _, err = send(proc, signal.SIGINT)
        worst = max(worst, time.perf_counter() - t0)
        codes.append(code)
        lines_ok &= "Traceback" not in err and len(
            [x for x in error_lines(err) if "interrupted" in x]) == 1
    rows = rl_steps(run_dir)
    lost = sum(abs(rows.count(s) - 1) for s in (1, 2))
    ok = first.returncode == 0 and codes == [130, 130] and lines_ok and lost == 0
    return {"kind": "SIGINT in the first seconds of a resume", "ok": ok, "data_lost": lost,
            "exit_s": round(worst, 1), "note": f"exits {codes}; rl rows {rows[:4]}"}


def fault_sigterm_blocked(root: Path) -> dict:
    """SIGTERM while user code blocks the event loop for good."""
    run_dir = root / "sig_blocked"
    proc = start([*_args(root, run_dir.name, 40, 0), *user_fault("blocks_the_loop"),
                  "pipeline.loop_block_limit_s=600"])
    while not (run_dir / "trace.perfetto-trace").exists() and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(3.0)
    t0 = time.perf_counter()
    code, _, err = send(proc, signal.SIGTERM)
    exit_s = time.perf_counter() - t0
    ok = code == 143 and len(_one_stop_line(err)) == 1 and "Traceback" not in err
    return {"kind": "SIGTERM while user code blocks the loop", "ok": ok, "data_lost": 0,
            "exit_s": round(exit_s, 1), "note": f"exit {code} {exit_s:.1f} s after the signal"}


def fault_disk_full(root: Path, mid_save: bool) -> dict | None:
    """A 6 MiB tmpfs: room for one checkpoint; the run must stop with one line and resume
    once there is room. None where no tmpfs can be mounted."""
    import subprocess

    mnt = root / ("disk_mid" if mid_save else "disk")
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        return None
    try:
        run_dir = mnt / "d"
        t0 = time.perf_counter()
        result = run(_args(mnt, "d", 8, 1), fault="no_space_check" if mid_save else "")
        wall = time.perf_counter() - t0
        lines = _one_stop_line(result.stderr)
        saved = checkpoint_dirs(run_dir)
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        resumed = run(["train", str(run_dir), "-q"])
        rows = rl_steps(run_dir)
        lost = sum(abs(rows.count(s) - 1) for s in range(1, 9))
        ok = (result.returncode == 1 and len(lines) == 1 and "no space" in lines[0]
              and "Traceback" not in result.stderr and all(d.startswith("step_") for d in saved)
              and resumed.returncode == 0 and lost == 0 and wall <= 60)
        return {"kind": "disk full " + ("mid-write" if mid_save else "(checked before)"),
                "ok": ok, "data_lost": lost, "exit_s": round(wall, 1),
                "note": f"exit {result.returncode} after {wall:.0f} s, {len(lines)} line(s), "
                        f"left {saved}; resumed to {rows[-1] if rows else 0}"
                        + ("" if ok else f"; stderr: {result.stderr.strip()[-300:]}")}
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def startup_hang_faults(root: Path) -> list[dict]:
    """A close that hangs at start-up (the probe environment's): one line, exit 1, <= 60 s."""
    out = []
    for kind, env_name in (("start-up close hang: async sleep", "close_sleeps"),
                           ("start-up close hang: sync block", "close_blocks"),
                           ("start-up close hang: ignores cancellation",
                            "close_ignores_cancel")):
        t0 = time.perf_counter()
        result = run([*_args(root, f"startup_{env_name}", 40, 0), *user_fault(env_name)],
                     timeout=600)
        wall = time.perf_counter() - t0
        lines = _one_stop_line(result.stderr)
        ok = (result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr
              and "env.close()" in lines[0] and env_name in lines[0] and wall <= 60)
        out.append({"kind": kind, "ok": ok, "data_lost": 0, "exit_s": round(wall, 1),
                    "note": f"exit {result.returncode} after {wall:.0f} s: "
                            f"{(lines or [result.stderr.strip()[-90:]])[-1][:90]}"})
    return out


def fault_sometimes_hanging_sync_env(root: Path, steps: int = 20) -> dict:
    """10 % of a sync environment's steps hang for good: every RL step trains all the same."""
    name = "sync_hangs_10pct"
    t0 = time.perf_counter()
    result = run([*_args(root, name, steps, 0), *user_fault("sync_sometimes_hangs"),
                  "env.kwargs={hang_rate: 0.1}", "pipeline.env_threads=8"], timeout=900)
    wall = time.perf_counter() - t0
    rows = rl_steps(root / name)
    lost = sum(abs(rows.count(s) - 1) for s in range(1, steps + 1))
    summary = root / name / "summary.json"
    books = json.loads(summary.read_text())["accounting"] if summary.exists() else {}
    hung = books.get("failed", {}).get("timeout", 0)
    balanced = bool(books) and books["started"] == (
        books["trained"] + sum(books["filtered"].values()) + sum(books["failed"].values())
        + books["in_flight"])
    ok = result.returncode == 0 and lost == 0 and balanced and "Traceback" not in result.stderr
    return {"kind": "10 %-hanging sync env trains all its steps", "ok": ok, "data_lost": lost,
            "note": f"exit {result.returncode} after {wall:.0f} s: rl steps {len(rows)}/{steps}, "
                    f"{hung} hung episodes counted as timeout of {books.get('started', 0)} "
                    f"started; books {'balance' if balanced else 'DO NOT balance'}"}


_FORK_AND_HOLD = """
import os, time
kids = []
for i in range(5):
    pid = os.fork()
    if pid == 0:
        block = bytearray(100 * 2**20)
        for j in range(0, len(block), 4096):
            block[j] = 1
        time.sleep(1.0)
        os._exit(0)
    kids.append(pid)
print("CODES", [os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids])
"""


def serve_signal_faults(root: Path, *, quick: bool) -> list[dict]:
    """`agentax serve` under load gets SIGTERM (and SIGINT in the full run): drains, exits 128 + N."""
    from tests.faults.serve_signal import save_tiny_model, serve_under_signal, survived

    model = save_tiny_model(root / "serve-tiny")
    out = []
    for sig in (signal.SIGTERM,) if quick else (signal.SIGTERM, signal.SIGINT):
        r = serve_under_signal(model, sig)
        out.append({"kind": f"serve: {sig.name} under load", "ok": survived(r, sig),
                    "data_lost": len(r["lost"]), "exit_s": r["exit_s"],
                    "note": f"exit {r['exit']} {r['exit_s']} s after the signal; long call "
                            f"{r['long']}, queued {r['queued']}, new {r['new']}, workers "
                            f"{r['workers']}" + (f"; lost {r['lost'][:2]}" if r["lost"] else "")})
    return out


def sandbox_attacks() -> list[dict]:
    """Model-written code that tries to take the host's memory or disk, in a real sandbox."""
    import asyncio
    import os

    from agentax.tools import Sandbox, SandboxConfig, SandboxUnavailableError
    from agentax.tools import check_sandbox_available

    fast = dict(timeout_s=20.0, cpu_time_s=10, max_output_bytes=4000)
    try:
        check_sandbox_available()
    except SandboxUnavailableError as e:
        return [{"attack": "sandbox", "contained": False, "note": f"no sandbox here: {e}"}]
    out = []
    with Sandbox(SandboxConfig(memory_mb=256, **fast)) as sb:
        if not sb.quotas.get("group"):
            out.append({"attack": "5 forked children x 100 MiB (limit 256 MiB)",
                        "contained": False, "note": "no cgroup on this host: per-process limits"})
        else:
            r = asyncio.run(sb.run_python(_FORK_AND_HOLD))
            line = [x for x in r.stdout.splitlines() if x.startswith("CODES")]
            codes = json.loads(line[0][len("CODES"):]) if line else []
            held = codes.count(0) * 100
            out.append({"attack": "5 forked children x 100 MiB (limit 256 MiB)",
                        "contained": bool(codes) and held < 256,
                        "note": f"{held} MiB held at once; exit codes {codes}"})
    with Sandbox(SandboxConfig(max_disk_mb=16, max_file_mb=4, **fast)) as sb:
        if not sb.quotas.get("disk"):
            out.append({"attack": "12 files x 4 MB (quota 16 MiB)", "contained": False,
                        "note": "no tmpfs quota on this host"})
        else:
            asyncio.run(sb.run_bash(
                "for i in $(seq 1 6); do head -c 4000000 /dev/zero > /workspace/w$i; "
                "head -c 4000000 /dev/zero > /tmp/t$i; done 2>/dev/null; echo END"))
            host = sum(os.path.getsize(os.path.join(d, f)) for d in (sb._work, sb._tmp)
                       for f in os.listdir(d))
            out.append({"attack": "12 files x 4 MB (quota 16 MiB)",
                        "contained": host <= 16 * 2**20,
                        "note": f"{host / 2**20:.1f} MiB reached the host"})
            r = asyncio.run(sb.run_bash(
                "unshare -Urm sh -c 'mount -t tmpfs none /tmp && head -c 40000000 /dev/zero "
                "> /tmp/x && echo WROTE'; echo rc=$?"))
            out.append({"attack": "nested user namespace + its own tmpfs (quota 16 MiB)",
                        "contained": "WROTE" not in r.stdout,
                        "note": (r.stdout + r.stderr).strip().replace("\n", " ")[-90:]})
    return out


def fault_sandbox_race(seconds: float) -> dict:
    """Sandboxed code swapping directories and files for links while the host works on them."""
    sys.path.insert(0, str(ROOT / "tests" / "tools"))
    from sandbox_race import OPERATIONS, race

    from agentax.tools import SandboxUnavailableError, check_sandbox_available

    kind = f"sandbox path race ({len(OPERATIONS)} host operations x {seconds:g} s)"
    try:
        check_sandbox_available()
    except SandboxUnavailableError as e:
        return {"kind": kind, "ok": False, "data_lost": 0, "note": f"no sandbox here: {e}"}
    rows = [race(op, seconds) for op in OPERATIONS]
    effects = sum(r["host_files_created"] + r["host_files_changed"] + r["host_bytes_read"] for r in rows)
    ok = effects == 0 and all(r["other_errors"] == 0 and r["swaps"] > 0 for r in rows)
    note = (f"{sum(r['swaps'] for r in rows)} swaps, {sum(r['calls'] for r in rows)} host calls "
            f"({sum(r['refused'] for r in rows)} refused); host files created/changed "
            f"{sum(r['host_files_created'] + r['host_files_changed'] for r in rows)}, "
            f"host bytes read {sum(r['host_bytes_read'] for r in rows)}")
    return {"kind": kind, "ok": ok, "data_lost": 0, "note": note}


def try_bad_inputs(root: Path, *, in_process: bool) -> list[dict]:
    from agentax.cli import main

    out = []
    for name, args, needle in bad_inputs(root / "bad"):
        if in_process:
            err_buf = io.StringIO()
            with contextlib.redirect_stderr(err_buf), contextlib.redirect_stdout(io.StringIO()):
                status = main(args)
            err = err_buf.getvalue()
        else:
            result = run(args, timeout=300)
            status, err = result.returncode, result.stderr
        lines = [line for line in error_lines(err) if line.startswith("agentax ")]
        one_line = (status not in (0, None) and len(lines) == 1 and needle in lines[0]
                    and "Traceback" not in err)
        out.append({"input": name, "one_line": one_line, "exit": status,
                    "line": lines[-1][:110] if lines else err.strip()[-110:]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="two kills, SIGINT and serve's SIGTERM only; bad inputs in this "
                        "process")
    opts = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="agentax-faults-") as tmp:
        root = Path(tmp)
        faults = [fault_kill_in_save(root, "rename"), fault_signal(root, signal.SIGINT)]
        if not opts.quick:
            faults += [fault_kill_in_save(root, "orbax"), fault_kill_mid_run(root),
                       fault_signal(root, signal.SIGTERM), fault_nan(root),
                       fault_stops(root, "always-failing environment", "env",
                                   fault="env_raises"),
                       fault_stops(root, "engine thread dies", "engine", fault="engine_dies"),
                       fault_stops(root, "every model call times out", "timeout",
                                   overrides=["collector.model_timeout_s=0.001"]),
                       fault_user_code(root, "env factory raises in every episode",
                                       "factory_raises"),
                       fault_user_code(root, "sync env steps hang for good",
                                       "sync_step_hangs"),
                       fault_user_code(root, "env swallows CancelledError", "swallows_cancel"),
                       fault_user_code(root, "time.sleep for good in an async env",
                                       "blocks_the_loop", resumable=False),
                       fault_user_code(root, "every group filtered out (equal rewards)",
                                       "constant_reward", "pipeline.filters=[all_equal_rewards]",
                                       "pipeline.max_dropped_episodes=256"),
                       fault_sigterm_after_config(root), fault_sigint_in_resume(root),
                       fault_sigterm_blocked(root)]
            faults += startup_hang_faults(root)
            faults.append(fault_sometimes_hanging_sync_env(root))
            for mid in (False, True):
                disk = fault_disk_full(root, mid)
                if disk is not None:
                    faults.append(disk)
                else:
                    print("disk-full cases skipped: no tmpfs can be mounted here")
        faults += serve_signal_faults(root, quick=opts.quick)
        bad = try_bad_inputs(root, in_process=opts.quick)
    attacks = sandbox_attacks()
    faults.append(fault_sandbox_race(1.0 if opts.quick else 10.0))

    print("| fault injected | ended correctly | data lost | note |")
    print("|---|---|---|---|")
    for f in faults:
        print(f"| {f['kind']} | {'yes' if f['ok'] else 'NO'} | {f['data_lost']} | {f['note']} |")
    print()
    print("| sandbox attack | contained | note |")
    print("|---|---|---|")
    for a in attacks:
        print(f"| {a['attack']} | {'yes' if a['contained'] else 'NO'} | {a['note']} |")
    print()
    print("| bad input | one line, non-zero exit | exit | the line |")
    print("|---|---|---|---|")
    for b in bad:
        print(f"| {b['input']} | {'yes' if b['one_line'] else 'NO'} | {b['exit']} | "
              f"{b['line'].replace('|', '/')} |")
    figures = {
        "faults_injected": len(faults),
        "faults_survived": sum(f["ok"] for f in faults),
        "sandbox_attacks": len(attacks),
        "sandbox_attacks_contained": sum(bool(a["contained"]) for a in attacks),
        "bad_inputs_tried": len(bad),
        "bad_inputs_one_line": sum(b["one_line"] for b in bad),
        "data_lost": sum(f["data_lost"] for f in faults),
        "max_exit_s": max((f["exit_s"] for f in faults if "exit_s" in f), default=None),
        "wall_s": round(time.perf_counter() - t0, 1),
        "quick": opts.quick,
    }
    if not opts.quick:
        results = ROOT / "benchmarks" / "results"
        results.mkdir(parents=True, exist_ok=True)
        (results / "faults.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
