"""`agentax serve` on the built-in tiny model answers the real `openai` client on loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import openai
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
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
