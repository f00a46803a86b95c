"""`GymnasiumEnvironment`: any Gymnasium env as a text environment, plus FrozenLake and Taxi.

The wrapper needs two small functions: a *formatter* (gym observation -> text the model reads)
and a *parser* (model text -> gym action, or None when the text names no valid action). An
agent may also hand a ready action in `Action.value`; the parser is then skipped. An invalid
action does not crash the episode and does not step the gym env: the agent gets the problem
and the valid actions as its next observation (the step still counts toward `max_steps`), and
`info["invalid_action"]` is set so the collector can count it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from agentax._executors import StageExecutor
from agentax.envs._base import Environment
from agentax.records import Action, Observation, StepResult, Task

__all__ = [
    "FROZEN_LAKE_ACTIONS",
    "GymnasiumEnvironment",
    "TAXI_ACTIONS",
    "format_frozen_lake",
    "format_taxi",
    "make_frozen_lake",
    "make_taxi",
    "parse_frozen_lake_action",
    "parse_taxi_action",
]

Formatter = Callable[[Any, gym.Env], str]
Parser = Callable[[str], Any]


def _default_formatter(obs: Any, env: gym.Env) -> str:
    if isinstance(obs, np.ndarray):
        return np.array2string(obs, precision=4, separator=", ")
    return str(obs)


def _default_parser_for(space: gym.Space) -> Parser:
    if isinstance(space, gym.spaces.Discrete):
        lo, hi = int(space.start), int(space.start + space.n - 1)

        def parse_discrete(text: str) -> int | None:
            nums = [int(m) for m in re.findall(r"-?\d+", text)]
            nums = [n for n in nums if lo <= n <= hi]
            return nums[-1] if nums else None

        return parse_discrete
    raise TypeError(
        f"no default parser for action space {space}; pass parser=... (text -> action or None)"
    )


def _describe_space(space: gym.Space) -> str:
    if isinstance(space, gym.spaces.Discrete):
        return f"an integer from {int(space.start)} to {int(space.start + space.n - 1)}"
    return str(space)


class GymnasiumEnvironment(Environment):
    """Wraps one Gymnasium env (`gym.Env`, a registered id, or a zero-argument factory).

    Args:
      env: the Gymnasium environment, its id (made with `gym.make(env, **make_kwargs)`), or a
        callable returning one. One wrapper holds one gym env: make a wrapper per episode in
        flight.
      formatter: `(observation, gym_env) -> str`; default `str(observation)`.
      parser: `(text) -> action | None`; default for Discrete spaces: the last integer in range.
      instructions: shown before the first observation when `task.prompt` is empty.
      action_help: appended to invalid-action feedback; default describes the action space.
      invalid_action_reward: reward of a step whose action was invalid (default 0.0).
      threaded: run the gym calls on the wrapper's own thread (for slow, blocking envs) so that
        timeouts apply; default False runs them inline (toy-text envs take microseconds).
      make_kwargs: keyword arguments for `gym.make` when `env` is an id.
      **limits: `max_steps`, `reset_timeout_s`, `step_timeout_s` (see `Environment`).

    Task fields used: `task.prompt` (instructions), `task.meta["seed"]` (reset seed),
    `task.meta["options"]` (reset options).
    """

    def __init__(
        self,
        env: gym.Env | str | Callable[[], gym.Env],
        *,
        formatter: Formatter | None = None,
        parser: Parser | None = None,
        instructions: str = "",
        action_help: str | None = None,
        invalid_action_reward: float = 0.0,
        threaded: bool = False,
        make_kwargs: dict[str, Any] | None = None,
        **limits: Any,
    ) -> None:
        super().__init__(**limits)
        if isinstance(env, str):
            env = gym.make(env, **(make_kwargs or {}))
        elif not isinstance(env, gym.Env) and callable(env):
            env = env()
        if not isinstance(env, gym.Env):
            raise TypeError(f"env must be a gymnasium.Env, an env id or a factory; got {type(env).__name__}")
        if self.max_steps is None and env.spec is not None and env.spec.max_episode_steps:
            self.max_steps = int(env.spec.max_episode_steps)
        self.gym_env = env
        self.formatter = formatter or _default_formatter
        self.parser = parser or _default_parser_for(env.action_space)
        self.instructions = instructions
        self.action_help = action_help or f"A valid action is {_describe_space(env.action_space)}."
        self.invalid_action_reward = float(invalid_action_reward)
        self.invalid_actions = 0
        """Invalid actions over this wrapper's lifetime."""
        # One daemon thread of its own (some gym envs are thread-affine); never blocks exit.
        self._pool = StageExecutor("gym", 1) if threaded else None
        self._last_obs: Any = None

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._pool is None:
            return fn(*args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def _reset(self, task: Task) -> Observation:
        seed = task.meta.get("seed")
        obs, info = await self._call(self.gym_env.reset, seed=seed, options=task.meta.get("options"))
        self._last_obs = obs
        intro = task.prompt or self.instructions
        text = self.formatter(obs, self.gym_env)
        return Observation(content=f"{intro}\n\n{text}" if intro else text, raw=obs, info={"gym_info": dict(info)})

    def _parse(self, action: Action) -> tuple[Any, str | None]:
        if action.value is not None:
            return action.value, None
        text = action.final_answer if action.final_answer is not None else action.text
        try:
            return self.parser(text), None
        except Exception as e:  # noqa: BLE001 - a parser bug must not kill the episode
            return None, f"{type(e).__name__}: {e}"

    async def _step(self, action: Action) -> StepResult:
        value, parse_exc = self._parse(action)
        space = self.gym_env.action_space
        valid = value is not None
        if valid:
            try:
                valid = bool(space.contains(value))
            except Exception:  # noqa: BLE001 - wrong type for the space
                valid = False
        if not valid:
            self.invalid_actions += 1
            shown = action.text if len(action.text) <= 200 else action.text[:200] + "..."
            feedback = (
                f"Invalid action: could not read a valid action from {shown!r}. {self.action_help}\n\n"
                f"{self.formatter(self._last_obs, self.gym_env)}"
            )
            info = {"invalid_action": True, "parsed": None if value is None else repr(value)}
            if parse_exc:
                info["parser_error"] = parse_exc
            return StepResult(
                observation=Observation(content=feedback, raw=self._last_obs),
                reward=self.invalid_action_reward,
                info=info,
            )
        obs, reward, terminated, truncated, info = await self._call(self.gym_env.step, value)
        self._last_obs = obs
        return StepResult(
            observation=Observation(content=self.formatter(obs, self.gym_env), raw=obs, info={"gym_info": dict(info)}),
            reward=float(reward),
            done=bool(terminated or truncated),
            truncated=bool(truncated and not terminated),
            info={"action": value, "terminated": bool(terminated)},
        )

    async def _close(self) -> None:
        self.gym_env.close()
        if self._pool is not None:
            self._pool.shutdown()


# ---------------------------------------------------------------------------- FrozenLake

FROZEN_LAKE_ACTIONS = ("left", "down", "right", "up")
"""FrozenLake-v1 action names by action id."""

_FL_WORDS = {
    "left": 0, "l": 0, "west": 0, "w": 0, "←": 0,
    "down": 1, "d": 1, "south": 1, "s": 1, "↓": 1,
    "right": 2, "r": 2, "east": 2, "e": 2, "→": 2,
    "up": 3, "u": 3, "north": 3, "n": 3, "↑": 3,
}  # fmt: skip


def _action_segment(text: str) -> str:
    """The part of a reply that states the action: inside <action>..</action>, after the last
    'Action:' / 'answer:', inside \\boxed{}, else the whole reply."""
    for pat in (r"<action>(.*?)</action>", r"\\boxed\{([^{}]*)\}"):
        found = re.findall(pat, text, flags=re.S | re.I)
        if found:
            return found[-1]
    m = list(re.finditer(r"(?:action|answer|move)\s*[:=]\s*(.+)", text, flags=re.I))
    if m:
        return m[-1].group(1).splitlines()[0]
    return text


def _parse_words(text: str, words: dict[str, int], n: int) -> int | None:
    seg = _action_segment(text).strip().lower()
    tokens = re.findall(r"[a-z]+|\d+|[←↓→↑]", seg)
    named: list[int] = []  # action words ("left", "pick up", "→")
    numbers: list[int] = []  # action ids ("2")
    letters: list[int] = []  # single-letter abbreviations ("L")
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        pair = f"{tok} {tokens[i + 1]}" if i + 1 < len(tokens) else ""
        if pair in words:
            named.append(words[pair])
            i += 2
            continue
        if tok.isdigit():
            if int(tok) < n:
                numbers.append(int(tok))
        elif tok in words:
            (letters if len(tok) == 1 and tok.isalpha() else named).append(words[tok])
        i += 1
    # Words beat ids, ids beat letters ("s" in "it's" is prose, not "south"); the last one wins.
    for hits in (named, numbers, letters):
        if hits:
            return hits[-1]
    return None


def parse_frozen_lake_action(text: str) -> int | None:
    """Forgiving FrozenLake parser: "left", "L", "0", "move left", "Action: ←", "<action>up</action>"
    all work; the last action named in the action part of the reply wins. None if none."""
    return _parse_words(text, _FL_WORDS, 4)


def format_frozen_lake(obs: Any, env: gym.Env) -> str:
    """Draw the lake with the player as P: S start, F frozen, H hole, G goal."""
    desc = env.unwrapped.desc
    nrow, ncol = desc.shape
    row, col = divmod(int(obs), ncol)
    lines = []
    for r in range(nrow):
        cells = [c.decode() if isinstance(c, bytes) else str(c) for c in desc[r]]
        if r == row:
            cells[col] = "P"
        lines.append(" ".join(cells))
    return (
        "\n".join(lines)
        + f"\nYou are P at row {row}, column {col} (0-based). Reach G without stepping into H."
        + "\nActions: left, down, right, up."
    )


def make_frozen_lake(*, map_name: str = "4x4", is_slippery: bool = False, **kwargs: Any) -> GymnasiumEnvironment:
    """FrozenLake-v1 as a text environment with the grid formatter and the forgiving parser.

    `kwargs` go to `GymnasiumEnvironment` (e.g. `max_steps`); default max_steps is the gym
    limit (100 for 4x4)."""
    env = gym.make("FrozenLake-v1", map_name=map_name, is_slippery=is_slippery)
    kwargs.setdefault(
        "instructions",
        "You are playing FrozenLake. Move on the grid from S to G; falling into a hole H ends the game.",
    )
    kwargs.setdefault("action_help", "Answer with one of: left, down, right, up.")
    return GymnasiumEnvironment(env, formatter=format_frozen_lake, parser=parse_frozen_lake_action, **kwargs)


# ---------------------------------------------------------------------------- Taxi

TAXI_ACTIONS = ("south", "north", "east", "west", "pickup", "dropoff")
"""Taxi-v4 action names by action id."""

_TAXI_WORDS = {
    "south": 0, "down": 0, "s": 0, "north": 1, "up": 1, "n": 1,
    "east": 2, "right": 2, "e": 2, "west": 3, "left": 3, "w": 3,
    "pickup": 4, "pick": 4, "p": 4, "pick up": 4,
    "dropoff": 5, "drop": 5, "d": 5, "drop off": 5,
}  # fmt: skip
_TAXI_LOCS = ("R", "G", "Y", "B")


def parse_taxi_action(text: str) -> int | None:
    """Forgiving Taxi parser: south/north/east/west (or down/up/right/left), pickup, dropoff, 0-5."""
    return _parse_words(text, _TAXI_WORDS, 6)


def format_taxi(obs: Any, env: gym.Env) -> str:
    """Draw the Taxi map with the taxi as T and say where the passenger and destination are."""
    taxi_row, taxi_col, pass_idx, dest_idx = env.unwrapped.decode(int(obs))
    grid = [[c.decode() if isinstance(c, bytes) else str(c) for c in row] for row in env.unwrapped.desc]
    grid[1 + taxi_row][2 * taxi_col + 1] = "T"
    passenger = "in the taxi" if pass_idx == 4 else f"waiting at {_TAXI_LOCS[pass_idx]}"
    return (
        "\n".join("".join(r) for r in grid)
        + f"\nTaxi T at row {taxi_row}, column {taxi_col}. Passenger {passenger}; destination {_TAXI_LOCS[dest_idx]}."
        + "\nActions: south, north, east, west, pickup, dropoff. Walls '|' block east/west moves."
    )


def make_taxi(**kwargs: Any) -> GymnasiumEnvironment:
    """Taxi-v4 as a text environment (map formatter, forgiving parser); kwargs as make_frozen_lake."""
    env = gym.make("Taxi-v4")
    kwargs.setdefault(
        "instructions",
        "You drive a taxi. Pick the passenger up and drop them off at the destination.",
    )
    kwargs.setdefault("action_help", "Answer with one of: south, north, east, west, pickup, dropoff.")
    return GymnasiumEnvironment(env, formatter=format_taxi, parser=parse_taxi_action, **kwargs)
