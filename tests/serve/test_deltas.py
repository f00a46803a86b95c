"""Pieces of streamed content (`ContentDeltas`) and the statuses of agents that raise.

Pure: no engine, no HTTP (the endpoint's streaming is tested in test_endpoint_stream.py).
"""

from __future__ import annotations

import asyncio

import numpy as np
from serve_helpers import ScriptedEngine

from agentax.agents import ModelAgent
from agentax.records import SamplingParams, Task, TrajectoryStatus
from agentax.rollout import Collector, CollectorConfig
from agentax.serve import AGENT_OUTCOMES, OpenAIAgentEnvironment
from agentax.serve._deltas import ContentDeltas, delivered_content
from agentax.text import ByteTokenizer

TOK = ByteTokenizer()


def pieces(text: str, **kw) -> list[str]:
    """The pieces `ContentDeltas` gives when `text` arrives one byte at a time."""
    d = ContentDeltas(lambda ids: TOK.decode(list(ids)), **kw)
    return [p for b in TOK.encode(text) if (p := d.feed([b]))]


def test_pieces_hold_back_what_could_still_change():
    assert "".join(pieces("héllo €")) == "héllo €"  # never half a character
    assert not any("\ufffd" in p for p in pieces("héllo €"))
    out = pieces("a STx STOP b", stop=["STOP"])
    assert "".join(out) == "a STx " and not any("STO" in p for p in out)
    # with tools (hermes): text before the tag, trailing whitespace held (content is stripped)
    assert "".join(pieces('Sure. <tool_call>{"name":"f"}</tool_call>', tool_format="hermes")) == "Sure."
    assert "".join(pieces("  Sure.", tool_format="hermes")) == ""  # leading whitespace: held whole
    assert "".join(pieces('{"name": "f"}', tool_format="llama3")) == ""  # no tags: held whole
    assert "".join(pieces("plain text", tool_format="hermes")) == "plain text"


def test_delivered_content_is_what_the_client_holds():
    assert delivered_content("", None) is None
    assert delivered_content("Hel", "Hello") == "Hello"
    assert delivered_content("Hellp", "Hello world") == "Hellp world"  # a re-spelled prefix


class Boom(RuntimeError):
    pass


def test_agent_exceptions_map_to_statuses():
    assert AGENT_OUTCOMES["agents.exceptions.MaxTurnsExceeded"] == TrajectoryStatus.TRUNCATED
    task = Task(id="t", prompt="hi", answer="x")

    async def agent(client, task):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        raise Boom("the harness gave up")

    def run(**kw):
        col = Collector(ScriptedEngine(TOK, ["a reply"]), TOK,
                        lambda: OpenAIAgentEnvironment(agent, **kw), lambda: ModelAgent(),
                        SamplingParams(max_tokens=16), CollectorConfig(max_episode_tokens=200))
        return asyncio.run(col.run_episode(task, seed=1))

    failed, outcome = run(), run(outcomes={Boom: TrajectoryStatus.TRUNCATED})
    assert failed.status == TrajectoryStatus.ENV_ERROR and failed.info["reason"] == "agent_error"
    assert outcome.status == TrajectoryStatus.TRUNCATED and outcome.info["reason"] == "Boom"
    assert "the harness gave up" in outcome.info["error"]
    np.testing.assert_array_equal(outcome.token_ids, failed.token_ids)  # the reply is kept
    env = OpenAIAgentEnvironment(agent, outcomes={"agents.exceptions.MaxTurnsExceeded": None})
    assert "agents.exceptions.MaxTurnsExceeded" not in env.outcomes


def test_requests_cancelled_by_a_stopping_run_are_not_logged_as_app_errors():
    """A run that stops cancels every episode's open model call; uvicorn logged each as
    "Exception in ASGI application" with a traceback (16 on Ctrl-C in an SDK recipe's RL)."""
    import asyncio
    import logging
    import sys

    from agentax.serve._server import _CancelledRequest, _quiet_cancelled_requests

    def record(exc):
        try:
            raise exc
        except BaseException:
            info = sys.exc_info()
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1,
                                 "Exception in ASGI application\n", (), info)

    quiet = _CancelledRequest()
    assert not quiet.filter(record(asyncio.CancelledError()))
    assert quiet.filter(record(ValueError("a real bug in the app")))  # still reported
    _quiet_cancelled_requests()
    _quiet_cancelled_requests()  # once, however many servers start
    assert sum(isinstance(f, _CancelledRequest)
               for f in logging.getLogger("uvicorn.error").filters) == 1
