"""The selfplay recipe's parts: tic-tac-toe between two roles of one trained policy.

`TicTacToe` is a `MultiAgentEnvironment` with roles "x" and "o". Each task is an opening (two
or three random marks already on the board); the role to move next sees its mark and the
board, empty cells shown by their digit (`x:1o34x6789`), and replies with a digit. A move onto
a taken cell, or a reply naming no cell, forfeits the game. Rewards: win 1, draw 0.5, loss or
forfeit 0 (a forfeit is the other role's win).

In training both roles sample from the trained policy (`env.roles: {x: trained, o: trained}`:
self-play), each role's moves forming its own GRPO groups. Evaluation plays the trained policy
as "x" against `random_player` (a fixed baseline that picks a random empty cell): an episode's
success is x's reward > 0, i.e. its win + draw rate. Held-out openings are never trained on.

The warm start imitates a careless demonstrator: it plays the centre ("5") whatever the board
with probability `centre` (a forfeit when the centre is taken), else a random empty cell.
Per-episode metrics: `forfeit` (the game ended on an illegal move), `draw`, `x_win`, `o_win`.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections.abc import Callable, Sequence

from agentax.agents import ModelAgent
from agentax.envs import MultiAgentEnvironment, RoleStep
from agentax.records import Message, Observation, Task

__all__ = ["TicTacToe", "demos", "make_agent", "make_env", "random_player", "render", "tasks",
           "winner"]

_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
_BOARD = re.compile(r"([xo]):([1-9xo]{9})")


def render(board: Sequence[str], mark: str) -> str:
    """What the role playing `mark` sees: `x:1o34x6789` (empty cells as their digit)."""
    return f"{mark}:" + "".join(c if c in "xo" else str(i + 1) for i, c in enumerate(board))


def winner(board: Sequence[str]) -> str | None:
    """"x" or "o" when that mark holds a line, "draw" on a full board, else None."""
    for a, b, c in _LINES:
        if board[a] in "xo" and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if all(c in "xo" for c in board) else None


def _to_move(board: Sequence[str]) -> str:
    return "x" if sum(c == "x" for c in board) == sum(c == "o" for c in board) else "o"


def _cell(text: str) -> int | None:
    m = re.search(r"[1-9]", text)
    return int(m.group()) - 1 if m else None


class TicTacToe(MultiAgentEnvironment):
    """Tic-tac-toe from the task's opening (`task.meta["opening"]`, 9 chars of x / o / .)."""

    roles = ("x", "o")

    def __init__(self, **limits) -> None:
        super().__init__(**limits)
        self.board: list[str] = []

    async def _reset(self, task: Task) -> RoleStep:
        self.board = list(task.meta.get("opening", "." * 9))
        mark = _to_move(self.board)
        return RoleStep(observations={mark: Observation(content=render(self.board, mark))},
                        next_role=mark)

    async def _step(self, role: str, action) -> RoleStep:
        other = "o" if role == "x" else "x"
        cell = _cell(action.text)
        if cell is None or self.board[cell] in "xo":
            return self._end({role: 0.0, other: 1.0}, forfeit=1.0, win=other)
        self.board[cell] = role
        result = winner(self.board)
        if result == role:
            return self._end({role: 1.0, other: 0.0}, win=role)
        if result == "draw":
            return self._end({role: 0.5, other: 0.5}, draw=1.0)
        return RoleStep(observations={other: Observation(content=render(self.board, other))},
                        next_role=other)

    @staticmethod
    def _end(rewards: dict[str, float], *, forfeit: float = 0.0, draw: float = 0.0,
             win: str | None = None) -> RoleStep:
        metrics = {"forfeit": forfeit, "draw": draw, "x_win": float(win == "x"),
                   "o_win": float(win == "o")}
        return RoleStep(rewards=rewards, done=True, info={"metrics": metrics})


def make_env(**limits) -> TicTacToe:
    """A fresh game (`limits`: `Environment`'s, e.g. step_timeout_s)."""
    return TicTacToe(**limits)


def make_agent(*, system_prompt: str = "") -> ModelAgent:
    """`ModelAgent` without a system prompt: the byte model learns the format from the
    demonstrations; the reply's first digit is the move."""
    return ModelAgent(system_prompt=system_prompt or None)


def random_player(*, seed: int = 0) -> Callable[[str], str]:
    """The fixed baseline: a random empty cell of the latest board in the conversation, drawn
    from the board and `seed` (the same position gets the same move in every run)."""

    def play(text: str) -> str:
        found = _BOARD.findall(text)
        if not found:
            return "1"
        cells = found[-1][1]
        empty = [c for c in cells if c not in "xo"]
        digest = hashlib.blake2b(f"{seed}/{text}".encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(digest, "little")).choice(empty) if empty else "1"

    return play


def tasks(*, num_train: int, num_eval: int, seed: int, premoves: Sequence[int] = (2, 3)
          ) -> tuple[list[Task], list[Task]]:
    """Distinct openings of `premoves` random marks (no finished game), shuffled; the
    held-out ones are never among the training ones. There are 324 of 2 or 3 marks."""
    openings = set()
    for k in premoves:
        for cells in itertools.permutations(range(9), k):
            board = ["."] * 9
            for i, c in enumerate(cells):
                board[c] = "x" if i % 2 == 0 else "o"
            if winner(board) is None:
                openings.add("".join(board))
    ordered = sorted(openings)
    random.Random(seed).shuffle(ordered)
    if num_train + num_eval > len(ordered):
        raise ValueError(f"only {len(ordered)} openings with premoves={list(premoves)}; ask for "
                         f"num_train + num_eval <= {len(ordered)}")
    out = [Task(id=f"ttt-{o}", meta={"opening": o}) for o in ordered[:num_train + num_eval]]
    return out[num_eval:], out[:num_eval]


def demos(train_tasks: Sequence[Task], n: int, seed: int, *, centre: float = 0.45
          ) -> list[list[Message]]:
    """n conversations of one role each, from games of the careless demonstrator against
    itself on training openings (cycled): the centre with probability `centre` whatever the
    board, else a random empty cell; a game ends as the environment would end it."""
    rng = random.Random(seed)
    convs: list[list[Message]] = []
    i = 0
    while len(convs) < n:
        board = list(train_tasks[i % len(train_tasks)].meta["opening"])
        i += 1
        talk: dict[str, list[Message]] = {"x": [], "o": []}
        while True:
            mark = _to_move(board)
            talk[mark].append(Message(role="user", content=render(board, mark)))
            empty = [c for c in range(9) if board[c] not in "xo"]
            cell = 4 if rng.random() < centre else rng.choice(empty)
            talk[mark].append(Message(role="assistant", content=str(cell + 1)))
            if board[cell] in "xo":
                break
            board[cell] = mark
            if winner(board) is not None:
                break
        convs.extend(c for c in talk.values() if c)
    return convs[:n]
