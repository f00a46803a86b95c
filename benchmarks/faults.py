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
    code, _, err = send(proc, sig)
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
            "note": f"stopped at {k}; {note}"}


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
                        help="two kills and SIGINT only; bad inputs in this process")
    opts = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="agentax-faults-") as tmp:
        root = Path(tmp)
        faults = [fault_kill_in_save(root, "rename"), fault_signal(root, signal.SIGINT)]
        if not opts.quick:
            faults += [fault_kill_in_save(root, "orbax"), fault_kill_mid_run(root),
                       fault_signal(root, signal.SIGTERM), fault_nan(root)]
        bad = try_bad_inputs(root, in_process=opts.quick)

    print("| fault injected | ended correctly | data lost | note |")
    print("|---|---|---|---|")
    for f in faults:
        print(f"| {f['kind']} | {'yes' if f['ok'] else 'NO'} | {f['data_lost']} | {f['note']} |")
    print()
    print("| bad input | one line, non-zero exit | exit | the line |")
    print("|---|---|---|---|")
    for b in bad:
        print(f"| {b['input']} | {'yes' if b['one_line'] else 'NO'} | {b['exit']} | "
              f"{b['line'].replace('|', '/')} |")
    figures = {
        "faults_injected": len(faults),
        "faults_survived": sum(f["ok"] for f in faults),
        "bad_inputs_tried": len(bad),
        "bad_inputs_one_line": sum(b["one_line"] for b in bad),
        "data_lost": sum(f["data_lost"] for f in faults),
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
