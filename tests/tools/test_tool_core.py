"""Tool construction from typed functions, bounded calls that never raise, and the registry."""

import asyncio
import time
from typing import Literal

import pytest

from agentax.records import ToolCall, ToolResult
from agentax.tools import Tool, ToolRegistry, tool, truncate_output


def run(coro):
    return asyncio.run(coro)


def add(a: int, b: float = 1.5, mode: Literal["x", "y"] = "x", tags: list[str] | None = None) -> float:
    """Adds two numbers.

    More detail here.

    Args:
        a: The first
            number, on two lines.
        b (float): The second number.
        mode: A mode.
        tags: Optional labels.

    Returns:
        The sum.
    """
    return a + b


def test_schema_from_signature_and_docstring():
    t = tool(add)
    s = t.schema()
    assert s["type"] == "function" and s["function"]["name"] == "add"
    assert s["function"]["description"] == "Adds two numbers.\n\nMore detail here."
    params = s["function"]["parameters"]
    assert params["required"] == ["a"]
    assert params["properties"]["a"] == {"type": "integer", "description": "The first number, on two lines."}
    assert params["properties"]["b"]["type"] == "number" and params["properties"]["b"]["default"] == 1.5
    assert params["properties"]["mode"]["enum"] == ["x", "y"]
    assert params["properties"]["tags"]["type"] == "array"
    assert params["properties"]["tags"]["items"] == {"type": "string"}
    assert params["additionalProperties"] is False


def test_decorator_with_options_and_untyped_parameter_rejected():
    @tool(name="renamed", timeout_s=3.0)
    def f(x: str) -> str:
        """Echo."""
        return x

    assert isinstance(f, Tool) and f.name == "renamed" and f.timeout_s == 3.0
    with pytest.raises(TypeError, match="needs a type annotation"):
        tool(lambda x: x)
    with pytest.raises(ValueError, match="tool name"):
        tool(add, name="bad name!")


def test_call_validates_arguments():
    t = tool(add)
    ok = run(t.call({"a": 2, "b": 3}, call_id="c1"))
    assert ok.ok and ok.content == "5.0" and ok.call_id == "c1" and ok.name == "add"
    assert run(t.call('{"a": 2}')).content == "3.5"  # raw JSON string accepted
    for bad, needle in [({}, "missing required"), ({"a": "two"}, "must be an integer"),
                        ({"a": 1, "zz": 1}, "unknown argument"), ({"a": 1, "mode": "q"}, "must be one of"),
                        ("{not json", "not valid JSON"), ([1, 2], "must be a JSON object"),
                        ({"a": True}, "must be an integer")]:
        r = run(t.call(bad))
        assert not r.ok and r.error == "bad_arguments" and needle in r.content, (bad, r)


def test_exceptions_timeouts_and_huge_output_become_results():
    @tool
    def boom(x: int) -> str:
        """Fails."""
        raise RuntimeError(f"kaput {x}")

    @tool(timeout_s=0.2)
    async def slow() -> str:
        """Sleeps."""
        await asyncio.sleep(30)
        return "never"

    @tool(timeout_s=0.2)
    def slow_sync() -> str:
        """Sleeps in a thread."""
        time.sleep(0.6)
        return "late"

    @tool(max_output_chars=200)
    def loud() -> str:
        """Prints a lot."""
        return "a" * 10_000 + "END"

    r = run(boom.call({"x": 3}))
    assert (r.ok, r.error) == (False, "crashed") and "RuntimeError: kaput 3" in r.content
    t0 = time.monotonic()
    r = run(slow.call({}))
    assert (r.ok, r.error) == (False, "timeout") and time.monotonic() - t0 < 2
    r = run(slow_sync.call({}))
    assert r.error == "timeout" and "0.2" in r.content
    r = run(loud.call({}))
    assert r.ok and len(r.content) <= 200 and "truncated" in r.content and r.content.endswith("END")


def test_tool_may_return_tool_result_or_json_value():
    @tool
    def refuse() -> ToolResult:
        """Refuses."""
        return ToolResult(name="x", content="nope", ok=False, error="denied")

    @tool
    def data() -> dict:
        """Returns data."""
        return {"k": [1, 2]}

    r = run(refuse.call({}, call_id="7"))
    assert (r.name, r.ok, r.error, r.call_id) == ("refuse", False, "denied", "7")
    assert run(data.call({})).content == '{"k": [1, 2]}'


def test_truncate_output_keeps_head_and_tail():
    text = "".join(str(i % 10) for i in range(5000))
    out = truncate_output(text, 300)
    assert len(out) <= 300 and out.startswith(text[:100]) and out.endswith(text[-50:])
    assert truncate_output("short", 300) == "short"


def test_registry_dispatch_and_errors():
    reg = ToolRegistry([tool(add)])
    assert reg.names == ("add",) and "add" in reg and reg.get("nope") is None
    assert reg.schemas()[0]["function"]["name"] == "add"
    r = run(reg.call(ToolCall(name="add", arguments={"a": 1}, id="i")))
    assert r.ok and r.content == "2.5" and r.call_id == "i"
    r = run(reg.call(ToolCall(name="ad", arguments={}, id="j")))
    assert (r.ok, r.error, r.call_id) == (False, "unknown_tool", "j") and "Did you mean 'add'" in r.content
    with pytest.raises(ValueError, match="already registered"):
        reg.register(tool(add))
