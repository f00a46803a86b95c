"""Agents: conversation bookkeeping, tool-call parsing, counting of bad calls, custom hooks."""

from __future__ import annotations

import pytest

from agentax.agents import Agent, ModelAgent, ToolAgent, tool_schemas
from agentax.agents.testing import ScriptedModel
from agentax.records import Action, Message, Observation, Task, ToolResult
from agentax.tools import ToolRegistry, calculator

TASK = Task(id="t", prompt="hi")


def test_model_agent_keeps_the_conversation():
    agent = ModelAgent(system_prompt="Be nice.")
    assert agent.reset(TASK) == [Message(role="system", content="Be nice.")]
    assert agent.observe(Observation(content="Hello")) == [Message(role="user", content="Hello")]
    action = agent.act("  Hi there!\n")
    assert action == Action(text="  Hi there!\n", final_answer="Hi there!")
    agent.observe(Observation(content="Bye"))
    assert [m.role for m in agent.messages] == ["system", "user", "assistant", "user"]
    assert agent.tools is None and agent.stats["replies"] == 1
    agent.reset(TASK)  # a new episode starts from scratch
    assert len(agent.messages) == 1
    with pytest.raises(TypeError, match="Observation"):
        agent.observe("Hello")


def test_tool_results_become_tool_messages():
    agent = ModelAgent()
    agent.reset(TASK)
    new = agent.observe(
        Observation(
            tool_results=(ToolResult(name="a", content="1", call_id="c1"), ToolResult(name="b", content="2", ok=False)),
            content="Note: b failed.",
        )
    )
    assert [(m.role, m.name, m.tool_call_id, m.content) for m in new] == [
        ("tool", "a", "c1", "1"),
        ("tool", "b", None, "2"),
        ("user", None, None, "Note: b failed."),
    ]


def test_tool_schemas_from_registry_tools_and_dicts():
    expected = calculator.schema()
    assert tool_schemas(ToolRegistry([calculator])) == [expected]
    assert tool_schemas([calculator]) == [expected]
    assert tool_schemas([expected["function"]]) == [expected]  # bare function dict is wrapped
    with pytest.raises(TypeError, match="cannot read a tool schema"):
        tool_schemas([42])
    with pytest.raises(ValueError, match="at least one tool"):
        ToolAgent([])
    with pytest.raises(ValueError, match="unknown tool-call format"):
        ToolAgent([calculator], tool_format="smoke-signals")


def test_tool_agent_parses_hermes_calls_and_answers():
    agent = ToolAgent([calculator])
    agent.reset(TASK)
    a = agent.act('Let me compute.<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>')
    assert a.final_answer is None and a.tool_calls[0].name == "calculator" and a.tool_calls[0].id == "call_1"
    last = agent.messages[-1]
    assert last.role == "assistant" and last.tool_calls == a.tool_calls and "Let me compute." in last.content
    b = agent.act("The answer is 2.")
    assert b.final_answer == "The answer is 2." and not b.tool_calls
    assert agent.stats["tool_calls"] == 1 and agent.stats["parse_errors"] == 0


def test_tool_agent_counts_broken_and_unknown_calls():
    agent = ToolAgent([calculator])
    agent.reset(TASK)
    a = agent.act('<tool_call>{"name": "calculator", "arguments": </tool_call><tool_call>{"name": "rm", "arguments": {}}</tool_call>')
    assert len(a.parse_errors) == 1 and [c.name for c in a.tool_calls] == ["rm"]
    assert a.final_answer is None  # a broken call is not an answer: the env reports the error
    assert agent.stats["parse_errors"] == 1 and agent.stats["unknown_tools"] == 1
    assert '{"name": "calculator", "arguments":' in agent.messages[-1].content  # the broken text stays visible


def test_tool_agent_llama3_format():
    agent = ToolAgent([calculator], tool_format="llama3")
    agent.reset(TASK)
    a = agent.act('{"name": "calculator", "parameters": {"expression": "6*7"}}')
    assert a.tool_calls[0].arguments == {"expression": "6*7"}


def test_custom_agent_by_overriding_hooks():
    class Shouty(Agent):
        def system_prompt_for(self, task):
            return f"Task {task.id}: answer in capitals."

        def parse_reply(self, reply):
            return Action(text=reply, final_answer=reply.upper(), value=len(reply))

    agent = Shouty()
    agent.reset(TASK)
    assert agent.messages[0].content == "Task t: answer in capitals."
    assert agent.act("ok").final_answer == "OK"


def test_scripted_model_runs_out_loudly():
    model = ScriptedModel(["a"])
    assert model([]) == "a"
    with pytest.raises(IndexError, match="1 scripted"):
        model([])
    with pytest.raises(ValueError, match="tokenizer"):
        ScriptedModel(["a"]).complete([])
