"""Token-by-token streaming with the real `openai` SDK: pieces leave while the engine generates,
concatenate to the non-streamed text, never leak a stop string, a tool-call tag or half a UTF-8
character, and a client that disconnects frees its slot."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import openai
import pytest
from serve_helpers import ScriptedEngine

from agentax.records import Completion, SamplingParams, TrajectoryStatus
from agentax.serve import ChatServer

CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluates arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}
MSGS = [{"role": "user", "content": "Tell me a story"}]


def run(coro):
    return asyncio.run(coro)


def client(server, key="k1"):
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


class Gated:
    """Wraps the real engine: `stream` holds back its final `Completion` until `gate` is set,
    so a client can only see a piece before it if the pieces leave while generating."""

    def __init__(self, engine):
        self.engine, self.gate = engine, asyncio.Event()

    async def generate(self, *args, **kw):
        return await self.engine.generate(*args, **kw)

    async def stream(self, *args, **kw):
        async for item in self.engine.stream(*args, **kw):
            if isinstance(item, Completion):
                await asyncio.wait_for(self.gate.wait(), 60)
            yield item

    def release(self, sequence_id):
        self.engine.release(sequence_id)


class ScriptedStream(ScriptedEngine):
    """A scripted engine that also streams, `per` tokens a chunk."""

    per = 3

    async def stream(self, prompt_ids, params=None, *, sequence_id=None):
        from agentax.engine import TokenChunk

        c = await self.generate(prompt_ids, params, sequence_id=sequence_id)
        for i in range(0, c.num_tokens, self.per):
            await asyncio.sleep(0)
            sl = slice(i, i + self.per)
            yield TokenChunk(token_ids=c.token_ids[sl], logprobs=c.logprobs[sl], versions=c.versions[sl])
        yield c


async def pieces_of(stream):
    """(content pieces, tool calls, finish reasons, chunks) of a streamed reply."""
    pieces, calls, finish, chunks = [], [], [], []
    async for ch in stream:
        chunks.append(ch)
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        if d.content:
            pieces.append(d.content)
        calls += d.tool_calls or []
        if ch.choices[0].finish_reason:
            finish.append(ch.choices[0].finish_reason)
    return pieces, calls, finish, chunks


def test_pieces_leave_while_generating_and_equal_the_greedy_text(engine, tok):
    gated = Gated(engine)

    async def main():
        async with ChatServer(gated, tok) as server:
            want = await client(server, "plain").chat.completions.create(
                model="agentax", messages=MSGS, max_tokens=48, temperature=0.0)
            gated.gate.clear()
            pieces, order = [], []
            async for ch in await client(server).chat.completions.create(
                    model="agentax", messages=MSGS, max_tokens=48, temperature=0.0, stream=True,
                    stream_options={"include_usage": True}):
                if ch.choices and ch.choices[0].delta.content:
                    pieces.append(ch.choices[0].delta.content)
                    gated.gate.set()  # the engine's Completion is held until a piece arrived
                order.append(ch)
            return want, pieces, order, server.session("k1").trajectory(0.0, TrajectoryStatus.OK)

    want, pieces, chunks, traj = run(main())
    assert len(pieces) > 1  # several pieces, as the decode calls return
    assert "".join(pieces) == want.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == want.usage.completion_tokens
    assert traj.num_generated == want.usage.completion_tokens  # recorded token for token


def test_a_stop_string_is_never_streamed(engine, tok):
    async def main():
        async with ChatServer(engine, tok) as server:
            full = (await client(server, "full").chat.completions.create(
                model="agentax", messages=MSGS, max_tokens=40, temperature=0.0)).choices[0].message.content
            chars = [i for i in range(8, len(full) - 3) if "\ufffd" not in full[i: i + 3]]
            stop = full[chars[len(chars) // 2]: chars[len(chars) // 2] + 3]
            want = await client(server, "cut").chat.completions.create(
                model="agentax", messages=MSGS, max_tokens=40, temperature=0.0, stop=[stop])
            got = await pieces_of(await client(server).chat.completions.create(
                model="agentax", messages=MSGS, max_tokens=40, temperature=0.0, stop=[stop],
                stream=True))
            return full, stop, want, got

    full, stop, want, (pieces, _, finish, _) = run(main())
    assert "".join(pieces) == want.choices[0].message.content == full[: full.find(stop)]
    assert stop not in "".join(pieces) and finish == ["stop"]


def test_held_back_text_stop_prefix_utf8_and_tool_tags(tok):
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"6*7"}}</tool_call>'
    eng = ScriptedStream(tok, ["naïve café € ST then STOP and more", f"Let me see. {call}", "42"])

    async def main():
        async with ChatServer(eng, tok) as server:
            c = client(server)
            text = await pieces_of(await c.chat.completions.create(
                model="agentax", messages=MSGS, stop=["STOP"], stream=True))
            msgs = [{"role": "user", "content": "What is 6*7?"}]
            tool = await pieces_of(await client(server, "k2").chat.completions.create(
                model="agentax", messages=msgs, tools=[CALC], stream=True))
            # the SDK's accumulated message, sent back: it continues the recorded segment
            (tc,) = tool[1]
            msgs += [{"role": "assistant", "content": "".join(tool[0]),
                      "tool_calls": [{"id": tc.id, "type": "function", "function": {
                          "name": tc.function.name, "arguments": tc.function.arguments}}]},
                     {"role": "tool", "tool_call_id": tc.id, "content": "42"}]
            await client(server, "k2").chat.completions.create(model="agentax", messages=msgs,
                                                                tools=[CALC])
            return text, tool, server.session("k2").trajectory(0.0, TrajectoryStatus.OK)

    (pieces, _, finish, _), (tpieces, calls, tfinish, _), traj = run(main())
    assert "".join(pieces) == "naïve café € ST then " and finish == ["stop"]
    assert len(pieces) > 3 and not any("\ufffd" in p or "STOP" in p for p in pieces)
    assert "".join(tpieces) == "Let me see." and not any("<" in p for p in tpieces)
    assert calls[0].function.name == "calculator"
    assert json.loads(calls[0].function.arguments) == {"expression": "6*7"}
    assert tfinish == ["tool_calls"]
    assert eng.calls[2][1] == 2  # the third call continued the second's engine sequence
    assert traj.info["segments"] == 1 and traj.info["segment_breaks"] == 0


def test_a_client_that_disconnects_frees_its_slot(engine, tok):
    async def main():
        async with ChatServer(engine, tok) as server:
            c = client(server)
            before = engine.stats()
            stream = await c.chat.completions.create(model="agentax", messages=MSGS, max_tokens=400,
                                                     temperature=0.0, stream=True)
            async for ch in stream:
                if ch.choices and ch.choices[0].delta.content:
                    engine.pause()  # the request is mid-generation: it cannot finish now
                    break
            assert engine.stats().active_slots == 1
            await stream.close()
            for _ in range(500):  # the cancel is applied while the engine is paused
                await asyncio.sleep(0.01)
                if engine.stats().active_slots == 0:
                    break
            after = engine.stats()
            engine.resume()
            again = await c.chat.completions.create(model="agentax", messages=MSGS, max_tokens=4)
            return before, after, again

    before, after, again = run(main())
    assert after.active_slots == 0 and after.parked_slots == before.parked_slots
    assert after.failed == before.failed + 1 and after.completed == before.completed
    assert again.choices[0].message.content is not None  # the session serves on


def test_streamed_pieces_match_engine_tokens(engine, tok):
    """The recorded trajectory of a streamed call is the engine's ids, not re-tokenized text."""
    async def main():
        async with ChatServer(engine, tok) as server:
            await pieces_of(await client(server).chat.completions.create(
                model="agentax", messages=MSGS, max_tokens=24, temperature=0.0, stream=True))
            return server.session("k1").trajectory(0.0, TrajectoryStatus.OK)

    traj = run(main())
    gen = traj.token_ids[traj.loss_mask == 1]
    prompt = traj.token_ids[traj.loss_mask == 0]
    want = engine.generate_batch([prompt], SamplingParams(temperature=0.0, max_tokens=24))[0]
    np.testing.assert_array_equal(gen, want.token_ids)


def test_the_agents_sdk_streams_a_tool_loop(tok):
    """`Runner.run_streamed` of the OpenAI Agents SDK (stream=True on every call; its output_type
    makes the answer a validated json_schema reply, sent whole at the end) continues the session."""
    pytest.importorskip("agents")
    from agents import RunConfig, Runner

    from agentax.recipes import agents_sdk_calculator

    eng = ScriptedStream(tok, ['<tool_call>{"name":"calc","arguments":{"expr":"6*7"}}</tool_call>',
                               '{"response":42}'])

    async def main():
        async with ChatServer(eng, tok) as server:
            result = Runner.run_streamed(agents_sdk_calculator.build_agent(client(server)),
                                         "What is 6*7?", max_turns=3,
                                         run_config=RunConfig(tracing_disabled=True))
            events = [ev async for ev in result.stream_events()]
            return result.final_output, events, server.session("k1").counts

    final, events, counts = run(main())
    assert final == 42 and events
    assert counts["calls"] == 2 and counts["segment_breaks"] == 0
