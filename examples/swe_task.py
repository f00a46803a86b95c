"""Software engineering, trained with async GRPO: fix a bug in a small repository until its
tests pass.

SWEEnvironment copies one of the built-in repositories into a sandbox and offers file tools
(list_files, read_file, search, write_file, replace_in_file) and run_tests; the reward is 1.0
when the test suite passes after the agent's final answer. SWEAgent is a ToolAgent with a
system prompt for the job. An untrained tiny model will not fix anything: this shows the
wiring; `agentax train swe_tiny` runs it from a config.

Run: python examples/swe_task.py [--steps N]
"""

import argparse

from flax import nnx

from agentax.agents import SWEAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import SWEEnvironment, swe_tasks
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import SamplingParams
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.tools import SandboxUnavailableError, check_sandbox_available
from agentax.train import RLTrainer, TrainerConfig


def main(steps):
    try:
        check_sandbox_available()
    except SandboxUnavailableError as e:
        print(f"skipped (no sandbox here): {e}")
        return
    tokenizer = ByteTokenizer()
    model = Transformer(ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128,
                                         num_heads=2, num_kv_heads=1, head_dim=32), rngs=nnx.Rngs(0))
    # SWEAgent's instructions and six tool schemas are ~3,200 bytes before the task's own text.
    engine = Engine(model, EngineConfig(max_slots=8, max_seq_len=4096, prefill_chunk=256),
                    eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer)
    collector = Collector(engine, tokenizer, lambda: SWEEnvironment(max_steps=2), SWEAgent,
                          SamplingParams(temperature=1.0, max_tokens=32),
                          CollectorConfig(max_turns=2, max_episode_tokens=4000))
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=4,
                                             max_seq_len=4096, min_seq_bucket=512))
    pipeline = Pipeline(collector, trainer, engine, swe_tasks(),
                        PipelineConfig(group_size=2, groups_per_step=2, max_concurrency=4,
                                       filters=()),
                        on_step=lambda r: print(f"step {r.step}: reward {r.reward_mean:.2f}"))
    try:
        result = pipeline.run(steps)
    finally:
        engine.shutdown()
    print(f"trained {result.trajectories_trained} episodes in {result.wall_s:.1f} s; "
          f"outcomes {result.accounting.summary()}")
    assert len(result.steps) == steps


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    main(parser.parse_args().steps)
