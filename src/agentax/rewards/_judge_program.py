"""The judge that `code_tests_reward` runs inside the sandbox (a standalone program, no imports
from agentax): the scored code and the tests never share a process.

* The judge reads a one-time secret from `.agentax-judge-secret` and deletes it, makes itself
  non-dumpable (so processes of the same uid cannot read its memory, environment or open files,
  nor ptrace it), and only then starts the *solution process*, which executes solution.py.
* The tests run in the judge. The names solution.py defines are proxies: calling one sends the
  (plain-data) arguments to the solution process and returns its plain-data result, or raises
  the builtin exception it raised. Comparisons (`assert f(2) == 4`) therefore happen in the
  judge on plain values: an object with a forged `__eq__`, a call to a report function, a
  `sys.exit(0)`, or printing a fake result line cannot make a test pass.
* The verdict is printed on one line prefixed by the secret, which the scored code never saw.

Limits: arguments and results must be plain data (None, bool, int, float, complex, str, bytes,
and lists / tuples / dicts / sets of them); a test that mutates an argument in place or needs
an object back (a class instance) sees a TypeError and fails. Each call is bounded by the
per-test time limit; a solution process that times out or dies is restarted for the next test.

Usage (in the sandbox, cwd = the workdir): python judge.py PER_TEST_S [pytest]
with `tests.json` (a list of snippets) or `test_solution.py` (a pytest module) in the workdir.
"""

import builtins
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
import types

_LINE_LIMIT = 16 * 2**20

_CODEC = r'''
def enc(v, depth=0):
    if depth > 64:
        raise TypeError("value nested too deeply")
    if v is None or type(v) in (bool, int, float, str):
        return v
    t = type(v)
    if t is list:
        return {"__l": [enc(x, depth + 1) for x in v]}
    if t is tuple:
        return {"__t": [enc(x, depth + 1) for x in v]}
    if t in (set, frozenset):
        return {"__s" if t is set else "__f": [enc(x, depth + 1) for x in v]}
    if t is dict:
        return {"__d": [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]}
    if t is bytes:
        return {"__b": v.hex()}
    if t is complex:
        return {"__c": [v.real, v.imag]}
    raise TypeError("a %s is not plain data (None, bool, int, float, str, bytes, list, tuple, "
                    "dict, set)" % t.__name__)


def dec(v):
    if type(v) is not dict:
        return v
    (tag, x), = v.items()
    if tag == "__l":
        return [dec(y) for y in x]
    if tag == "__t":
        return tuple(dec(y) for y in x)
    if tag == "__s":
        return set(dec(y) for y in x)
    if tag == "__f":
        return frozenset(dec(y) for y in x)
    if tag == "__d":
        return {dec(k): dec(y) for k, y in x}
    if tag == "__b":
        return bytes.fromhex(x)
    if tag == "__c":
        return complex(*x)
    raise ValueError("bad tag")
'''
exec(_CODEC)

_SOLUTION = _CODEC + r'''
import json, os, sys
sys.path.insert(0, os.getcwd())
requests, replies = os.fdopen(int(sys.argv[1]), "rb"), os.fdopen(int(sys.argv[2]), "wb")
def send(msg):
    replies.write(json.dumps(msg).encode() + b"\n")
    replies.flush()
ns = {"__name__": "solution"}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
except BaseException as e:
    send({"ok": False, "exc": type(e).__name__, "msg": "solution failed to load: %s" % str(e)[:200]})
    raise SystemExit(0)
names = {}
for k, v in list(ns.items()):
    if k.startswith("__"):
        continue
    if callable(v):
        names[k] = {"call": 1}
    else:
        try:
            names[k] = {"v": enc(v)}
        except Exception:
            pass
send({"ok": True, "names": names})
for line in requests:
    req = json.loads(line)
    try:
        result = ns[req["call"]](*dec(req["args"]), **dec(req["kwargs"]))
        send({"ok": True, "v": enc(result)})
    except BaseException as e:
        try:
            send({"ok": False, "exc": type(e).__name__, "msg": str(e)[:200]})
        except BaseException:
            send({"ok": False, "exc": "TypeError", "msg": "unreportable error"})
'''


class _Solution:
    """The solution process and the pipes to it; restarted after a timeout or a crash."""

    def __init__(self, per_call_s):
        self.per_call_s = per_call_s
        self.proc = None
        self.names = None
        self.load_error = None

    def start(self):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SOLUTION, str(req_r), str(rep_w)],
            pass_fds=(req_r, rep_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )
        os.close(req_r)
        os.close(rep_w)
        self.req, self.rep, self.buf = req_w, rep_r, b""
        first = self.read()
        if not first.get("ok"):
            self.load_error = first.get("msg", "solution failed to load")
            self.stop()
            return
        self.names = first["names"]

    def stop(self):
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
            for fd in (self.req, self.rep):
                os.close(fd)
            self.proc = None

    def read(self):
        deadline = time.monotonic() + self.per_call_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rep], [], [], left)[0]:
                self.stop()
                raise TimeoutError("the solution took longer than %.1f s" % self.per_call_s)
            chunk = os.read(self.rep, 65536)
            if not chunk:
                self.stop()
                raise RuntimeError("the solution process died")
            self.buf += chunk
            if len(self.buf) > _LINE_LIMIT:
                self.stop()
                raise RuntimeError("the solution's answer is too large")
        line, _, self.buf = self.buf.partition(b"\n")
        msg = json.loads(line)
        if type(msg) is not dict:
            raise RuntimeError("malformed answer from the solution process")
        return msg

    def call(self, name, args, kwargs):
        if self.proc is None:
            self.start()
            if self.load_error:
                raise RuntimeError(self.load_error)
        os.write(self.req, json.dumps({"call": name, "args": enc(list(args)), "kwargs": enc(dict(kwargs))}).encode() + b"\n")
        msg = self.read()
        if msg.get("ok"):
            return dec(msg["v"])
        exc = getattr(builtins, str(msg.get("exc")), None)
        if not (isinstance(exc, type) and issubclass(exc, Exception)):
            exc = RuntimeError
        raise exc(str(msg.get("msg", "")))


def _namespace(solution):
    module = types.ModuleType("solution")
    for name, spec in (solution.names or {}).items():
        if "call" in spec:
            def proxy(*args, __name=name, **kwargs):
                return solution.call(__name, args, kwargs)
            proxy.__name__ = name
            setattr(module, name, proxy)
        else:
            setattr(module, name, dec(spec["v"]))
    return module


def _alarm(signum, frame):
    raise TimeoutError("test took too long")


def _snippets(solution, per_test_s):
    with open("tests.json") as f:
        tests = json.load(f)
    passed = 0
    for i, test in enumerate(tests):
        ns = dict(vars(_namespace(solution)))
        ns["__name__"] = "__test__"
        signal.setitimer(signal.ITIMER_REAL, per_test_s * 2 + 1)
        try:
            exec(compile(test, "test_%d" % i, "exec"), ns)
            passed += 1
        except BaseException:
            pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return passed, len(tests)


def _pytest(solution):
    import pytest

    counts = {"passed": 0, "failed": 0}

    class Count:
        def pytest_runtest_logreport(self, report):
            if report.failed:
                counts["failed"] += 1
            elif report.when == "call" and report.passed:
                counts["passed"] += 1

        def pytest_collectreport(self, report):
            if report.failed:
                counts["failed"] += 1

    sys.modules["solution"] = _namespace(solution)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    pytest.main(["-q", "-p", "no:cacheprovider", "--no-header", "test_solution.py"], plugins=[Count()])
    return counts["passed"], counts["passed"] + counts["failed"]


def main():
    with open(".agentax-judge-secret") as f:
        secret = f.read().strip()
    os.remove(".agentax-judge-secret")
    libc = ctypes.CDLL(None)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: the solution cannot read this process
    signal.signal(signal.SIGALRM, _alarm)
    per_test_s = float(sys.argv[1])
    solution = _Solution(per_test_s)
    try:
        solution.start()
    except (TimeoutError, RuntimeError, ValueError) as e:
        solution.load_error = str(e)
    if solution.load_error:
        print("solution failed to load:", solution.load_error)
    if len(sys.argv) > 2 and sys.argv[2] == "pytest":
        passed, total = _pytest(solution)
    else:
        passed, total = _snippets(solution, per_test_s)
    solution.stop()
    sys.stdout.flush()
    print("\n" + secret + json.dumps({"passed": passed, "total": total}), flush=True)


if __name__ == "__main__":
    main()
