"""TrajectoryBuilder: one token-exact stream per episode on real templates and real tokenizers.

Checked on ChatML (Qwen2.5), Llama 3.1 and the byte tokenizer's template: the assembled ids
equal the chat template's render of the same conversation, the loss mask is 1 exactly on the
model's ids, generated ids are never re-tokenized; on Qwen3 (which drops earlier reasoning) the
divergence is detected, the generated stream is kept, and the suffix is still well-formed.
"""

from __future__ import annotations

import numpy as np
import pytest

from agentax.agents import ModelAgent, ToolAgent, TrajectoryBuilder
from agentax.agents._trajectory import decode_reply
from agentax.agents.testing import ScriptedModel
from agentax.records import (
    Completion,
    FinishReason,
    Message,
    Observation,
    StepResult,
    Task,
    ToolResult,
    TrajectoryStatus,
)
from agentax.text import render_conversation

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
TASK = Task(id="q1", prompt="What is 12*7?")

# Replies written exactly the way each template renders a tool call, so that the agent's own
# structured conversation also renders to the stream.
CALL_REPLY = {
    "qwen25_tok": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>',
    "llama31_tok": '{"name": "calculator", "parameters": {"expression": "12*7"}}',
    "byte_tok": '<tool_call>{"name":"calculator","arguments":{"expression":"12*7"}}</tool_call>',
}
FORMAT = {"qwen25_tok": "hermes", "llama31_tok": "llama3", "byte_tok": "hermes"}


def drive(tok, agent, replies, observations, *, eos=True):
    """Run agent + builder over scripted completions; observations[i] answers reply i."""
    model = ScriptedModel(replies, tokenizer=tok)
    b = TrajectoryBuilder(tok, tools=agent.tools, task_id=TASK.id)
    agent.reset(TASK)
    agent.observe(Observation(content=TASK.prompt))
    prompt = b.start(agent.messages)
    completions = []
    for i in range(len(replies)):
        c = model.complete(agent.messages, version=10 + i, eos=eos if isinstance(eos, bool) else eos[i])
        completions.append(c)
        action = agent.act(b.add_completion(c))
        if i < len(observations):
            obs = observations[i](action)
            b.record_step(action, StepResult(observation=obs, reward=0.25), env_time_s=0.01)
            b.add_observation(agent.observe(obs))
    return b.build(1.0, TrajectoryStatus.OK), completions, prompt, b


def tool_answer(action):
    (call,) = action.tool_calls
    return Observation(tool_results=(ToolResult(name=call.name, content="84", call_id=call.id),))


def check_mask_and_arrays(traj, completions):
    gen = np.flatnonzero(traj.loss_mask)
    expected = np.concatenate([c.token_ids for c in completions])
    assert traj.num_generated == expected.size
    np.testing.assert_array_equal(traj.token_ids[gen], expected)  # the model's ids, untouched
    np.testing.assert_array_equal(traj.logprobs[gen], np.concatenate([c.logprobs for c in completions]))
    np.testing.assert_array_equal(traj.versions[gen], np.concatenate([c.versions for c in completions]))
    assert (traj.logprobs[traj.loss_mask == 0] == 0).all() and (traj.versions[traj.loss_mask == 0] == -1).all()
    # turn records reassemble the stream
    pieces = [np.concatenate([t.prompt_ids, t.completion.token_ids]) for t in traj.turns]
    np.testing.assert_array_equal(np.concatenate(pieces), traj.token_ids)


@pytest.mark.parametrize("tok_name", ["qwen25_tok", "llama31_tok", "byte_tok"])
def test_tool_episode_equals_template_render(tok_name, request):
    tok = request.getfixturevalue(tok_name)
    agent = ToolAgent([CALC], tool_format=FORMAT[tok_name])
    traj, completions, _, b = drive(tok, agent, [CALL_REPLY[tok_name], "The answer is 84."], [tool_answer])

    assert traj.info["template_divergences"] == 0 and traj.status is TrajectoryStatus.OK
    check_mask_and_arrays(traj, completions)
    for messages in (b.messages, agent.messages):  # verbatim and structured conversations
        rendered = tok.chat_template.render([m.to_dict() for m in messages], tools=agent.tools)
        full = tok.encode(rendered)
        assert full[: traj.num_tokens] == traj.token_ids.tolist()
        assert tok.decode(full[traj.num_tokens :]).strip() == ""  # only the template's trailing newline
    # the text team's segment-wise render agrees on ids and on the assistant mask
    rc = render_conversation(tok, agent.messages, tools=agent.tools)
    n = traj.num_tokens
    np.testing.assert_array_equal(rc.token_ids[:n], traj.token_ids)
    np.testing.assert_array_equal(rc.assistant_mask[:n], traj.loss_mask)
    assert [t.reward for t in traj.turns] == [0.25, 0.0] and traj.turns[0].action.tool_calls[0].name == "calculator"


@pytest.mark.parametrize("tok_name", ["qwen25_tok", "llama31_tok"])
def test_multi_turn_chat_and_length_cut(tok_name, request):
    """A reply cut by max_tokens has no end-of-turn id: the template's one is added, mask 0."""
    tok = request.getfixturevalue(tok_name)
    agent = ModelAgent(system_prompt="Be brief.")
    follow = lambda a: Observation(content="Are you sure?")  # noqa: E731
    traj, completions, _, b = drive(
        tok, agent, ["It is 84", "Yes, 84."], [follow], eos=[False, True]
    )
    assert traj.info["template_divergences"] == 0
    check_mask_and_arrays(traj, completions)
    rendered = tok.encode(tok.chat_template.render([m.to_dict() for m in agent.messages]))
    assert rendered[: traj.num_tokens] == traj.token_ids.tolist()
    eot = tok.eos_token_ids[0]
    first_end = completions[0].num_tokens + traj.turns[0].prompt_ids.size
    assert traj.token_ids[first_end] == eot and traj.loss_mask[first_end] == 0


def test_generated_ids_are_never_retokenized(qwen25_tok):
    tok = qwen25_tok
    text = "The answer is 84."
    canonical = tok.encode(text)
    # the same text, spelled one character per token (a sampler may well produce this)
    odd = [i for ch in text for i in tok.encode(ch)] + [tok.eos_token_ids[0]]
    assert len(odd) - 1 > len(canonical)
    b = TrajectoryBuilder(tok)
    b.start([Message(role="user", content="q")])
    c = Completion(
        token_ids=np.asarray(odd, np.int32),
        logprobs=np.full(len(odd), -1.0, np.float32),
        versions=np.zeros(len(odd), np.int32),
        finish_reason=FinishReason.EOS,
    )
    assert b.add_completion(c) == text
    nxt = b.add_observation([Message(role="user", content="ok")])
    traj = b.build(0.0, TrajectoryStatus.OK)
    gen = np.flatnonzero(traj.loss_mask)
    np.testing.assert_array_equal(traj.token_ids[gen], odd)
    assert tok.decode(nxt).startswith("\n<|im_start|>user\nok<|im_end|>")


def test_qwen3_reasoning_removal_is_detected_and_stream_kept(qwen3_tok):
    tok = qwen3_tok
    agent = ModelAgent()
    reasoning = "<think>\n12*7 = 84\n</think>\n\nIt is 84."
    follow = lambda a: Observation(content="And 84+1?")  # noqa: E731
    traj, completions, _, b = drive(tok, agent, [reasoning, "<think>\nadd one\n</think>\n\n85."], [follow])

    # the template drops the first turn's <think> block once a new user turn follows ...
    rendered = tok.chat_template.render([m.to_dict() for m in agent.messages])
    assert "12*7 = 84" not in rendered
    # ... but the training stream keeps what the model saw and generated, and says so
    stream = tok.decode(traj.token_ids)
    assert "12*7 = 84" in stream
    assert traj.info["template_divergences"] == 1
    (div,) = traj.info["template_divergence"]
    assert div["turn"] == 1 and div["rule"] == "kept_generated_stream"
    check_mask_and_arrays(traj, completions)
    # the observation suffix is well-formed: end of turn, the user turn, the generation prompt
    end0 = traj.turns[0].prompt_ids.size + completions[0].num_tokens
    assert tok.decode(traj.turns[1].prompt_ids) == "\n<|im_start|>user\nAnd 84+1?<|im_end|>\n<|im_start|>assistant\n"
    assert traj.token_ids[end0 - 1] == tok.eos_token_ids[0]


def test_qwen3_tool_turns_with_reasoning_stay_exact(qwen3_tok):
    """Qwen3 keeps reasoning after the last user query: tool turns are prefix-stable."""
    tok = qwen3_tok
    agent = ToolAgent([CALC])
    call = '<think>\nuse the tool\n</think>\n\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
    traj, completions, _, b = drive(tok, agent, [call, "<think>\ndone\n</think>\n\n84"], [tool_answer])
    assert traj.info["template_divergences"] == 0
    rendered = tok.encode(tok.chat_template.render([m.to_dict() for m in b.messages], tools=agent.tools))
    assert rendered[: traj.num_tokens] == traj.token_ids.tolist()


def test_llama_trim_divergence_keeps_suffix_well_formed(llama31_tok):
    tok = llama31_tok
    agent = ModelAgent()
    follow = lambda a: Observation(content="Thanks")  # noqa: E731
    traj, completions, _, _ = drive(tok, agent, ["  84  \n", "You're welcome"], [follow])
    assert traj.info["template_divergences"] == 1  # the template trims the first reply
    assert (
        tok.decode(traj.turns[1].prompt_ids)
        == "<|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    check_mask_and_arrays(traj, completions)


def test_builder_misuse_is_a_clear_error(byte_tok):
    b = TrajectoryBuilder(byte_tok, task_id="e")
    empty = b.build(0.0, TrajectoryStatus.ENV_ERROR)  # failed before the first prompt
    assert empty.num_tokens == 0 and empty.status is TrajectoryStatus.ENV_ERROR and not b.started
    with pytest.raises(RuntimeError, match="prompt first"):
        b.add_completion(ScriptedModel(["x"], tokenizer=byte_tok).complete([]))
    b.start([Message(role="user", content="q")])
    with pytest.raises(RuntimeError, match="follows a completion"):
        b.add_observation([Message(role="user", content="again")])
    bad = Completion(
        token_ids=np.asarray([65, 66], np.int32),
        logprobs=np.zeros(1, np.float32),
        versions=np.zeros(2, np.int32),
        finish_reason=FinishReason.EOS,
    )
    with pytest.raises(ValueError, match="one logprob and version per token"):
        b.add_completion(bad)


def test_decode_reply_keeps_special_markers_and_drops_eos(byte_tok):
    ids = byte_tok.encode("<tool_call>{}</tool_call>") + [byte_tok.eos_token_ids[0]]
    assert decode_reply(byte_tok, ids) == "<tool_call>{}</tool_call>"
    assert decode_reply(byte_tok, ids[:-1]) == "<tool_call>{}</tool_call>"


def test_truncated_episode_builds_with_status(byte_tok):
    agent = ModelAgent()
    traj, completions, prompt, _ = drive(byte_tok, agent, ["a"], [lambda a: Observation(content="more")])
    # the episode stopped after the observation was fed: the last prompt is mask 0, no reply
    assert traj.loss_mask[-1] == 0 and traj.num_generated == completions[0].num_tokens
    t2 = TrajectoryBuilder(byte_tok)
    t2.start([Message(role="user", content="q")])
    out = t2.build(0.0, TrajectoryStatus.TRUNCATED, task_id="z", group_id="g", sample_index=3, timings={"env_s": 1.0})
    assert (out.status, out.task_id, out.group_id, out.sample_index, out.num_generated) == (
        TrajectoryStatus.TRUNCATED, "z", "g", 3, 0
    )
    assert out.num_tokens == len(byte_tok.encode(byte_tok.chat_template.render([{"role": "user", "content": "q"}], add_generation_prompt=True)))


def test_template_that_cannot_be_continued_is_a_clear_error():
    """A template with no end-of-turn token that rewrites the last turn has no token-exact
    continuation: the builder says so instead of guessing."""
    from agentax.text import ByteTokenizer, ChatTemplate

    class PlainTok(ByteTokenizer):
        def __init__(self):
            super().__init__()
            self._template = ChatTemplate(
                "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% if loop.last %} (last){% endif %}\n"
                "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
            )

    with pytest.raises(ValueError, match="cannot be continued token-exactly"):
        drive(PlainTok(), ModelAgent(), ["84", "85"], [lambda a: Observation(content="plus one?")])
