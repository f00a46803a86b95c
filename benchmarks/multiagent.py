"""Two-role episodes through one engine: the collector's one loop, concurrent, over the same
episodes with the roles' model calls made one after another.

Workload: a two-role "debate" (`Debate`): roles "pro" and "con" take turns, each sees the
other's last reply, 3 turns each (6 model calls an episode, 16 generated tokens at most a call),
sampled from the ~0.9M-parameter byte model (`ModelConfig.tiny`, random weights: the cost of
generation, not its quality, is measured). Both roles sample from the one engine (self-play).

  concurrent   all episodes at once through `Collector.run_episode_roles` (asyncio.gather):
               the engine batches the calls of every role of every episode in flight
  sequential   the same episodes, same seeds, one after another: each role's call waits for
               the previous one (no two model calls overlap)

Per-request seeds make both modes generate the same tokens (an engine request's key depends on
its own seed and position, never on the batch), checked: `same_tokens`.

Figures:
  multiagent_over_sequential   episodes/s concurrent / episodes/s sequential (goal >= 1.5)
  concurrent_episodes_per_s, sequential_episodes_per_s, episodes, model_calls

Untimed first: 3 concurrent runs and 2 sequential episodes (compilation). Then 3 alternated
pairs of timed runs; each mode's median time counts. --quick: 16 episodes (< 60 s on 2 cores).

Usage: python benchmarks/multiagent.py [--quick] [--episodes N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import MultiAgentEnvironment, RoleStep
from agentax.models import ModelConfig, Transformer
from agentax.records import Observation, SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer

TURNS_PER_ROLE = 3
MAX_TOKENS = 16
WARMUP_RUNS = 3
REPEATS = 3


class Debate(MultiAgentEnvironment):
    """"pro" and "con" alternate; each sees the other's last reply; 3 turns each."""

    roles = ("pro", "con")

    async def _reset(self, task):
        self.turns = 0
        return RoleStep(observations={"pro": Observation(content=task.prompt)}, next_role="pro")

    async def _step(self, role, action):
        self.turns += 1
        other = "con" if role == "pro" else "pro"
        done = self.turns >= 2 * TURNS_PER_ROLE
        reward = sum(c in "aeiou" for c in action.text) / max(len(action.text), 1)
        return RoleStep(observations={other: Observation(content=action.text[-24:] or "?")},
                        rewards={role: reward}, done=done, next_role=other)


def build(max_slots: int):
    tok = ByteTokenizer()
    model = Transformer(ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128,
                                         num_heads=2, num_kv_heads=1, head_dim=32),
                        rngs=nnx.Rngs(0))
    engine = Engine(model, EngineConfig(max_slots=max_slots, max_seq_len=256, prefill_chunk=64,
                                        decode_steps_per_call=4),
                    eos_token_ids=tok.eos_token_ids, tokenizer=tok)
    collector = Collector(engine, tok, Debate, ModelAgent,
                          SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS),
                          CollectorConfig(max_turns=2 * TURNS_PER_ROLE, max_episode_tokens=240))
    return engine, collector


async def run(collector, tasks, concurrent: bool):
    def one(i, task):
        return collector.run_episode_roles(task, seed=i, group_id="bench", sample_index=i)

    t0 = time.perf_counter()
    if concurrent:
        out = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    else:
        out = [await one(i, t) for i, t in enumerate(tasks)]
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 episodes (< 60 s)")
    ap.add_argument("--episodes", type=int, default=None, help="episodes per mode (default 48)")
    args = ap.parse_args()
    n = args.episodes or (16 if args.quick else 48)
    tasks = [Task(id=f"t{i}", prompt=f"Argue about {i}.") for i in range(n)]
    engine, collector = build(max_slots=2 * n)
    try:
        # Untimed: the batch and prompt shapes both modes meet compile here (concurrent
        # arrivals vary from run to run, so it gets several runs).
        for _ in range(WARMUP_RUNS):
            asyncio.run(run(collector, tasks, True))
        asyncio.run(run(collector, tasks[:2], False))
        seq_times, con_times = [], []
        for _ in range(REPEATS):  # alternated; the median of each mode is reported
            seq_s, seq = asyncio.run(run(collector, tasks, False))
            con_s, con = asyncio.run(run(collector, tasks, True))
            seq_times.append(seq_s)
            con_times.append(con_s)
        seq_s, con_s = statistics.median(seq_times), statistics.median(con_times)
    finally:
        engine.shutdown()

    def tokens(runs):
        return [[t.token_ids.tolist() for t in trajs] for trajs in runs]

    ok = all(t.status.value == "ok" for trajs in (*seq, *con) for t in trajs)
    figures = {
        "multiagent_over_sequential": round(seq_s / con_s, 3),
        "concurrent_episodes_per_s": round(n / con_s, 3),
        "sequential_episodes_per_s": round(n / seq_s, 3),
        "concurrent_s": [round(x, 3) for x in con_times],
        "sequential_s": [round(x, 3) for x in seq_times],
        "episodes": n, "model_calls": n * 2 * TURNS_PER_ROLE, "all_ok": ok,
        "same_tokens": tokens(seq) == tokens(con), "quick": bool(args.quick),
        "workload": f"2 roles on one engine, {TURNS_PER_ROLE} turns each, <= {MAX_TOKENS} "
                    "tokens a call, byte model ModelConfig.tiny (2 layers), random weights",
    }
    os.makedirs(Path(__file__).with_name("results"), exist_ok=True)
    with open(Path(__file__).with_name("results") / "multiagent.json", "w") as f:
        json.dump(figures, f, indent=2)
    print(f"multiagent_over_sequential {figures['multiagent_over_sequential']:.2f} "
          f"({figures['concurrent_episodes_per_s']:.2f} vs {figures['sequential_episodes_per_s']:.2f} "
          f"episodes/s, {n} episodes)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
