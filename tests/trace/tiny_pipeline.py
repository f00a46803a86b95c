"""A real tiny RL pipeline (byte model, engine, collector, trainer) with injectable bottlenecks.

Used by tests/trace/test_doctor_real.py (the doctor's verdicts on real runs) and by
benchmarks/trace.py (tracing overhead on a real pipeline, and whether the doctor's advice helps).
Everything is real agentax; only the environment's step latency and an added sleep in the train
step are injected. Generation never stops early (no end-of-sequence id), so every episode does
the same work and runs of one workload are comparable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import time

from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import Environment
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig, PipelineResult
from agentax.records import Observation, SamplingParams, StepResult, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.trace import get_tracer
from agentax.train import RLTrainer, TrainerConfig

MODEL = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                         num_kv_heads=1, head_dim=32)
TASKS = [Task(id=f"t{i}", prompt=f"Say {w}.") for i, w in enumerate(["hi", "yes", "abc", "ok"])]
MAX_SLOTS = 16
MAX_SEQ_LEN = 128


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """One injected shape of work; times in seconds."""

    turns: int = 1  # environment steps per episode
    env_step_s: float = 0.0  # every environment step sleeps this long
    tail_every: int = 0  # every k-th episode's steps sleep `tail_s` instead (0: never)
    tail_s: float = 0.0
    train_sleep_s: float = 0.0  # added to every train step (in the trainer's thread)
    train_spin_s: float = 0.0  # ... as Python work holding the GIL: compute the engine shares
    max_tokens: int = 8  # generated per model call (always all of them)
    max_concurrency: int = 8
    max_staleness: int = 1
    group_size: int = 2
    groups_per_step: int = 2
    reward: float | None = None  # every episode's reward (None: the reply's vowel share)
    filters: tuple[str, ...] = ()  # pipeline.filters
    max_dropped_episodes: int = 4096


WORKLOADS = {
    "environment": Workload(turns=3, env_step_s=0.15, max_concurrency=4),
    "trainer": Workload(train_sleep_s=0.6, max_concurrency=8),
    "model": Workload(max_tokens=100, max_concurrency=2),
    "staleness": Workload(tail_every=4, tail_s=0.5, env_step_s=0.01, train_sleep_s=0.25,
                          max_staleness=0, max_concurrency=8),
    # The same, but the train step computes on the engine's cores instead of sleeping.
    "staleness_shared": Workload(tail_every=4, tail_s=0.5, env_step_s=0.01, train_spin_s=0.25,
                                 max_staleness=0, max_concurrency=8),
}


class SleepyEnv(Environment):
    """Each step sleeps (the injected environment latency) and gives a vowel-share reward."""

    step_timeout_s = 30.0

    def __init__(self, work: Workload, counter: itertools.count) -> None:
        super().__init__()
        self.work = work
        slow = work.tail_every and next(counter) % work.tail_every == work.tail_every - 1
        self.delay_s = work.tail_s if slow else work.env_step_s

    async def _reset(self, task: Task) -> Observation:
        return Observation(content=task.prompt)

    async def _step(self, action) -> StepResult:
        await asyncio.sleep(self.delay_s)
        text = action.text
        reward = sum(c in "aeiou" for c in text) / max(len(text), 1) if self.work.reward is None \
            else self.work.reward
        return StepResult(observation=Observation(content="again"), reward=reward,
                          done=self.num_steps >= self.work.turns)


class TinyPipeline:
    """One model, engine, trainer and collector; `run` runs any workload on them.

    Built once (kernels compile once, at start-up: `precompile`), so each run measures only the
    workload. The policy version carries over from run to run, as in a resumed run.
    """

    def __init__(self, *, seed: int = 0) -> None:
        self.work = Workload()
        self.version = 0
        tok = ByteTokenizer()
        model = Transformer(MODEL, rngs=nnx.Rngs(seed))
        self.engine = Engine(model, EngineConfig(
            max_slots=MAX_SLOTS, max_seq_len=MAX_SEQ_LEN, prefill_chunk=64, min_prefill_bucket=64, max_prefill_rows=2,
            decode_steps_per_call=4, precompile=True), eos_token_ids=(), tokenizer=tok)
        self.trainer = RLTrainer(model, TrainerConfig(
            learning_rate=1e-3, micro_batch_size=8, max_seq_len=MAX_SEQ_LEN, min_seq_bucket=128,
            off_policy="tis", is_cap=2.0))
        step = self.trainer.step

        def train_step(groups):
            time.sleep(self.work.train_sleep_s)  # the injected slow train step
            end = time.perf_counter() + self.work.train_spin_s
            while time.perf_counter() < end:
                pass
            return step(groups)

        self.trainer.step = train_step
        counter = itertools.count()
        self.collector = Collector(
            self.engine, tok, lambda: SleepyEnv(self.work, counter),
            lambda: ModelAgent(system_prompt=None),
            SamplingParams(temperature=1.0, max_tokens=64),  # per run: `run` replaces it
            CollectorConfig(max_turns=8, max_episode_tokens=MAX_SEQ_LEN - 8,
                            model_timeout_s=60, episode_timeout_s=120))

    def run(self, work: Workload, steps: int, run_dir: str | None = None, *,
            env_factory=None) -> PipelineResult:
        """Run `steps` optimizer steps of `work`; with `run_dir`, traced into it (and a
        config.yaml with the knobs the doctor reads). `last_run_s` / `last_cpu_s` are the wall
        and process CPU time from starting the tracer to closing it; without `run_dir`, of the
        run and a `flush` of what it recorded into a file the caller started, if any (the run
        pays for encoding every event it recorded). `env_factory` replaces the sleepy
        environment for this run (e.g. a black-box agent's `OpenAIAgentEnvironment`)."""
        self.work = work
        default_env = self.collector.env_factory
        if env_factory is not None:
            self.collector.env_factory = env_factory
        self.collector.sampling = SamplingParams(temperature=1.0, max_tokens=work.max_tokens)
        self.collector.config = dataclasses.replace(self.collector.config, max_turns=work.turns)
        config = PipelineConfig(group_size=work.group_size, groups_per_step=work.groups_per_step,
                                max_concurrency=work.max_concurrency, filters=work.filters,
                                mode="async", max_staleness=work.max_staleness,
                                max_dropped_episodes=work.max_dropped_episodes)
        tracer = get_tracer()
        if run_dir is not None:
            os.makedirs(run_dir, exist_ok=True)
            with open(os.path.join(run_dir, "config.yaml"), "w", encoding="utf-8") as f:
                f.write(f"pipeline:\n  max_concurrency: {config.max_concurrency}\n"
                        f"  max_staleness: {config.max_staleness}\n"
                        f"engine:\n  max_slots: {MAX_SLOTS}\n")
            tracer.take_events()  # drop what earlier untraced runs left in the buffer
        start, cpu = time.perf_counter(), time.process_time()
        if run_dir is not None:
            tracer.start(run_dir)
        try:
            result = Pipeline(self.collector, self.trainer, self.engine, TASKS, config,
                              start_version=self.version).run(steps)
            if run_dir is None:
                tracer.flush()  # into the file the caller started, if any
        finally:
            self.collector.env_factory = default_env
            if run_dir is not None:
                tracer.close()
        self.last_run_s = time.perf_counter() - start
        self.last_cpu_s = time.process_time() - cpu
        self.version += steps
        return result

    def close(self) -> None:
        self.engine.shutdown()
