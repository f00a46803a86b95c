"""Multi-turn tool use: a calculator tool, a ToolAgent, and the token-exact training stream.

The model (scripted here) calls the calculator, reads the result, and answers. Alongside the
text loop, a TrajectoryBuilder assembles the episode as one token stream — the model's own ids
with loss mask 1, the templated tool output with mask 0 — exactly what the trainer receives.

Run: python examples/calculator_tool.py
"""

import asyncio

import numpy as np

from agentax.agents import ToolAgent, TrajectoryBuilder
from agentax.agents.testing import ScriptedModel
from agentax.envs import ToolEnvironment
from agentax.records import Task, TrajectoryStatus
from agentax.rewards import math_verify
from agentax.text import ByteTokenizer
from agentax.tools import calculator

REPLIES = [
    '<tool_call>{"name": "calculator", "arguments": {"expression": "(17 + 25) * 3"}}</tool_call>',
    "The result is \\boxed{126}.",
]


async def main():
    tokenizer = ByteTokenizer()
    task = Task(id="calc-1", prompt="What is (17 + 25) * 3? Use the calculator.", answer="126")
    env = ToolEnvironment([calculator], math_verify, max_steps=4)
    agent = ToolAgent([calculator])
    model = ScriptedModel(REPLIES, tokenizer=tokenizer)

    agent.reset(task)
    agent.observe(await env.reset(task))
    builder = TrajectoryBuilder(tokenizer, tools=agent.tools, task_id=task.id)
    builder.start(agent.messages)
    total = 0.0
    while True:
        completion = model.complete(agent.messages, version=0)  # the engine's role in a real run
        action = agent.act(builder.add_completion(completion))
        result = await env.step(action)
        builder.record_step(action, result)
        total += result.reward
        print(f"[model] {action.text}")
        if result.done:
            break
        new_messages = agent.observe(result.observation)
        print(f"[tool]  {new_messages[0].content}")
        builder.add_observation(new_messages)  # ids to feed the engine next
    await env.close()

    traj = builder.build(total, TrajectoryStatus.OK)
    print(f"reward {traj.reward}; {traj.num_tokens} tokens, {traj.num_generated} generated (loss mask 1)")
    print("the stream as the model saw it:\n" + tokenizer.decode(traj.token_ids))
    assert traj.reward == 1.0 and env.tool_stats["tool_calls"] == 1
    generated = np.concatenate([t.completion.token_ids for t in traj.turns])
    assert (traj.token_ids[traj.loss_mask == 1] == generated).all()


if __name__ == "__main__":
    asyncio.run(main())
