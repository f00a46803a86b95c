"""Tool-call parsers: exact results on known replies, round trips, and hypothesis fuzzing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentax.records import ToolCall, ToolCallError
from agentax.text import ParsedReply, format_tool_call, get_tool_parser, parse_tool_calls

JSON_SCALARS = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=12)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
CALLS = st.builds(
    lambda name, args: ToolCall(name=name, arguments=args),
    st.text(min_size=1, max_size=12).filter(lambda s: s.strip()),
    st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4),
)
TAGS = ["<tool_call>", "</tool_call>", "<|python_tag|>", "{", "}", ";", '"name"', ":", "\n"]
NOISY_TEXT = st.lists(st.sampled_from(TAGS) | st.text(max_size=10), max_size=12).map("".join)


def _check_shape(reply: ParsedReply) -> None:
    assert isinstance(reply.content, str)
    assert all(isinstance(c, ToolCall) and c.name.strip() and isinstance(c.arguments, dict) for c in reply.tool_calls)
    assert all(isinstance(e, ToolCallError) and e.message for e in reply.errors)


def test_hermes_several_calls_and_content():
    text = (
        "I'll check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": "</tool_call>"}}</tool_call> done'
    )
    reply = parse_tool_calls(text, "hermes")
    assert reply.content == "I'll check both.\n\n done"
    assert reply.tool_calls == (
        ToolCall(name="get_weather", arguments={"city": "Paris"}),
        ToolCall(name="add", arguments={"a": 1, "b": "</tool_call>"}),
    )
    assert reply.errors == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('<tool_call>{"name": "f", "arguments": {</tool_call>', "broken JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "f", "arguments": "nope"}</tool_call>', "is a string, not a JSON object"),
        ('<tool_call>["f"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "f", "arguments": {}}', "unclosed <tool_call>"),
        ('<tool_call>{"name": "f"} trailing</tool_call>', "unexpected text after the JSON object"),
        ("text </tool_call>", "without a matching <tool_call>"),
    ],
)
def test_hermes_malformed_calls_become_errors(text, message):
    reply = parse_tool_calls(text, "hermes")
    assert reply.tool_calls == () and len(reply.errors) == 1
    assert message in reply.errors[0].message


def test_hermes_recovers_after_an_unclosed_call():
    reply = parse_tool_calls('<tool_call>{"name": "a"\n<tool_call>{"name": "b", "arguments": {}}</tool_call>', "hermes")
    assert [c.name for c in reply.tool_calls] == ["b"] and "unclosed" in reply.errors[0].message


def test_hermes_accepts_string_encoded_arguments_and_missing_arguments():
    reply = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>{"name": "g"}</tool_call>')
    assert reply.tool_calls == (ToolCall(name="f", arguments={"x": 1}), ToolCall(name="g", arguments={}))


def test_llama3_formats():
    parse = get_tool_parser("llama3")
    one = parse('{"name": "get_weather", "parameters": {"city": "Rome"}}')
    assert one == ParsedReply(content="", tool_calls=(ToolCall(name="get_weather", arguments={"city": "Rome"}),))
    tagged = parse('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": [1]}}')
    assert [c.name for c in tagged.tool_calls] == ["a", "b"] and tagged.errors == ()
    assert parse("The answer is {42}.").content == "The answer is {42}." and parse("Plain.").tool_calls == ()
    trailing = parse('{"name": "a", "parameters": {}} and some words')
    assert trailing.content == "and some words" and len(trailing.tool_calls) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"name": "f", "parameters": {', "broken JSON"),
        ('{"parameters": {}}', 'no "name"'),
        ('{"name": "f", "parameters": 3}', "must be a JSON object"),
        ("<|python_tag|>brave_search.call(query='x')", "expected a JSON object"),
        ('<|python_tag|>{"name": "a", "parameters": {}}; oops', "expected a JSON object"),
    ],
)
def test_llama3_malformed_calls_become_errors(text, message):
    reply = parse_tool_calls(text, "llama3")
    assert len(reply.errors) == 1 and message in reply.errors[0].message


def test_unknown_format_and_non_text():
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'"):
        get_tool_parser("xml")
    reply = parse_tool_calls(None, "hermes")  # type: ignore[arg-type]
    assert reply.errors and reply.errors[0].message == "reply is not text"


@settings(max_examples=150, deadline=None)
@given(st.lists(CALLS, min_size=1, max_size=3), st.booleans(), st.text(max_size=20).filter(lambda s: "<tool_call>" not in s and "</tool_call>" not in s))
def test_hermes_round_trip(calls, compact, prefix):
    text = prefix + "".join(format_tool_call(c, "hermes", compact=compact) for c in calls)
    reply = parse_tool_calls(text, "hermes")
    assert reply.tool_calls == tuple(calls) and reply.errors == () and reply.content == prefix.strip()


@settings(max_examples=150, deadline=None)
@given(st.lists(CALLS, min_size=1, max_size=3), st.booleans())
def test_llama3_round_trip(calls, tagged):
    text = ("<|python_tag|>" if tagged else "") + "; ".join(format_tool_call(c, "llama3") for c in calls)
    reply = parse_tool_calls(text, "llama3")
    assert reply.tool_calls == tuple(calls) and reply.errors == () and reply.content == ""


@settings(max_examples=300, deadline=None)
@given(NOISY_TEXT, st.sampled_from(["hermes", "llama3"]))
def test_parsers_never_raise_on_arbitrary_text(text, fmt):
    _check_shape(get_tool_parser(fmt)(text))  # the raw parser itself, not only the guarded entry point


@settings(max_examples=300, deadline=None)
@given(CALLS, st.sampled_from(["hermes", "llama3"]), st.data())
def test_near_valid_calls_parse_or_error(call, fmt, data):
    valid = format_tool_call(call, fmt)
    cut = data.draw(st.integers(0, len(valid) - 1))
    mutation = data.draw(st.sampled_from(["truncate", "delete", "insert"]))
    if mutation == "truncate":
        text = valid[:cut]
    elif mutation == "delete":
        text = valid[:cut] + valid[cut + 1 :]
    else:
        text = valid[:cut] + data.draw(st.sampled_from(['"', "{", "}", ",", "<", "x", "\\"])) + valid[cut:]
    reply = get_tool_parser(fmt)(text)
    _check_shape(reply)
    if fmt == "hermes" and mutation == "truncate" and cut > len("<tool_call>"):
        assert reply.tool_calls == () and len(reply.errors) == 1  # a cut call is always reported
    for parsed in reply.tool_calls:  # whatever parsed is a real call, serializable again
        json.dumps(dict(parsed.arguments))
