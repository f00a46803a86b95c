"""`agentax.demos` records demonstrations through the real environment and agent; on the
calculator and FrozenLake it reproduces the shipped demonstrations' token streams."""

from __future__ import annotations

import random

import pytest

from agentax.demos import click_target, record, record_many
from agentax.records import Observation, Task, ToolCall
from agentax.text import ByteTokenizer, render_conversation


def _tokens(tok, convs, tools=None):
    return [list(render_conversation(tok, c, tools=tools).token_ids) for c in convs]


def test_calculator_recording_reproduces_the_shipped_demonstrations():
    from agentax.recipes import calculator
    from agentax.recipes._calculator import _near_miss

    train, _ = calculator.tasks(num_train=40, num_eval=0, seed=3)
    shipped = calculator.demos(train, 40, seed=7)
    mix = calculator.DEMO_MIX
    rng = random.Random(7)

    def demonstrator(observation: Observation, task: Task):
        """The shipped sloppy demonstrator, as a policy of what the agent is shown."""
        value = int(task.answer)
        if observation.tool_results:  # the calculator answered: copy it (or miscopy it)
            return _near_miss(rng, value) if rng.random() < mix.miscopy_rate else str(value)
        rate = mix.tool_rate_mul if task.meta["op"] == "*" else mix.tool_rate_add
        if rng.random() < rate:
            return ToolCall(name="calc", arguments={"expr": task.meta["expression"]})
        return f"about {round(value, -1) if abs(value) >= 10 else value}"

    recorded = record_many(calculator.make_env, calculator.make_agent, train, demonstrator)
    assert len(recorded) == len(shipped) == 40
    tools = calculator.make_agent().tools
    tok = ByteTokenizer()
    assert _tokens(tok, recorded, tools) == _tokens(tok, shipped, tools)
    assert any(len(c) == 4 for c in recorded) and any(len(c) == 2 for c in recorded)


def test_frozen_lake_recording_reproduces_the_shipped_demonstrations():
    from agentax.agents import FrozenLakeAgent
    from agentax.recipes import frozen_lake

    train, _ = frozen_lake.tasks(num_train=24, num_eval=0, seed=5)
    shipped = frozen_lake.demos(train, 24, seed=11)
    rng = random.Random(11)

    def planner(observation: Observation, task: Task) -> str:
        """The shipped noisy planner: a shortest-path move, a random one with p=0.25."""
        desc = task.meta["map"]
        grid = observation.content.splitlines()[:len(desc)]
        pos = next((r, row.index("P")) for r, row in enumerate(grid) if "P" in row)
        action = frozen_lake.shortest_path_action(desc, pos)
        if action is None or rng.random() < 0.25:
            action = rng.randrange(4)
        return FrozenLakeAgent.action_name(action)

    recorded = record_many(frozen_lake.make_env, frozen_lake.make_agent, train, planner)
    tok = ByteTokenizer()
    assert _tokens(tok, recorded) == _tokens(tok, shipped)
    assert any(len(c) > 3 for c in recorded)


def test_a_list_of_replies_and_the_errors_a_user_can_fix():
    from agentax.recipes import calculator

    task = calculator.tasks(num_train=1, num_eval=0, seed=0)[0][0]
    demo = record(calculator.make_env(), calculator.make_agent(), task,
                  [ToolCall(name="calc", arguments={"expr": task.meta["expression"]}), task.answer])
    assert demo.done and demo.reward == 1.0 and demo.steps == 2
    assert [m.role for m in demo.messages] == ["user", "assistant", "tool", "assistant"]
    assert demo.messages[1].tool_calls[0].name == "calc" and demo.messages[2].content == task.answer
    with pytest.raises(ValueError, match="replies ran out"):
        record(calculator.make_env(), calculator.make_agent(), task,
               [ToolCall(name="calc", arguments={"expr": "1+1"})])
    with pytest.raises(ValueError, match="cannot parse"):
        record(calculator.make_env(), calculator.make_agent(), task, ['<tool_call>{"name": </tool_call>'])


def test_click_target_finds_the_control_a_description_names():
    page = ('Click the "Cancel" button.\n[3] button "OK"\n[4] button "Cancel"\n'
            '[5] input text "Your name"\n[6] link "Cancel order"')
    task = Task(id="t", prompt="", answer="Cancel")
    obs = Observation(content=page)
    assert click_target(lambda t: t.answer)(obs, task) == "click 4"  # equal name beats contains
    assert click_target("your NAME", text="Ada")(obs, task) == 'type 5 "Ada"'
    assert click_target("order")(obs, task) == "click 6"
    with pytest.raises(ValueError, match=r"no single control .* \[3\] button 'OK'"):
        click_target("Submit")(obs, task)
