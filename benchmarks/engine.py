"""Engine benchmark: continuous vs static batching, vs `transformers`, continuation vs re-prefill.

Workloads (same model, same kernels, measured in one run, per model preset):

* continuous_over_static — N requests, prompts of 16..64 tokens, output lengths lognormal
  (median 24, sigma 0.8, clipped to [1, 200]; eos disabled so each request generates exactly
  its length). Continuous: all submitted at once to the engine. Static: batches of max_slots
  submitted together, the next batch only after the longest member of the previous one is done
  (same engine, so same kernels). Figure: requests/s continuous over static.
* over_transformers — the first batches of that workload, greedy: agentax continuous tokens/s
  over `transformers.generate` (torch CPU, same weights via `save_pretrained`, static batches of
  max_slots, left padding, each batch runs to its longest member). Useful tokens only.
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

import numpy as np
from flax import nnx

from agentax.engine import Engine, EngineConfig
from agentax.models import ModelConfig, Transformer, save_pretrained
from agentax.records import SamplingParams


def workload(rng, n: int, max_len: int = 200):
    prompts = [rng.integers(0, 256, size=int(rng.integers(16, 65))).tolist() for _ in range(n)]
    lengths = np.clip(np.round(rng.lognormal(np.log(24), 0.8, size=n)), 1, max_len).astype(int)
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


def bench_batching(engine, prompts, lengths, slots):
    params = [SamplingParams(temperature=1.0, max_tokens=n, seed=i) for i, n in enumerate(lengths)]
    _, t_cont = timed(lambda: asyncio.run(_continuous(engine, prompts, params)))
    _, t_stat = timed(lambda: asyncio.run(_static(engine, prompts, params, slots)))
    n = len(prompts)
    return {
        "continuous_req_per_s": n / t_cont,
        "static_req_per_s": n / t_stat,
        "continuous_over_static": t_stat / t_cont,
        "continuous_tokens_per_s": sum(lengths) / t_cont,
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


def run_preset(name, *, slots, requests, hf_requests, episodes, steps_sweep):
    model = Transformer(ModelConfig.preset(name), rngs=nnx.Rngs(0))
    config = EngineConfig(max_slots=slots, max_seq_len=288, prefill_chunk=64)
    rng = np.random.default_rng(0)
    out = {}
    with Engine(model, config) as engine:
        # Compile every kernel before timing (prefill buckets 16/32/64 and decode).
        warm = [[1] * n for n in (10, 30, 60)]
        engine.generate_batch(warm, SamplingParams(max_tokens=2))
        prompts, lengths = workload(rng, requests)
        out.update(bench_batching(engine, prompts, lengths, slots))
        out.update(bench_transformers(model, engine, prompts[:hf_requests],
                                      lengths[:hf_requests], slots))
        out.update(bench_episodes(engine, episodes))
        out["compiles"] = engine.num_compiles
        out["kv_cache_bytes"] = engine.kv_cache_bytes
        stats = engine.stats()
        out["decode_steps"] = stats.steps
    for steps in steps_sweep:  # host overhead: decode steps fused per jitted call
        cfg = EngineConfig(max_slots=slots, max_seq_len=288, prefill_chunk=64,
                           decode_steps_per_call=steps)
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
        plan = {"tiny": dict(slots=8, requests=32, hf_requests=8, episodes=8, steps_sweep=())}
    else:
        plan = {
            "tiny": dict(slots=32, requests=256, hf_requests=64, episodes=64,
                         steps_sweep=(4,)),
            "small": dict(slots=32, requests=256, hf_requests=64, episodes=64, steps_sweep=()),
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
        "lognormal outputs (median 24), prompts 16-64; 4-turn episodes, 50 ms tools"
    )
    if not args.quick:
        out = Path(__file__).parent / "results" / "engine.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
