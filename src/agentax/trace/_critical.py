"""The critical path of an RL run, walked backwards from the last train step.

Each train step waits for its slowest input: the previous train step, or the last episode
of the groups it consumed (found through flow ids). Each episode waits for whatever ended
just before it started (a weight publish, a train step, a freed concurrency slot - another
episode). Walking these "last arrival" edges back from the end gives one chain of spans; its
time is split by what the chain was doing (train, model calls, env steps, tools, rewards,
and idle gaps between a predecessor's end and a successor's start).
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from agentax.trace import names
from agentax.trace._reader import SpanRecord

_EPS_NS = 1_000_000  # a predecessor may end up to 1 ms after its successor starts (jitter)

CATEGORY = {
    names.MODEL_CALL: "model", names.ENV_STEP: "env", names.ENV_RESET: "env",
    names.TOOL_CALL: "tool", names.REWARD: "reward", names.TRAIN_STEP: "train",
    names.WEIGHT_PUBLISH: "publish", names.STALENESS_WAIT: "staleness_wait",
    names.PRODUCER_BLOCKED: "producer_blocked",
}


def _episode_breakdown(episode: SpanRecord, children: list[SpanRecord], lo: int, hi: int,
                       out: dict[str, int]) -> None:
    covered = 0
    for child in children:
        cat = CATEGORY.get(child.name)
        if cat is None or child.depth != episode.depth + 1:
            continue
        s, e = max(child.start_ns, lo), min(child.end_ns, hi)
        if e > s:
            out[cat] += e - s
            covered += e - s
    out["agent/other"] += max(0, (hi - lo) - covered)


def critical_path(spans: tuple[SpanRecord, ...]) -> tuple[dict[str, int], int]:
    """Nanoseconds on the critical path by category, and the number of spans on it."""
    train = sorted((s for s in spans if s.name == names.TRAIN_STEP), key=lambda s: s.end_ns)
    episodes = [s for s in spans if s.name == names.EPISODE]
    out: dict[str, int] = defaultdict(int)
    if not train and not episodes:
        return {}, 0
    by_flow = {fid: ep for ep in episodes for fid in ep.flow_out}
    children: dict[str, list[SpanRecord]] = defaultdict(list)
    for s in spans:
        if s.track.startswith(names.EPISODE_TRACK_PREFIX) and s.name != names.EPISODE:
            children[s.track].append(s)
    gates = sorted((s for s in spans if s.name in (names.EPISODE, names.TRAIN_STEP,
                                                   names.WEIGHT_PUBLISH)),
                   key=lambda s: s.end_ns)
    gate_ends = [s.end_ns for s in gates]

    def latest_before(candidates: list[SpanRecord], start: int, cur: SpanRecord):
        best = None
        for c in candidates:
            if c is not cur and c.end_ns <= start + _EPS_NS and c.end_ns < cur.end_ns and (
                    best is None or c.end_ns > best.end_ns):
                best = c
        return best

    cur = train[-1] if train else max(episodes, key=lambda s: s.end_ns)
    t = cur.end_ns
    count = 0
    while cur is not None and count < 100_000:
        count += 1
        lo, hi = cur.start_ns, min(cur.end_ns, t)
        if hi > lo:
            if cur.name == names.EPISODE:
                _episode_breakdown(cur, children.get(cur.track, []), lo, hi, out)
            else:
                out[CATEGORY.get(cur.name, cur.name)] += hi - lo
        t = min(t, lo)
        if cur.name == names.TRAIN_STEP:
            i = train.index(cur)
            cands = [by_flow[f] for f in cur.flow_in if f in by_flow] or episodes
            cands = cands + train[max(0, i - 1):i]
            pred = latest_before(cands, cur.start_ns, cur)
        else:
            j = bisect.bisect_right(gate_ends, cur.start_ns + _EPS_NS)
            pred = next((gates[k] for k in range(j - 1, -1, -1)
                         if gates[k] is not cur and gates[k].end_ns < cur.end_ns), None)
        if pred is None:
            break
        if pred.end_ns < t:
            out["idle"] += t - pred.end_ns
            t = pred.end_ns
        cur = pred
    return dict(out), count
