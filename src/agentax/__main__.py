"""The `agentax` command's entry point (also `python -m agentax`).

Before anything heavy is imported, it re-executes itself once with glibc's malloc told to back
its memory with transparent huge pages (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`), where that
helps: Linux, glibc >= 2.35, transparent huge pages in `madvise` mode (the common default).
XLA on CPU hands every jitted call fresh buffers from malloc, and the kernel maps them a 4 KiB
page at a time: ~20,000 page faults a demo SFT step. Huge pages cut the faults ~15× and make
the demo's SFT phase faster (docs/quickstart.md has the figures).
Setting `glibc.malloc.hugetlb` yourself (`=0` turns it off) leaves the environment alone. The
library itself never does this: it only happens for the `agentax` command.
"""

from __future__ import annotations

import os
import sys

_TUNABLE = "glibc.malloc.hugetlb"
_THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def _huge_page_env() -> dict[str, str] | None:
    """The environment to re-execute with, or None when there is nothing to gain."""
    if sys.platform != "linux" or _TUNABLE in os.environ.get("GLIBC_TUNABLES", ""):
        return None
    try:
        libc, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        recent = tuple(map(int, version.split(".")[:2])) >= (2, 35)
        with open(_THP) as f:
            thp = f.read()
    except (ValueError, OSError, AttributeError):  # not glibc, odd version, no THP
        return None
    if libc != "glibc" or not recent:
        return None
    if "[madvise]" not in thp:  # "always": malloc gets huge pages already; "never": none
        return None
    tunables = os.environ.get("GLIBC_TUNABLES")
    value = f"{tunables}:{_TUNABLE}=1" if tunables else f"{_TUNABLE}=1"
    return {**os.environ, "GLIBC_TUNABLES": value}


def _early_signal(signum: int, frame: object) -> None:
    """SIGINT / SIGTERM while the command is still importing: nothing is written yet."""
    os.write(2, f"agentax: interrupted by signal {signum} during start-up (nothing "
                "written)\n".encode())
    os._exit(128 + signum)


def main() -> int:
    import signal

    signals = {signal.SIGINT, signal.SIGTERM}
    env = _huge_page_env()
    if env is not None:
        # Blocked across the exec (a signal mask survives it, handlers do not): a signal in
        # the new interpreter's first milliseconds waits for the handler below instead of
        # meeting Python's default (a KeyboardInterrupt traceback, or death by SIGTERM).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            os.execve(sys.executable, sys.orig_argv, env)
        except (OSError, ValueError):  # no executable to re-run, or no argv to re-run it with
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # run as we are
    # Until a command installs its own handlers (train: `StopGuard`), a signal ends the
    # process at once with one line: the imports take seconds and nothing is written yet.
    for sig in signals:
        signal.signal(sig, _early_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    from agentax.cli import main as cli_main

    code = cli_main()
    # The command is over (its files are written): a signal from here to the exit is too
    # late to stop anything, and the interpreter's teardown would let it kill the process.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if code in (130, 143):  # interrupted: its line is out; what it cut short dies silently
        import warnings

        sys.unraisablehook = lambda args: None
        warnings.simplefilter("ignore")
    return code


if __name__ == "__main__":
    sys.exit(main())
