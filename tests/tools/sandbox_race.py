"""A path race against the host's sandbox file helpers (used by the tests and benchmarks/faults.py).

Code in a real sandbox swaps a directory of its workdir (`d`), and a file in it (`d/f.txt`),
for symlinks in a tight loop -- atomically with renameat2(RENAME_EXCHANGE) and by plain
rename/symlink sequences -- pointing at a host directory, at the same directory through
/proc/self/root, and at another sandbox's workdir. Meanwhile the host calls one `Sandbox` file
operation on paths inside `d` over and over. Afterwards the host's directories must be exactly
as they were, and no read may have returned host bytes.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import threading
import time
from pathlib import Path

from agentax.tools import Sandbox, SandboxConfig, SandboxPathError

ATTACKER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def exchange(a, b):
    return libc.renameat2(-100, a.encode(), -100, b.encode(), 2)  # AT_FDCWD, RENAME_EXCHANGE
seconds, dir_targets, file_targets = float(sys.argv[1]), sys.argv[2].split(":"), sys.argv[3].split(":")
os.chdir("/workspace")
def repair():
    os.makedirs("d", exist_ok=True)
    for name in ("f.txt", "victim.txt"):
        p = os.path.join("d", name)
        if not os.path.lexists(p):
            with open(p, "w") as f:
                f.write("inside\n")
    for i, t in enumerate(file_targets):
        if not os.path.lexists(f"d/f.l{i}"):
            os.symlink(t, f"d/f.l{i}")
for i, t in enumerate(dir_targets):
    os.symlink(t, f"d.l{i}")
repair()
open("ready", "w").close()
end, swaps = time.time() + seconds, 0
while time.time() < end:
    for i in range(len(dir_targets)):
        if exchange("d", f"d.l{i}") == 0:  # d -> a host directory, atomically
            swaps += 1
            exchange("d", f"d.l{i}")
        for j in range(len(file_targets)):
            if exchange("d/f.txt", f"d/f.l{j}") == 0:  # d/f.txt -> a host file
                swaps += 1
                exchange("d/f.txt", f"d/f.l{j}")
        try:  # a window where d does not exist, then a plain link in its place
            os.rename("d", "d.real")
            os.symlink(dir_targets[i], "d")
            swaps += 1
            os.unlink("d")
            os.rename("d.real", "d")
        except OSError:
            pass
    try:
        repair()
    except OSError:
        pass
print("SWAPS", swaps)
"""

OPERATIONS = ("read", "write", "edit", "list", "remove", "rename", "copy_out")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(folder.rglob("*"))}


def _operate(sb: Sandbox, op: str, i: int, out_dir: Path) -> bytes:
    """One host operation on a path inside `d`; returns the bytes it read (if any)."""
    if op == "read":
        return sb.read_bytes("d/f.txt")
    if op == "write":
        sb.write_file(f"d/new_{i % 50}.txt", "written by the host\n")
    elif op == "edit":
        text = sb.read_file("d/victim.txt")
        sb.write_file("d/victim.txt", text.replace("inside", "inside"))
        return text.encode()
    elif op == "list":
        return "\n".join(sb.list_files("d")).encode()
    elif op == "remove":
        sb.remove("d/victim.txt")
    elif op == "rename":
        sb.rename("d/victim.txt", f"d/moved_{i % 50}.txt")
    elif op == "copy_out":
        dest = out_dir / f"copy_{i}"
        sb.copy_out("d", dest, max_bytes=2**20)
        return b"".join(p.read_bytes() for p in dest.rglob("*") if p.is_file())
    return b""


def race(op: str, seconds: float) -> dict:
    """Runs the attacker against one host operation for `seconds`; returns what leaked.

    Keys: op, calls, refused (SandboxPathError), other_errors (any other exception: a bug),
    swaps (the attacker's completed swaps), host_files_created, host_files_changed (changed or
    removed), host_bytes_read (bytes of host-only content a read returned).
    """
    if op not in OPERATIONS:
        raise ValueError(f"unknown operation {op!r}; one of {OPERATIONS}")
    marker = f"HOST-ONLY-{secrets.token_hex(6)}"
    config = SandboxConfig(timeout_s=seconds + 30, cpu_time_s=int(seconds) + 30)
    with tempfile.TemporaryDirectory(prefix="agentax-race-") as tmp, \
            Sandbox(config, files={"f.txt": marker + "\n", "victim.txt": marker + "\n",
                                   f"{marker}.txt": marker}) as other:
        host = Path(tmp, "host")
        host.mkdir()
        for name in ("f.txt", "victim.txt", f"{marker}.txt"):
            (host / name).write_text(marker + "\n")
        out_dir = Path(tmp, "out")
        out_dir.mkdir()
        watched = {"host": host, "other sandbox": other.workdir}
        before = {k: _snapshot(v) for k, v in watched.items()}
        dir_targets = [str(host), f"/proc/self/root{host}", str(other.workdir)]
        file_targets = [str(host / "f.txt"), str(other.workdir / "f.txt")]
        with Sandbox(config) as sb:
            result: dict = {}

            def attack() -> None:
                r = asyncio.run(sb.run_python(
                    "import sys; sys.argv = ['x', %r, %r, %r]\n" % (
                        str(seconds), ":".join(dir_targets), ":".join(file_targets)) + ATTACKER))
                result["r"] = r

            thread = threading.Thread(target=attack, daemon=True)
            thread.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and thread.is_alive():
                try:
                    sb.read_bytes("ready")
                    break
                except SandboxPathError:
                    time.sleep(0.01)
            calls = refused = other_errors = leaked = 0
            errors: list[str] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end and thread.is_alive():
                try:
                    got = _operate(sb, op, calls, out_dir)
                    leaked += len(got) if marker.encode() in got else 0
                except SandboxPathError:
                    refused += 1
                except Exception as e:  # noqa: BLE001 - counted: anything else is a bug
                    other_errors += 1
                    errors.append(f"{type(e).__name__}: {e}")
                calls += 1
            thread.join(seconds + 60)
        r = result.get("r")
        swaps = 0
        if r is not None:
            for line in r.stdout.splitlines():
                if line.startswith("SWAPS "):
                    swaps = int(line.split()[1])
        after = {k: _snapshot(v) for k, v in watched.items()}
        created = sum(len(set(after[k]) - set(before[k])) for k in watched)
        changed = sum(1 for k in watched for name, data in before[k].items() if after[k].get(name) != data)
        return {"op": op, "calls": calls, "refused": refused, "other_errors": other_errors,
                "errors": sorted(set(errors))[:3], "swaps": swaps,
                "attacker": "" if r is None else (r.stderr[-300:] if not r.ok else ""),
                "host_files_created": created, "host_files_changed": changed,
                "host_bytes_read": leaked}
