"""A synthetic asynchronous RL run, instrumented like a real one, for the doctor tests and the
span-dense figures of benchmarks/trace.py (which imports it from here; not part of the library).

Episodes (reset, then turns of model call + env step, a tool call every other turn, a reward)
run as asyncio tasks; an engine with `max_slots` slots serves model calls; complete groups go
through a bounded queue to a trainer that waits for them, trains, and publishes new weights;
the collector stops starting groups that would exceed `max_staleness`. Everything is recorded
with the real `Tracer` under the standard names.

With `virtual_time=True` the run executes on an event loop whose clock jumps to the next timer,
so minutes of simulated pipeline take milliseconds and every duration is exact.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import selectors
from typing import Any

from agentax.trace import CONFIG_FILENAME, MetricsLogger, Tracer, names


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticRun:
    """Shape of a synthetic run; durations in (virtual) seconds."""

    train_steps: int = 12
    groups_per_step: int = 1
    group_size: int = 4
    max_concurrency: int = 16  # episodes in flight
    max_slots: int = 16  # engine slots
    max_staleness: int = 2
    queue_size: int = 4  # complete groups waiting for the trainer
    turns: int = 3
    model_s: float = 0.2  # generation time of one model call once it has a slot
    env_s: float = 0.2  # median env step
    env_sigma: float = 0.3  # lognormal spread of env steps
    tool_s: float = 0.05
    reward_s: float = 0.02
    train_s: float = 0.5
    publish_s: float = 0.02
    seed: int = 0


SCENARIOS: dict[str, SyntheticRun] = {
    "environment": SyntheticRun(max_concurrency=16, max_slots=32, env_s=2.0, env_sigma=0.6,
                                model_s=0.2, train_s=0.5),
    "trainer": SyntheticRun(max_concurrency=32, max_slots=32, env_s=0.1, model_s=0.1,
                            train_s=3.0, max_staleness=4, queue_size=2),
    "engine_slots": SyntheticRun(max_concurrency=64, max_slots=4, env_s=0.1, model_s=0.3,
                                 train_s=0.3, max_staleness=4),
    "staleness": SyntheticRun(max_concurrency=64, max_slots=64, groups_per_step=4,
                              max_staleness=0, env_s=0.2, model_s=0.2, train_s=1.5, turns=3),
}


class _VirtualSelector(selectors.BaseSelector):
    """A selector whose waits advance a virtual clock instead of sleeping."""

    def __init__(self, clock: list[float]) -> None:
        self._inner = selectors.DefaultSelector()
        self._clock = clock

    def register(self, fileobj, events, data=None):
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._inner.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._inner.modify(fileobj, events, data)

    def get_map(self):
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout=None):
        ready = self._inner.select(0)
        if not ready:
            if timeout is None:
                raise RuntimeError("synthetic run deadlocked: nothing scheduled, nothing ready")
            self._clock[0] += timeout
        return ready


def virtual_time_loop() -> tuple[asyncio.AbstractEventLoop, list[float]]:
    """An event loop on a virtual clock (a one-element list of seconds)."""
    clock = [1000.0]
    loop = asyncio.SelectorEventLoop(_VirtualSelector(clock))
    loop.time = lambda: clock[0]  # type: ignore[method-assign]
    return loop, clock


class _Sim:
    def __init__(self, cfg: SyntheticRun, tracer: Tracer, metrics: MetricsLogger | None) -> None:
        self.cfg, self.tracer, self.metrics = cfg, tracer, metrics
        self.rng = random.Random(cfg.seed)
        self.version = 0
        self.weights = asyncio.Condition()
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=cfg.queue_size)
        self.slots = asyncio.Semaphore(cfg.max_slots)
        self.concurrency = asyncio.Semaphore(cfg.max_concurrency)
        self.active = self.waiting = 0
        self.next_episode = 0

    def _engine_counters(self) -> None:
        # Like the engine: both gauges at every state change, recorded only when they change.
        self.tracer.counter(names.ENGINE_ACTIVE_SLOTS, self.active, on_change=True)
        self.tracer.counter(names.ENGINE_WAITING, self.waiting, on_change=True)

    async def model_call(self) -> None:
        with self.tracer.span(names.MODEL_CALL):
            self.waiting += 1
            self._engine_counters()
            async with self.slots:
                self.waiting -= 1
                self.active += 1
                self._engine_counters()
                await asyncio.sleep(self.cfg.model_s)
                self.active -= 1
                self._engine_counters()

    async def episode(self, group: int) -> tuple[int, int]:
        cfg, tr = self.cfg, self.tracer
        eid = self.next_episode
        self.next_episode += 1
        flow = tr.new_flow_id()
        version = self.version
        with tr.span(names.EPISODE, track=names.episode_track(eid), flow_out=(flow,),
                     args={names.ARG_EPISODE_ID: eid, "group": group,
                           names.ARG_POLICY_VERSION: version}) as span:
            with tr.span(names.ENV_RESET):
                await asyncio.sleep(cfg.env_s * 0.2)
            for turn in range(cfg.turns):
                await self.model_call()
                with tr.span(names.ENV_STEP, args={"turn": turn}):
                    await asyncio.sleep(self.rng.lognormvariate(0.0, cfg.env_sigma) * cfg.env_s)
                if turn % 2 == 1:
                    with tr.span(names.TOOL_CALL, args={"tool": "calc"}):
                        await asyncio.sleep(cfg.tool_s)
            with tr.span(names.REWARD):
                await asyncio.sleep(cfg.reward_s)
            span.set_arg(names.ARG_STATUS, "ok")
        return flow, version

    async def rollout(self, group: int) -> None:
        cfg, tr = self.cfg, self.tracer
        with tr.span(names.ROLLOUT, track=f"rollout/{group}", args={"group": group}):
            results = await asyncio.gather(*(self._held_episode(group)
                                             for _ in range(cfg.group_size)))
            if self.queue.full():
                with tr.span(names.PRODUCER_BLOCKED):
                    await self.queue.put(results)
            else:
                self.queue.put_nowait(results)
            tr.counter(names.QUEUE_DEPTH, self.queue.qsize())
        for _ in results:
            self.concurrency.release()

    async def _held_episode(self, group: int) -> tuple[int, int]:
        return await self.episode(group)

    async def collector(self) -> None:
        cfg, tr = self.cfg, self.tracer
        tasks = []
        for group in range(cfg.train_steps * cfg.groups_per_step):
            step = group // cfg.groups_per_step
            if step > self.version + cfg.max_staleness:
                with tr.span(names.STALENESS_WAIT, track=names.COLLECTOR_TRACK,
                             args={"group": group}):
                    async with self.weights:
                        await self.weights.wait_for(
                            lambda: step <= self.version + cfg.max_staleness)
            for _ in range(cfg.group_size):
                await self.concurrency.acquire()
            tasks.append(asyncio.ensure_future(self.rollout(group)))
        await asyncio.gather(*tasks)

    async def trainer(self) -> None:
        cfg, tr = self.cfg, self.tracer
        for step in range(cfg.train_steps):
            groups = []
            with tr.span(names.TRAINER_WAIT, track=names.TRAINER_TRACK):
                for _ in range(cfg.groups_per_step):
                    groups.append(await self.queue.get())
            tr.counter(names.QUEUE_DEPTH, self.queue.qsize())
            flows = [f for g in groups for f, _ in g]
            staleness = max(self.version - v for g in groups for _, v in g)
            for g in groups:
                tr.counter(names.STALENESS, max(self.version - v for _, v in g))
            with tr.span(names.TRAIN_STEP, track=names.TRAINER_TRACK, flow_in=flows,
                         args={names.ARG_POLICY_VERSION: self.version + 1,
                               names.ARG_STALENESS: staleness}):
                await asyncio.sleep(cfg.train_s)
            with tr.span(names.WEIGHT_PUBLISH, track=names.TRAINER_TRACK):
                await asyncio.sleep(cfg.publish_s)
            async with self.weights:
                self.version += 1
                self.weights.notify_all()
            if self.metrics is not None:
                self.metrics.log(step, {"loss": 1.0 / (step + 1), "staleness_max": staleness,
                                        "groups": len(groups)})

    async def run(self) -> None:
        await asyncio.gather(self.collector(), self.trainer())


def write_config(run_dir: str, cfg: SyntheticRun) -> None:
    """A `config.yaml` carrying the knobs the doctor reads."""
    with open(os.path.join(run_dir, CONFIG_FILENAME), "w", encoding="utf-8") as f:
        f.write(f"pipeline:\n  max_concurrency: {cfg.max_concurrency}\n"
                f"  max_staleness: {cfg.max_staleness}\nengine:\n  max_slots: {cfg.max_slots}\n")


async def run_workload(cfg: SyntheticRun, tracer: Tracer,
                       metrics: MetricsLogger | None = None) -> None:
    """Run the synthetic pipeline on the current event loop (real or virtual time)."""
    await _Sim(cfg, tracer, metrics).run()


def simulate_run(run_dir: str | os.PathLike, cfg: SyntheticRun | str = "environment", *,
                 virtual_time: bool = True, capacity: int = 1 << 20) -> dict[str, Any]:
    """Write a complete synthetic run directory (trace, metrics.jsonl, config.yaml).

    Args:
      run_dir: output directory (created).
      cfg: a `SyntheticRun` or a scenario name from `SCENARIOS`.
      virtual_time: simulate on a virtual clock (fast, exact) instead of sleeping.
    Returns:
      The tracer's stats after closing.
    """
    if isinstance(cfg, str):
        if cfg not in SCENARIOS:
            raise ValueError(f"unknown scenario {cfg!r}; choose one of {sorted(SCENARIOS)}")
        cfg = SCENARIOS[cfg]
    run_dir = os.fspath(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    write_config(run_dir, cfg)
    if virtual_time:
        loop, clock = virtual_time_loop()
        tracer = Tracer(capacity=capacity, clock=lambda: int(clock[0] * 1e9))
    else:
        loop = asyncio.new_event_loop()
        tracer = Tracer(capacity=capacity)
    tracer.start(run_dir, process_name="agentax-synthetic")
    metrics = MetricsLogger(run_dir)
    try:
        loop.run_until_complete(run_workload(cfg, tracer, metrics))
    finally:
        loop.close()
        metrics.close()
        tracer.close()
    return tracer.stats()
