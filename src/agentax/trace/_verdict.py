"""Turn the measured fractions into a bottleneck, a plain-words verdict and one suggestion.

`decide` checks its rules in order: all_filtered (no train step, and groups were dropped for
all-equal rewards), balanced (a busy trainer that the rollouts keep up with),
trainer, staleness, engine_slots, environment, model, else balanced. The thresholds are
deliberately round and the report prints the numbers behind them, so a reader can disagree;
docs/tracing.md tabulates the rules.
"""

from __future__ import annotations

import math
from typing import Any

from agentax.trace import names
from agentax.trace._intervals import length


MAX_TOKENS_FLOOR = 16
"""sampling.max_tokens at or below which the doctor no longer suggests shorter generations: a
reply that short barely holds a tool call or an answer."""


def _nice(x: float) -> int:
    """Round up to a 'nice' knob value (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, ...)."""
    if x <= 2:
        return max(1, math.ceil(x))
    exp = 2 ** math.floor(math.log2(x))
    for mult in (1.0, 1.5, 2.0):
        if exp * mult >= x - 1e-9:
            return int(exp * mult)
    return int(exp * 2)


def pct(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def _latency(fields: dict, name: str):
    return next((lat for lat in fields["latencies"] if lat.name == name), None)


def _knob(fields: dict, key: str) -> Any:
    value = fields["knobs"].get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _shared_compute(fields: dict) -> str:
    """Why overlapping rollouts with training may not pay: both use the same compute."""
    slowdown, host = fields["training_slowdown"], fields["host"]
    if slowdown is not None and slowdown >= 1.5:
        return (f"; but it will not help here: engine and trainer share compute (decode steps "
                f"took {slowdown:.1f}x longer while a train step ran), so overlapping them "
                f"does not shorten the run; give them separate devices or a faster train step")
    if host.get("jax_backend") == "cpu":
        return (f"; caution: on the cpu backend the engine and the trainer share the same "
                f"{host.get('cpu_cores', '?')} cores, so overlapping them helps only while the "
                f"train step leaves cores idle (waits, host work); measure a run before keeping it")
    return ""


BROWSER_BOUND_SHARE = 0.5
"""An environment-bound run is called browser-bound when at least this share of its
environment time (env_reset + env_step spans) went to browser spans (`names.BROWSER_SPANS`)."""


def _browser_share(by_name: dict) -> float:
    """Browser spans' summed time over the environment spans' (the former nest in the latter)."""
    env = sum(e - s for n in (names.ENV_RESET, names.ENV_STEP) for s, e in by_name.get(n, ()))
    browser = sum(e - s for n in names.BROWSER_SPANS for s, e in by_name.get(n, ()))
    return min(1.0, browser / env) if env else 0.0


ALL_EQUAL_KNOB = (
    "warm-start the policy (sft.steps, init.from_run) if it fails every task, or raise "
    "sampling.temperature / pipeline.group_size so a group's samples can differ; "
    "pipeline.filters=[] trains on all-equal groups anyway (their advantage is 0: no signal)")
"""What to turn when groups are dropped for all-equal rewards (the doctor and the pipeline's
warnings say the same)."""


def _all_filtered(fields: dict) -> tuple[str, str, str]:
    groups, episodes = fields["dropped_groups"], fields["dropped_episodes"]
    n, eps = groups["all_equal_rewards"], episodes.get("all_equal_rewards", 0)
    tasks = fields["dropped_tasks"]
    named = ", ".join(f"{t} ({k})" for t, k in list(tasks.items())[:5])
    more = f" and {len(tasks) - 5} more" if len(tasks) > 5 else ""
    lead = (f"No train step happened: {n} groups ({eps} episodes) were dropped "
            f"by the 'all_equal_rewards' filter (pipeline.filters): every sample of a group got "
            f"the same reward, so there was nothing to learn from; tasks (groups): {named}{more}")
    others = {k: v for k, v in groups.items() if k != "all_equal_rewards"}
    if others:
        lead += f"; other drops: {others}"
    return "all_filtered", lead + ".", ALL_EQUAL_KNOB


def decide(fields: dict, by_name: dict, wall: int) -> tuple[str, str, str]:
    """(bottleneck, verdict, suggestion) from the report fields."""
    if not fields["train_steps"] and fields["dropped_groups"].get("all_equal_rewards"):
        return _all_filtered(fields)  # nothing else matters while no step can happen
    busy = fields["trainer_busy_fraction"]
    wait = fields["trainer_wait_fraction"]
    stalls, episodes = by_name.get(names.STALENESS_WAIT, []), by_name.get(names.EPISODE, [])
    stall = length(stalls) / wall
    # A staleness stall costs throughput only while no rollout work is left in flight.
    stall_idle = (length(stalls + episodes) - length(episodes)) / wall
    blocked = length(by_name.get(names.PRODUCER_BLOCKED, [])) / wall
    shares = fields["episode_time_shares"]
    env_share = sum(shares.get(k, 0.0) for k in ("env", "tool", "reward"))
    model_share = shares.get("model", 0.0)
    waiting = fields["engine_mean_waiting"] or 0.0
    full = fields["engine_full_fraction"] or 0.0
    active = fields["engine_mean_active"] or 0.0
    conc = _knob(fields, "max_concurrency")
    stale = _knob(fields, "max_staleness")
    slots = _knob(fields, "max_slots")
    train_lat = _latency(fields, names.TRAIN_STEP)

    if busy is not None and busy >= 0.8 and max(blocked, stall) < 0.1:
        return ("balanced", f"Healthy: the trainer was busy {pct(busy)} of its time and the "
                f"rollouts kept up (producers blocked {pct(blocked)}, stalled on staleness "
                f"{pct(stall)}).", "nothing to rebalance; to go faster, make the train step "
                "faster (it is the stage everything else waits for)")

    if busy is not None and busy >= 0.8:
        lead = (f"The trainer is the bottleneck: it was busy {pct(busy)} of its time and "
                f"producers were blocked on a full queue {pct(blocked)} of the run")
        if train_lat:
            lead += f" (train step p50 {train_lat.p50_s:.2f} s)"
        tip = "make the train step faster (larger micro-batches, fewer padding buckets, more devices)"
        target = _nice(max(1.0, conc * (1.0 - blocked))) if conc else 0
        if conc and blocked > 0.05 and target < conc:
            tip += (f", or lower pipeline.max_concurrency from {conc} to about {target}: "
                    f"rollouts beyond that only wait for the trainer")
        else:
            tip += "; more rollout concurrency will not help"
        return "trainer", lead + ".", tip

    if stall >= 0.2 and stall_idle >= 0.1 and (wait is None or wait >= 0.1):
        lead = (f"Staleness-bound: the collector waited for new weights {pct(stall)} of the "
                f"run (max_staleness={stale if stale is not None else '?'}) while the trainer "
                f"waited for groups {pct(wait)} of its time; for {pct(stall_idle)} of the run no "
                f"episode was in flight: rollouts and training take turns instead of "
                f"overlapping")
        step = 1 if stall < 0.35 else 2
        if stale is not None:
            tip = (f"raise pipeline.max_staleness from {stale} to {stale + step} (off-policy "
                   f"correction keeps the update sound)")
        else:
            tip = f"raise pipeline.max_staleness by {step}"
        return "staleness", lead + ".", tip + _shared_compute(fields)

    if waiting >= 1.0 and full >= 0.5 and model_share >= 0.3:
        lat = _latency(fields, names.MODEL_CALL)
        lead = (f"Too few engine slots: all slots were busy {pct(full)} of the run and on "
                f"average {waiting:.1f} requests waited for one; model calls took "
                f"{pct(model_share)} of episode time")
        if lat:
            lead += f" (model call p50 {lat.p50_s:.2f} s, p99 {lat.p99_s:.2f} s)"
        have = slots if slots is not None else (active or 1.0)
        target = _nice(have + waiting)
        tip = (f"raise engine.max_slots from {slots if slots is not None else round(have)} to "
               f"about {target} (KV-cache memory grows with it); if memory is short, lower "
               f"pipeline.max_concurrency instead so requests stop queueing")
        return "engine_slots", lead + ".", tip

    if wait is not None and wait >= 0.2 and env_share >= 0.4:
        parts = {k: shares.get(k, 0.0) for k in ("env", "tool", "reward")}
        worst = max(parts, key=parts.get)
        span_name = {"env": names.ENV_STEP, "tool": names.TOOL_CALL, "reward": names.REWARD}[worst]
        lat = _latency(fields, span_name)
        browser = _browser_share(by_name)
        kind = "Browser-bound" if browser >= BROWSER_BOUND_SHARE else "Environment-bound"
        lead = (f"{kind}: the trainer waited {pct(wait)} of its time for groups; "
                f"episodes spent {pct(env_share)} of their time in environment steps, tools "
                f"and rewards")
        if lat:
            lead += f"; {span_name.replace('_', ' ')} p50 is {lat.p50_s:.2f} s, p99 {lat.p99_s:.2f} s"
        if browser >= BROWSER_BOUND_SHARE:
            lead += (f"; {pct(browser)} of the environments' time went to the browser (page "
                     f"loads, actions, page views)")
        factor = min(4.0, 1.0 / max(busy or 0.0, 0.25))
        if conc:
            target = _nice(conc * factor)
            tip = f"raise pipeline.max_concurrency from {conc} to about {target}"
            if slots is not None and target > slots:
                tip += f" (and engine.max_slots from {slots} to about {target})"
            tip += " so more episodes overlap their environment waits"
            if stall >= 0.2 and stale is not None:
                tip += (f"; the collector also waited for weights {pct(stall)} of the run, so "
                        f"raise pipeline.max_staleness from {stale} to {stale + 1} with it")
            if factor >= 4.0:
                tip += "; then run the doctor again"
        else:
            tip = f"raise pipeline.max_concurrency about {factor:.1f}x"
        if lat and lat.p50_s > 0 and lat.p99_s > 4 * lat.p50_s:
            tip += f"; the {span_name} tail is long (p99 {lat.p99_s / lat.p50_s:.0f}x p50): set a timeout"
        if browser >= BROWSER_BOUND_SHARE:
            tip += ("; a browser's work is CPU on its host: when that host's cores are busy, run "
                    "the environments in more worker processes or machines (agentax.scale."
                    "RayEnvPool, one browser each) rather than more contexts in one")
        return "environment", lead + ".", tip

    if wait is not None and wait >= 0.2:
        lat = _latency(fields, names.MODEL_CALL)
        lead = (f"Generation-bound: the trainer waited {pct(wait)} of its time; episodes "
                f"spent {pct(model_share)} of their time in model calls and the engine was "
                f"busy {pct(fields['engine_busy_fraction'])}")
        if lat:
            lead += f" (model call p50 {lat.p50_s:.2f} s)"
        max_tokens = _knob(fields, "max_tokens")
        if conc and slots and conc < slots:
            tip = (f"the engine has free slots: raise pipeline.max_concurrency from {conc} to "
                   f"about {_nice(min(slots, conc * 2))}")
        elif max_tokens is not None and max_tokens <= MAX_TOKENS_FLOOR:
            tip = (f"give the engine more devices or a smaller model; generations are already "
                   f"short (sampling.max_tokens={max_tokens}) and raising concurrency only "
                   "helps while engine slots are free")
        else:
            tip = ("shorten generations (sampling.max_tokens) or give the engine more devices; "
                   "raising concurrency only helps while engine slots are free")
        return "model", lead + ".", tip

    if busy is None:
        return ("unknown", "No train steps were traced, so the doctor cannot tell what the "
                "trainer waited for.", "instrument the trainer with train_step and "
                "trainer_wait spans (agentax.trace.names)")
    return ("balanced", f"No single bottleneck: the trainer was busy {pct(busy)} of its time "
            f"and waited {pct(wait)}.", "nothing to change; raise the load to find the next limit")
