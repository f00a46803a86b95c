"""A real `agentax serve` under load gets SIGTERM / SIGINT: what every client got, and the exit.

Used by tests/faults/test_serve_signal.py and benchmarks/faults.py. The load, on the built-in
tiny model (random weights, greedy decoding) served with one engine slot:

* session "a": one long call (16 choices of 400 tokens: one slot decodes them one after the
  other), then two more calls of session "a" sent while it runs: they wait behind it on the
  session (its calls run one at a time);
* sessions "w0".."w3": short calls back to back (streamed for even workers), each worker
  until a call is answered 503, or its connection is refused because the server already
  drained and exited (its previous call was answered at the very end of the drain);
* the signal comes halfway through the long call (timed by the same call made first, which
  also compiles the kernels); right after it, one call of a new session.

Every call must end as a 200 or a 503 (`server_shutting_down`), or never reach the server (a
refused connection after it exited); anything else (a connection cut mid-call, a 404, a stream
cut without an error) is counted as lost.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LONG_N, LONG_TOKENS = 16, 400


def save_tiny_model(path: Path) -> Path:
    """The tiny random model of the serve tests, as a Hugging Face directory."""
    from flax import nnx

    from agentax.models import ModelConfig, Transformer, save_pretrained

    if not (path / "config.json").is_file():
        cfg = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                               num_kv_heads=1, head_dim=32)
        save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), path)
    return path


def start_serve(model_dir: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """`agentax serve MODEL_DIR --port 0 ARGS` as a child (the real entry point); (process, base
    URL ending in /v1) once it listens."""
    env = {**os.environ,
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "agentax", "serve", str(model_dir), "--port",
                             "0", "--max-seq-len", "512", "--max-slots", "1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    m = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"agentax serve did not start: {line!r} {proc.communicate()[1][-2000:]}")
    return proc, m.group(1)


def _outcome(call) -> str:
    """"200", "503" (server_shutting_down) or "lost: why" for one SDK call."""
    import openai

    try:
        call()
        return "200"
    except openai.APIStatusError as e:
        if e.status_code == 503 and e.code == "server_shutting_down":
            return "503"
        return f"lost: {e.status_code} {e.code}"
    except openai.APIConnectionError as e:
        # (the SDK's transport is httpx or its fork httpx2: match the class by name)
        if type(e.__cause__).__name__ == "ConnectError":
            # Nothing listens any more: the server drained and exited before this call was
            # sent (a worker whose call was answered at the very end of the drain), so the
            # call never reached it. A connection cut mid-call stays lost.
            return "refused"
        return f"lost: {type(e).__name__}: {e} ({type(e.__cause__).__name__}: {e.__cause__})"
    except openai.APIError as e:  # a stream that ended with an error event
        if "shut down" in str(e) or "shutting down" in str(e):
            return "503"
        return f"lost: {type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - a connection error is a lost call
        return f"lost: {type(e).__name__}: {e} ({type(e.__cause__).__name__}: {e.__cause__})"


def serve_under_signal(model_dir: Path, sig: signal.Signals, *, drain_s: float = 60.0) -> dict:
    """Runs the load above, sends `sig`, waits for the exit.

    Returns:
      {"exit": code, "exit_s": seconds from the signal to the exit, "long": outcome of the long
      call (and "long_choices"), "queued": outcomes of the two calls queued behind it, "new":
      the new session's call after the signal, "workers": {"200": n, "503": n}, "lost": the
      calls lost (their reasons), "stderr_tail": the serve command's own lines}.
    """
    import openai

    proc, url = start_serve(model_dir, "--drain-s", str(drain_s))
    model = Path(model_dir).name  # the id `agentax serve` serves a model directory under
    stop_workers = threading.Event()
    out: dict = {"queued": [], "workers": {"200": 0, "503": 0, "refused": 0}, "lost": []}
    lock = threading.Lock()

    def client(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)

    def long_call(key: str) -> int:
        r = client(key).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell a story."}], n=LONG_N,
            max_tokens=LONG_TOKENS, temperature=0)
        return len(r.choices)

    def long_in_session_a() -> None:
        choices = []
        out["long"] = _outcome(lambda: choices.append(long_call("a")))
        out["long_choices"] = choices[0] if choices else 0

    def queued() -> None:
        result = _outcome(lambda: client("a").chat.completions.create(
            model=model, messages=[{"role": "user", "content": "and then?"}], max_tokens=8))
        with lock:
            out["queued"].append(result)

    def worker(i: int) -> None:
        c = client(f"w{i}")

        def call():
            r = c.chat.completions.create(model=model, max_tokens=16, stream=i % 2 == 0,
                                          messages=[{"role": "user", "content": f"hi {i}"}])
            if i % 2 == 0:
                for _ in r:
                    pass

        while not stop_workers.is_set():
            result = _outcome(call)
            with lock:
                if result.startswith("lost"):
                    out["lost"].append(f"worker {i}: {result}")
                    return
                out["workers"][result] += 1
            if result in ("503", "refused"):
                return

    threads: list[threading.Thread] = []
    err = ""
    try:
        long_call("warm-up")  # compiles the kernels; a second one times the long call
        t = time.perf_counter()
        long_call("timing")
        long_s = time.perf_counter() - t
        threads.append(threading.Thread(target=long_in_session_a))
        threads[0].start()
        time.sleep(long_s / 4)
        threads += [threading.Thread(target=queued) for _ in range(2)]
        threads += [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t_ in threads[1:]:
            t_.start()
        time.sleep(long_s / 4)  # the queued calls reach the server and wait behind the long one
        t0 = time.perf_counter()
        proc.send_signal(sig)
        out["new"] = _outcome(lambda: client("new").chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4))
        try:
            _, err = proc.communicate(timeout=drain_s + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        out["exit_s"] = round(time.perf_counter() - t0, 1)
        out["long_s"] = round(long_s, 2)
    finally:
        stop_workers.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for t_ in threads:
            t_.join(60)
    out["exit"] = proc.returncode
    out["stderr_tail"] = [line for line in err.splitlines() if line.startswith("agentax serve")]
    for name in ("long", "new"):
        if out.get(name, "lost").startswith("lost"):
            out["lost"].append(f"{name}: {out.get(name)}")
    out["lost"] += [f"queued: {q}" for q in out["queued"] if q.startswith("lost")]
    return out


def survived(result: dict, sig: signal.Signals) -> bool:
    """The case's verdict: exit 128 + N, the long call finished whole, the queued calls and the new
    one got 503, every call answered, no call lost."""
    return (result["exit"] == 128 + sig and result["long"] == "200"
            and result["long_choices"] == LONG_N
            and result["queued"] == ["503", "503"] and result["new"] == "503"
            and result["workers"]["503"] + result["workers"]["refused"] == 4
            and not result["lost"])
