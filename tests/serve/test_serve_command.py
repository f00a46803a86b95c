"""`agentax serve` on the built-in tiny model answers the real `openai` client on loopback, and
every HTTP-level error (bytes that are not HTTP, bad headers, bad JSON, an unknown route, a
wrong method, a body too large) with its status and an OpenAI error body."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import openai
import pytest
from serve_helpers import MODEL
from flax import nnx

from agentax.models import Transformer, save_pretrained

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_agentax_serve_answers_the_openai_client(tmp_path):
    save_pretrained(Transformer(MODEL, rngs=nnx.Rngs(0)), tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from agentax.cli import main; sys.exit(main())",
         "serve", str(tmp_path / "tiny"), "--port", "0", "--max-seq-len", "256", "--max-slots", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        m = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        client = openai.OpenAI(base_url=m.group(1), api_key="session-1", max_retries=0, timeout=120)
        assert [x.id for x in client.models.list()] == ["tiny"]
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                           max_tokens=5, seed=1)
        assert r.choices[0].message.role == "assistant" and 1 <= r.usage.completion_tokens <= 5
        host, port = re.match(r"http://([\d.]+):(\d+)", m.group(1)).groups()
        failures = []
        for name, raw, status, code in HTTP_ERRORS:
            got = raw_http(host, int(port), raw)
            body = got[2]
            ok = (got[0] == status and got[1].get("content-type") == "application/json"
                  and isinstance(body, dict) and set(body) == {"error"}
                  and set(body["error"]) == {"message", "type", "param", "code"}
                  and body["error"]["message"] and body["error"]["code"] == code)
            if not ok:
                failures.append((name, got))
        assert failures == []
        with pytest.raises(openai.BadRequestError) as e:  # the SDK reads the 400 as OpenAI's
            client.chat.completions.create(model="tiny", messages=[{"role": "robot", "content": "x"}])
        assert e.value.type == "invalid_request_error" and e.value.param
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130  # 128 + SIGINT, after the drain


HEAD = b"Host: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n"
HTTP_ERRORS = [  # (what, raw bytes sent, status, error code)
    ("garbage", b"GARBAGE\r\n\r\n", 400, "invalid_http_request"),
    ("binary (a TLS hello)", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", 400,
     "invalid_http_request"),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "invalid_http_request"),
    ("header without a colon", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
     400, "invalid_http_request"),
    ("bad content-length", b"POST /v1/chat/completions HTTP/1.1\r\n" + HEAD +
     b"Content-Length: abc\r\n\r\n", 400, "invalid_http_request"),
    ("bad chunk size", b"POST /v1/chat/completions HTTP/1.1\r\n" + HEAD +
     b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "invalid_http_request"),
    ("bad JSON", b"POST /v1/chat/completions HTTP/1.1\r\n" + HEAD +
     b"Content-Length: 9\r\nConnection: close\r\n\r\n{\"model\":", 400, None),
    ("unknown route", b"GET /v2/engines HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404,
     "unknown_url"),
    ("wrong method", b"DELETE /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405,
     "method_not_allowed"),
    ("body too large", b"POST /v1/chat/completions HTTP/1.1\r\n" + HEAD +
     b"Content-Length: 1000000000\r\nConnection: close\r\n\r\n", 413, None),
]


def raw_http(host: str, port: int, data: bytes) -> tuple[int, dict[str, str], object]:
    """(status, headers, JSON body or the raw text) of the server's answer to `data`."""
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(data)
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < _length(reply):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines[0].startswith("HTTP/") else 0
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    try:
        return status, headers, json.loads(body)
    except ValueError:
        return status, headers, body.decode("latin-1")


def _length(reply: bytes) -> int:
    m = re.search(rb"(?i)content-length: (\d+)", reply)
    return int(m.group(1)) if m else 1 << 30
