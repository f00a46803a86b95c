"""Any Gymnasium environment as a text environment: CliffWalking-v1 with our own formatter
(observation -> text) and parser (text -> action), trained with async GRPO.

Gymnasium rewards pass through unchanged (-1 a step, -100 for the cliff); a reply that names
no move costs -1 too. An untrained policy's group often gets one reward for every sample, so
the example keeps such groups (`filters=()`) instead of waiting for a learning signal.

Run: python examples/gymnasium_wrapper.py [--steps N]
"""

import argparse
import re

from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import GymnasiumEnvironment
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, TrainerConfig

MOVES = {"up": 0, "right": 1, "down": 2, "left": 3}


def describe(obs, gym_env):
    row, col = divmod(int(obs), 12)
    return f"row {row}, col {col}; goal row 3, col 11"


def parse(text):
    words = re.findall(r"up|right|down|left", text.lower())
    return MOVES[words[-1]] if words else None


def make_env():
    return GymnasiumEnvironment("CliffWalking-v1", formatter=describe, parser=parse,
                                instructions="Reach the goal. Moves: up, right, down, left.",
                                invalid_action_reward=-1.0, max_steps=4)


def main(steps):
    tokenizer = ByteTokenizer()
    model = Transformer(ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128,
                                         num_heads=2, num_kv_heads=1, head_dim=32), rngs=nnx.Rngs(0))
    engine = Engine(model, EngineConfig(max_slots=16, max_seq_len=384, prefill_chunk=64),
                    eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer)
    collector = Collector(engine, tokenizer, make_env, lambda: ModelAgent(),
                          SamplingParams(temperature=1.0, max_tokens=8),
                          CollectorConfig(max_turns=4, max_episode_tokens=360))
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=16,
                                             max_seq_len=384, min_seq_bucket=128))
    tasks = [Task(id=f"cliff-{seed}", meta={"seed": seed}) for seed in range(16)]
    pipeline = Pipeline(collector, trainer, engine, tasks,
                        PipelineConfig(group_size=4, groups_per_step=4, max_concurrency=16,
                                       filters=()),  # keep groups whose rewards are all equal
                        on_step=lambda r: print(f"step {r.step}: reward {r.reward_mean:.2f}"))
    try:
        result = pipeline.run(steps)
    finally:
        engine.shutdown()
    print(f"trained {result.trajectories_trained} episodes in {result.wall_s:.1f} s")
    assert len(result.steps) == steps


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    main(parser.parse_args().steps)
