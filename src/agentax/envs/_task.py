"""`TaskEnvironment`: one question, one answer, one reward (math, QA, code-in-one-shot).

reset shows `task.prompt` (or `prompt_fn(task)`); the first step scores the reply with a reward
function `(task, response) -> float` from agentax.rewards (or any callable) and ends the
episode. The response scored is `action.final_answer` when the agent set one, else the text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentax.envs._base import Environment
from agentax.envs._reward import RewardFn, check_reward_fn, traced_reward
from agentax.records import Action, Observation, StepResult, Task

__all__ = ["TaskEnvironment"]


class TaskEnvironment(Environment):
    """Single-turn environment: the task prompt in, one scored reply out.

    Args:
      reward_fn: `(task, response) -> float`, sync or async, or a name for
        `agentax.rewards.get_reward`.
      prompt_fn: builds the user message from the task; default `task.prompt`.
      reward_timeout_s: limit for one reward call; a timeout ends the episode as REWARD_ERROR.
    """

    max_steps = 1

    def __init__(
        self,
        reward_fn: RewardFn | str,
        *,
        prompt_fn: Callable[[Task], str] | None = None,
        reward_timeout_s: float | None = 30.0,
        **limits: Any,
    ) -> None:
        super().__init__(**limits)
        self.reward_fn = check_reward_fn(reward_fn)
        self.prompt_fn = prompt_fn
        self.reward_timeout_s = reward_timeout_s

    async def _reset(self, task: Task) -> Observation:
        prompt = self.prompt_fn(task) if self.prompt_fn is not None else task.prompt
        return Observation(content=prompt)

    async def _step(self, action: Action) -> StepResult:
        task = self.task
        assert task is not None
        response = action.final_answer if action.final_answer is not None else action.text
        reward = await traced_reward(self.reward_fn, task, response, timeout_s=self.reward_timeout_s)
        return StepResult(observation=Observation(), reward=reward, done=True, info={"response_chars": len(response)})
