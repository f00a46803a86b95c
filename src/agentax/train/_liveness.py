"""A dead peer stops every survivor within a second, with one line that names it.

JAX's coordination service notices a process that died (`kill -9`, the OOM killer, a segfault)
only once its heartbeats are missed (`heartbeat_timeout_s`), and then aborts the others from
C++ (exit 134 after a page of log). So the connections of the join's pre-flight
(`_preflight.py`) stay open for the whole run: process 0 holds one to every other process,
each other process one to process 0. The kernel closes a process's sockets however it ends,
so a peer's end reaches the others at once:

* a peer that leaves normally says `bye` first (`leave_job()`, called when `agentax train`
  returned) and is let go;
* a peer whose command failed says so (`fail_job(reason)`, called by `agentax train` on an
  exception): the others stop too (its own log says more), instead of waiting at the next
  barrier; any other exit of the interpreter says `bye` (`atexit`);
* a peer whose connection ends without a word died: the others stop.

Process 0 relays what it hears to every other process, so each survivor prints one line on
stderr, such as ``process 1 (pid 4242 on node-1) died: this process (0) stops. Resume from
runs/x/checkpoints/step_2: agentax train runs/x (the same flags)``, and exits 1 at once
(`os._exit`: no teardown that would wait for the dead peer). Host loss without a closed
connection (a power cut, a network partition) still ends through JAX's heartbeats.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import socket
import sys
import threading
from collections.abc import Callable

__all__ = ["watch_peers", "leave_job", "fail_job", "set_resume_hint", "EXIT_PEER_LOST"]

EXIT_PEER_LOST = 1

_lock = threading.Lock()
_state: dict = {"peers": {}, "me": 0, "left": False, "hint": None, "stopping": False}


def set_resume_hint(hint: Callable[[], str] | None) -> None:
    """What the stop line says after the cause (e.g. the checkpoint to resume from); called
    at the moment of stopping, so it can name the newest checkpoint."""
    _state["hint"] = hint


def _send(conn: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):
        conn.sendall((json.dumps(message) + "\n").encode())


def _stop(cause: str) -> None:
    """Prints the one line and ends this process now."""
    with _lock:
        if _state["left"] or _state["stopping"]:
            return
        _state["stopping"] = True
    hint = ""
    if _state["hint"] is not None:
        with contextlib.suppress(Exception):
            hint = " " + _state["hint"]()
    with contextlib.suppress(Exception):
        sys.stderr.write(f"agentax: {cause}: this process ({_state['me']}) stops.{hint}\n")
        sys.stderr.flush()
    os._exit(EXIT_PEER_LOST)


def _describe(pid: int, info: dict) -> str:
    where = f" (pid {info['pid']} on {info['host']})" if info.get("pid") else ""
    return f"process {pid}{where}"


def _cause(pid: int, info: dict, message: dict | None) -> str:
    if message is not None and message.get("failed"):
        return f"{_describe(pid, info)} failed ({message['failed']}; its own log says more)"
    return f"{_describe(pid, info)} died"


def _watch() -> None:
    """The thread: reads every peer connection; acts on `bye`, `failed`, `lost` or an end."""
    peers: dict[int, socket.socket] = dict(_state["peers"])
    infos: dict[int, dict] = dict(_state["infos"])
    buffers = {pid: b"" for pid in peers}
    said_bye: set[int] = set()
    while peers:
        try:
            ready, _, _ = select.select(list(peers.values()), [], [], 1.0)
        except (OSError, ValueError):
            return  # closed by leave_job()
        if _state["left"]:
            return
        for conn in ready:
            pid = next(p for p, c in peers.items() if c is conn)
            try:
                chunk = conn.recv(4096)
            except OSError:
                chunk = b""
            messages = []
            buffers[pid] += chunk
            while b"\n" in buffers[pid]:
                line, buffers[pid] = buffers[pid].split(b"\n", 1)
                with contextlib.suppress(ValueError):
                    messages.append(json.loads(line))
            for message in messages:
                if message.get("bye"):
                    said_bye.add(pid)
                elif message.get("failed") or message.get("lost") is not None:
                    if message.get("lost") is not None:  # relayed by process 0
                        lost = int(message["lost"])
                        cause = message.get("cause") or f"process {lost} died"
                    else:
                        cause = _cause(pid, infos.get(pid, {}), message)
                    _relay(peers, pid, cause)
                    _stop(cause)
            if chunk:
                continue
            del peers[pid]
            if pid not in said_bye:
                cause = _cause(pid, infos.get(pid, {}), None)
                _relay(peers, pid, cause)
                _stop(cause)


def _relay(peers: dict[int, socket.socket], lost: int, cause: str) -> None:
    """Process 0 tells every other process which one is gone (they only hear from 0)."""
    if _state["me"] != 0:
        return
    for pid, conn in peers.items():
        if pid != lost:
            _send(conn, {"lost": lost, "cause": cause})


def watch_peers(me: int, peers: dict[int, socket.socket], infos: dict[int, dict]) -> None:
    """Starts watching the pre-flight's connections (`peers`: process id -> socket; `infos`:
    process id -> {"pid", "host"}); registers the `atexit` farewell."""
    _state.update(me=me, peers=dict(peers), infos=dict(infos), left=False, stopping=False)
    for conn in peers.values():
        conn.settimeout(None)
    threading.Thread(target=_watch, name="agentax-peers", daemon=True).start()
    atexit.register(leave_job)


def leave_job() -> None:
    """This process is done (the command returned, or the interpreter exits): the others let
    it go."""
    _goodbye({"bye": True})


def fail_job(reason: str) -> None:
    """This process's command failed (`reason`: one short phrase): the others stop now."""
    _goodbye({"failed": reason[:300]})


def _goodbye(message: dict) -> None:
    with _lock:
        if _state["left"] or _state["stopping"]:
            return
        _state["left"] = True
    for conn in _state["peers"].values():
        _send(conn, message)
