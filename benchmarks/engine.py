"""Engine benchmark: continuous vs static batching, vs `transformers`, continuation vs re-prefill.

Workloads (same model, same kernels, measured in one run, per model preset):

* continuous_over_static — N requests in a fixed arrival order, prompts of 16..64 tokens,
  output lengths lognormal (median 24, sigma 1.0 — a real tail —, capped at max_tokens=200;
  eos disabled so each request generates exactly its length). Continuous: all submitted at
  once to the engine. Static: batches of max_slots in arrival order, submitted together, the
  next batch only after the longest member of the previous one is done (same engine, so the
  same kernels, slots and batched prefill). Figure: requests/s continuous over static, the
  median of `repeats` alternating pairs (the machine is shared). Also reported: decode steps
  and slot occupancy (generated tokens / (steps x slots)) of both, and the wall-time split
  of the continuous run (jitted decode, jitted prefill, host) from an instrumented repeat.
* over_transformers — the first batches of that workload, greedy: agentax continuous tokens/s
  over `transformers.generate` (torch CPU with 1 thread — 2 threads measured ~100x slower on
  the shared machine —, same weights via `save_pretrained`, static batches of max_slots, left
  padding, each batch runs to its longest member). Useful tokens only.
* continuation_over_reprefill — E concurrent 4-turn episodes, 50 ms simulated tool latency
  between turns, 32 new tokens per turn, 16 generated per turn: continuing the sequence
  (prefill only the new tokens) vs re-prefilling the whole history every turn. Figure: wall
  time of re-prefill over continuation.
* kv_cache_bytes, compiles (engine kernel compilations for the whole run of a preset).

`--quick` runs the tiny preset on small workloads (< 1 min on 2 cores); the full run does
tiny and small and writes benchmarks/results/engine.json. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from agentax.engine import Engine, EngineConfig
from agentax.models import ModelConfig, Transformer, save_pretrained
from agentax.records import SamplingParams


MEDIAN_LEN, SIGMA, MAX_TOKENS = 24, 1.0, 200


def workload(rng, n: int, max_len: int = MAX_TOKENS):
    prompts = [rng.integers(0, 256, size=int(rng.integers(16, 65))).tolist() for _ in range(n)]
    lengths = rng.lognormal(np.log(MEDIAN_LEN), SIGMA, size=n)
    lengths = np.clip(np.round(lengths), 1, max_len).astype(int)
    return prompts, lengths.tolist()


async def _continuous(engine, prompts, params):
    outs = await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, params)))
    for o in outs:
        engine.release(o.sequence_id)
    return outs


async def _static(engine, prompts, params, batch):
    outs = []
    for i in range(0, len(prompts), batch):
        outs += await _continuous(engine, prompts[i: i + batch], params[i: i + batch])
    return outs


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _run_counted(engine, fn):
    s0 = engine.stats()
    _, t = timed(fn)
    s1 = engine.stats()
    steps = s1.steps - s0.steps
    tokens = s1.total_tokens - s0.total_tokens
    return t, steps, tokens / max(steps * engine.config.max_slots, 1)


def bench_batching(engine, prompts, lengths, slots, repeats):
    params = [SamplingParams(temperature=1.0, max_tokens=n, seed=i) for i, n in enumerate(lengths)]
    cont, stat = [], []
    for _ in range(repeats):  # alternate, so load changes hit both sides alike
        cont.append(_run_counted(engine, lambda: asyncio.run(_continuous(engine, prompts, params))))
        stat.append(_run_counted(
            engine, lambda: asyncio.run(_static(engine, prompts, params, slots))))
    t_cont = float(np.median([c[0] for c in cont]))
    t_stat = float(np.median([s[0] for s in stat]))
    n = len(prompts)
    return {
        "continuous_req_per_s": n / t_cont,
        "static_req_per_s": n / t_stat,
        "continuous_over_static": float(np.median([s[0] / c[0] for c, s in zip(cont, stat)])),
        "continuous_over_static_min": min(s[0] / c[0] for c, s in zip(cont, stat)),
        "continuous_tokens_per_s": sum(lengths) / t_cont,
        "continuous_steps": cont[0][1],
        "static_steps": stat[0][1],
        "continuous_occupancy": cont[0][2],
        "static_occupancy": stat[0][2],
        "ideal_continuous_steps": sum(lengths) / slots,
        "mean_output_len": float(np.mean(lengths)),
        "max_output_len": max(lengths),
    }


def time_split(engine, prompts, lengths):
    """Wall time of one continuous run split into jitted decode, jitted prefill and host work.

    Wraps the engine's kernels to block on their results (so this run is a little slower
    than an unwrapped one); "host" is everything else in the run (scheduling, bookkeeping,
    transfers, the asyncio front end).
    """
    from agentax.engine import _engine as eng_mod

    spent = {"decode": 0.0, "prefill": 0.0}
    originals = {"decode": eng_mod.decode_steps, "prefill": eng_mod.prefill_chunk}

    def wrap(name):
        def call(*args):
            t = time.perf_counter()
            out = originals[name](*args)
            jax.block_until_ready(out)
            spent[name] += time.perf_counter() - t
            return out
        return call

    eng_mod.decode_steps, eng_mod.prefill_chunk = wrap("decode"), wrap("prefill")
    try:
        params = [SamplingParams(temperature=1.0, max_tokens=n, seed=i)
                  for i, n in enumerate(lengths)]
        s0 = engine.stats()
        _, t = timed(lambda: asyncio.run(_continuous(engine, prompts, params)))
        s1 = engine.stats()
    finally:
        eng_mod.decode_steps, eng_mod.prefill_chunk = originals["decode"], originals["prefill"]
    steps = max(s1.steps - s0.steps, 1)
    calls = max(s1.prefill_calls - s0.prefill_calls, 1)
    return {
        "split_decode_frac": spent["decode"] / t,
        "split_prefill_frac": spent["prefill"] / t,
        "split_host_frac": 1 - (spent["decode"] + spent["prefill"]) / t,
        "decode_ms_per_step": 1000 * spent["decode"] / steps,
        "host_ms_per_step": 1000 * (t - spent["decode"] - spent["prefill"]) / steps,
        "prefill_calls": s1.prefill_calls - s0.prefill_calls,
        "prefill_rows_per_call": len(prompts) / calls,
    }


def bench_transformers(model, engine, prompts, lengths, slots):
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, d)
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            d, attn_implementation="sdpa", dtype=torch.float32
        ).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    # One torch thread: on this shared 2-core machine torch's default 2 threads spin against
    # each other and the other tenants (measured ~100x slower per generated token).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in lengths]
    _, t_ax = timed(lambda: asyncio.run(_continuous(engine, prompts, params)))
    t_hf = 0.0
    for i in range(0, len(prompts), slots):
        batch, n_new = prompts[i: i + slots], max(lengths[i: i + slots])
        width = max(map(len, batch))
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(batch):  # left padding
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        t = time.perf_counter()
        with torch.no_grad():
            hf.generate(ids, attention_mask=mask, max_new_tokens=n_new, do_sample=False)
        t_hf += time.perf_counter() - t
    torch.set_num_threads(threads)
    tokens = sum(lengths)
    return {
        "agentax_tokens_per_s": tokens / t_ax,
        "transformers_tokens_per_s": tokens / t_hf,
        "over_transformers": t_hf / t_ax,
    }


async def _episode(engine, rng_seed, turns, continuation, tool_latency):
    rng = np.random.default_rng(rng_seed)
    history = rng.integers(0, 256, size=64).tolist()
    seq, new = None, history
    for turn in range(turns):
        params = SamplingParams(temperature=1.0, max_tokens=16, seed=rng_seed * 16 + turn)
        if continuation:
            out = await engine.generate(new, params, sequence_id=seq)
            seq = out.sequence_id
        else:
            out = await engine.generate(history, params)
            engine.release(out.sequence_id)
        history = history + out.token_ids.tolist()
        await asyncio.sleep(tool_latency)  # the tool / environment runs
        new = rng.integers(0, 256, size=32).tolist()
        history = history + new
    if continuation:
        engine.release(seq)


def bench_episodes(engine, episodes, turns=4, tool_latency=0.05):
    async def run(continuation):
        await asyncio.gather(*(
            _episode(engine, i, turns, continuation, tool_latency) for i in range(episodes)
        ))

    ev0 = engine.stats().evictions
    _, t_cont = timed(lambda: asyncio.run(run(True)))
    evictions = engine.stats().evictions - ev0
    _, t_re = timed(lambda: asyncio.run(run(False)))
    return {
        "continuation_s": t_cont,
        "reprefill_s": t_re,
        "continuation_over_reprefill": t_re / t_cont,
        "continuation_evictions": evictions,
    }


def run_preset(name, *, slots, requests, hf_requests, episodes, steps_sweep, repeats, chunk=64):
    model = Transformer(ModelConfig.preset(name), rngs=nnx.Rngs(0))
    # precompile: every prefill shape and decode compile before any timing.
    config = EngineConfig(max_slots=slots, max_seq_len=288, prefill_chunk=chunk, precompile=True)
    rng = np.random.default_rng(0)
    out = {}
    warm = [[1] * n for n in (10, 30, 60)]
    with Engine(model, config) as engine:
        engine.generate_batch(warm, SamplingParams(max_tokens=2))
        prompts, lengths = workload(rng, requests)
        out.update(bench_batching(engine, prompts, lengths, slots, repeats))
        out.update(time_split(engine, prompts, lengths))
        out.update(bench_transformers(model, engine, prompts[:hf_requests],
                                      lengths[:hf_requests], slots))
        out.update(bench_episodes(engine, episodes))
        out["compiles"] = engine.num_compiles
        out["kv_cache_bytes"] = engine.kv_cache_bytes
    for steps in steps_sweep:  # host overhead: decode steps fused per jitted call
        cfg = EngineConfig(max_slots=slots, max_seq_len=288, prefill_chunk=chunk,
                           decode_steps_per_call=steps, precompile=True)
        with Engine(model, cfg) as engine:
            engine.generate_batch(warm, SamplingParams(max_tokens=2))
            params = [SamplingParams(max_tokens=n, seed=i) for i, n in enumerate(lengths)]
            _, t = timed(lambda: asyncio.run(_continuous(engine, prompts, params)))
            out[f"tokens_per_s_steps_per_call_{steps}"] = sum(lengths) / t
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny preset, small workloads")
    args = parser.parse_args()
    if args.quick:
        # Fewer prefill shapes (chunk 32: 4 row x 2 chunk buckets) keep compiling short.
        plan = {"tiny": dict(slots=8, requests=32, hf_requests=8, episodes=8, steps_sweep=(),
                             repeats=1, chunk=32)}
    else:
        plan = {
            "tiny": dict(slots=32, requests=256, hf_requests=64, episodes=64,
                         steps_sweep=(4,), repeats=3),
            # One pair: a small-preset decode step is ~150 ms on the shared CPU.
            "small": dict(slots=32, requests=256, hf_requests=64, episodes=64, steps_sweep=(),
                          repeats=1),
        }
    results = {}
    for name, kw in plan.items():
        t = time.perf_counter()
        r = run_preset(name, **kw)
        r["wall_s"] = time.perf_counter() - t
        print(f"[{name}] " + ", ".join(f"{k}={v:.3g}" for k, v in r.items()), flush=True)
        results[name] = r
    figures = {
        f"{name}/{k}": round(float(v), 4) for name, r in results.items() for k, v in r.items()
    }
    head = list(results)[-1]  # the largest preset run
    for key in ("continuous_over_static", "over_transformers", "continuation_over_reprefill",
                "kv_cache_bytes", "compiles"):
        figures[key] = figures[f"{head}/{key}"]
    figures["workload"] = (
        f"lognormal outputs (median {MEDIAN_LEN}, sigma {SIGMA}, cap {MAX_TOKENS}), prompts "
        "16-64, arrival order fixed; 4-turn episodes, 50 ms tools"
    )
    if not args.quick:
        out = Path(__file__).parent / "results" / "engine.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
