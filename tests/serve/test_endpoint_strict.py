"""The endpoint is strict the way OpenAI's is: unknown models, unknown routes and wrong methods,
missing or mistyped message content, pathological JSON and an over-long conversation all get
OpenAI-shaped errors (never a 200, a plain-text reply or a 500), checked with the real `openai`
SDK where it can send the request and with raw HTTP where it cannot."""

from __future__ import annotations

import argparse
import asyncio
import json
import urllib.error
import urllib.request

import openai
import pytest
from serve_helpers import ScriptedEngine

from agentax.serve import ChatServer

ERROR_KEYS = {"message", "type", "param", "code"}


def run(coro):
    return asyncio.run(coro)


def client(server, key="k1"):
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def http(url, body: bytes | None = None, method: str | None = None):
    """(status, headers, JSON body) of a raw request, outside the SDK (to send what it never would)."""
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Authorization": "Bearer k9", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def assert_openai_error(body, type_="invalid_request_error"):
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    assert body["error"]["type"] == type_ and body["error"]["message"]


def test_unknown_model_is_404_model_not_found_and_models_can_be_retrieved(tok):
    eng = ScriptedEngine(tok, ["hello", "hi"])

    async def main():
        async with ChatServer(eng, tok, model_name="org/tiny-1") as server:
            c = client(server)
            msgs = [{"role": "user", "content": "hi"}]
            with pytest.raises(openai.NotFoundError) as e:
                await c.chat.completions.create(model="gpt-4o", messages=msgs)
            assert e.value.code == "model_not_found" and e.value.type == "invalid_request_error"
            assert "gpt-4o" in e.value.message and "org/tiny-1" in e.value.message
            assert not eng.calls  # the engine never saw it
            listed = [m.id for m in (await c.models.list()).data]
            assert listed == ["org/tiny-1"]
            m = await c.models.retrieve("org/tiny-1")  # a slash in the id is part of it
            assert (m.id, m.object, m.owned_by) == ("org/tiny-1", "model", "agentax")
            with pytest.raises(openai.NotFoundError) as e:
                await c.models.retrieve("gpt-4o")
            assert e.value.code == "model_not_found"
            # the listed name is served, over /v1 and over a session path alike
            r = await c.chat.completions.create(model=listed[0], messages=msgs)
            assert r.model == "org/tiny-1" and r.choices[0].message.content == "hello"
            s = server.open_session()
            direct = await asyncio.to_thread(http, f"{server.session_url(s)}/models/org/tiny-1")
            # no model at all: a 400 naming the field
            missing = await asyncio.to_thread(
                http, f"{server.url}/v1/chat/completions", json.dumps({"messages": msgs}).encode())
            await c.close()
            return direct, missing

    direct, missing = run(main())
    assert direct[0] == 200 and direct[2]["id"] == "org/tiny-1"
    assert missing[0] == 400 and missing[2]["error"]["param"] == "model"
    assert_openai_error(missing[2])


def test_training_endpoint_accepts_any_model_name(tok):
    """An agent trained unchanged keeps whatever model name it was written with."""
    eng = ScriptedEngine(tok, ["ok"])

    async def main():
        async with ChatServer(eng, tok, open_sessions=False, check_model=False) as server:
            s = server.open_session()
            c = openai.AsyncOpenAI(base_url=server.session_url(s), api_key="unused", max_retries=0)
            r = await c.chat.completions.create(model="gpt-4o-mini",
                                                messages=[{"role": "user", "content": "hi"}])
            await c.close()
            return r

    assert run(main()).choices[0].message.content == "ok"


def test_unknown_path_and_wrong_method_are_openai_shaped(tok):
    async def main():
        async with ChatServer(ScriptedEngine(tok, []), tok) as server:
            c = client(server)
            with pytest.raises(openai.NotFoundError) as nf:  # legacy completions: not served
                await c.completions.create(model="agentax", prompt="hi")
            with pytest.raises(openai.APIStatusError) as na:  # DELETE /v1/models/agentax
                await c.models.delete("agentax")
            await c.close()
            raw = [await asyncio.to_thread(http, f"{server.url}{path}", None, method)
                   for path, method in [("/v1/chat/completions", "GET"), ("/v1/models", "POST"),
                                        ("/nowhere", "GET"), ("/v1/embeddings", "POST")]]
            return nf.value, na.value, raw

    nf, na, raw = run(main())
    assert nf.status_code == 404 and nf.type == "invalid_request_error" and "/v1/completions" in nf.message
    assert na.status_code == 405 and "DELETE" in na.message and na.type == "invalid_request_error"
    (s1, h1, b1), (s2, h2, b2), (s3, _, b3), (s4, _, b4) = raw
    assert (s1, s2, s3, s4) == (405, 405, 404, 404)
    assert "POST" in h1["allow"] and "GET" in h2["allow"]  # the Allow header is kept
    for b in (b1, b2, b3, b4):
        assert_openai_error(b)


@pytest.mark.parametrize("message,why", [
    ({"role": "user"}, "required"),
    ({"role": "user", "content": None}, "required"),
    ({"role": "user", "content": 42}, "string"),
    ({"role": "user", "content": {"text": "hi"}}, "string"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "text"),
])
def test_user_message_without_valid_content_is_400_naming_the_field(tok, message, why):
    eng = ScriptedEngine(tok, ["fine"])

    async def main():
        async with ChatServer(eng, tok) as server:
            c = client(server)
            with pytest.raises(openai.BadRequestError) as e:
                await c.chat.completions.create(model="agentax", messages=[message])
            # a following good request in the same session is answered
            ok = await c.chat.completions.create(model="agentax",
                                                 messages=[{"role": "user", "content": "hi"}])
            await c.close()
            return e.value, ok

    err, ok = run(main())
    assert err.param == "messages[0].content" and err.type == "invalid_request_error"
    assert "messages[0].content" in err.message and why in err.message
    assert ok.choices[0].message.content == "fine" and len(eng.calls) == 1


def test_deep_nesting_and_lone_surrogates_are_400_not_500(tok):
    eng = ScriptedEngine(tok, ["still here"])
    deep = b'{"model": "agentax", "messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    node: dict = tool["function"]["parameters"]
    for _ in range(100):  # parses fine, but deeper than any schema needs
        node["items"] = {}
        node = node["items"]
    deep_tool = json.dumps({"model": "agentax", "messages": [{"role": "user", "content": "x"}],
                            "tools": [tool]}).encode()
    surrogate = b'{"model": "agentax", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    surrogate_key = b'{"model": "agentax", "messages": [{"role": "user", "content": "x"}], "\\udfff": 1}'
    pair = b'{"model": "agentax", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'

    async def main():
        async with ChatServer(eng, tok) as server:
            url = f"{server.url}/v1/chat/completions"
            out = [await asyncio.to_thread(http, url, b) for b in (deep, deep_tool, surrogate, surrogate_key)]
            ok = await asyncio.to_thread(http, url, pair)  # a proper surrogate pair is an emoji
            return out, ok

    out, ok = run(main())
    for status, _, body in out:
        assert status == 400, body
        assert_openai_error(body)
    assert "deep" in out[0][2]["error"]["message"] and "deep" in out[1][2]["error"]["message"]
    assert out[2][2]["error"]["param"] == "messages[0].content"
    assert "surrogate" in out[2][2]["error"]["message"] and "surrogate" in out[3][2]["error"]["message"]
    assert ok[0] == 200 and ok[2]["choices"][0]["message"]["content"] == "still here"
    assert "\U0001F600" in tok.decode(eng.calls[0][0])


def test_context_length_exceeded_names_the_serve_flag(engine, tok):
    from agentax.cli._serve import add_parser

    async def main():
        async with ChatServer(engine, tok) as server:
            c = client(server)
            with pytest.raises(openai.BadRequestError) as e:
                await c.chat.completions.create(model="agentax",
                                                messages=[{"role": "user", "content": "x" * 900}])
            await c.close()
            return e.value

    err = run(main())
    assert err.code == "context_length_exceeded" and err.param == "messages"
    assert "max_seq_len=512" in err.message  # what the limit is
    assert "agentax serve" in err.message and "--max-seq-len" in err.message  # and what to change
    # the flag it names is the command's real one
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert parser.parse_args(["serve", "somewhere", "--max-seq-len", "4096"]).max_seq_len == 4096
