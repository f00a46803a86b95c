"""The optional chat-completions fields, with the real `openai` SDK against the real server:
`top_logprobs` (a scoring pass over the real tiny engine's reply), `tool_choice`
(`none` / `auto` / `required` / a named function, validated), `parallel_tool_calls`,
`response_format` (`json_object` / `json_schema`, validated) and `stream_options.include_usage`."""

from __future__ import annotations

import asyncio
import json
import math

import openai
import pytest
from serve_helpers import ScriptedEngine

from agentax.serve import ChatServer

CALC = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"6*7"}}</tool_call>'
CALL_W = '<tool_call>{"name":"weather","arguments":{}}</tool_call>'
MSGS = [{"role": "user", "content": "What is 6*7?"}]


def run(coro):
    return asyncio.run(coro)


def client(server, key="k1"):
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def _check_top(content, k):
    """Every token's alternatives: k of them, best first, a sub-distribution; the sampled token,
    when among them, with the engine's own logprob (to float rounding)."""
    for entry in content:
        top = entry.top_logprobs
        assert len(top) == k
        vals = [t.logprob for t in top]
        assert vals == sorted(vals, reverse=True) and all(v <= 1e-6 for v in vals)
        assert sum(math.exp(v) for v in vals) <= 1.0 + 1e-4
        assert vals[0] >= entry.logprob - 1e-3  # nothing beats the best alternative
        same = [t.logprob for t in top if t.token == entry.token]
        if same and len(entry.token) == 1 and entry.token != "\ufffd":  # distinct text per id
            assert abs(same[0] - entry.logprob) < 2e-3, (entry, top)


def test_top_logprobs_score_the_reply(engine, tok):
    async def main():
        async with ChatServer(engine, tok) as server:
            c = client(server)
            greedy = await c.chat.completions.create(
                model="agentax", messages=[{"role": "user", "content": "Count"}], max_tokens=6,
                temperature=0, logprobs=True, top_logprobs=5)
            # a continuation (the context is the whole session), n=2, sampled at temperature 0.7
            msgs = [{"role": "user", "content": "Count"},
                    greedy.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "more"}]
            sampled = await c.chat.completions.create(
                model="agentax", messages=msgs, max_tokens=6, temperature=0.7, seed=1, n=2,
                logprobs=True, top_logprobs=20)
            breaks = server.session("k1").counts["segment_breaks"]
            plain = await c.chat.completions.create(
                model="agentax", messages=MSGS, max_tokens=3, logprobs=True)
            for bad in ({"top_logprobs": 21, "logprobs": True}, {"top_logprobs": 2}):
                with pytest.raises(openai.BadRequestError) as e:
                    await c.chat.completions.create(model="agentax", messages=MSGS, **bad)
                assert e.value.param == "top_logprobs"
            await c.close()
            return greedy, sampled, plain, breaks

    greedy, sampled, plain, breaks = run(main())
    content = greedy.choices[0].logprobs.content
    assert len(content) == greedy.usage.completion_tokens
    _check_top(content, 5)
    for entry in content:  # greedy: the sampled token is the best alternative
        assert entry.top_logprobs[0].token == entry.token
        assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 2e-3
    assert len(sampled.choices) == 2
    for ch in sampled.choices:
        _check_top(ch.logprobs.content, 20)
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    assert breaks == 0  # the scored continuation kept its segment


def test_top_logprobs_need_a_real_engine(tok):
    async def main():
        async with ChatServer(ScriptedEngine(tok, ["x"]), tok) as server:
            c = client(server)
            with pytest.raises(openai.BadRequestError) as e:
                await c.chat.completions.create(model="agentax", messages=MSGS, logprobs=True,
                                                top_logprobs=3)
            await c.close()
            return e.value

    err = run(main())
    assert err.param == "top_logprobs" and err.code == "unsupported_parameter"


def test_tool_choice_modes(tok):
    forced = {"type": "function", "function": {"name": "calculator"}}
    eng = ScriptedEngine(tok, [CALL, CALL, "no call", CALL_W, CALL, CALL, "plain", "plain"])

    async def main():
        async with ChatServer(eng, tok) as server:
            c = client(server)
            mk = c.chat.completions.create
            tools = [CALC, WEATHER]
            out = {"auto": await mk(model="agentax", messages=MSGS, tools=tools, tool_choice="auto"),
                   "required": await mk(model="agentax", messages=MSGS, tools=tools,
                                        tool_choice="required")}
            errs = {}
            with pytest.raises(openai.BadRequestError) as e:  # the model made no call
                await mk(model="agentax", messages=MSGS, tools=tools, tool_choice="required")
            errs["required"] = e.value
            with pytest.raises(openai.BadRequestError) as e:  # it called another function
                await mk(model="agentax", messages=MSGS, tools=tools, tool_choice=forced)
            errs["forced"] = e.value
            out["forced"] = await mk(model="agentax", messages=MSGS, tools=tools, tool_choice=forced)
            # none: the tools are not rendered and the reply is not parsed
            out["none"] = await mk(model="agentax", messages=MSGS, tools=tools, tool_choice="none")
            out["none_plain"] = await mk(model="agentax", messages=MSGS, tools=tools,
                                         tool_choice="none")
            # before the engine: a forced function not in tools; required without tools
            for bad in ({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "x"}}},
                        {"tool_choice": "required"}, {"tools": tools, "tool_choice": "always"}):
                with pytest.raises(openai.BadRequestError) as e:
                    await mk(model="agentax", messages=MSGS, **bad)
                assert e.value.param == "tool_choice", bad
            await c.close()
            return out, errs, server.session("k1")

    out, errs, session = run(main())
    for key in ("auto", "required", "forced"):
        (tc,) = out[key].choices[0].message.tool_calls
        assert tc.function.name == "calculator" and out[key].choices[0].finish_reason == "tool_calls"
    assert errs["required"].code == "tool_choice_not_satisfied" and errs["required"].param == "tool_choice"
    assert "weather" in errs["forced"].message and errs["forced"].code == "tool_choice_not_satisfied"
    assert out["none"].choices[0].message.tool_calls is None
    assert out["none"].choices[0].message.content == CALL and out["none"].choices[0].finish_reason == "stop"
    # only 'none' requests rendered no tools: the others' prompts list them
    rendered = [tok.decode(p) for p, _ in eng.calls]
    assert len(rendered) == 7  # the three bad requests never reached the engine
    assert all("weather" in r for r in rendered[:5]) and not any("weather" in r for r in rendered[5:])
    assert session.counts["segment_breaks"] >= 2  # the failed replies are kept, not continued


def test_parallel_tool_calls(tok):
    two = CALL + "\n" + CALL_W
    eng = ScriptedEngine(tok, [two, two])

    async def main():
        async with ChatServer(eng, tok) as server:
            c = client(server)
            both = await c.chat.completions.create(model="agentax", messages=MSGS,
                                                   tools=[CALC, WEATHER], parallel_tool_calls=True)
            first = await c.chat.completions.create(model="agentax", messages=MSGS,
                                                    tools=[CALC, WEATHER], parallel_tool_calls=False)
            await c.close()
            return both, first

    both, first = run(main())
    assert [t.function.name for t in both.choices[0].message.tool_calls] == ["calculator", "weather"]
    assert [t.function.name for t in first.choices[0].message.tool_calls] == ["calculator"]


def test_response_format_is_validated(tok):
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
        "type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}}}
    eng = ScriptedEngine(tok, ['{"answer": 42}', "forty-two", '[1, 2]', '{"answer": 42}',
                               '{"other": 1}', '"just text"'])

    async def main():
        async with ChatServer(eng, tok) as server:
            c = client(server)
            mk = c.chat.completions.create
            ok = await mk(model="agentax", messages=MSGS, response_format={"type": "json_object"})
            errs = []
            for fmt in ({"type": "json_object"}, {"type": "json_object"}):  # not JSON; not an object
                with pytest.raises(openai.BadRequestError) as e:
                    await mk(model="agentax", messages=MSGS, response_format=fmt)
                errs.append(e.value)
            ok_schema = await mk(model="agentax", messages=MSGS, response_format=schema)
            with pytest.raises(openai.BadRequestError) as e:  # a required key is missing
                await mk(model="agentax", messages=MSGS, response_format=schema)
            errs.append(e.value)
            text = await mk(model="agentax", messages=MSGS, response_format={"type": "text"})
            for bad in ({"type": "xml"}, {"type": "json_schema"},
                        {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "tuple"}}}):
                with pytest.raises(openai.BadRequestError) as e:
                    await mk(model="agentax", messages=MSGS, response_format=bad)
                assert e.value.param == "response_format", bad
            await c.close()
            return ok, ok_schema, text, errs

    ok, ok_schema, text, errs = run(main())
    assert json.loads(ok.choices[0].message.content) == {"answer": 42}
    assert json.loads(ok_schema.choices[0].message.content) == {"answer": 42}
    assert text.choices[0].message.content == '"just text"'
    for err in errs:
        assert err.param == "response_format" and err.code == "response_format_not_satisfied"
    assert "not valid JSON" in errs[0].message and "not an object" in errs[1].message
    assert "answer" in errs[2].message
    assert len(eng.calls) == 6


def test_stream_include_usage_and_unknown_fields(tok):
    eng = ScriptedEngine(tok, ["hello there", "hello there"])

    async def main():
        async with ChatServer(eng, tok) as server:
            c = client(server)
            with_usage = [ch async for ch in await c.chat.completions.create(
                model="agentax", messages=MSGS, stream=True, stream_options={"include_usage": True})]
            without = [ch async for ch in await c.chat.completions.create(
                model="agentax", messages=MSGS, stream=True)]
            errs = []
            for extra in ({"presence_penalty": 0.5}, {"logit_bias": {"1": 2}},
                          {"frequency_penalty": 1.0}, {"prediction": {"type": "content", "content": "x"}}):
                with pytest.raises(openai.BadRequestError) as e:
                    await c.chat.completions.create(model="agentax", messages=MSGS, **extra)
                errs.append((next(iter(extra)), e.value))
            await c.close()
            return with_usage, without, errs

    with_usage, without, errs = run(main())
    assert with_usage[-1].choices == [] and with_usage[-1].usage.completion_tokens == len("hello there") + 1
    assert with_usage[-1].usage.total_tokens == with_usage[-1].usage.prompt_tokens + len("hello there") + 1
    assert all(ch.usage is None for ch in without)
    assert "".join(ch.choices[0].delta.content or "" for ch in without if ch.choices) == "hello there"
    for field, err in errs:
        assert err.param == field and err.code == "unsupported_parameter" and field in err.message
