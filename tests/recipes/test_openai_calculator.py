"""The openai_calculator recipe: the SDK agent's episodes are what its warm start trained on.

The SDK agent runs through the real `openai` client and the engine's endpoint on loopback
(`OpenAIAgentEnvironment`), with a scripted engine that replays a demonstration's replies; the
episode it records must be, token for token and mask bit for mask bit, the demonstration as
the warm start renders it, and the native agent's episode with the same tool list.
"""

from __future__ import annotations

import numpy as np

from agentax.cli import load_config
from agentax.envs import ToolEnvironment
from agentax.recipes import calculator_reward, recipe_path
from agentax.recipes._render import render_examples
from agentax.text import ByteTokenizer, format_tool_call
from agentax.tools import calculator
from tests.recipes.scripted import recipe_suite, scripted_episode


def _suite():
    return recipe_suite("openai_calculator")


def _episode(suite, env_factory, agent_factory, task, replies, max_episode_tokens):
    return scripted_episode(env_factory, agent_factory, task, replies, max_tokens=64,
                            max_episode_tokens=max_episode_tokens)


def test_sdk_episode_is_the_warm_start_rendering_token_for_token():
    suite = _suite()
    cfg = load_config(recipe_path("openai_calculator"))
    tok = ByteTokenizer()
    demos = suite.demos(60, 1)
    by_prompt = {t.prompt: t for t in suite.train_tasks}
    shapes = {len(d): d for d in demos}  # a tool-using (4 messages) and a direct (2) one
    assert set(shapes) == {2, 4}
    for demo in shapes.values():
        task = by_prompt[demo[0].content]
        replies = [format_tool_call(m.tool_calls[0], "hermes", compact=True) if m.tool_calls
                   else m.content for m in demo if m.role == "assistant"]
        sdk = _episode(suite, suite.make_env, suite.make_agent, task, replies,
                       cfg.collector.max_episode_tokens)
        # The native environment with the SDK agent's tool (the embedded demo's is `calc`).
        native = _episode(suite, lambda: ToolEnvironment([calculator], calculator_reward),
                          suite.make_agent, task, replies,
                          cfg.collector.max_episode_tokens)
        (ids, mask), = render_examples(tok, [demo], tools=list(suite.tools))
        # The demonstration's rendering ends with the newline after the last <|im_end|>.
        np.testing.assert_array_equal(sdk.token_ids, ids[:-1])
        np.testing.assert_array_equal(sdk.loss_mask, mask[:-1])
        np.testing.assert_array_equal(sdk.token_ids, native.token_ids)
        np.testing.assert_array_equal(sdk.loss_mask, native.loss_mask)
        assert sdk.reward == native.reward == float(demo[-1].content == task.answer)
        assert sdk.info["segment_breaks"] == 0 and sdk.info["parse_errors"] == 0


def test_recipe_lengths_fit_its_longest_demonstration_and_episode():
    cfg = load_config(recipe_path("openai_calculator"))
    suite = _suite()
    tok = ByteTokenizer()
    longest = max(len(ids) for ids, _ in render_examples(tok, suite.demos(2000, 1),
                                                          tools=list(suite.tools)))
    # A tool-using episode is the demonstration without its final newline; with the largest
    # operands it must fit the episode budget, and that budget the engine slot and train row.
    assert longest - 1 <= cfg.collector.max_episode_tokens <= cfg.engine.max_seq_len
    assert cfg.engine.max_seq_len <= cfg.trainer.max_seq_len
    header = longest - max(len(ids) for ids, _ in render_examples(tok, suite.demos(2000, 1)))
    assert header <= 40  # the tool, by name only, is all that the SDK agent adds to a prompt
