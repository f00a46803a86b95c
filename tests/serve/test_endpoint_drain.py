"""`ChatServer.stop(drain_s=...)` on a real uvicorn endpoint, with the real `openai` SDK: the
requests running finish, calls queued behind them on their session and new requests get a
503 `server_shutting_down` at once, and requests still running at the bound are answered 503
(a stream ends with an error event the SDK raises). The engine here waits on a gate the test
opens, so what is running, queued or new when `stop` begins is certain."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from agentax.engine import TokenChunk
from agentax.records import Completion, FinishReason
from agentax.serve import ChatServer

MSGS = [{"role": "user", "content": "hi"}]


class GatedEngine:
    """Answers "ok" once `gate` is open; `started` counts the calls that reached it."""

    def __init__(self, tok):
        self.tok = tok
        self.gate = asyncio.Event()
        self.started = 0
        self.released: list[int] = []
        self.cancelled = 0
        self._next = 0

    def _completion(self, prompt_ids, sequence_id):
        ids = np.asarray(self.tok.encode("ok") + [self.tok.eos_token_ids[0]], np.int32)
        if sequence_id is None:
            self._next += 1
            sequence_id = self._next
        n = ids.shape[0]
        return Completion(token_ids=ids, logprobs=np.zeros(n, np.float32),
                          versions=np.zeros(n, np.int32), finish_reason=FinishReason.EOS,
                          prompt_len=len(prompt_ids), sequence_id=sequence_id)

    async def generate(self, prompt_ids, params=None, *, sequence_id=None):
        self.started += 1
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return self._completion(prompt_ids, sequence_id)

    def release(self, sequence_id):
        self.released.append(sequence_id)


class GatedStreamingEngine(GatedEngine):
    """Streams its first token at once, the rest once `gate` is open."""

    async def stream(self, prompt_ids, params=None, *, sequence_id=None):
        self.started += 1
        c = self._completion(prompt_ids, sequence_id)
        yield TokenChunk(token_ids=c.token_ids[:1], logprobs=c.logprobs[:1], versions=c.versions[:1])
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        yield TokenChunk(token_ids=c.token_ids[1:], logprobs=c.logprobs[1:], versions=c.versions[1:])
        yield c


def client(server, key):
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=30)


async def until(predicate, what: str, limit_s: float = 20.0):
    for _ in range(int(limit_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def outcome(coro):
    """("ok", content) or ("error", status, code) of one SDK call."""
    try:
        r = await coro
        return ("ok", r.choices[0].message.content)
    except openai.APIStatusError as e:
        return ("error", e.status_code, e.code)


def test_stop_finishes_running_calls_and_answers_queued_and_new_ones_503(tok):
    eng = GatedEngine(tok)

    async def main():
        async with ChatServer(eng, tok, model_name="m") as server:
            a, b = client(server, "session-a"), client(server, "session-b")
            running = asyncio.ensure_future(outcome(a.chat.completions.create(model="m", messages=MSGS)))
            other = asyncio.ensure_future(outcome(b.chat.completions.create(model="m", messages=MSGS)))
            await until(lambda: eng.started == 2, "both sessions' calls reach the engine")
            # two more calls of session a: they wait behind its running call
            queued = [asyncio.ensure_future(outcome(a.chat.completions.create(model="m", messages=MSGS)))
                      for _ in range(2)]
            await until(lambda: server.gate.in_flight == 4, "the queued calls reach the server")
            stopping = asyncio.ensure_future(server.stop(drain_s=60))
            # queued calls are answered at once, while the running ones still wait on the engine
            answered = await asyncio.wait_for(asyncio.gather(*queued), 20)
            late = await outcome(client(server, "session-c").chat.completions.create(
                model="m", messages=MSGS))
            assert not running.done() and not other.done() and not stopping.done()
            eng.gate.set()
            counts = await asyncio.wait_for(stopping, 30)
            return answered, late, await running, await other, counts

    answered, late, running, other, counts = asyncio.run(main())
    assert answered == [("error", 503, "server_shutting_down")] * 2
    assert late == ("error", 503, "server_shutting_down")
    assert running == ("ok", "ok") and other == ("ok", "ok")
    assert counts == {"in_flight": 4, "finished": 2, "refused": 3, "cut": 0}
    assert eng.started == 2  # the refused calls never reached the engine


def test_calls_still_running_at_the_bound_are_answered_503(tok):
    eng = GatedEngine(tok)

    async def main():
        async with ChatServer(eng, tok, model_name="m") as server:
            c = client(server, "k")
            running = asyncio.ensure_future(outcome(c.chat.completions.create(model="m", messages=MSGS)))
            await until(lambda: eng.started == 1, "the call reaches the engine")
            counts = await asyncio.wait_for(server.stop(drain_s=0.2), 30)
            return await asyncio.wait_for(running, 10), counts

    running, counts = asyncio.run(main())
    assert running == ("error", 503, "server_shutting_down")
    assert counts == {"in_flight": 1, "finished": 0, "refused": 0, "cut": 1}
    assert eng.cancelled == 1  # its engine work was cancelled, not left running


def test_a_stream_cut_at_the_bound_ends_with_an_error_event_the_sdk_raises(tok):
    eng = GatedStreamingEngine(tok)

    async def main():
        async with ChatServer(eng, tok, model_name="m") as server:
            c = client(server, "k")
            stream = await c.chat.completions.create(model="m", messages=MSGS, stream=True)
            pieces = []
            it = stream.__aiter__()
            pieces.append((await it.__anext__()))  # the role chunk
            pieces.append((await it.__anext__()))  # the first content piece
            hurry = asyncio.Event()
            stopping = asyncio.ensure_future(server.stop(drain_s=60, hurry=hurry))
            await asyncio.sleep(0.1)
            assert not stopping.done()  # the stream is running: the drain waits for it
            hurry.set()  # a second signal: the drain ends now
            with pytest.raises(openai.APIError) as e:
                async for chunk in it:
                    pieces.append(chunk)
            return pieces, e.value, await asyncio.wait_for(stopping, 30)

    pieces, error, counts = asyncio.run(main())
    assert pieces[1].choices[0].delta.content == "o"
    assert "shut down before this request finished" in error.message
    assert counts["cut"] == 1 and counts["in_flight"] == 1
    assert eng.cancelled == 1


def test_requests_after_stop_get_a_json_503_not_a_closed_socket(tok):
    eng = GatedEngine(tok)

    async def main():
        async with ChatServer(eng, tok, model_name="m") as server:
            c = client(server, "k")
            running = asyncio.ensure_future(outcome(c.chat.completions.create(model="m", messages=MSGS)))
            await until(lambda: eng.started == 1, "the call reaches the engine")
            stopping = asyncio.ensure_future(server.stop(drain_s=60))
            await asyncio.sleep(0)
            raw = await asyncio.to_thread(_get, f"{server.url}/v1/models")
            eng.gate.set()
            await asyncio.wait_for(stopping, 30)
            return raw, await running

    (status, headers, body), running = asyncio.run(main())
    assert status == 503 and headers["content-type"] == "application/json"
    assert body["error"]["code"] == "server_shutting_down" and body["error"]["type"] == "server_error"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert running == ("ok", "ok")


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())
