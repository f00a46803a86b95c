"""FrozenLake with a custom agent, trained with async GRPO.

`make_frozen_lake` wraps FrozenLake-v1 (GymnasiumEnvironment: a grid formatter and a forgiving
action parser); FrozenLakeAgent subclasses Agent to explain the grid in its system prompt and
to read "left", "L", "0", "Action: left" alike. Every task is one map seed; a reply that names
no action comes back as feedback, never as a crash. `agentax train frozen_lake` trains the
tiny model to solve held-out random maps (SFT on a noisy planner first).

Run: python examples/frozen_lake_agent.py [--steps N]
"""

import argparse

from flax import nnx

from agentax.agents import FrozenLakeAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import make_frozen_lake
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, TrainerConfig


def main(steps):
    tokenizer = ByteTokenizer()
    model = Transformer(ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128,
                                         num_heads=2, num_kv_heads=1, head_dim=32), rngs=nnx.Rngs(0))
    # One prefill chunk shape (prompts ~560 bytes, observations ~180): 11 kernels, not 17.
    engine = Engine(model, EngineConfig(max_slots=16, max_seq_len=1024, prefill_chunk=128,
                                        min_prefill_bucket=128),
                    eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer)
    collector = Collector(engine, tokenizer,
                          env_factory=lambda: make_frozen_lake(is_slippery=True, max_steps=4),
                          agent_factory=lambda: FrozenLakeAgent(),
                          sampling=SamplingParams(temperature=1.0, max_tokens=16),
                          config=CollectorConfig(max_turns=4, max_episode_tokens=1000))
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=16,
                                             max_seq_len=1024, min_seq_bucket=256))
    tasks = [Task(id=f"lake-{seed}", meta={"seed": seed}) for seed in range(64)]
    pipeline = Pipeline(collector, trainer, engine, tasks,
                        PipelineConfig(group_size=4, groups_per_step=4, max_concurrency=16,
                                       filters=()),
                        on_step=lambda r: print(f"step {r.step}: reward {r.reward_mean:.3f}"))
    try:
        result = pipeline.run(steps)
    finally:
        engine.shutdown()
    print(f"trained {result.trajectories_trained} episodes in {result.wall_s:.1f} s; "
          f"outcomes {result.accounting.summary()}")
    assert len(result.steps) == steps and result.trajectories_trained == 16 * steps


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    main(parser.parse_args().steps)
