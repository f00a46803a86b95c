"""XLA flags for test programs whose time is mostly XLA compiling (tiny models, few steps).

On CPU, LLVM at -O0 and XLA:CPU's loop emitters in place of its MLIR fusion emitters compile
faster and run slower: the default suite runs with them (tests/conftest.py), and so do the
subprocesses of slow tests that compile much and execute little (their XLA_FLAGS pass through
`fast_compile_xla_flags`). Learning runs, which execute for minutes, run without them.
"""

from __future__ import annotations

FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def fast_compile_xla_flags(flags: str = "") -> str:
    """`flags` (an XLA_FLAGS value) with each fast-compile flag it does not set already."""
    for flag in FAST_COMPILE_FLAGS:
        if flag.split("=")[0] not in flags:
            flags = f"{flags} {flag}".strip()
    return flags
