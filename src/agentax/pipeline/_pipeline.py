"""The producer/consumer pipeline: episodes stream into groups, groups stream into the trainer.

async mode (the point of agentax):

    producer ──(StalenessGate)──► group of G episodes (engine-batched) ──► filters ──► ready
                                                                                      │ complete
    engine ◄── weights, version v ◄── trainer.step(groups_per_step groups) ◄──────────┘ groups

* The producer admits a new group only while the staleness bound allows it (`StalenessGate`),
  and only while fewer than `max_concurrency` episodes are in flight. A group is its G episodes
  run with `asyncio.gather`; failed members sink the group and the configured filters
  (`GROUP_FILTERS`) run on it — a dropped group is counted by reason and its place released.
* The trainer takes complete groups as they arrive — no batch barrier — earliest staleness
  deadline first, and steps as soon as it has `groups_per_step` of them. It waits for a
  straggler only when the straggler's deadline has come, so no admitted group goes stale; a
  group staler than `max_staleness` anyway is dropped and counted (a safety net). A straggler
  that has run `straggler_factor` (3.5) x the median group time while complete groups could
  fill the step without it is cancelled and counted as `stale` instead (`StragglerLimit`; 0 never
  drops).
* New weights go to the engine between two decode steps, tagged with their version;
  in-flight episodes keep going.

sync mode is the classic loop, written separately as the baseline: start a batch of groups,
wait for all of them, train, publish, repeat. With `max_staleness=0` the async pipeline admits
exactly the same groups with the same seeds and trains on the same tokens.

The trainer step (a blocking JAX call) runs on its own thread so the event loop keeps
collecting meanwhile. Every started episode ends up trained, filtered or failed (`Accounting`).
A run that cannot make progress stops with `RunFailed` (see `_breaker.py`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentax import _aio as aio
from agentax._executors import set_stage_threads
from agentax.contracts import EngineClient
from agentax.pipeline._accounting import Accounting
from agentax.pipeline._breaker import FailureBreaker, LoopWatchdog, RunFailed, describe_stuck
from agentax.pipeline._config import PipelineConfig
from agentax.pipeline._confident import DropReport, SuccessStop, TaskRest
from agentax.pipeline._placement import publish_into
from agentax.pipeline._screen import GroupScreening
from agentax.pipeline._staleness import StalenessGate, StragglerLimit
from agentax.pipeline._steps import (
    PipelineResult,
    StepRecord,
    _Members,
    _next_group,
    _Running,
    _result_or_failure,
    drop_all_equal_rewards,
    group_staleness,
    split_roles,
)
from agentax.records import Group, Task, Trajectory, TrajectoryStatus
from agentax.rollout import Collector, episode_seed
from agentax.trace import get_tracer, names

__all__ = ["Pipeline", "PipelineResult", "StepRecord", "drop_all_equal_rewards", "group_staleness",
           "split_roles"]

log = logging.getLogger(__name__)
_DROP_STREAK_WARNING = 8  # in units of groups_per_step: all-equal groups before a first warning
_MAX_SKIPS = 4096  # admissions of resting tasks skipped at most in a row (then one runs anyway)
TRAIN_FINISH_S = 600.0  # a stopping run waits this long for the train step in flight


class Pipeline(GroupScreening):
    """Wires a collector, an engine and a trainer.

    Args:
      collector: runs episodes (it holds the engine, environments and agents).
      trainer: anything with `step(groups) -> metrics`, `params_for_engine()`; e.g. RLTrainer.
      engine: the engine the collector samples from (receives published weights).
      tasks: a sequence of `Task`s (group i uses tasks[i % len]) or a callable i -> Task.
      config: the pipeline knobs.
      on_step: called with each `StepRecord` (progress display, metrics, checkpoints).
      on_episode: called with every finished `Trajectory`, as it finishes, whatever becomes of
        its group (trained, filtered, failed); e.g. to aggregate per-episode metrics.
      on_trained: called with each `StepRecord` and the groups that step trained on, just
        before `on_step`; e.g. to keep transcripts of trained episodes.
      publish: how weights reach the engine, `publish(trainer, engine, version)`; default
        `publish_into`: an agentax `Engine` and trainer write in place
        (`engine.update_weights(trainer.params_for_engine(live=True), version,
        in_place=True)`), anything else gets `engine.update_weights(
        trainer.params_for_engine(), version)`.
      start_version / start_group: where a resumed run continues (`start_group`: this
        process's own group counter, `next_group`).
      data_shard: (this process's index, process count): with several processes each admits
        the groups whose data index is `local index * count + process index`, so the
        processes' tasks, seeds and group ids are disjoint and a step trains on the groups of
        all of them; default: JAX's process index and count ((0, 1) in one process).
    """

    def __init__(
        self,
        collector: Collector,
        trainer: Any,
        engine: EngineClient,
        tasks: Sequence[Task] | Callable[[int], Task],
        config: PipelineConfig = PipelineConfig(),
        *,
        on_step: Callable[[StepRecord], None] | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
        on_trained: Callable[[StepRecord, Sequence[Group]], None] | None = None,
        publish: Callable[[Any, Any, int], None] | None = None,
        start_version: int = 0,
        start_group: int = 0,
        data_shard: tuple[int, int] | None = None,
    ):
        if not callable(tasks) and len(tasks) == 0:
            raise ValueError("Pipeline needs at least one task")
        if data_shard is None:
            from agentax.train import process_count, process_index

            data_shard = (process_index(), process_count())
        if not (data_shard[1] >= 1 and 0 <= data_shard[0] < data_shard[1]):
            raise ValueError(f"data_shard={data_shard} must be (index, count) with 0 <= index < count")
        self.data_shard = (int(data_shard[0]), int(data_shard[1]))
        if config.stop_success and self.data_shard[1] > 1:
            raise ValueError(f"pipeline.stop_success={config.stop_success:g} needs a run of one "
                             f"process (this one has {self.data_shard[1]}: each would stop on "
                             "its own episodes); set pipeline.stop_success=0")
        self.collector = collector
        self.trainer = trainer
        self.engine = engine
        self.tasks = tasks
        self.config = config
        self.on_step = on_step
        self.on_episode = on_episode
        self.on_trained = on_trained
        self.publish_fn = publish or _publish_colocated
        self.tracer = get_tracer()
        self.accounting = Accounting()
        self.version = start_version
        self.next_group = start_group
        """Index of the next group to admit (the task/data position, saved in checkpoints)."""
        self.breaker = FailureBreaker(config.breaker_window, config.breaker_failure_rate)
        set_stage_threads(env=config.env_threads, tool=config.tool_threads, reward=config.reward_threads)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentax-trainer")
        self._drop_streak = 0
        self._filtered_streak = 0  # episodes dropped by filters since the last kept group
        self._rest = TaskRest(config.rest_confident_after, config.rest_confident_max)
        self._drops = DropReport(min_groups=_DROP_STREAK_WARNING * config.groups_per_step)
        self._admitted: dict[int, Task] = {}  # group index -> its task, chosen at admission
        self._training: asyncio.Future | None = None  # the train step in flight (_train_whole)
        self.on_loop_stuck: Callable[[RunFailed], Any] | None = None
        """Called from a watchdog thread when the event loop stays blocked after the loop
        watchdog stopped the run (the loop may never run again): e.g. exit the process."""
        self._failure: asyncio.Future | None = None
        self._stop: asyncio.Future | None = None  # set with the reason when RL ends early
        self._success = SuccessStop(config.stop_success, config.stop_window)
        self._records: list[StepRecord] = []  # this `arun`'s steps, as each one finishes
        self.stopped_early = ""
        """Why the last `arun` ended before its `num_steps` (`PipelineConfig.stop_success`);
        empty when it ran them all."""
        self._abandoned: set[asyncio.Task] = set()  # had their cancellation grace (`arun`)
        self._waiting_since: float | None = None  # the trainer waits for groups since then

    # ------------------------------------------------------------------ shared pieces

    def data_index(self, local_index: int) -> int:
        """The data index of this process's `local_index`-th group (its task, seeds and id)."""
        return local_index * self.data_shard[1] + self.data_shard[0]

    def task_for(self, group_index: int) -> Task:
        if callable(self.tasks):
            return self.tasks(group_index)
        return self.tasks[group_index % len(self.tasks)]

    def _admit(self) -> int:
        """The next group index to run, past admissions of resting tasks (counted by task)."""
        for skipped in range(_MAX_SKIPS + 1):
            index = self.next_group
            self.next_group += 1
            task = self.task_for(self.data_index(index))
            # (every task resting that long: this one runs anyway)
            if skipped == _MAX_SKIPS or not self._rest.skip(task.id):
                break
            self.accounting.rested[task.id] += 1
        self._admitted[index] = task
        return index

    def _stop_early(self, reason: str) -> None:
        """Ends the run without an error (the step in flight finishes; the first reason wins)."""
        if self._stop is not None and not self._stop.done():
            self._stop.set_result(reason)

    def _fail(self, error: RunFailed) -> None:
        """Stops the run with `error` (the first reason wins)."""
        if self._failure is not None and not self._failure.done():
            self._failure.set_exception(error)

    async def _run_group(self, index: int, episodes: asyncio.Semaphore,
                         members: _Members | None = None) -> Group:
        key = self.data_index(index)
        task = self._admitted.pop(index, None) or self.task_for(key)
        group_id = f"g{key}"
        members = members if members is not None else _Members()

        run_roles = getattr(self.collector, "run_episode_roles", None)

        async def one(sample: int) -> tuple[Trajectory, ...]:
            async with episodes:
                self.accounting.started += 1
                members.started += 1
                seed = episode_seed(self.config.seed, key, sample)
                if run_roles is not None:
                    trajs = tuple(await run_roles(task, seed=seed, group_id=group_id,
                                                  sample_index=sample))
                else:
                    trajs = (await self.collector.run_episode(
                        task, seed=seed, group_id=group_id, sample_index=sample),)
                # The books count trajectories: an episode of k trained roles is k of them.
                self.accounting.started += len(trajs) - 1
                members.started += len(trajs) - 1
                members.finished.extend(trajs)
                members.episodes += 1
            for traj in trajs:
                if self.on_episode is not None:
                    self.on_episode(traj)
                error = self.breaker.record(traj)
                if error is not None:
                    self._fail(error)
            return trajs

        with self.tracer.span(names.ROLLOUT, track=names.COLLECTOR_TRACK, args={"group": group_id}):
            per_episode = await asyncio.gather(*(one(i) for i in range(self.config.group_size)))
        return Group(group_id=group_id, task_id=task.id,
                     trajectories=tuple(t for trajs in per_episode for t in trajs))

    async def _train_whole(self, groups: list[Group], wait_s: float,
                           t_start: float) -> StepRecord:
        """`_train` in a task of its own that a stopping run does not cancel: a step that has
        started finishes, publishes and is logged (`on_step`), so the trainer's state, the
        pipeline's version and the run's records agree when the run stops (`arun` waits)."""
        task = asyncio.ensure_future(self._train(groups, wait_s, t_start))
        self._training = task
        return await asyncio.shield(task)

    async def _finish_training(self) -> None:
        """At the end of `arun`: waits for a step that a stop interrupted (see `_train_whole`)."""
        task, self._training = self._training, None
        if task is None:
            return
        if not task.done():
            log.info("the run is stopping: finishing the train step in flight first")
            await asyncio.wait({task}, timeout=TRAIN_FINISH_S)
        if not task.done():
            log.error("the train step in flight did not finish within %.0f s; stopping without "
                      "it", TRAIN_FINISH_S)
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        elif not task.cancelled() and task.exception() is not None:
            log.debug("the interrupted train step ended with %r", task.exception())

    async def _train(self, groups: list[Group], wait_s: float, t_start: float) -> StepRecord:
        self._waiting_since = None
        groups.sort(key=lambda g: int(g.group_id[1:]))  # deterministic order inside a step
        staleness = tuple(group_staleness(g, self.version) for g in groups)
        flows = list(dict.fromkeys(t.info["flow_id"] for g in groups for t in g.trajectories
                                   if "flow_id" in t.info))  # (an episode's roles share one)
        # GRPO groups are per (task, role): a multi-agent task's roles train as separate groups.
        role_groups = [part for g in groups for part in split_roles(g)]
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        with self.tracer.span(
            names.TRAIN_STEP, track=names.TRAINER_TRACK, flow_in=flows,
            args={names.ARG_STALENESS: max(staleness, default=0)},
        ) as span:
            metrics = await loop.run_in_executor(self._executor, self.trainer.step, role_groups)
            self.version += 1
            span.set_arg(names.ARG_POLICY_VERSION, self.version)
        train_s = time.perf_counter() - t0
        for s in staleness:
            self.tracer.counter(names.STALENESS, s)
        if self.version % self.config.publish_every == 0:
            with self.tracer.span(names.WEIGHT_PUBLISH, track=names.TRAINER_TRACK,
                                  args={names.ARG_POLICY_VERSION: self.version}):
                await loop.run_in_executor(
                    self._executor, self.publish_fn, self.trainer, self.engine, self.version
                )
        trajs = [t for g in groups for t in g.trajectories]
        for traj in trajs:
            self.accounting.statuses[traj.status.value] += 1
        if getattr(metrics, "skipped", False):
            # The trainer applied no update (no trained tokens, or a non-finite one it was told
            # to skip): these episodes were not trained on.
            self.accounting.filtered["train_step_skipped"] += len(trajs)
        else:
            self.accounting.trained += len(trajs)
        rewards = np.asarray([t.reward for t in trajs], np.float32)
        record = StepRecord(
            step=self.version, policy_version=self.version,
            group_ids=tuple(g.group_id for g in groups),
            reward_mean=float(rewards.mean()), success_rate=float((rewards > 0).mean()),
            staleness=staleness, trainer_wait_s=wait_s, train_s=train_s,
            wall_s=time.perf_counter() - t_start, metrics=metrics,
        )
        self._records.append(record)
        if self.on_trained is not None:
            self.on_trained(record, role_groups)
        if self.on_step is not None:
            self.on_step(record)
        self._waiting_since = time.perf_counter()
        return record

    # ------------------------------------------------------------------ entry points

    def run(self, num_steps: int) -> PipelineResult:
        """Runs `num_steps` optimizer steps (blocking); see `arun`.

        Unlike `asyncio.run`, it does not wait forever at the end for tasks that ignore
        cancellation (an environment swallowing CancelledError): they are abandoned.
        """
        return aio.run(self.arun(num_steps), grace_s=self._cancel_grace_s())

    async def arun(self, num_steps: int) -> PipelineResult:
        """Runs `num_steps` optimizer steps in the configured mode; checks the accounting.

        Raises:
          RunFailed: the run cannot make progress (persistent failures, a dead engine, no
            group for `stall_timeout_s`, a blocked event loop); its message is one line.
        """
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        t_start = time.perf_counter()
        loop = asyncio.get_running_loop()
        cfg = self.config
        self._failure = loop.create_future()
        self._stop = loop.create_future()
        self._success = SuccessStop(cfg.stop_success, cfg.stop_window)
        self._records, self.stopped_early = [], ""
        self._waiting_since = t_start
        run = self._run_sync if cfg.mode == "sync" else self._run_async
        body = asyncio.create_task(run(num_steps, t_start))
        stall = asyncio.create_task(self._watch_stall())
        watchdog = (LoopWatchdog(cfg.loop_block_limit_s, self._fail, on_stuck=self.on_loop_stuck)
                    if cfg.loop_block_limit_s else None)
        if watchdog is not None:
            watchdog.start()
        try:
            await asyncio.wait({body, self._failure, self._stop},
                               return_when=asyncio.FIRST_COMPLETED)
            if not body.done():
                body.cancel()
            await _result_or_failure(body, self._failure, self._stop)
        finally:
            if watchdog is not None:
                watchdog.stop()
            stall.cancel()
            body.cancel()
            await self._finish_training()
            # Bounded: an environment that swallows CancelledError must not hang the shutdown.
            _, stuck = await asyncio.wait({body, stall}, timeout=self._cancel_grace_s())
            if stuck:
                self._abandon_pending()
            if self._failure.done():
                self._failure.exception()  # retrieved (raised above, or the run had finished)
            else:
                self._failure.cancel()
            if self._stop.done() and len(self._records) < num_steps:
                self.stopped_early = self._stop.result()
            self._stop.cancel()
            self._settle_in_flight()
            self._waiting_since = None
            self._executor.shutdown(wait=True)
        self.accounting.check()
        wall = time.perf_counter() - t_start
        steps = self._records  # (each `_train` appends; a step a stop interrupted finished in
        # `_finish_training`)
        return PipelineResult(
            steps=tuple(steps), accounting=self.accounting, wall_s=wall,
            trainer_busy_s=sum(s.train_s for s in steps),
            trainer_wait_s=sum(s.trainer_wait_s for s in steps),
            trajectories_trained=self.accounting.trained,
        )

    async def _watch_stall(self) -> None:
        """Fails the run when no group reached the trainer for `stall_timeout_s`."""
        limit = self.config.stall_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            since = self._waiting_since
            if since is None or time.perf_counter() - since <= limit:
                continue
            acc = self.accounting
            stuck = describe_stuck(list(asyncio.all_tasks()))
            knob = f"pipeline.stall_timeout_s (now {limit:g})"
            if acc.filtered.get("all_equal_rewards"):
                knob += ("; or pipeline.filters=[] to train on groups whose rewards are all "
                         "equal, or warm-start the policy")
            self._fail(RunFailed(
                "stalled",
                f"no group reached the trainer for {limit:g} s ({acc.in_flight} episodes in "
                f"flight{', waiting in ' + stuck if stuck else ''}; dropped so far: filtered "
                f"{dict(acc.filtered)}, failed {dict(acc.failed)})",
                knob=knob,
            ))
            return

    async def _run_sync(self, num_steps: int, t_start: float) -> None:
        cfg = self.config
        episodes = asyncio.Semaphore(cfg.max_concurrency)
        for _ in range(num_steps):
            t_wait = time.perf_counter()
            kept: list[Group] = []
            with self.tracer.span(names.TRAINER_WAIT, track=names.TRAINER_TRACK):
                while len(kept) < cfg.groups_per_step:
                    need = cfg.groups_per_step - len(kept)
                    indices = [self._admit() for _ in range(need)]
                    groups = await asyncio.gather(*(self._run_group(i, episodes) for i in indices))
                    kept.extend(s for s in map(self._screen, groups) if s is not None)
            await self._train_whole(kept, time.perf_counter() - t_wait, t_start)

    async def _run_async(self, num_steps: int, t_start: float) -> None:
        cfg = self.config
        gate = StalenessGate(cfg.max_staleness, cfg.groups_per_step)
        base = self.version  # the gate counts versions from this run's start
        ready: asyncio.Queue[tuple[int, Group]] = asyncio.Queue()  # bounded by the gate
        episodes = asyncio.Semaphore(cfg.max_concurrency)
        running: dict[asyncio.Task, _Running] = {}
        stragglers = StragglerLimit(cfg.straggler_factor) if cfg.straggler_factor else None
        dropped: set[asyncio.Task] = set()  # cancelled stragglers still unwinding

        async def group_done(run: _Running) -> None:
            group = await self._run_group(run.index, episodes, run.members)
            if stragglers is not None:
                stragglers.observe(time.perf_counter() - run.started_at)
            screened = self._screen(group)  # (a multi-agent task may keep only some roles)
            if screened is None:
                await gate.release(run.deadline)
                return
            ready.put_nowait((run.deadline, screened))
            self.tracer.counter(names.QUEUE_DEPTH, ready.qsize())

        def slots_full() -> bool:
            # Never start more groups than there are episode slots to run them.
            return len(running) * cfg.group_size >= cfg.max_concurrency + cfg.group_size - 1

        async def produce() -> None:
            while True:
                while slots_full():
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                if gate.would_block():
                    with self.tracer.span(names.STALENESS_WAIT, track=names.COLLECTOR_TRACK):
                        deadline = await gate.acquire()
                else:
                    deadline = await gate.acquire()
                index = self._admit()
                run = _Running(index, deadline, time.perf_counter(), _Members())
                task = asyncio.create_task(group_done(run))
                running[task] = run
                task.add_done_callback(lambda t: running.pop(t, None))
                task.add_done_callback(self._group_failed)

        producer = asyncio.create_task(produce())
        pool: list[tuple[int, Group]] = []  # complete groups the trainer has not taken yet
        try:
            while len(self._records) < num_steps:  # (each step appends its record)
                batch: list[tuple[int, Group]] = []
                t_wait = time.perf_counter()
                with self.tracer.span(names.TRAINER_WAIT, track=names.TRAINER_TRACK):
                    while len(batch) < cfg.groups_per_step:
                        while not ready.empty():
                            pool.append(ready.get_nowait())
                        picked = await self._pick(gate, pool, batch)
                        if picked is not None:
                            batch.append(picked)
                            continue
                        timeout = None
                        if stragglers is not None:
                            # Complete groups could fill the step, or no new group may start
                            # (running groups hold the whole staleness window or every episode
                            # slot): a running group blocks them, the earliest-deadline one.
                            blocked = (len(pool) + len(batch) >= cfg.groups_per_step
                                       or gate.would_block() or slots_full())
                            timeout = await self._drop_straggler(gate, running, stragglers,
                                                                 dropped, blocked)
                            if timeout == 0.0:
                                continue
                        item = await _next_group(ready, producer, timeout)
                        if item is not None:
                            pool.append(item)
                wait_s = time.perf_counter() - t_wait
                await self._train_whole([g for _, g in batch], wait_s, t_start)
                await gate.step(d for d, _ in batch)
                if self.version % cfg.publish_every == 0:
                    await gate.publish(self.version - base)
        finally:
            producer.cancel()
            for task in list(running):
                task.cancel()
            _, stuck = await asyncio.wait({producer, *running, *dropped},
                                          timeout=self._cancel_grace_s())
            if stuck:
                self._abandon_pending()
            while not ready.empty():
                pool.append(ready.get_nowait())
            for _, group in pool:
                self._account_dropped(group, "unconsumed_at_end")

    async def _drop_straggler(self, gate: StalenessGate, running: dict[asyncio.Task, _Running],
                              stragglers: StragglerLimit, dropped: set[asyncio.Task],
                              blocked: bool) -> float | None:
        """Called while the trainer waits for a group. When it is `blocked` (complete groups
        could fill the step, or no new group may start) by a running group with an earlier
        deadline, drops that group if it has run past the straggler limit (returns 0.0).
        Otherwise returns how long to wait before asking again (None: no limit applies yet, and
        the next finished group wakes the trainer anyway): the victim's time left, or one limit
        when no group could be late before then (a group started from now on needs a limit)."""
        limit = stragglers.limit_s()
        if limit is None:
            return None
        # A group whose members have all finished is being screened, not late.
        alive = [(r, t) for t, r in running.items()
                 if not t.done() and r.members.episodes < self.config.group_size]
        if not blocked or not alive:
            return limit
        victim, task = min(alive, key=lambda rt: (rt[0].deadline, rt[0].index))
        left = victim.started_at + limit - time.perf_counter()
        if left > 0:
            return left
        task.cancel()
        running.pop(task, None)
        dropped.add(task)
        task.add_done_callback(dropped.discard)
        # Counted now, not when the cancellation lands: the trainer moves on without waiting
        # for the episodes to unwind (they release their engine slots and close their envs).
        members = victim.members
        for traj in members.finished:
            self.accounting.statuses[traj.status.value] += 1
        unfinished = members.started - len(members.finished)
        self.accounting.statuses[TrajectoryStatus.CANCELLED.value] += unfinished
        self.accounting.filtered["stale"] += members.started
        await gate.release(victim.deadline)
        return 0.0

    async def _pick(self, gate: StalenessGate, pool: list, batch: list) -> tuple[int, Group] | None:
        """The complete group to add to `batch` (earliest deadline first), or None to wait."""
        pool.sort(key=lambda item: (item[0], int(item[1].group_id[1:])))
        for item in list(pool):
            deadline, group = item
            if group_staleness(group, self.version) > self.config.max_staleness:
                pool.remove(item)  # only possible with weights published out of band
                self._account_dropped(group, "stale")
                await gate.release(deadline)
                continue
            if gate.fits((d for d, _ in batch), deadline):
                pool.remove(item)
                return item
        return None

    def _group_failed(self, task: asyncio.Task) -> None:
        """A group's task raised (a bug outside the episodes' own error handling): the run
        stops with it instead of waiting for a group that will never come."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        failed = RunFailed("internal", "rolling out a group raised", sample_error=(
            f"{type(error).__name__}: {error}"), knob="report it with the `--debug` traceback")
        failed.__cause__ = error
        self._fail(failed)

    def _abandon_pending(self) -> None:
        """Cancelled tasks outlived their grace: says where they wait and leaves them (with the
        episodes they gathered, which had the same grace) out of `run`'s final wait."""
        pending = {t for t in asyncio.all_tasks() if not t.done()}
        log.error("episodes ignored cancellation for %.0f s (%s); abandoning them",
                  self._cancel_grace_s(), describe_stuck(list(pending)) or "?")
        self._abandoned |= pending
        for task in pending:
            aio.abandon(task)  # `run` gives them no second grace

    def _cancel_grace_s(self) -> float:
        """How long cancelled episodes get to unwind (they close their environments)."""
        close_s = getattr(getattr(self.collector, "config", None), "close_timeout_s", 10.0)
        return float(close_s) + 5.0

    def _settle_in_flight(self) -> None:
        """At shutdown: episodes started but never finished are counted as cancelled."""
        missing = self.accounting.in_flight
        if missing > 0:
            self.accounting.failed[TrajectoryStatus.CANCELLED.value] += missing
            self.accounting.statuses[TrajectoryStatus.CANCELLED.value] += missing


def _publish_colocated(trainer: Any, engine: Any, version: int) -> None:
    publish_into(trainer, engine, version)
