"""Multi-turn tool use: the model may call a calculator, read its result and answer.

ToolEnvironment runs the tool calls the agent parses (Hermes `<tool_call>` JSON) and scores
the final answer with `math_verify`; the collector keeps each episode as one token stream,
the model's own tokens with loss mask 1 and the tool output with mask 0, which is what the
trainer receives. For the tiny model learning this in two minutes, see `agentax train
calculator` (SFT warm start first); this file shows the same loop in plain Python.

Run: python examples/calculator_tool.py [--steps N]
"""

import argparse

from flax import nnx

from agentax.agents import ToolAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import ToolEnvironment
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.tools import calculator
from agentax.train import RLTrainer, TrainerConfig

TASKS = [Task(id=f"calc-{a}-{b}", prompt=f"What is {a}*{b}?", answer=str(a * b))
         for a in range(11, 30) for b in range(3, 9)]


def main(steps):
    tokenizer = ByteTokenizer()
    model = Transformer(ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128,
                                         num_heads=2, num_kv_heads=1, head_dim=32), rngs=nnx.Rngs(0))
    # The system prompt (ToolAgent's instructions and calc's JSON schema) is ~630 bytes alone;
    # one prefill chunk shape compiles fewer kernels than chunks of 16 to 128.
    engine = Engine(model, EngineConfig(max_slots=16, max_seq_len=768, prefill_chunk=128,
                                        min_prefill_bucket=128),
                    eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer)
    collector = Collector(engine, tokenizer,
                          env_factory=lambda: ToolEnvironment([calculator], "math_verify"),
                          agent_factory=lambda: ToolAgent([calculator]),
                          sampling=SamplingParams(temperature=1.0, max_tokens=24),
                          config=CollectorConfig(max_turns=3, max_episode_tokens=760))
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=16,
                                             max_seq_len=768, min_seq_bucket=128))
    pipeline = Pipeline(collector, trainer, engine, TASKS,
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
