"""`agentax serve`: the OpenAI-compatible endpoint over a checkpoint or a run's latest weights."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["load_for_serving", "serve"]


def load_for_serving(source: str, *, max_seq_len: int | None = None, max_slots: int | None = None):
    """(engine, tokenizer, tool_format, name) for a run directory or a Hugging Face model directory.

    Raises:
      FileNotFoundError / ValueError: the source is neither, or has no weights or tokenizer.
    """
    from agentax.run import (build_engine, build_tokenizer, is_run_dir, load_run_model,
                             resolve_config, run_config)
    from agentax.config import replace
    from agentax.engine import Engine, EngineConfig
    from agentax.models import load_pretrained
    from agentax.text import ByteTokenizer, load_tokenizer

    path = Path(source)
    if not path.is_dir():
        raise FileNotFoundError(f"{source} is not a directory; give a run directory (agentax train "
                                "output) or a Hugging Face model directory (config.json + safetensors)")
    if is_run_dir(path):
        cfg = resolve_config(run_config(path))
        engine_cfg = cfg.engine
        if max_seq_len or max_slots:
            engine_cfg = replace(engine_cfg, max_seq_len=max_seq_len or engine_cfg.max_seq_len,
                                 max_slots=max_slots or engine_cfg.max_slots)
        tokenizer = build_tokenizer(cfg)
        model = load_run_model(path, cfg)
        engine = build_engine(replace(cfg, engine=engine_cfg), model, tokenizer)
        return engine, tokenizer, _run_tool_format(cfg), path.name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{source} has neither config.yaml (run directory) nor config.json "
                                "(Hugging Face model directory)")
    model = load_pretrained(path)
    if (path / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(path)
    elif model.config.vocab_size == ByteTokenizer().vocab_size:
        tokenizer = ByteTokenizer()
    else:
        raise FileNotFoundError(f"{source} has no tokenizer.json (and its vocabulary is not the "
                                "built-in byte tokenizer's); copy the model's tokenizer files there")
    tool_format = "llama3" if model.config.family == "llama" else "hermes"
    engine = Engine(model, EngineConfig(max_slots=max_slots or 16, max_seq_len=max_seq_len or 2048),
                    eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer)
    return engine, tokenizer, tool_format, path.name


def _run_tool_format(cfg: Any) -> str:
    """The tool-call format a run's agent was configured with (its own field, or its kwargs)."""
    agent = cfg.agent
    fmt = getattr(agent, "tool_format", None) or dict(getattr(agent, "kwargs", None) or {}).get("tool_format")
    return fmt or "hermes"


DRAIN_S = 5.0
"""Default of `--drain-s`: seconds requests in flight get to finish after SIGINT / SIGTERM."""
EXIT_GRACE_S = 30.0
"""After a signal, the process ends within drain + this, whatever blocks it (`hard_exit`)."""


def serve(source: str, *, host: str = "127.0.0.1", port: int = 8000, max_seq_len: int | None = None,
          max_slots: int | None = None, tool_format: str | None = None,
          drain_s: float = DRAIN_S) -> int:
    """Serves until SIGINT / SIGTERM; prints the base URL once listening.

    On the signal it drains (`ChatServer.stop`): requests running get `drain_s` seconds to
    finish, requests queued behind another call of their session and new ones get a 503
    `server_shutting_down`; then it exits 128 + N (130 SIGINT, 143 SIGTERM), through
    `Interrupted`. A second signal ends the drain at once.
    """
    from agentax.run._signals import Interrupted, hard_exit, interrupted_by
    from agentax.serve import ChatServer

    if not drain_s >= 0:
        raise ValueError(f"--drain-s must be >= 0 seconds, got {drain_s}")
    engine, tokenizer, default_format, name = load_for_serving(
        source, max_seq_len=max_seq_len, max_slots=max_slots)

    async def main() -> None:
        got: list[int] = []
        stop, hurry = asyncio.Event(), asyncio.Event()

        def on_signal(signum: int) -> None:
            if got:
                os.write(2, f"agentax serve: second {signal.Signals(signum).name}: answering the "
                            "requests left 503 now\n".encode())
                hurry.set()
                return
            got.append(signum)
            watchdog = threading.Timer(drain_s + EXIT_GRACE_S, hard_exit, (128 + signum, (
                f"agentax serve: {interrupted_by(signum)}; the drain did not end within "
                f"{drain_s + EXIT_GRACE_S:g} s, exited now")))
            watchdog.daemon = True
            watchdog.start()
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        server = ChatServer(engine, tokenizer, model_name=name, host=host, port=port,
                            tool_format=tool_format or default_format)
        url = await server.start()
        print(f"agentax serve: {name} at {url}/v1 (OPENAI_BASE_URL={url}/v1; any API key names a "
              "session)", flush=True)
        await stop.wait()
        signum = got[0]
        print(f"agentax serve: {signal.Signals(signum).name}: draining (requests running get up "
              f"to {drain_s:g} s; new and queued ones get 503)", file=sys.stderr, flush=True)
        c = await server.stop(drain_s=drain_s, hurry=hurry)
        raise Interrupted(signum, f"{interrupted_by(signum)}; drained: requests finished "
                          f"{c['finished']}, answered 503 (queued or new) {c['refused']}, cut at "
                          f"the {drain_s:g} s bound (answered 503) {c['cut']}")

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible endpoint (chat completions) over a "
                       "checkpoint or a run's latest weights")
    p.add_argument("source", metavar="MODEL_DIR_OR_RUN_DIR")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-seq-len", type=int, default=None, help="tokens per conversation")
    p.add_argument("--max-slots", type=int, default=None, help="conversations decoded together")
    p.add_argument("--tool-format", default=None, help="tool-call parser (hermes, llama3)")
    p.add_argument("--drain-s", type=float, default=DRAIN_S, metavar="SECONDS",
                   help="on SIGINT / SIGTERM, how long requests in flight get to finish before "
                   f"they are answered 503 (default {DRAIN_S:g}); exit 130 / 143")
    p.set_defaults(fn=lambda a: serve(a.source, host=a.host, port=a.port, max_seq_len=a.max_seq_len,
                                      max_slots=a.max_slots, tool_format=a.tool_format,
                                      drain_s=a.drain_s))


