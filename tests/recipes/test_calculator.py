"""The built-in calculator task: questions, reward, the sloppy demonstrator, fast rendering."""

from __future__ import annotations

import asyncio
import collections
import re

import numpy as np
import pytest

from agentax.cli import load_config
from agentax.run._build import build_suite_for
from agentax.recipes import calculator_demos, calculator_reward, calculator_tasks, render_examples
from agentax.recipes._calculator import compact_calculator
from agentax.recipes._render import _fast, _fast_headers
from agentax.records import Action, Message, Task, ToolCall
from agentax.text import ByteTokenizer, render_conversation
from agentax.tools._calculator import evaluate


def test_tasks_are_deterministic_distinct_and_correct():
    a, b = calculator_tasks(500, seed=3), calculator_tasks(500, seed=3)
    assert [t.prompt for t in a] == [t.prompt for t in b]
    assert len({t.prompt for t in a}) == 500
    for t in a:
        assert t.answer == str(evaluate(t.meta["expression"]))
        assert t.prompt == f"What is {t.meta['expression']}?"
    assert {t.meta["op"] for t in a} == {"+", "-", "*"}


def test_suite_held_out_tasks_are_not_trained_on():
    suite = build_suite_for(load_config(None, ["tasks.num_train=300", "tasks.num_eval=40"]))
    train = {t.prompt for t in suite.train_tasks}
    assert len(suite.eval_tasks) == 40 and not train & {t.prompt for t in suite.eval_tasks}
    demo_questions = {c[0].content for c in suite.demos(600, 1)}
    assert demo_questions <= train


def test_reward_is_exact_number():
    task = Task(id="t", prompt="What is 2+3?", answer="5")
    assert calculator_reward(task, " 5 ") == 1.0
    assert calculator_reward(task, "55") == 0.0 and calculator_reward(task, "5.0") == 0.0


def test_demonstrator_is_sloppy_in_the_documented_way():
    tasks = calculator_tasks(3000, seed=0)
    convs = calculator_demos(tasks, seed=1)
    by_op = collections.defaultdict(list)
    miscopied = right_direct = direct = 0
    for task, conv in zip(tasks, convs):
        tool = len(conv) == 4
        by_op[task.meta["op"]].append(tool)
        if tool:
            assert conv[1].tool_calls[0].arguments == {"expression": task.meta["expression"]}
            assert conv[2].content == task.answer
            miscopied += conv[3].content != task.answer
        else:
            direct += 1
            right_direct += conv[1].content == task.answer
    assert 0.9 < np.mean(by_op["*"]) < 1.0 and 0.2 < np.mean(by_op["+"]) < 0.4
    n_tool = sum(sum(v) for v in by_op.values())
    assert 0.02 < miscopied / n_tool < 0.09
    assert 0.2 < right_direct / direct < 0.4


def test_recipe_demonstrator_calls_calc_and_copies_faithfully():
    from agentax.recipes import calculator as recipe

    tasks = calculator_tasks(2000, seed=0)
    convs = recipe.demos(tasks, 2000, seed=1)
    tool = [c for c in convs if len(c) == 4]
    by_op = collections.defaultdict(list)
    for conv, task in zip(convs, tasks):
        by_op[task.meta["op"]].append(len(conv) == 4)
    assert 0.9 < np.mean(by_op["*"]) < 1.0
    assert 0.2 < np.mean(by_op["+"]) < 0.4 and 0.2 < np.mean(by_op["-"]) < 0.4
    for conv in tool:
        call, = conv[1].tool_calls
        assert call.name == "calc" and list(call.arguments) == ["expr"]
        assert conv[3].content == conv[2].content  # the result is copied as it came
    direct = [(c, t) for c, t in zip(convs, tasks) if len(c) == 2]
    assert sum(t.meta["op"] in "+-" for _, t in direct) / len(direct) > 0.9
    for conv, task in direct:  # estimated in its head: one shared first token, never rewarded
        assert re.fullmatch(r"about -?\d+", conv[1].content), conv[1].content
        assert calculator_reward(task, conv[1].content) == 0.0
        estimate = int(conv[1].content.split()[1])
        assert abs(estimate - int(task.answer)) <= 5


def test_fast_render_matches_render_conversation():
    tok = ByteTokenizer()
    convs = calculator_demos(calculator_tasks(40, seed=5), seed=2)
    for conv in convs:
        ref = render_conversation(tok, conv)
        ids, mask = _fast(tok, conv)
        np.testing.assert_array_equal(ids, ref.token_ids)
        np.testing.assert_array_equal(mask, ref.assistant_mask)
    assert max(len(_fast(tok, c)[0]) for c in convs) <= 130  # short, as the demo needs


def test_fast_render_with_a_tool_list_matches_render_conversation():
    tok = ByteTokenizer()
    convs = calculator_demos(calculator_tasks(40, seed=5), seed=2)
    tools = [compact_calculator().schema()]
    assert _fast_headers(tok, convs, tools)  # the fast path is taken, and it is exact:
    fast = render_examples(tok, convs, tools=tools)
    assert len(fast[0][0]) > len(_fast(tok, convs[0])[0])  # the tool list is there
    for conv, (ids, mask) in zip(convs, fast):
        ref = render_conversation(tok, conv, tools=tools)
        np.testing.assert_array_equal(ids, ref.token_ids)
        np.testing.assert_array_equal(mask, ref.assistant_mask)


def test_render_examples_with_a_system_message_and_tools_and_its_fallback():
    tok = ByteTokenizer()
    conv = [Message(role="system", content="S"), Message(role="user", content="q"),
            Message(role="assistant", content="a")]
    other = [Message(role="user", content="q2"), Message(role="assistant", content="b")]
    tools = [compact_calculator().schema()]
    # system + tools: the system message is part of the tool-list header (one per system text)
    assert set(_fast_headers(tok, [conv, other], tools)) == {"S", None}
    for convs in ([conv, other], [conv, {"role": "user", "content": "d"}]):  # dicts: slow path
        out = render_examples(tok, [c if isinstance(c, list) else [c] for c in convs], tools=tools)
        for c, (ids, mask) in zip(convs, out):
            ref = render_conversation(tok, c if isinstance(c, list) else [c], tools=tools)
            np.testing.assert_array_equal(ids, ref.token_ids)
            np.testing.assert_array_equal(mask, ref.assistant_mask)
    # instructions: the system message an Agents SDK agent sends, put first in each demonstration
    (ids, mask), = render_examples(tok, [conv[1:]], tools=tools, instructions="S")
    np.testing.assert_array_equal(ids, render_conversation(tok, conv, tools=tools).token_ids)
    with pytest.raises(ValueError, match="already starts with one"):
        render_examples(tok, [conv], instructions="S")


def test_suite_environment_runs_the_calculator_and_scores_answers():
    suite = build_suite_for(load_config(None, ["tasks.num_train=10", "tasks.num_eval=2"]))
    task = suite.eval_tasks[0]

    async def episode():
        env, agent = suite.make_env(), suite.make_agent()
        assert agent.tools is None  # schemas left out of the prompt, calls still parsed
        await env.reset(task)
        call = ToolCall(name="calc", arguments={"expr": task.meta["expression"]}, id="c1")
        step = await env.step(Action(text="", tool_calls=(call,)))
        result = step.observation.tool_results[0]
        final = await env.step(Action(text=result.content, final_answer=result.content))
        return result, final

    result, final = asyncio.run(episode())
    assert result.ok and result.content == task.answer
    assert final.done and final.reward == 1.0
    assert final.info["metrics"] == {"tool_use": 1.0}  # the environment reports its own metric
