"""Train an agent written only against the `openai` SDK, unchanged: the calculator tool loop.

`calculator_agent(client, task)` (agentax.recipes.openai_calculator) is a plain chat-completions
tool loop: `client.chat.completions.create(..., tools=[calculator])`, run the calls, send the
results, stop at an answer. `OpenAIAgentEnvironment` points its `client` at the engine's own
endpoint (one session per episode) and hands the collector each episode as a token-exact
trajectory; the rest is the ordinary pipeline. With the warm start and held-out evaluation,
`agentax train openai_calculator` is the same run (docs/openai.md has its numbers).

Run: python examples/openai_sdk_agent.py [--steps N]
"""

import argparse

from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import SamplingParams
from agentax.recipes import calculator_reward, calculator_tasks
from agentax.recipes.openai_calculator import calculator_agent
from agentax.rollout import Collector, CollectorConfig
from agentax.serve import OpenAIAgentEnvironment
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, TrainerConfig


def main(steps):
    tokenizer = ByteTokenizer()
    model = Transformer(ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128,
                                         num_heads=2, num_kv_heads=1, head_dim=32), rngs=nnx.Rngs(0))
    engine = Engine(model, EngineConfig(max_slots=16, max_seq_len=384, prefill_chunk=64),
                    eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer)
    collector = Collector(
        engine, tokenizer,
        # the black-box agent; its reward: the exact number in its last reply without a call
        env_factory=lambda: OpenAIAgentEnvironment(calculator_agent, reward_fn=calculator_reward),
        agent_factory=ModelAgent,  # unused: the SDK agent is its own agent
        sampling=SamplingParams(temperature=1.0, max_tokens=32),
        config=CollectorConfig(max_turns=3, max_episode_tokens=360))
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=16,
                                             max_seq_len=384, min_seq_bucket=64))
    pipeline = Pipeline(collector, trainer, engine, calculator_tasks(256, seed=0),
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
