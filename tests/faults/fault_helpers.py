"""Real `agentax` processes for fault injection: start, kill at a chosen point, inspect.

Used by tests/faults and benchmarks/faults.py. A run is a miniature of the demo (no SFT, no
evaluation episodes) so that its cost is the compile of the engine and train kernels.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import agentax

SRC = Path(agentax.__file__).resolve().parents[1]
ROOT = Path(__file__).resolve().parents[2]
USER_CODE = ("agent.factory=tests.faults.faulty_user_code:agent",
             "tasks.factory=tests.faults.faulty_user_code:tasks")
"""With `env.factory=tests.faults.faulty_user_code:<fault>`: the whole run is that code's."""


def user_fault(name: str) -> tuple[str, ...]:
    """Overrides that run the faulty environment `name` of tests/faults/faulty_user_code.py."""
    return (f"env.factory=tests.faults.faulty_user_code:{name}", *USER_CODE)

TINY = (
    "sft.steps=0", "tasks.num_train=64", "tasks.num_eval=2",
    "pipeline.group_size=2", "pipeline.groups_per_step=2", "pipeline.max_concurrency=4",
    "pipeline.filters=[]", "engine.max_slots=4", "eval.max_concurrency=4",
    "eval.greedy=false", "eval.samples=0", "tracing.console=false", "tracing.plots=false",
    "tracing.doctor=false",
)
"""Overrides of a miniature run: every RL stage runs, nothing is expected to learn."""

# Runs `agentax` in a child process; AGENTAX_TEST_KILL_AT="<point>:<step>" makes the child
# SIGKILL itself at that point of the checkpoint save of RL step <step>:
#   orbax   - the array files are being written (Orbax's save returned, not finalised)
#   rename  - the checkpoint is complete under its temporary name, not yet renamed
# and AGENTAX_TEST_FAULT breaks a component: env_raises (every environment reset raises),
# engine_dies (the engine's step thread raises at its first decode).
_LAUNCHER = r"""
import os, signal, sys
point, _, step = os.environ.get("AGENTAX_TEST_KILL_AT", "").partition(":")
if point:
    from agentax.train import _checkpoint as ck
    def _die():
        os.kill(os.getpid(), signal.SIGKILL)
    if point == "rename":
        orig = ck._fsync_tree
        def _fsync_tree(path):
            orig(path)
            if path.name.startswith(f".tmp-step_{step}-"):
                _die()
        ck._fsync_tree = _fsync_tree
    elif point == "orbax":
        import orbax.checkpoint as ocp
        orig_save = ocp.StandardCheckpointer.save
        def save(self, directory, *args, **kwargs):
            orig_save(self, directory, *args, **kwargs)
            if directory.parent.name.startswith(f".tmp-step_{step}-"):
                _die()
        ocp.StandardCheckpointer.save = save
fault = os.environ.get("AGENTAX_TEST_FAULT", "")
if fault == "env_raises":  # every episode's environment fails to reset
    from agentax.envs import ToolEnvironment
    async def _reset(self, task):
        raise RuntimeError("injected: reset always fails")
    ToolEnvironment._reset = _reset
elif fault == "no_space_check":  # saves find a full disk while writing, not before
    from agentax.train import _checkpoint as ck
    ck.check_space = lambda directory, need: None
elif fault == "engine_dies":  # the engine's step thread dies at its first decode
    from agentax.engine import Engine
    def _decode(self, *args, **kwargs):
        raise RuntimeError("injected: the decode kernel crashed")
    Engine._decode = _decode
from agentax.cli import main
sys.exit(main(sys.argv[1:]))
"""


def env(kill_at: str = "", fault: str = "") -> dict[str, str]:
    out = dict(os.environ)
    # The repository root too: tests.faults.faulty_user_code is the children's user code.
    out["PYTHONPATH"] = os.pathsep.join([str(SRC), str(ROOT), out.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    out["JAX_PLATFORMS"] = "cpu"
    out.pop("AGENTAX_TEST_KILL_AT", None)
    out.pop("AGENTAX_TEST_FAULT", None)
    if kill_at:
        out["AGENTAX_TEST_KILL_AT"] = kill_at
    if fault:
        out["AGENTAX_TEST_FAULT"] = fault
    return out


def start(args, *, kill_at: str = "", fault: str = "", cwd=None,
          entry: bool = False) -> subprocess.Popen:
    """Starts `agentax ARGS` (output captured as text); `entry=True` runs the real command
    (`python -m agentax`: its start-up signal handling included) instead of the launcher."""
    head = ["-m", "agentax"] if entry else ["-c", _LAUNCHER]
    return subprocess.Popen([sys.executable, *head, *args], env=env(kill_at, fault),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)


def run(args, *, kill_at: str = "", fault: str = "",
        timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `agentax ARGS` to its end."""
    proc = start(args, kill_at=kill_at, fault=fault)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def rl_steps(run_dir: Path) -> list[int]:
    """Steps of the complete RL rows of metrics.jsonl, in file order."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("phase") == "rl":
            steps.append(row["step"])
    return steps


def wait_for_rl_step(proc: subprocess.Popen, run_dir: Path, step: int,
                     timeout: float = 300) -> bool:
    """Waits until metrics.jsonl has RL step `step` (False if the process ended first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step in rl_steps(run_dir):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.2)
    raise TimeoutError(f"no RL step {step} in {run_dir} after {timeout} s")


def send(proc: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 300):
    """Sends `sig` to the child and waits for it; returns (returncode, stdout, stderr)."""
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def checkpoint_dirs(run_dir: Path) -> list[str]:
    d = Path(run_dir) / "checkpoints"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def error_lines(stderr: str) -> list[str]:
    """The non-empty stderr lines that are not warnings (agentax's `warning: ...`) or log
    chatter of libraries."""
    return [line for line in stderr.splitlines() if line.strip()
            and not line.startswith(("warning: ", "WARNING", "INFO", "W0", "I0", "E0"))]


# ----------------------------------------------------------------------------- bad inputs


def make_run_dir(path: Path) -> Path:
    """A run directory holding config.yaml and one RL checkpoint of the demo model (no run)."""
    from flax import nnx

    from agentax.cli import RunConfig
    from agentax.run._rundir import RunCheckpointer, write_config
    from agentax.models import Transformer
    from agentax.train import RLTrainer

    path.mkdir(parents=True)
    cfg = RunConfig()
    write_config(path, cfg)
    trainer = RLTrainer(Transformer(cfg.model, rngs=nnx.Rngs(0)), cfg.trainer)
    RunCheckpointer(path).save(trainer, rl_step=1, next_group=4)
    return path


def bad_inputs(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(name, `agentax` argv, text the one-line error must contain) for each bad input.

    Builds the damaged files the cases need under `tmp`.
    """
    from agentax.cli import RunConfig
    from agentax.models import Transformer, save_pretrained

    tmp.mkdir(parents=True, exist_ok=True)
    cases: list[tuple[str, list[str], str]] = [
        ("enum: pipeline.mode", ["train", "pipeline.mode=asynch"], "'sync', 'async'"),
        ("enum: model.dtype", ["train", "model.dtype=foo"], "'float32', 'bfloat16'"),
        ("enum: model.hidden_act", ["train", "model.hidden_act=foo"], "'silu'"),
        ("enum: init.dtype", ["sft", "init.dtype=float64"], "'bfloat16'"),
        ("enum: trainer.off_policy", ["train", "trainer.off_policy=yes"], "'tis'"),
        ("unknown agent factory", ["eval", "agent.factory=no_such_pkg:make"], "no_such_pkg"),
        ("negative timeout", ["train", "collector.model_timeout_s=-1"], "must be > 0"),
        ("zero timeout", ["train", "collector.episode_timeout_s=0"], "must be > 0"),
        ("negative size", ["train", "collector.max_episode_tokens=-5"], "must be >= 0"),
        ("NaN learning rate", ["train", "trainer.learning_rate=nan"], "not a finite number"),
        ("inf temperature", ["train", "sampling.temperature=.inf"], "not a finite number"),
        ("unknown key", ["train", "trainer.learnin_rate=1"], "learning_rate"),
        ("bad override", ["train", "steps"], "neither a YAML file nor a recipe"),
    ]
    dup = tmp / "dup.yaml"
    dup.write_text("run:\n  steps: 3\n  steps: 4\n")
    cases.append(("duplicate YAML key", ["train", str(dup)], "appears twice"))
    broken = tmp / "broken.yaml"
    broken.write_text("run: [steps: 3\n")
    cases.append(("invalid YAML", ["train", str(broken)], "not valid YAML"))

    # Issue 44 F8-F11: every float finite, aliases bounded, sections typed, files named.
    nan_kw = tmp / "nan_kwargs.yaml"
    nan_kw.write_text("trainer:\n  advantage_kwargs: {eps: .nan}\n")
    cases.append(("NaN inside advantage_kwargs", ["train", str(nan_kw)],
                  "trainer.advantage_kwargs.eps: nan is not a finite number"))
    laughs = tmp / "laughs.yaml"
    laughs.write_text("env:\n  kwargs:\n    l0: &l0 [lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)))
    cases.append(("YAML billion laughs", ["train", str(laughs)], "anchors/aliases expand"))
    scalar = tmp / "scalar.yaml"
    scalar.write_text("run: 5\n")
    cases.append(("scalar for a section", ["train", str(scalar), "run.steps=3"],
                  "section 'run' is 5, not a mapping"))
    latin1 = tmp / "latin1.yaml"
    latin1.write_bytes(b"run:\n  name: caf\xe9\n")
    cases.append(("non-UTF-8 YAML", ["train", str(latin1)], "latin1.yaml:2: not UTF-8"))
    bad_data = tmp / "demos.jsonl"
    bad_data.write_bytes(b'{"messages": []}\n\n{"messages": [\n')
    cases.append(("bad sft.data line", ["sft", f"sft.data={bad_data}"], "demos.jsonl:3: not JSON"))
    cases.append(("task file is a directory", ["eval", "tasks.factory=null",
                                              f"tasks.train_file={tmp}"], "is a directory"))
    cases.append(("string NaN in advantage_kwargs", ["config", "trainer.advantage_kwargs={eps: nan}"],
                  "trainer.advantage_kwargs.eps: 'nan' is not a finite number"))

    cfg = RunConfig()
    hf = tmp / "hf"
    save_pretrained(Transformer(cfg.model), hf)
    truncated = tmp / "hf_truncated"
    truncated.mkdir()
    (truncated / "config.json").write_text((hf / "config.json").read_text())
    data = (hf / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    cases.append(("truncated safetensors", ["eval", f"init.model_path={truncated}",
                                            "init.tokenizer=byte"], "model.safetensors"))
    listed = tmp / "hf_list"
    listed.mkdir()
    (listed / "config.json").write_text("[1, 2]")
    cases.append(("config.json is a list", ["eval", f"init.model_path={listed}"], "config.json"))

    good = make_run_dir(tmp / "run_ok")
    out = tmp / "exported"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    cases.append(("export onto an existing path", ["export", str(good), str(out)],
                  "already exists"))
    damaged = make_run_dir(tmp / "run_damaged_state")
    for f in (damaged / "checkpoints" / "step_1" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    cases.append(("damaged Orbax checkpoint: export", ["export", str(damaged), str(tmp / "o1")],
                  "step_1"))
    cases.append(("damaged Orbax checkpoint: resume", ["train", str(damaged), "-q"], "step_1"))
    meta = make_run_dir(tmp / "run_damaged_meta")
    (meta / "checkpoints" / "step_1" / "meta.json").write_text("{not json")
    cases.append(("damaged meta.json", ["export", str(meta), str(tmp / "o2")], "meta.json"))
    cfg_bad = make_run_dir(tmp / "run_damaged_config")
    (cfg_bad / "config.yaml").write_text("run: {steps: [}\n")
    cases.append(("damaged config.yaml", ["train", str(cfg_bad)], "config.yaml"))
    cases.append(("not a run directory", ["export", str(tmp), str(tmp / "o3")], "config.yaml"))
    cases.append(("doctor on a missing dir", ["doctor", str(tmp / "nope")], "nope"))
    return cases
