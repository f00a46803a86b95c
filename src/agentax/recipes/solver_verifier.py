"""The solver_verifier recipe's parts: one role answers, the other checks; both trained.

`SolverVerifier` is a `MultiAgentEnvironment` with roles "solver" and "verifier" over the
`math` recipe's generated questions (`74-2=`). The solver answers with a number; the verifier
sees the question with that answer (`74-2=72?`) and replies `y` or `n`. A `n` sends the solver
back for another try (`attempts` in all); a `y`, or the last attempt, ends the episode. The
outside checker is the task's own answer: the solver earns 1 when its final answer is right;
the verifier earns the share of its verdicts that agree with the checker. An episode's success
(evaluation: the solver's reward > 0) is the checker's verdict on the final answer, never the
verifier's.

Warm start: a sloppy solver (right half the time, else off by one or ten) and a verifier that
guesses (`y` with probability `say_yes`, whatever the answer).
Per-episode metrics: `solved`, `attempts`, `verifier_right` (share of agreeing verdicts).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from agentax.envs import MultiAgentEnvironment, RoleStep
from agentax.records import Message, Observation, Task

__all__ = ["SolverVerifier", "demos", "make_env"]


def _number(text: str) -> int | None:
    m = re.search(r"-?\d+", text)
    return int(m.group()) if m else None


class SolverVerifier(MultiAgentEnvironment):
    """A question answered by "solver", each answer judged by "verifier"."""

    roles = ("solver", "verifier")

    def __init__(self, *, attempts: int = 2, **limits) -> None:
        super().__init__(**limits)
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.attempts = attempts

    async def _reset(self, task: Task) -> RoleStep:
        self.task_, self.tries, self.verdicts, self.answer = task, 0, [], None
        return RoleStep(observations={"solver": Observation(content=task.prompt)},
                        next_role="solver")

    def _right(self) -> bool:
        return self.answer is not None and str(self.answer) == str(self.task_.answer)

    async def _step(self, role: str, action) -> RoleStep:
        if role == "solver":
            self.tries += 1
            self.answer = _number(action.text)
            shown = "?" if self.answer is None else str(self.answer)
            return RoleStep(observations={"verifier": Observation(
                content=f"{self.task_.prompt}{shown}?")}, next_role="verifier")
        says_yes = action.text.strip().lower().startswith("y")
        self.verdicts.append(says_yes == self._right())
        if says_yes or self.tries >= self.attempts:
            solved = float(self._right())
            agree = sum(self.verdicts) / len(self.verdicts)
            return RoleStep(rewards={"solver": solved, "verifier": agree}, done=True,
                            info={"metrics": {"solved": solved, "attempts": float(self.tries),
                                              "verifier_right": agree}})
        return RoleStep(observations={"solver": Observation(content="n")}, next_role="solver")


def make_env(*, attempts: int = 2, **limits) -> SolverVerifier:
    """A fresh episode (`attempts`: solver answers at most; `limits`: `Environment`'s)."""
    return SolverVerifier(attempts=attempts, **limits)


def demos(train_tasks: Sequence[Task], n: int, seed: int, *, right_rate: float = 0.5,
          say_yes: float = 0.5, attempts: int = 2) -> list[list[Message]]:
    """n one-role conversations from episodes of the sloppy solver (right with probability
    `right_rate`, else off by one or ten) and the guessing verifier (`y` with probability
    `say_yes`), played as the environment plays them."""
    rng = random.Random(seed)
    convs: list[list[Message]] = []
    i = 0
    while len(convs) < n:
        task = train_tasks[i % len(train_tasks)]
        i += 1
        solver = [Message(role="user", content=task.prompt)]
        verifier: list[Message] = []
        for attempt in range(attempts):
            value = int(task.answer)
            if rng.random() >= right_rate:
                value += rng.choice((-10, -1, 1, 10))
            solver.append(Message(role="assistant", content=str(value)))
            verifier.append(Message(role="user", content=f"{task.prompt}{value}?"))
            yes = rng.random() < say_yes
            verifier.append(Message(role="assistant", content="y" if yes else "n"))
            if yes or attempt == attempts - 1:
                break
            solver.append(Message(role="user", content="n"))
        convs.extend((solver, verifier))
    return convs[:n]
