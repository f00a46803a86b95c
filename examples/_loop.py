"""A tiny episode loop shared by the examples (the real, concurrent collector is agentax.rollout).

It drives one episode: reset the environment, let the agent turn observations into messages,
ask the (scripted) model for a reply, let the agent parse it into an action, step, repeat.
"""

from __future__ import annotations

from agentax.envs import EnvError


async def run_episode(env, agent, model, task, *, show=True):
    """Returns (total reward, last StepResult). Prints the conversation when `show`."""
    agent.reset(task)
    agent.observe(await env.reset(task))
    total, result = 0.0, None
    try:
        while True:
            reply = model(agent.messages, tools=agent.tools)
            action = agent.act(reply)
            if show:
                print(f"[user/tool] {agent.messages[-2].content[:300]}\n[model] {reply}")
            result = await env.step(action)
            total += result.reward
            if result.done:
                break
            agent.observe(result.observation)
    except EnvError as e:
        print(f"episode failed: {e.status.value} ({e.kind}): {e.message}")
    finally:
        await env.close()
    if show:
        print(f"-> reward {total}, done={result.done if result else None}, truncated={result.truncated if result else None}")
    return total, result
