"""The endpoint against the real `openai` client on loopback: plain, tools, streaming, n > 1,
logprobs, errors, concurrent sessions, and token-exact recording."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
from serve_helpers import ScriptedEngine

from agentax.records import SamplingParams, TrajectoryStatus
from agentax.serve import ChatServer

CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluates arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}


def run(coro):
    return asyncio.run(coro)


def client(server, key="k1"):
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def http(url, body=None):
    """(status, JSON body) of a raw request, outside the SDK (to send what it never would)."""
    req = urllib.request.Request(url, data=body, headers={"Authorization": "Bearer k9"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def generated(traj):
    return traj.token_ids[traj.loss_mask == 1]


def test_plain_call_records_engine_ids_exactly(recording, tok):
    async def main():
        async with ChatServer(recording, tok) as server:
            c = client(server)
            r = await c.chat.completions.create(
                model="agentax", messages=[{"role": "user", "content": "Hi there"}],
                max_tokens=12, seed=7, logprobs=True)
            await c.close()
            return r, server.session("k1")

    r, session = run(main())
    (prompt, seq, comp), = recording.calls
    assert seq is None
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == comp.num_tokens and r.usage.prompt_tokens == len(prompt)
    # logprobs reported are the engine's behaviour logprobs, token by token
    lps = [t.logprob for t in r.choices[0].logprobs.content]
    np.testing.assert_allclose(lps, comp.logprobs, rtol=0, atol=0)
    traj = session.trajectory(1.0, TrajectoryStatus.OK)
    np.testing.assert_array_equal(generated(traj), comp.token_ids)
    np.testing.assert_array_equal(traj.logprobs[traj.loss_mask == 1], comp.logprobs)
    np.testing.assert_array_equal(traj.versions[traj.loss_mask == 1], comp.versions)
    assert tok.decode(traj.token_ids[: len(prompt)]).startswith("<|im_start|>user\nHi there")


def test_continuation_feeds_only_new_tokens_and_rewrite_breaks(recording, tok):
    async def main():
        async with ChatServer(recording, tok, open_sessions=False) as server:
            # a training session (the run's sampling), reached by its base-URL path
            session = server.open_session(sampling=SamplingParams(max_tokens=6, seed=1))
            c = openai.AsyncOpenAI(base_url=server.session_url(session), api_key="unused", max_retries=0)
            with pytest.raises(openai.NotFoundError):  # no session behind an unknown key
                await client(server).chat.completions.create(model="agentax", messages=[{"role": "user", "content": "x"}])
            msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "One"}]
            r1 = await c.chat.completions.create(model="agentax", messages=msgs, max_tokens=6, seed=1)
            msgs += [r1.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": [{"type": "text", "text": "Two"}]}]
            await c.chat.completions.create(model="agentax", messages=msgs, max_tokens=6, seed=1)
            mid = session.trajectory(0.0, TrajectoryStatus.OK)
            # a rewrite: the agent drops the first exchange
            await c.chat.completions.create(
                model="agentax", messages=[{"role": "user", "content": "Three"}], max_tokens=6, seed=1)
            await c.close()
            return mid, session

    mid, session = run(main())
    (p1, s1, c1), (p2, s2, c2), (p3, s3, c3) = recording.calls
    assert s1 is None and s2 == c1.sequence_id and s3 is None
    # the second call prefilled only the new user turn, not the history
    suffix = tok.decode(p2)
    assert "Two" in suffix and "One" not in suffix and "Be brief" not in suffix
    np.testing.assert_array_equal(generated(mid), np.concatenate([c1.token_ids, c2.token_ids]))
    np.testing.assert_array_equal(mid.token_ids, np.concatenate([p1, c1.token_ids, p2, c2.token_ids]))
    traj = session.trajectory(0.0, TrajectoryStatus.OK)
    assert traj.info["segment_breaks"] == 1 and traj.info["segments"] == 2
    np.testing.assert_array_equal(generated(traj), c3.token_ids)
    (earlier,) = traj.info["earlier_segments"]
    np.testing.assert_array_equal(earlier["token_ids"], mid.token_ids)


def test_tools_round_trip_and_streaming(tok):
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"6*7"}}</tool_call>'
    eng = ScriptedEngine(tok, [call, "42", call, "42"])

    async def main():
        async with ChatServer(eng, tok) as server:
            c = client(server)
            msgs = [{"role": "user", "content": "What is 6*7?"}]
            r = await c.chat.completions.create(model="agentax", messages=msgs, tools=[CALC])
            m = r.choices[0].message
            assert r.choices[0].finish_reason == "tool_calls" and m.content is None
            (tc,) = m.tool_calls
            assert tc.function.name == "calculator" and json.loads(tc.function.arguments) == {"expression": "6*7"}
            msgs += [m.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": tc.id, "content": "42"}]
            r2 = await c.chat.completions.create(model="agentax", messages=msgs, tools=[CALC])
            assert r2.choices[0].message.content == "42" and r2.choices[0].finish_reason == "stop"
            # the same exchange streamed, in another session
            s = client(server, "k2")
            chunks = [ch async for ch in await s.chat.completions.create(
                model="agentax", messages=msgs[:1], tools=[CALC], stream=True,
                stream_options={"include_usage": True})]
            await c.close()
            await s.close()
            return chunks, server.session("k1")

    chunks, session = run(main())
    # the continuation fed only the tool message, on the same engine sequence
    assert eng.calls[1][1] == 1 and "<tool_response>42</tool_response>" in tok.decode(eng.calls[1][0])
    assert "What is" not in tok.decode(eng.calls[1][0])
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert deltas[0].role == "assistant"
    (tc,) = [t for d in deltas if d.tool_calls for t in d.tool_calls]
    assert tc.function.name == "calculator"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == len(tok.encode(call)) + 1
    traj = session.trajectory(1.0, TrajectoryStatus.OK)
    assert [bool(t.action.tool_calls) for t in traj.turns] == [True, False]
    assert traj.info["segments"] == 1 and traj.info["final_answer"] == "42"


def test_n_choices(recording, tok):
    async def main():
        async with ChatServer(recording, tok) as server:
            c = client(server)
            r = await c.chat.completions.create(
                model="agentax", messages=[{"role": "user", "content": "Count"}], n=3, max_tokens=10,
                temperature=1.0, seed=3)
            await c.close()
            return r, server.session("k1")

    r, session = run(main())
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert len(recording.calls) == 3
    traj = session.trajectory(0.0, TrajectoryStatus.OK)
    # choice 0 continues the session and is the one recorded, token for token
    assert any(np.array_equal(c.token_ids, generated(traj)) for _, _, c in recording.calls)
    assert r.choices[0].message.content == tok.decode(generated(traj)[:-1] if generated(traj)[-1] in tok.eos_token_ids else generated(traj))
    assert len({tuple(c.token_ids) for _, _, c in recording.calls}) > 1  # different seeds
    assert r.usage.completion_tokens == sum(c.num_tokens for _, _, c in recording.calls)


def test_bad_requests_get_openai_errors_and_do_not_harm_others(recording, tok):
    async def main():
        async with ChatServer(recording, tok, max_request_bytes=20_000) as server:
            c = client(server)
            msgs = [{"role": "user", "content": "hi"}]
            with pytest.raises(openai.BadRequestError) as e:
                await c.chat.completions.create(model="agentax", messages=msgs, presence_penalty=0.5)
            assert "presence_penalty" in str(e.value) and e.value.code == "unsupported_parameter"
            with pytest.raises(openai.BadRequestError, match="top_logprobs"):
                await c.chat.completions.create(model="agentax", messages=msgs, logprobs=True, top_logprobs=21)
            with pytest.raises(openai.BadRequestError, match="tool_choice"):
                await c.chat.completions.create(model="agentax", messages=msgs, tools=[CALC],
                                                tool_choice={"type": "function", "function": {"name": "nope"}})
            with pytest.raises(openai.BadRequestError, match="context"):
                await c.chat.completions.create(model="agentax", messages=[{"role": "user", "content": "x" * 900}])
            url = f"{server.url}/v1/chat/completions"
            big = await asyncio.to_thread(http, url, b"{" + b" " * 30_000)
            bad = await asyncio.to_thread(http, url, b"{not json")
            models = await asyncio.to_thread(http, f"{server.url}/v1/models")
            assert big[0] == 413 and bad[0] == 400
            assert bad[1]["error"]["type"] == "invalid_request_error"
            assert models[1]["data"][0]["id"] == "agentax"
            ok = await c.chat.completions.create(model="agentax", messages=msgs, max_tokens=4)
            await c.close()
            return ok

    assert run(main()).choices[0].message.content is not None


def test_concurrent_sessions_stay_separate(recording, tok):
    words = ["apple", "brick", "cloud", "delta", "ember", "fjord"]

    async def agent(server, w):
        c = client(server, key=f"key-{w}")
        msgs = [{"role": "user", "content": f"Say {w}"}]
        r = await c.chat.completions.create(model="agentax", messages=msgs, max_tokens=8, seed=1)
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": w * 2}]
        await c.chat.completions.create(model="agentax", messages=msgs, max_tokens=8, seed=1)
        await c.close()

    async def main():
        async with ChatServer(recording, tok) as server:
            await asyncio.gather(*(agent(server, w) for w in words))
            return {w: server.session(f"key-{w}").trajectory(0.0, TrajectoryStatus.OK) for w in words}

    trajs = run(main())
    by_seq = {}
    for _, _, c in recording.calls:
        by_seq.setdefault(c.sequence_id, []).append(c)
    for w, traj in trajs.items():
        text = tok.decode(traj.token_ids[traj.loss_mask == 0])
        assert f"Say {w}" in text and w * 2 in text
        assert not any(o in text for o in words if o != w)
        assert traj.info["segments"] == 1
        # its generated ids are exactly the two completions of one engine sequence
        (comps,) = [cs for cs in by_seq.values()
                    if np.array_equal(np.concatenate([x.token_ids for x in cs]), generated(traj))]
        assert len(comps) == 2


def test_stop_strings_are_cut_from_content(tok):
    eng = ScriptedEngine(tok, ["hello world, again"])

    async def main():
        async with ChatServer(eng, tok) as server:
            c = client(server)
            r = await c.chat.completions.create(model="agentax", messages=[{"role": "user", "content": "hi"}],
                                                stop=["wor", "zzz"], max_completion_tokens=40)
            await c.close()
            return r, server.session("k1").trajectory(0.0, TrajectoryStatus.OK)

    r, traj = run(main())
    assert r.choices[0].message.content == "hello " and r.choices[0].finish_reason == "stop"
    # the recorded stream keeps every generated token (the engine's ids, not the cut text)
    assert tok.decode(generated(traj)[:-1]) == "hello world, again"
