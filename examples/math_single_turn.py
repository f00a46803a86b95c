"""Single-turn math with a verifier reward, trained with async GRPO — the whole loop in one file.

TaskEnvironment asks one question and scores the reply with `math_verify`; ModelAgent sends the
question and takes the reply as the answer. The rest is the training stack every example
shares: a model, the continuous-batching engine, the collector, the trainer and the pipeline.
A freshly initialised byte-level model scores ~0 here, so this shows the mechanics; swap in a
real checkpoint (`agentax.models.load_pretrained`) and its tokenizer to learn.

Run: python examples/math_single_turn.py [--steps N]
"""

import argparse
import random

from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import TaskEnvironment
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, TrainerConfig


def make_tasks(n, seed=0):
    rng = random.Random(seed)
    pairs = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(n)]
    return [Task(id=f"add-{i}", prompt=f"{a}+{b}=", answer=str(a + b)) for i, (a, b) in enumerate(pairs)]


def main(steps):
    tokenizer = ByteTokenizer()
    model = Transformer(ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128,
                                         num_heads=2, num_kv_heads=1, head_dim=32), rngs=nnx.Rngs(0))
    engine = Engine(model, EngineConfig(max_slots=16, max_seq_len=64, prefill_chunk=32),
                    eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer)
    collector = Collector(engine, tokenizer,
                          env_factory=lambda: TaskEnvironment("math_verify"),
                          agent_factory=lambda: ModelAgent(),
                          sampling=SamplingParams(temperature=1.0, max_tokens=6),
                          config=CollectorConfig(max_turns=1, max_episode_tokens=48))
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=16,
                                             max_seq_len=64, min_seq_bucket=64))
    pipeline = Pipeline(collector, trainer, engine, make_tasks(256),
                        PipelineConfig(mode="async", group_size=4, groups_per_step=4,
                                       max_concurrency=16, filters=()),
                        on_step=lambda r: print(f"step {r.step}: reward {r.reward_mean:.3f}, "
                                                f"staleness {max(r.staleness)}"))
    try:
        result = pipeline.run(steps)
    finally:
        engine.shutdown()
    print(f"trained {result.trajectories_trained} episodes in {result.wall_s:.1f} s; "
          f"final reward {result.steps[-1].reward_mean:.3f}")
    assert len(result.steps) == steps and result.trajectories_trained == 16 * steps


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    main(parser.parse_args().steps)
