"""A bash task in a sandbox, trained with async GRPO: the agent must leave the right file behind.

CodeEnvironment gives every episode a fresh confined sandbox holding the task's files and
offers a `bash` tool; a check function inspects the sandbox after the final answer and sets
the reward. `agentax train bash` runs the same kind of task from a config.

Run: python examples/bash_task.py [--steps N]
"""

import argparse

from flax import nnx

from agentax.agents import ToolAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import CodeEnvironment
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.tools import SandboxConfig, SandboxUnavailableError, check_sandbox_available
from agentax.train import RLTrainer, TrainerConfig

NAMES = ["ada", "grace", "linus", "alan", "barbara", "ken"]
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def sorted_ok(sandbox, task, answer):
    """Reward: 1 if out.txt holds the distinct names sorted; 0.2 if it merely exists."""
    try:
        text = sandbox.read_file("out.txt")
    except Exception:
        return 0.0
    return 1.0 if text.split() == task.meta["expected"] else 0.2


def make_tasks(n):
    tasks = []
    for i in range(n):
        names = [NAMES[(i + k) % len(NAMES)] for k in range(4)] * 2
        tasks.append(Task(id=f"uniq-{i}", prompt="Write the distinct names of in.txt, sorted, to out.txt.",
                          meta={"files": {"in.txt": "\n".join(names) + "\n"},
                                "expected": sorted(set(names))}))
    return tasks


def main(steps):
    try:
        check_sandbox_available()
    except SandboxUnavailableError as e:
        print(f"skipped (no sandbox here): {e}")
        return
    tokenizer = ByteTokenizer()
    model = Transformer(ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128,
                                         num_heads=2, num_kv_heads=1, head_dim=32), rngs=nnx.Rngs(0))
    engine = Engine(model, EngineConfig(max_slots=8, max_seq_len=384, prefill_chunk=64),
                    eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer)
    env = lambda: CodeEnvironment(check=sorted_ok, tools=("bash",),  # noqa: E731
                                  sandbox_config=SandboxConfig(timeout_s=10), max_steps=2)
    collector = Collector(engine, tokenizer, env, lambda: ToolAgent([BASH]),
                          SamplingParams(temperature=1.0, max_tokens=48),
                          CollectorConfig(max_turns=2, max_episode_tokens=360))
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=8,
                                             max_seq_len=384, min_seq_bucket=128))
    pipeline = Pipeline(collector, trainer, engine, make_tasks(16),
                        PipelineConfig(group_size=4, groups_per_step=2, max_concurrency=8,
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
