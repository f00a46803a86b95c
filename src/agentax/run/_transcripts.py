"""Episode transcripts: RUN_DIR/transcripts.jsonl, one JSON object per episode.

A run keeps a sample of what its agent did, so a flat curve can be read episode by episode:
`tracing.transcripts_fraction` of the trained RL episodes (chosen by a hash of the run seed and
the episode's group and sample, so a resumed run picks the same ones) and the first
`tracing.eval_transcripts` episodes of every evaluation, per mode (in task order, so the
evaluations before and after RL show the same tasks). `agentax show` reads them back.

A record (docs/tracing.md, "Transcripts"): phase (train, eval_before, eval_mid, eval_after,
eval, eval_after_sft), step (the RL step that trained it, or at which the evaluation ran),
segment (the RL step its process started from: a resumed run appends), mode, task and episode
ids, reward, success, status, reason, token counts, policy versions, the episode's metrics,
the conversation (`messages`, with roles) and per model call (`turns`) the raw generated text
and the parsed action.

Writing is cheap (a few records a step, appended and flushed once) and never fails a run: the
first error is one warning, and the run goes on without transcripts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from agentax.run._evaluate import EvalResult, episode_metrics
from agentax.records import Action, Group, Trajectory, Turn

__all__ = ["TRANSCRIPTS_FILENAME", "Transcripts", "episode_record", "read_transcripts"]

TRANSCRIPTS_FILENAME = "transcripts.jsonl"


def _versions(versions: np.ndarray) -> list[int]:
    """The distinct policy versions among generated tokens (-1 marks the others)."""
    return [int(v) for v in np.unique(versions) if v >= 0]


def _action(action: Action) -> dict[str, Any]:
    """What the agent parsed from a reply (its text is the turn's raw text)."""
    out: dict[str, Any] = {}
    if action.tool_calls:
        out["tool_calls"] = [{"name": c.name, "arguments": dict(c.arguments)}
                             for c in action.tool_calls]
    if action.parse_errors:
        out["parse_errors"] = [{"raw": e.raw, "message": e.message} for e in action.parse_errors]
    if action.final_answer is not None:
        out["final_answer"] = action.final_answer
    if action.value is not None:
        out["value"] = action.value
    return out


def _turn(turn: Turn, tokenizer: Any) -> dict[str, Any]:
    """One model call: the raw generated text (special tokens kept), its tokens, the parsed
    action and the environment's answer (its text is in `messages`)."""
    completion = turn.completion
    out: dict[str, Any] = {
        "raw": tokenizer.decode([int(i) for i in completion.token_ids], skip_special_tokens=False),
        "prompt_tokens": int(turn.prompt_ids.size), "completion_tokens": completion.num_tokens,
        "finish_reason": completion.finish_reason.value,
        "policy_versions": _versions(completion.versions), "reward": float(turn.reward),
        "action": _action(turn.action)}
    observation = turn.observation
    if observation is not None and observation.tool_results:
        out["tool_results"] = [{"name": r.name, "ok": r.ok, "error": r.error}
                               for r in observation.tool_results]
    return out


def episode_record(traj: Trajectory, tokenizer: Any, *, phase: str, step: int, segment: int,
                   mode: str = "", trained_tokens: int = 0,
                   group_rewards: Sequence[float] | None = None) -> dict[str, Any]:
    """The transcript record of one episode (see the module docstring).

    Args:
      trained_tokens: generated tokens the loss saw (0 for an evaluation episode).
      group_rewards: the rewards of the episode's whole group (training episodes: what its
        advantage was computed against).
    """
    generated = traj.num_generated
    record: dict[str, Any] = {
        "phase": phase, "step": int(step), "segment": int(segment), "mode": mode,
        "task_id": traj.task_id, "group_id": traj.group_id, "sample_index": traj.sample_index,
        "reward": float(traj.reward), "success": bool(traj.reward > 0),
        "status": traj.status.value, "reason": str(traj.info.get("reason", "")),
        "tokens": {"prompt": traj.num_tokens - generated, "completion": generated,
                   "trained": int(trained_tokens), "total": traj.num_tokens},
        "policy_versions": _versions(traj.versions[traj.loss_mask > 0]),
        "metrics": episode_metrics(traj),
        "messages": [m.to_dict() for m in traj.info.get("messages", ())],
        "turns": [_turn(t, tokenizer) for t in traj.turns],
    }
    if "role" in traj.info:  # one role's view of a multi-agent episode
        record["role"] = str(traj.info["role"])
        record["roles"] = [str(r) for r in traj.info.get("roles", ())]
        for turn in record["turns"]:
            turn["role"] = record["role"]
    if group_rewards is not None:
        record["group_rewards"] = [float(r) for r in group_rewards]
    if "error" in traj.info:
        record["error"] = str(traj.info["error"])
    if "agent_returned" in traj.info:
        record["agent_returned"] = str(traj.info["agent_returned"])
    return record


def _chosen(seed: int, traj: Trajectory, fraction: float) -> bool:
    """Whether a training episode is kept: a hash of (seed, group, sample) below `fraction`
    (the same episodes on every run of the same seed, resumed or not)."""
    if fraction >= 1.0:
        return True
    digest = hashlib.blake2b(f"{seed}/{traj.group_id}/{traj.sample_index}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < fraction


class Transcripts:
    """Appends episode records to RUN_DIR/transcripts.jsonl (opened on the first record).

    Args:
      run_dir: the run directory.
      tokenizer: decodes the generated tokens into the raw text.
      fraction: share of the trained RL episodes to keep (0: none).
      eval_first: episodes kept from the start of every evaluation, per mode (0: none).
      seed: the run seed (which training episodes are kept).
      segment: the RL step this process started from (0, or where a resume continued).
      max_seq_len: the trainer's; generated tokens beyond it are not trained on.
      warn: prints a warning line (the first write error, once).
    """

    def __init__(self, run_dir: Path, tokenizer: Any, *, fraction: float, eval_first: int,
                 seed: int, segment: int = 0, max_seq_len: int | None = None,
                 warn: Callable[[str], None] = print) -> None:
        self.path = Path(run_dir) / TRANSCRIPTS_FILENAME
        self.tokenizer, self.fraction, self.eval_first = tokenizer, fraction, eval_first
        self.seed, self.segment, self.max_seq_len, self.warn = seed, segment, max_seq_len, warn
        self._file: TextIO | None = None
        self._failed = False

    def trained(self, step: int, groups: Sequence[Group], *, skipped: bool = False) -> None:
        """Keeps the sampled episodes of the groups RL step `step` trained on (`skipped`: the
        trainer applied no update, so no token was trained)."""
        if self.fraction <= 0:
            return
        self._write(lambda: [
            self._record(t, "train", step, trained=not skipped, group_rewards=[u.reward for u in g.trajectories])
            for g in groups for t in g.trajectories if _chosen(self.seed, t, self.fraction)])

    def evaluated(self, phase: str, step: int, results: Iterable[EvalResult]) -> None:
        """Keeps the first episodes of an evaluation (`EvalResult.examples`)."""
        self._write(lambda: [self._record(t, phase, step, mode=r.mode)
                             for r in results for t in r.examples[: self.eval_first]])

    def _record(self, traj: Trajectory, phase: str, step: int, *, mode: str = "sampled",
                trained: bool = False, group_rewards: Sequence[float] | None = None) -> dict:
        mask = traj.loss_mask if self.max_seq_len is None else \
            traj.loss_mask[: self.max_seq_len + 1]  # the trainer keeps max_seq_len + 1 tokens
        return episode_record(traj, self.tokenizer, phase=phase, step=step, segment=self.segment,
                              mode=mode, trained_tokens=int(mask.sum()) if trained else 0,
                              group_rewards=group_rewards)

    def _write(self, make: Callable[[], list[dict[str, Any]]]) -> None:
        """Builds and appends records; the first failure warns once and stops transcripts."""
        if self._failed:
            return
        try:
            records = make()
            if not records:
                return
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")
            self._file.write("".join(json.dumps(r, default=str) + "\n" for r in records))
            self._file.flush()
        except Exception as e:  # noqa: BLE001 - transcripts must never fail a run
            self._failed = True
            self.warn(f"cannot write transcripts to {self.path} ({type(e).__name__}: {e}); "
                      "the run goes on without them")

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:  # a full disk at the last flush: the run is not lost for it
                pass
            self._file = None


def read_transcripts(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of RUN_DIR/transcripts.jsonl (a line torn by a kill is skipped).

    Raises:
      FileNotFoundError: the run has no transcripts (yet).
    """
    path = Path(run_dir) / TRANSCRIPTS_FILENAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no {TRANSCRIPTS_FILENAME} yet: `agentax train` and `agentax eval` "
            "write it as episodes finish (tracing.transcripts_fraction, "
            "tracing.eval_transcripts)")
    records = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, Mapping):
                records.append(dict(record))
    return records
