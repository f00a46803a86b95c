"""The frozen_lake recipe's parts: FrozenLake-v1 on many random maps, played from text.

Every task is a random 4x4 map (`gymnasium`'s `generate_random_map`, non-slippery); held-out
maps are never trained on. The environment is `GymnasiumEnvironment` (it builds the task's
map at reset) with a compact grid formatter that also shows the map ahead of the player
(`render`), the agent is `FrozenLakeAgent`. Warm-start demonstrations come from a noisy
planner: it walks a shortest path but takes a random move with probability `noise`, so some
demonstrations fall into holes or wander.

The environment reports per-episode `hole` (fell into a hole), `invalid` (replies that named
no action) and `moves`; `agentax train` shows them next to success.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from agentax.agents import FrozenLakeAgent
from agentax.envs import GymnasiumEnvironment
from agentax.records import Action, Message, Observation, StepResult, Task

__all__ = ["FrozenLakeMapsEnvironment", "CompactFrozenLakeAgent", "demos", "format_grid",
           "make_agent", "make_env", "render", "shortest_path_action", "tasks"]

_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}  # left, down, right, up


def _unread(text: str) -> None:
    # FrozenLakeAgent parses every reply itself (Action.value); one it could not read names no
    # action, so the environment's own text parser has nothing to add.
    return None


def render(desc: Sequence[str], pos: tuple[int, int]) -> str:
    """The map, one row a line, with the player as P (S start, F ice, H hole, G goal), then
    the view ahead: the same map again from the player's cell down and right, P at its top
    left and '#' past the edge, always 4x4 ("PFH#\\nFFF#\\nHFG#\\n####").

    The view ahead is a formatting choice for the ~0.3M-parameter demo model: it holds no cell
    the map above does not, but puts the cells one and two moves down or right of P at the same
    place in every observation, where the 2-layer model finds them (it does not learn to find
    them in the map itself within the recipe's budget).
    """
    rows = [list(r) for r in desc]
    rows[pos[0]][pos[1]] = "P"
    n, m = len(desc), len(desc[0])
    ahead = ["".join("P" if (dr, dc) == (0, 0) else desc[pos[0] + dr][pos[1] + dc]
                     if pos[0] + dr < n and pos[1] + dc < m else "#" for dc in range(m))
             for dr in range(n)]
    return "\n".join("".join(r) for r in rows) + "\n" + "\n".join(ahead)


def format_grid(obs: Any, env: gym.Env) -> str:
    """`render` for a FrozenLake gym env and its observation (the player's cell index)."""
    desc = ["".join(c.decode() if isinstance(c, bytes) else str(c) for c in row)
            for row in env.unwrapped.desc]
    return render(desc, divmod(int(obs), len(desc[0])))


class FrozenLakeMapsEnvironment(GymnasiumEnvironment):
    """`GymnasiumEnvironment` whose FrozenLake map comes with each task (`task.meta["map"]`)."""

    def __init__(self, **limits: Any) -> None:
        super().__init__(gym.make("FrozenLake-v1", map_name="4x4", is_slippery=False),
                         formatter=format_grid, parser=_unread,
                         action_help="Answer left, down, right or up.", **limits)
        self._invalid = 0

    async def _reset(self, task: Task) -> Observation:
        self.gym_env.close()
        self.gym_env = gym.make("FrozenLake-v1", desc=list(task.meta["map"]), is_slippery=False)
        self._invalid = 0
        return await super()._reset(task)

    async def _step(self, action: Action) -> StepResult:
        result = await super()._step(action)
        self._invalid += bool(result.info.get("invalid_action"))
        hole = bool(result.info.get("terminated")) and result.reward <= 0
        metrics = {"hole": float(hole), "invalid": float(self._invalid),
                   "moves": float(self.num_steps)}
        return dataclasses.replace(result, info={**result.info, "metrics": metrics})


class CompactFrozenLakeAgent(FrozenLakeAgent):
    """`FrozenLakeAgent` that passes the grid through as is (no reminder line): every byte is a
    token for the byte-level demo model."""

    def format_observation(self, observation: Observation) -> list[Message]:
        return [Message(role="user", content=observation.content)]


def make_env(*, max_steps: int = 8) -> FrozenLakeMapsEnvironment:
    """A fresh environment; the map arrives with each task."""
    return FrozenLakeMapsEnvironment(max_steps=max_steps)


def make_agent(*, system_prompt: str = "", compact: bool = True) -> FrozenLakeAgent:
    """`FrozenLakeAgent` (no system prompt by default: the tiny model learns the format from
    demonstrations); `compact=False` keeps its reminder line."""
    cls = CompactFrozenLakeAgent if compact else FrozenLakeAgent
    return cls(system_prompt=system_prompt)


def tasks(*, num_train: int, num_eval: int, seed: int, size: int = 4,
          frozen_p: float = 0.8) -> tuple[list[Task], list[Task]]:
    """Distinct random maps; the held-out ones never appear among the training maps."""
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    out: list[Task] = []
    while len(out) < num_train + num_eval:
        desc = tuple(generate_random_map(size=size, p=frozen_p, seed=rng.randrange(2**31)))
        if desc in seen:
            continue
        seen.add(desc)
        out.append(Task(id=f"lake-{len(out)}", meta={"map": desc, "seed": 0}))
    return out[:num_train], out[num_train:]


def _distances(desc: Sequence[str]) -> dict[tuple[int, int], int]:
    """Steps to the goal from every reachable cell (BFS from G over non-hole cells)."""
    n, m = len(desc), len(desc[0])
    goal = next((r, c) for r in range(n) for c in range(m) if desc[r][c] == "G")
    dist, queue = {goal: 0}, collections.deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in _MOVES.values():
            q = (r + dr, c + dc)
            if 0 <= q[0] < n and 0 <= q[1] < m and q not in dist and desc[q[0]][q[1]] != "H":
                dist[q] = dist[(r, c)] + 1
                queue.append(q)
    return dist


def _move(desc: Sequence[str], pos: tuple[int, int], action: int) -> tuple[int, int]:
    dr, dc = _MOVES[action]
    r, c = pos[0] + dr, pos[1] + dc
    return (r, c) if 0 <= r < len(desc) and 0 <= c < len(desc[0]) else pos


def shortest_path_action(desc: Sequence[str], pos: tuple[int, int]) -> int | None:
    """An action on a shortest path to G from `pos` (None if G is unreachable). Of several
    equally short moves it takes the one along the axis with more distance left to G, so its
    paths keep near the diagonal, where more ways around a hole stay open."""
    dist = _distances(desc)
    best = [a for a in _MOVES if _move(desc, pos, a) in dist
            and dist[_move(desc, pos, a)] < dist.get(pos, 1 << 30)]
    goal = next(q for q, d in dist.items() if d == 0)
    left = (abs(goal[0] - pos[0]), abs(goal[1] - pos[1]))  # rows, columns still to go
    return max(best, key=lambda a: left[0] if _MOVES[a][0] else left[1]) if best else None


def demos(train_tasks: Sequence[Task], n: int, seed: int, *, noise: float = 0.25,
          max_steps: int = 8) -> list[list[Message]]:
    """n episodes of the noisy planner on training maps (cycled): a shortest-path move, or a
    uniformly random one with probability `noise`; an episode ends at G, in a hole, or after
    `max_steps` moves, as the environment would end it."""
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        desc = train_tasks[i % len(train_tasks)].meta["map"]
        pos = (0, 0)
        conv = [Message(role="user", content=render(desc, pos))]
        for _ in range(max_steps):
            action = shortest_path_action(desc, pos)
            if action is None or rng.random() < noise:
                action = rng.randrange(4)
            conv.append(Message(role="assistant", content=FrozenLakeAgent.action_name(action)))
            pos = _move(desc, pos, action)
            if desc[pos[0]][pos[1]] in "HG":
                break
            conv.append(Message(role="user", content=render(desc, pos)))
        if conv[-1].role == "user":
            conv.pop()
        convs.append(conv)
    return convs
