"""`OpenAIAgentEnvironment` through the real `Collector`: an SDK agent (and a subprocess program)
becomes a token-exact trajectory with the run's sampling, limits, reward and versions."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import numpy as np
import openai
import pytest
from serve_helpers import MODEL

from agentax.agents import ModelAgent
from agentax.models import Transformer
from agentax.records import SamplingParams, Task, TrajectoryStatus
from agentax.rollout import Collector, CollectorConfig
from agentax.serve import OpenAIAgentEnvironment, Reward

TASK = Task(id="t1", prompt="Say yes.", answer="yes")
# Generous limits: the first calls compile kernels, and CI machines can be loaded.
CFG = CollectorConfig(max_turns=4, max_episode_tokens=400, model_timeout_s=300, episode_timeout_s=600)


def collector(recording, tok, env_factory, sampling=SamplingParams(max_tokens=8), cfg=CFG, **kw):
    return Collector(recording, tok, env_factory, lambda: ModelAgent(), sampling, cfg, **kw)


async def two_turn_agent(client, task):
    msgs = [{"role": "user", "content": task.prompt}]
    r = await client.chat.completions.create(model="agentax", messages=msgs, temperature=0.0)
    msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
    await client.chat.completions.create(model="agentax", messages=msgs)
    return Reward(0.5)


def test_sdk_agent_becomes_a_token_exact_trajectory(recording, tok):
    col = collector(recording, tok, lambda: OpenAIAgentEnvironment(two_turn_agent))
    traj = asyncio.run(col.run_episode(TASK, seed=11, group_id="g", sample_index=2))
    assert traj.status == TrajectoryStatus.OK, traj.info
    assert traj.reward == 0.5 and traj.group_id == "g" and traj.sample_index == 2
    (p1, s1, c1), (p2, s2, c2) = recording.calls
    assert s2 == c1.sequence_id  # one engine sequence for the episode
    np.testing.assert_array_equal(traj.token_ids, np.concatenate([p1, c1.token_ids, p2, c2.token_ids]))
    np.testing.assert_array_equal(traj.logprobs[traj.loss_mask == 1],
                                  np.concatenate([c1.logprobs, c2.logprobs]))
    assert traj.info["sampling_overridden"] == 1  # temperature=0.0 asked; the run's 1.0 governs
    assert traj.num_generated <= 16  # the run's max_tokens caps every call


def test_the_episode_client_streams(recording, tok):
    """The client handed to the agent (its HTTP transport the loopback one, `serve._loopback`)
    streams server-sent events, in consecutive episodes on one loop."""
    async def streamer(client, task):
        parts = []
        async for chunk in await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": task.prompt}], stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return Reward(float(len("".join(parts))))

    async def main():
        col = collector(recording, tok, lambda: OpenAIAgentEnvironment(streamer))
        return [await col.run_episode(TASK, seed=s) for s in (1, 2)]

    trajs = asyncio.run(main())
    for traj, (_, _, c) in zip(trajs, recording.calls, strict=True):
        assert traj.status == TrajectoryStatus.OK, traj.info
        ids = [int(i) for i in c.token_ids]
        if ids[-1] in tok.eos_token_ids:
            ids = ids[:-1]
        assert traj.reward == len(tok.decode(ids, skip_special_tokens=False))
        np.testing.assert_array_equal(traj.token_ids[traj.loss_mask == 1], c.token_ids)


def test_budget_timeout_reward_fn_and_agent_errors(recording, tok):
    async def chatty(client, task):
        msgs = [{"role": "user", "content": task.prompt}]
        while True:
            r = await client.chat.completions.create(model="m", messages=msgs)
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]

    async def slow(client, task):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        await asyncio.sleep(120)

    async def broken(client, task):
        raise KeyError("oops")

    async def silent(client, task):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

    capped = CollectorConfig(max_turns=3, max_episode_tokens=400, model_timeout_s=300, episode_timeout_s=600)
    short = CollectorConfig(max_turns=3, max_episode_tokens=400, model_timeout_s=300, episode_timeout_s=8)

    async def main():
        out = {}
        for name, env, cfg in [
            ("chatty", lambda: OpenAIAgentEnvironment(chatty), capped),
            ("slow", lambda: OpenAIAgentEnvironment(slow), short),
            ("broken", lambda: OpenAIAgentEnvironment(broken), capped),
            ("silent", lambda: OpenAIAgentEnvironment(silent, reward_fn=lambda t, a: 2.0), capped),
        ]:
            out[name] = await collector(recording, tok, env, cfg=cfg).run_episode(TASK, seed=1)
        return out

    out = asyncio.run(main())
    assert out["chatty"].status == TrajectoryStatus.TRUNCATED and out["chatty"].info["turns"] == 3
    assert out["slow"].status == TrajectoryStatus.TIMEOUT and out["slow"].num_generated > 0
    assert out["broken"].status == TrajectoryStatus.ENV_ERROR and "oops" in out["broken"].info["error"]
    assert out["silent"].status == TrajectoryStatus.OK and out["silent"].reward == 2.0


def test_a_returned_value_is_the_final_answer_never_a_reward(recording, tok, caplog):
    """An agent that returns its answer ("825", 825, an SDK output object) has it judged by
    reward_fn and shown in the transcript; with nothing to score it, the reward is 0 and one
    warning line names the agent, once."""
    seen = []

    async def answers(client, task):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.prompt}])
        return "825" if task.id == "str" else 825 if task.id == "int" else {"answer": 825}

    def judge(task, final_answer):
        seen.append(final_answer)
        return 1.0 if "825" in final_answer else 0.0

    async def main(**kw):
        col = collector(recording, tok, lambda: OpenAIAgentEnvironment(answers, **kw))
        return [await col.run_episode(Task(id=i, prompt="q"), seed=1) for i in ("str", "int", "obj", "str")]

    judged = asyncio.run(main(reward_fn=judge))
    assert [t.reward for t in judged] == [1.0, 1.0, 1.0, 1.0]
    assert seen == ["825", "825", '{"answer": 825}', "825"]
    assert [t.info["final_answer"] for t in judged] == seen
    assert judged[0].info["agent_returned"] == "str: 825"
    with caplog.at_level("WARNING", logger="agentax.serve._env"):
        unscored = asyncio.run(main())
    assert [t.reward for t in unscored] == [0.0] * 4 and all(t.status == TrajectoryStatus.OK for t in unscored)
    lines = [r.getMessage() for r in caplog.records if "final answer" in r.getMessage()]
    assert len(lines) == 1 and "answers" in lines[0] and "'825'" in lines[0] and "Reward(" in lines[0]
    with pytest.raises(TypeError, match="number"):
        Reward("1.0")
    with pytest.raises(ValueError, match="finite"):
        Reward(float("nan"))


def test_a_prompt_over_the_budget_fails_first_and_truncates_later(recording, tok):
    """As the collector's own episodes end: a first prompt that fills max_episode_tokens fails the
    episode (model_error, prompt_too_long: nothing to train) and one that fills it on a later turn
    ends it truncated with the first turn kept. The SDK sees a 400 either way (its code says
    which); the model is not called for the over-budget prompt."""
    codes = []

    async def call(client, msgs):
        try:
            return await client.chat.completions.create(model="m", messages=msgs)
        except openai.BadRequestError as e:
            codes.append(e.code)
            raise

    async def long_first(client, task):
        await call(client, [{"role": "user", "content": "x" * 300}])

    async def long_later(client, task):
        msgs = [{"role": "user", "content": task.prompt}]
        r = await call(client, msgs)
        await call(client, msgs + [r.choices[0].message.model_dump(exclude_none=True),
                                   {"role": "user", "content": "y" * 300}])

    cfg = CollectorConfig(max_turns=4, max_episode_tokens=200, model_timeout_s=300, episode_timeout_s=600)
    first = asyncio.run(collector(recording, tok, lambda: OpenAIAgentEnvironment(long_first),
                                  cfg=cfg).run_episode(TASK, seed=1))
    assert first.status == TrajectoryStatus.MODEL_ERROR and first.info["reason"] == "prompt_too_long"
    assert "max_episode_tokens=200" in first.info["error"] and first.num_generated == 0
    assert recording.calls == [] and codes == ["context_length_exceeded"]
    later = asyncio.run(collector(recording, tok, lambda: OpenAIAgentEnvironment(long_later),
                                  cfg=cfg).run_episode(TASK, seed=1))
    assert later.status == TrajectoryStatus.TRUNCATED, later.info
    assert later.info["reason"] == "max_episode_tokens=200" and later.info["turns"] == 1
    ((_, _, c),) = recording.calls
    assert later.num_generated == c.num_tokens and codes[1:] == ["episode_budget_exhausted"]


def test_subprocess_program_posts_its_reward(recording, tok, tmp_path):
    prog = tmp_path / "agent.py"
    prog.write_text(textwrap.dedent('''
        import json, os, urllib.request
        import openai
        task = json.loads(os.environ["AGENTAX_TASK"])
        client = openai.OpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
        r = client.chat.completions.create(model="agentax", messages=[{"role": "user", "content": task["prompt"]}])
        body = json.dumps({"reward": 0.25 + len(r.choices[0].message.content) * 0}).encode()
        urllib.request.urlopen(urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/reward", data=body))
    '''))
    col = collector(recording, tok, lambda: OpenAIAgentEnvironment(command=[sys.executable, str(prog)]))
    traj = asyncio.run(col.run_episode(TASK, seed=3))
    assert traj.status == TrajectoryStatus.OK, traj.info
    assert traj.reward == 0.25
    ((_, _, c),) = recording.calls
    np.testing.assert_array_equal(traj.token_ids[traj.loss_mask == 1], c.token_ids)


def test_weight_update_mid_episode_tags_versions(engine, recording, tok):
    from flax import nnx

    other = Transformer(MODEL, rngs=nnx.Rngs(1))

    async def agent(client, task):
        msgs = [{"role": "user", "content": task.prompt}]
        r = await client.chat.completions.create(model="m", messages=msgs)
        engine.update_weights(other, 5)
        await asyncio.sleep(0.2)
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go."}]
        await client.chat.completions.create(model="m", messages=msgs)

    try:
        traj = asyncio.run(collector(recording, tok, lambda: OpenAIAgentEnvironment(agent)).run_episode(TASK, seed=5))
    finally:
        engine.update_weights(Transformer(MODEL, rngs=nnx.Rngs(0)), 0)
    v = traj.versions[traj.loss_mask == 1]
    n1 = recording.calls[0][2].num_tokens
    assert set(v[:n1]) == {0} and set(v[n1:]) == {5}


def test_reset_says_how_to_run_it():
    env = OpenAIAgentEnvironment(two_turn_agent)
    with pytest.raises(Exception, match="Collector"):
        asyncio.run(env.reset(TASK))
    with pytest.raises(ValueError, match="exactly one"):
        OpenAIAgentEnvironment()
