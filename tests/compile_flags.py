"""XLA flags for the tests: fast to compile for the many short programs, XLA's defaults for
the learning runs.

On CPU, LLVM at -O0 and XLA:CPU's loop emitters in place of its MLIR fusion emitters compile
faster and run slower. Most tests' programs are tiny and run a few steps, so compiling is most
of their time: tests/conftest.py sets these flags for the whole session, and the subprocesses
tests start inherit them (or pass `fast_compile_xla_flags(...)` when they set XLA_FLAGS of
their own). A learning run executes for minutes, so it runs as a user runs it, in a process of
its own with XLA's defaults: `train_as_a_user`.
"""

from __future__ import annotations

import os
import subprocess
import sys

FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def fast_compile_xla_flags(flags: str = "") -> str:
    """`flags` (an XLA_FLAGS value) with each fast-compile flag it does not set already."""
    for flag in FAST_COMPILE_FLAGS:
        if flag.split("=")[0] not in flags:
            flags = f"{flags} {flag}".strip()
    return flags


def learning_env() -> dict[str, str]:
    """This process's environment without the fast-compile flags in XLA_FLAGS."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE_FLAGS]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    return env


def train_as_a_user(args: list[str], *, cwd=None, timeout: float = 1800) -> subprocess.CompletedProcess:
    """`agentax train ARGS` in a process of its own with XLA's default flags; `cwd` is on its
    import path (a user's own modules)."""
    return subprocess.run([sys.executable, "-m", "agentax", "train", *args], cwd=cwd,
                          env=learning_env(), capture_output=True, text=True, timeout=timeout)
