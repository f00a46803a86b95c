"""A pre-flight check of a multi-process job, before JAX's own join, that fails fast and says why.

`jax.distributed.initialize` with a wrong process count, a coordinator nobody listens on, or
two processes given one id stays silent until its join timeout and then aborts with a C++
message that names neither the address nor the counts. So before it, the processes meet once
on the coordinator's own port: process 0 listens there, every other process connects and says
its id and the count it was started with, and process 0 answers all of them with "ok" or with
the one problem it found:

* a process started with another `--num-processes` (both counts named);
* two processes with the same id (both peers' addresses named);
* processes missing when the join timeout ends (their ids named);
* for a process other than 0: no coordinator answering at the address within the timeout.

Then process 0 closes its listening socket and JAX's coordinator binds the port. One line of
JSON each way; the exchange takes milliseconds once every process is up. The connections
themselves stay open when the join succeeds: `_liveness.py` watches them for the rest of the
run, so a process that dies stops the others at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time

__all__ = ["JoinError", "preflight"]

_RETRY_S = 0.25


class JoinError(RuntimeError):
    """The processes of a multi-process job could not be joined; the message says why."""


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise JoinError(f"coordinator address {address!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def _receive(conn: socket.socket, deadline: float) -> dict:
    buf = b""
    while not buf.endswith(b"\n"):
        conn.settimeout(max(0.05, deadline - time.monotonic()))
        chunk = conn.recv(4096)
        if not chunk or len(buf) > 65536:
            break
        buf += chunk
    try:
        out = json.loads(buf.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        out = None
    if not isinstance(out, dict):
        raise JoinError("the coordinator's port answered, but not as an agentax process (another "
                        "service on that port, or a peer of another agentax version)")
    return out


Peers = tuple[dict[int, socket.socket], dict[int, dict]]
"""Process id -> open connection, and process id -> {"pid", "host"} of that process."""


def _me() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _coordinate(host: str, port: int, num_processes: int, timeout_s: float) -> Peers:
    """Process 0: wait for every other process's hello and answer them all."""
    deadline = time.monotonic() + timeout_s
    try:
        server = socket.create_server(("", port), reuse_port=False)
    except OSError as e:
        raise JoinError(f"process 0 cannot listen on port {port} of the coordinator "
                        f"{host}:{port}: {e.strerror or e} (is another job using it?)") from None
    joined: dict[int, str] = {0: "process 0"}
    peers: list[socket.socket] = []
    conns: dict[int, socket.socket] = {}
    infos: dict[int, dict] = {}
    problem = None
    with contextlib.closing(server):
        try:
            while len(joined) < num_processes and problem is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(num_processes)) - set(joined))
                    problem = (f"{len(joined)} of {num_processes} processes joined the coordinator "
                               f"{host}:{port} within {timeout_s:g} s; missing process id(s) "
                               f"{missing}: start them with --coordinator {host}:{port} "
                               f"--num-processes {num_processes} --process-id I, or raise "
                               "--join-timeout")
                    break
                server.settimeout(left)
                try:
                    conn, peer = server.accept()
                except TimeoutError:
                    continue
                peers.append(conn)
                where = f"{peer[0]}:{peer[1]}"
                try:
                    hello = _receive(conn, time.monotonic() + 10)
                except (OSError, JoinError) as e:
                    problem = f"a peer at {where} did not say hello properly: {e}"
                    break
                pid, count = hello.get("process_id"), hello.get("num_processes")
                if count != num_processes:
                    problem = (f"process {pid} (at {where}) was started with --num-processes "
                               f"{count}, process 0 with {num_processes}: give every process the same count")
                elif not isinstance(pid, int) or not 0 < pid < num_processes:
                    problem = f"process id {pid} (at {where}) is outside 1..{num_processes - 1}"
                elif pid in joined:
                    problem = (f"two processes were started with --process-id {pid} "
                               f"({joined[pid]} and {where}): give each process its own id")
                else:
                    joined[pid] = where
                    conns[pid] = conn
                    infos[pid] = {"pid": hello.get("pid"), "host": hello.get("host")}
        finally:
            for conn in peers:
                with contextlib.suppress(OSError):
                    _send(conn, {"ok": problem is None, "error": problem, **_me()})
                    if problem is not None or conn not in conns.values():
                        conn.close()
    if problem is not None:
        raise JoinError(problem)
    return conns, infos


def _join(host: str, port: int, num_processes: int, process_id: int, timeout_s: float) -> Peers:
    """Process i > 0: say hello to process 0 (retrying until it listens) and read its answer."""
    deadline = time.monotonic() + timeout_s
    refused = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise JoinError(f"no coordinator answered at {host}:{port} within {timeout_s:g} s "
                            f"({refused or 'no answer'}): start process 0 with --coordinator "
                            f"{host}:{port} --num-processes {num_processes} --process-id 0, check "
                            "the address, or raise --join-timeout")
        try:
            conn = socket.create_connection((host, port), timeout=min(2.0, left))
        except OSError as e:
            refused = e.strerror or str(e)
            time.sleep(min(_RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        try:
            _send(conn, {"process_id": process_id, "num_processes": num_processes, **_me()})
            try:
                answer = _receive(conn, deadline + 15)
            except OSError as e:
                raise JoinError(f"the coordinator {host}:{port} closed the connection before "
                                f"answering ({e})") from None
            if not answer.get("ok"):
                raise JoinError(str(answer.get("error") or "the coordinator refused this process"))
        except BaseException:
            conn.close()
            raise
        return {0: conn}, {0: {"pid": answer.get("pid"), "host": answer.get("host")}}


def preflight(coordinator_address: str, num_processes: int, process_id: int,
              timeout_s: float) -> Peers:
    """Meets the other processes on the coordinator's port; returns when all are there, with
    the open connections (process 0: to every other process; the others: to process 0) and
    what each peer said of itself.

    Raises:
        JoinError: a count that differs, a duplicate or out-of-range id, missing processes, or
            no coordinator, within `timeout_s`; the message names the address and the ids.
    """
    host, port = _split(coordinator_address)
    if process_id == 0:
        return _coordinate(host, port, num_processes, timeout_s)
    return _join(host, port, num_processes, process_id, timeout_s)
