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
* decode_over_bare_filled — 32 greedy requests (16-token prompts, 108 generated: sequences
  <= 124 tokens) on an engine of 32 slots with max_seq_len 1024: engine tokens/s (the whole
  `generate_batch`, prefill and host included) over a bare jitted decode loop on the same
  model and batch that attends only over the filled positions (its own [B, 128, K, H] cache,
  `dynamic_update_slice` writes, attention over a power-of-two span from 16 covering the
  filled length, greedy argmax, 8 steps per jitted call, prefill not timed). Goal >= 0.8.
* decode_cost_growth — the same workload on two engines, max_seq_len 1024 and 128: decode
  ms per step (wall time of the run / decode steps) at 1024 over at 128. Goal <= 1.3.
* tokens_per_s_steps_N / tokens_per_s_chunk_N — the lognormal workload with N fused decode
  steps per call / N-token prefill chunks (full run only; alternated rounds), the
  measurement behind the defaults.
* kv_bytes_per_token_held — KV bytes per token the workload's sequences hold in their
  pages (a page is held whole); sequences_held_over_slots — the most sequences holding KV at
  once (finished ones stay parked until the whole workload is done) over max_slots, what one
  cache row per slot would have held (measured on the continuous runs' engine). Full run
  (`paged_memory`): paged_third_tokens_per_s_over_auto — the workload on a third of the
  pages; decode_temp_bytes — a decode call's working set on top of the cache.
* --window-study — decode call cost (8 steps) of a Gemma-like tiny model (5 sliding layers of
  window 64, 1 global) with 16 slots at 1,900 tokens of 2,048, over the same model with
  every layer global (`window_study_global_over_sliding`): a sliding layer reads only the
  pages its window sees.
* publish_extra_bytes_over_weights — bytes a weight publication allocates beyond the engine's
  own weights (XLA's memory analysis of the in-place write at Qwen3-0.6B shapes, bfloat16
  engine, float32 master), over those weights; the former cast-and-swap path: 1.0. Full run;
  `--publish-memory` alone.
* straggler_decode_cost — a decode call (8 steps, tiny model, 32 slots, max_seq_len 8,192,
  process CPU time, median of interleaved calls) with 31 rows at 128 tokens and one at
  4,096, over all 32 at 128. Goal <= 1.5. `straggler_tokens_read_ratio` is the ratio of the
  positions the two loads must read (1.97). `--straggler-study` runs it alone.

* group_prefill_fraction, group_shared_over_unshared, system_prompt_hit_fraction,
  system_prompt_hits_across_update — prefix sharing on the paged cache (`bench_prefix`'s
  docstring: one group of 16 samples of a 1,024-token prompt; 64 prompts sharing a 512-token
  system prompt; a weight update with `prefix_version_bound=0`; `--quick`: a 512-token
  prompt, whose prefill and kernels cost half). Goals <= 0.07, >= 3, >= 0.9, 0.
* tp8_greedy_equal, tp8_kv_bytes_per_device_ratio, tp8_weight_bytes_per_device_ratio — a
  tensor-parallel engine on 8 fake CPU devices (a child process) against one device
  (`tp_study`; full run only, and `--tp-study` alone with XLA_FLAGS set; the same properties
  are asserted by tests/engine/test_tensor_parallel.py). Goals 1 and 1/8.
* engine_decode_hlo_ops_qwen3_0_6b[_unrolled], engine_decode_compile_s_qwen3_0_6b[_unrolled],
  engine_scan_compile_speedup — the paged decode kernel at Qwen3-0.6B shapes (28 layers,
  bfloat16, 16 slots of 1,024 tokens) with its layers as one scan over stacked weights (the
  engine's default for 5 layers or more) and unrolled, lowered on abstract arrays: HLO ops
  (both runs) and wall seconds to lower and compile on this CPU, unrolled over scanned (full
  run; `--scan-compile` alone).
* engine_kernels_qwen3_0_6b_32k — kernel shapes a 64-slot, 32,768-token engine may compile
  (`EngineConfig.kernel_shapes()`, what `precompile` compiles) with the default prefill
  knobs (decode once, prefill per row bucket x chunk bucket: no span); `_long_prefill` with
  8 prefill rows of 512-token chunks. Goal <= 40.

Every timed figure is the median of alternating pairs after a warm-up run of the very same
workload (so the timed part compiles nothing; `timed_compiles` reports it). `*_cpu` figures
are the same ratios in process CPU time (all threads): steadier than wall time on a shared
machine, and equal to it when the process has its cores to itself.

`--quick` runs the tiny preset on small workloads (< 1 min on 2 cores); the full run does
the tiny preset (`--with-small` adds the ~20M one) and writes benchmarks/results/engine.json.
The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentax.engine import Engine, EngineConfig
from agentax.models import ModelConfig, Transformer, save_pretrained
from agentax.models._layers import attention
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
    cpu = time.process_time()
    _, t = timed(fn)
    cpu = time.process_time() - cpu
    s1 = engine.stats()
    steps = s1.steps - s0.steps
    tokens = s1.total_tokens - s0.total_tokens
    return t, steps, tokens / max(steps * engine.config.max_slots, 1), cpu


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
        "continuous_over_static_cpu": float(np.median([s[3] / c[3] for c, s in zip(cont, stat)])),
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
    from agentax.engine import _runner as eng_mod

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


# ---------------------------------------------------------------------- decode over filled


@functools.partial(jax.jit, static_argnums=(0, 5, 6), donate_argnums=(2, 3))
def _bare_decode(graphdef, state, k, v, tok_b, span, steps, pos):
    """`steps` greedy decode steps of every row at position `pos`..: [B, T, K, H] per-layer
    caches written with dynamic_update_slice, attention over the first `span` positions."""
    model = nnx.merge(graphdef, state)
    b = tok_b.shape[0]

    def step(i, carry):
        k, v, tok = carry
        p = pos + i
        positions = jnp.full((b, 1), p, jnp.int32)
        x = model.embed_tokens(tok[:, None])
        mask = jnp.broadcast_to((jnp.arange(span) <= p)[None, None, :], (b, 1, span))
        new_k, new_v = [], []
        for layer, block in enumerate(model.layers):
            attn = block.attn
            q, kk, vv = attn.qkv(block.attn_norm(x), positions)
            kl = jax.lax.dynamic_update_slice(k[layer], kk.astype(k[layer].dtype), (0, p, 0, 0))
            vl = jax.lax.dynamic_update_slice(v[layer], vv.astype(v[layer].dtype), (0, p, 0, 0))
            out = attention(q, kl[:, :span], vl[:, :span], mask, scale=attn.scale,
                            softcap=attn.softcap)
            x = block._finish(x, attn.o_proj(out.reshape(b, 1, -1)))
            new_k.append(kl)
            new_v.append(vl)
        nxt = jnp.argmax(model.logits(model.final_norm(x))[:, 0], axis=-1).astype(jnp.int32)
        return tuple(new_k), tuple(new_v), nxt

    return jax.lax.fori_loop(0, steps, step, (k, v, tok_b))


def bare_filled_decode(model, batch, prompt_len, new_tokens, cap=128, steps=8):
    """Runs the bare loop once; returns its wall time (prefill excluded: the cache starts
    zeroed at position prompt_len, which costs the same)."""
    cfg = model.config
    graphdef, state = nnx.split(model)
    shape = (batch, cap, cfg.num_kv_heads, cfg.head_dim)
    k = tuple(jnp.zeros(shape, jnp.dtype(cfg.dtype)) for _ in range(cfg.num_layers))
    v = tuple(jnp.zeros(shape, jnp.dtype(cfg.dtype)) for _ in range(cfg.num_layers))
    tok = jnp.ones((batch,), jnp.int32)
    jax.block_until_ready((k, v))
    t = time.perf_counter()
    pos = prompt_len
    while pos < prompt_len + new_tokens:
        n = min(steps, prompt_len + new_tokens - pos)
        span = max(16, 1 << (pos + n - 1).bit_length())
        k, v, tok = _bare_decode(graphdef, state, k, v, tok, min(span, cap), n, jnp.int32(pos))
        tok = jax.device_get(tok)  # the host sees every call's tokens, as an engine must
        pos += n
    return time.perf_counter() - t


def _filled_run(engine, prompts, params):
    s0 = engine.stats()
    cpu = time.process_time()
    _, t = timed(lambda: engine.generate_batch(prompts, params))
    cpu = time.process_time() - cpu
    s1 = engine.stats()
    return t, s1.steps - s0.steps, s1.num_compiles - s0.num_compiles, cpu


def _bare_run(model, batch, prompt_len, new_tokens):
    cpu = time.process_time()
    t = bare_filled_decode(model, batch, prompt_len, new_tokens)
    return t, time.process_time() - cpu


def bench_decode_filled(model, *, batch=32, prompt_len=16, new_tokens=108, pairs=3):
    """decode_over_bare_filled and decode_cost_growth (see the module docstring)."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 256, size=prompt_len).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    # No prefix sharing: the timed runs repeat the warm-up's prompts (see run_preset).
    common = dict(max_slots=batch, prefill_chunk=16, min_prefill_bucket=16,
                  prefix_sharing=False)
    long = Engine(model, EngineConfig(max_seq_len=1024, **common))
    short = Engine(model, EngineConfig(max_seq_len=128, **common))
    try:
        for eng in (long, short):  # warm-up: compiles every shape the timed runs use
            _filled_run(eng, prompts, params)
        bare_filled_decode(model, batch, prompt_len, new_tokens)
        over_bare, growth, compiles = [], [], 0
        ms_long, ms_short, tps, over_bare_cpu, growth_cpu = [], [], [], [], []
        for _ in range(pairs):
            t_long, steps_long, c1, cpu_long = _filled_run(long, prompts, params)
            t_bare, cpu_bare = _bare_run(model, batch, prompt_len, new_tokens)
            t_short, steps_short, c2, cpu_short = _filled_run(short, prompts, params)
            compiles += c1 + c2
            over_bare.append(t_bare / t_long)
            over_bare_cpu.append(cpu_bare / cpu_long)
            ms_long.append(1000 * t_long / steps_long)
            ms_short.append(1000 * t_short / steps_short)
            growth.append(ms_long[-1] / ms_short[-1])
            growth_cpu.append((cpu_long / steps_long) / (cpu_short / steps_short))
            tps.append(batch * new_tokens / t_long)
    finally:
        long.shutdown()
        short.shutdown()
    return {
        "decode_over_bare_filled": float(np.median(over_bare)),
        "decode_over_bare_filled_min": float(min(over_bare)),
        "decode_cost_growth": float(np.median(growth)),
        "decode_cost_growth_max": float(max(growth)),
        "decode_over_bare_filled_cpu": float(np.median(over_bare_cpu)),
        "decode_cost_growth_cpu": float(np.median(growth_cpu)),
        "decode_ms_per_step_1024": float(np.median(ms_long)),
        "decode_ms_per_step_128": float(np.median(ms_short)),
        "filled_engine_tokens_per_s": float(np.median(tps)),
        "filled_pairs": pairs,
        "timed_compiles": compiles,
    }


def bench_config_sweep(model, prompts, lengths, base, sweep, rounds=2):
    """Tokens/s of the lognormal workload per engine setting (alternated rounds, each after
    a warm-up run): `steps_N` fuses N decode steps per call, `chunk_N` prefills N-token chunks,
    `rows_N` prefills at most N requests a call; each changes one field of `base`."""
    params = [SamplingParams(max_tokens=n, seed=i) for i, n in enumerate(lengths)]

    def config(name):
        kind, n = name.rsplit("_", 1)
        n = int(n)
        smallest = min(n, base.min_prefill_bucket)
        change = {"steps": dict(decode_steps_per_call=n),
                  "chunk": dict(prefill_chunk=n, min_prefill_bucket=smallest),
                  "rows": dict(max_prefill_rows=n)}[kind]
        return dataclasses.replace(base, **change)

    engines = {name: Engine(model, config(name)) for name in sweep}
    times = {name: [] for name in sweep}
    try:
        for eng in engines.values():
            asyncio.run(_continuous(eng, prompts, params))  # warm-up: compiles what runs
        for _ in range(rounds):
            for name, eng in engines.items():
                times[name].append(timed(lambda: asyncio.run(_continuous(eng, prompts, params)))[1])
    finally:
        for eng in engines.values():
            eng.shutdown()
    return {f"tokens_per_s_{name}": sum(lengths) / float(np.median(t)) for name, t in times.items()}


def _active_decode_args(batch, filled):
    """decode_steps' state, sampling and stop table: every slot active at position `filled`,
    greedy, no stop ids, no token budget in reach."""
    from agentax.engine._sampling import RowSampling

    st = jnp.asarray(np.stack([np.ones(batch, np.int32), np.full(batch, filled, np.int32),
                               np.ones(batch, np.int32), np.full(batch, 1 << 20, np.int32)]))
    samp = RowSampling(jnp.zeros(batch), jnp.zeros(batch, jnp.int32), jnp.ones(batch),
                       jnp.zeros(batch, jnp.uint32))
    return st, samp, jnp.full((batch, 8), -1, jnp.int32)


def window_study(batch=16, filled=1900, max_seq_len=2048, window=64, calls=24):
    """Decode call cost (8 fused steps, wall and process CPU ms, median of interleaved calls)
    on a Gemma-like tiny model (5 sliding layers of `window` + 1 global) with every slot at
    `filled` tokens, against the same model with every layer global: a sliding layer reads
    only the pages its window sees (the former ring layout's gain, without rings)."""
    from agentax.engine._config import PAGE
    from agentax.engine._kernels import ModelDef, decode_steps
    from agentax.engine._runner import _page_pool

    engine_cfg = EngineConfig(max_slots=batch, max_seq_len=max_seq_len)
    per_seq = engine_cfg.kv_pages // batch
    table = jnp.asarray(np.random.default_rng(0).permutation(engine_cfg.kv_pages)
                        .reshape(batch, per_seq).astype(np.int32))
    st, samp, stop = _active_decode_args(batch, filled)
    runs = {}
    for name, types in (("sliding", ("sliding",) * 5 + ("full",)), ("global", ("full",) * 6)):
        cfg = ModelConfig.tiny(num_layers=6, sliding_window=window, layer_types=types)
        graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
        leaves, treedef = jax.tree.flatten(state)
        runs[name] = [ModelDef(graphdef, treedef), leaves, _page_pool(cfg, engine_cfg)]
    wall = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
    for i in range(calls + 1):  # the first call of each compiles
        for name, run in runs.items():
            t, c = time.perf_counter(), time.process_time()
            *out, run[2] = decode_steps(run[0], run[1], run[2], table, st, samp, stop, 8,
                                        max_seq_len)
            jax.block_until_ready(out)
            if i:
                wall[name].append(time.perf_counter() - t)
                cpu[name].append(time.process_time() - c)
    med = {f"{k}_{n}": 1e3 * float(np.median(d[n])) for k, d in (("wall", wall), ("cpu", cpu))
           for n in runs}
    return {
        "window_study_global_over_sliding": med["wall_global"] / med["wall_sliding"],
        "window_study_global_over_sliding_cpu": med["cpu_global"] / med["cpu_sliding"],
        "window_study_sliding_ms": med["wall_sliding"], "window_study_global_ms": med["wall_global"],
        "window_study_pages_per_row": per_seq, "window_study_page": PAGE,
    }


def memory_figures(engine, prompts, lengths, sequences_peak):
    """KV bytes per token the workload's sequences hold (a page is held whole), and the most
    sequences that held KV at once (`sequences_peak`) over max_slots (what one cache row per
    slot held)."""
    cfg = engine.config
    per_token = engine.kv_cache_bytes / (cfg.kv_pages * 16)
    held = np.array([len(p) + n for p, n in zip(prompts, lengths)])
    return {
        "kv_bytes_per_token_held": per_token * float((np.ceil(held / 16) * 16).mean()
                                                     / held.mean()),
        "kv_bytes_per_token": per_token,
        "sequences_held_over_slots": sequences_peak / cfg.max_slots,
        "mean_sequence_tokens": float(held.mean()),
    }


def paged_memory(model, config, prompts, lengths, auto_tokens_per_s):
    """The same workload on an engine of a third of the pages ("auto": the pages of
    max_slots sequences of max_seq_len), sequences released when all are done (finished ones
    stay parked, as an agent's between turns), warm runs: paged_third_tokens_per_s_over_auto
    (tokens/s over the "auto" engine's continuous run) and its evictions; and
    decode_temp_bytes, the decode kernel's working set on top of the cache."""
    params = [SamplingParams(temperature=1.0, max_tokens=n, seed=i) for i, n in enumerate(lengths)]
    cfg = dataclasses.replace(config, kv_cache_tokens=config.kv_pages * 16 // 3)
    with Engine(model, cfg) as engine:
        asyncio.run(_continuous(engine, prompts, params))  # warm-up
        _, t = timed(lambda: asyncio.run(_continuous(engine, prompts, params)))
        s = engine.stats()
    out = {"paged_third_tokens_per_s_over_auto": sum(lengths) / t / auto_tokens_per_s,
           "paged_third_evictions": s.evictions,
           "paged_third_kv_cache_bytes": engine.kv_cache_bytes}
    out.update(decode_temp_bytes(model, config))
    return out


def decode_temp_bytes(model, config):
    """Temporary bytes XLA allocates for one decode call (its ragged attention reads a block
    of pages at a time, whatever the lengths; XLA's memory analysis)."""
    from agentax.engine._kernels import ModelDef, decode_steps
    from agentax.engine._runner import _page_pool

    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    model_def = ModelDef(graphdef, treedef)
    b, t = config.max_slots, config.max_seq_len
    pool = _page_pool(model.config, config)
    table = jnp.zeros((b, -(-t // 16)), jnp.int32)
    st, samp, stop = _active_decode_args(b, 0)
    stop = jnp.full((b, config.max_stop_ids), -1, jnp.int32)
    paged = decode_steps.lower(model_def, leaves, pool, table, st, samp, stop,
                               config.decode_steps_per_call, t).compile()
    return {"decode_temp_bytes": paged.memory_analysis().temp_size_in_bytes}


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

    asyncio.run(run(True))  # warm-up: longer histories need prefill spans not yet compiled
    asyncio.run(run(False))
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


def prefix_config(prompt_len: int) -> EngineConfig:
    """The prefix benchmarks' engine: 16 slots (one group), prompts in one chunk (few kernel
    shapes to compile), a paged cache with room for every group member's own tokens and the
    system-prompt episodes' pages."""
    return EngineConfig(max_slots=16, max_seq_len=prompt_len + 64, prefill_chunk=prompt_len,
                        min_prefill_bucket=16, kv_cache_tokens=16 * (prompt_len + 64) + 64 * 48)


def _group_run(engine, prompt, n=16, max_tokens=16):
    params = [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=j) for j in range(n)]
    return asyncio.run(_continuous(engine, [prompt] * n, params))


def bench_prefix(model, pairs=3, group=16, prompt_len=1024, episodes=64):
    """Prefix sharing on the paged cache (docs/engine.md).

    * group_prefill_fraction — one group of `group` samples of one `prompt_len`-token prompt
      submitted together: prompt tokens the engine prefilled over group x prompt_len.
    * group_shared_over_unshared — that group's wall time (prefill and 16 sampled tokens
      each) on an engine with `prefix_sharing=False` over one with sharing (same kernels,
      median of alternating pairs, a fresh random prompt for every run, so the index never
      holds it beforehand).
    * system_prompt_hit_fraction — `episodes` requests whose prompts share a prefix of
      `prompt_len` / 2 tokens (then 32 of their own), submitted together, after the first: prefix
      tokens served from the cache over the prefix tokens they asked for.
      system_prompt_hits_across_update — prefix tokens the first such request after a
      weight update (bound 0) was served from KV of the weights before: must be 0.
    """
    rng = np.random.default_rng(11)
    system_len = prompt_len // 2
    config = prefix_config(prompt_len)
    shared = Engine(model, config)
    unshared = Engine(model, dataclasses.replace(config, prefix_sharing=False))
    out = {}
    try:
        # Warm-up (compiles every shape the timed runs meet); the shared engine's, on a fresh
        # engine and prompt, is the prefill measurement.
        _group_run(shared, rng.integers(0, 256, prompt_len).tolist(), group)
        out["group_prefill_fraction"] = shared.stats().prefill_tokens / (group * prompt_len)
        _group_run(unshared, rng.integers(0, 256, prompt_len).tolist(), group)
        ratios = []
        for _ in range(pairs):
            _, t_on = timed(lambda: _group_run(shared, rng.integers(0, 256, prompt_len).tolist()))
            _, t_off = timed(lambda: _group_run(unshared,
                                                rng.integers(0, 256, prompt_len).tolist()))
            ratios.append(t_off / t_on)
        out["group_shared_over_unshared"] = float(np.median(ratios))
        out["group_shared_s"], out["group_unshared_s"] = t_on, t_off

        system = rng.integers(0, 256, system_len).tolist()
        prompts = [system + rng.integers(0, 256, 32).tolist() for _ in range(episodes)]
        params = [SamplingParams(temperature=1.0, max_tokens=8, seed=i) for i in range(episodes)]
        outs = asyncio.run(_continuous(shared, prompts, params))
        hits = sum(min(o.cached_prompt_tokens, system_len) for o in outs[1:])
        out["system_prompt_hit_fraction"] = hits / ((episodes - 1) * system_len)
        shared.update_weights(nnx.split(model)[1], version=shared.policy_version + 1)
        after = asyncio.run(_continuous(shared, prompts[:1], params[:1]))[0]
        out["system_prompt_hits_across_update"] = after.cached_prompt_tokens
        out["prefix_compiles"] = shared.num_compiles
    finally:
        shared.shutdown()
        unshared.shutdown()
    return out


def tp_study(devices=8, prompts=16, max_tokens=32):
    """Tensor parallelism on `devices` fake CPU devices (run in its own process: the device
    count is fixed when JAX starts). A float32 tiny model with 8 kv heads, 16 prompts, greedy:
    tp{N}_greedy_equal (1: every token equal to one device's), tp{N}_kv_bytes_per_device_ratio
    and tp{N}_weight_bytes_per_device_ratio (bytes on one device over the whole),
    tp{N}_tokens_per_s_over_1 (CPU devices share the same cores: not a speed figure)."""
    model = Transformer(ModelConfig.tiny(num_heads=8, num_kv_heads=8, head_dim=16),
                        rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, int(n)).tolist() for n in rng.integers(8, 60, prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    config = EngineConfig(max_slots=16, max_seq_len=128, prefill_chunk=64,
                          min_prefill_bucket=64, kv_cache_tokens=16 * 128)
    out, tokens = {}, {}
    for tp in (1, devices):
        with Engine(model, dataclasses.replace(config, tensor_parallel=tp)) as engine:
            engine.generate_batch(prompts, params)  # compiles
            outs, t = timed(lambda: engine.generate_batch(prompts, params))
            tokens[tp] = [o.token_ids.tolist() for o in outs]
            out[f"tp{tp}_tokens_per_s"] = sum(o.num_tokens for o in outs) / t
            if tp > 1:
                w = engine._weights
                out[f"tp{tp}_kv_bytes_per_device_ratio"] = (
                    engine.kv_cache_bytes_per_device / engine.kv_cache_bytes)
                out[f"tp{tp}_weight_bytes_per_device_ratio"] = (
                    sum(x.addressable_shards[0].data.nbytes for x in w) / sum(x.nbytes for x in w))
    out[f"tp{devices}_greedy_equal"] = float(tokens[1] == tokens[devices])
    out[f"tp{devices}_tokens_per_s_over_1"] = (out[f"tp{devices}_tokens_per_s"]
                                               / out["tp1_tokens_per_s"])
    return out


def tp_figures(devices=8):
    """`tp_study` in a child process with `devices` fake CPU devices (full run only: the
    child's start-up and compilations, ~10 s, do not fit --quick's minute beside the rest)."""
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    proc = subprocess.run([sys.executable, __file__, "--tp-study"], capture_output=True,
                          text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"tp study failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_preset(name, *, slots, requests, hf_requests, episodes, steps_sweep, repeats,
               filled_pairs=3, prefix_pairs=3, prefix_len=1024):
    model = Transformer(ModelConfig.preset(name), rngs=nnx.Rngs(0))
    # precompile: every shape the traffic may meet (which row buckets a run meets depends on
    # timing, so a warm-up run alone leaves some to compile inside timed runs). Prefill calls
    # of at most 8 rows (as the demo's engine) in chunks of 32 or 64, and decode: 9 kernels.
    # Rows up to max_slots and chunks down to 16 would compile 19; the sweep's rows_32
    # measures that wider prefill. No prefix sharing: every run repeats the very same prompts
    # (and the re-prefill arm the same histories), which would otherwise be served from the
    # pages of the run before, measuring the prefix cache instead of batching and
    # continuation (bench_prefix measures sharing).
    config = EngineConfig(max_slots=slots, max_seq_len=288, prefill_chunk=64,
                          min_prefill_bucket=32, max_prefill_rows=8, precompile=True,
                          prefix_sharing=False)
    rng = np.random.default_rng(0)
    out = {}
    with Engine(model, config) as engine:
        prompts, lengths = workload(rng, requests)
        # Warm-up: the very workload once, so the timed runs compile nothing.
        params = [SamplingParams(temperature=1.0, max_tokens=n, seed=i)
                  for i, n in enumerate(lengths)]
        asyncio.run(_continuous(engine, prompts, params))
        asyncio.run(_static(engine, prompts, params, slots))
        warm_compiles = engine.num_compiles
        out.update(bench_batching(engine, prompts, lengths, slots, repeats))
        sequences_peak = engine.stats().kv_sequences_peak  # the lognormal runs' alone
        out["timed_compiles_batching"] = engine.num_compiles - warm_compiles
        if repeats > 2:  # the full run: an instrumented repeat (informative, no goal)
            out.update(time_split(engine, prompts, lengths))
        if hf_requests:
            out.update(bench_transformers(model, engine, prompts[:hf_requests],
                                          lengths[:hf_requests], slots))
        out.update(bench_episodes(engine, episodes))
        out["compiles"] = engine.num_compiles
        out["kv_cache_bytes"] = engine.kv_cache_bytes
        out.update(memory_figures(engine, prompts, lengths, sequences_peak))
    if steps_sweep:  # full run only: another engine to compile
        out.update(paged_memory(model, config, prompts, lengths, out["continuous_tokens_per_s"]))
    if filled_pairs:
        out.update(bench_decode_filled(model, pairs=filled_pairs))
    if prefix_pairs:
        out.update(bench_prefix(model, pairs=prefix_pairs, prompt_len=prefix_len))
    if steps_sweep:
        out.update(bench_config_sweep(model, prompts, lengths, config, steps_sweep))
    return out


def straggler_study(model, batch=32, short=128, long=4096, max_seq_len=8192, calls=12):
    """A decode call (8 fused steps, process CPU ms, median of interleaved calls) of the
    engine's kernel with 31 slots at `short` tokens and one at `long`, over all slots at
    `short`: ragged attention reads each row's own pages, so the straggler costs its own
    tokens."""
    from agentax.engine._config import PAGE
    from agentax.engine._kernels import ModelDef, decode_steps
    from agentax.engine._runner import _page_pool

    cfg = model.config
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    model_def = ModelDef(graphdef, treedef)
    per_seq = max_seq_len // PAGE
    pool = _page_pool(cfg, EngineConfig(max_slots=batch, max_seq_len=max_seq_len,
                                        kv_cache_tokens=batch * max_seq_len))
    table = jnp.asarray(np.random.default_rng(0).permutation(batch * per_seq)
                        .reshape(batch, per_seq).astype(np.int32))
    loads = {}
    for name, last in (("even", short), ("straggler", long)):
        st, samp, stop = _active_decode_args(batch, short)
        loads[name] = (st.at[1, -1].set(last), samp, stop)
    times = {name: [] for name in loads}
    for i in range(calls + 1):  # the first call of each compiles
        for name, (st, samp, stop) in loads.items():
            c = time.process_time()
            *res, pool = decode_steps(model_def, leaves, pool, table, st, samp, stop, 8,
                                      max_seq_len)
            jax.block_until_ready(res)
            if i:
                times[name].append(time.process_time() - c)
    ms = {name: 1e3 * float(np.median(times[name])) for name in loads}
    return {"straggler_decode_cost": ms["straggler"] / ms["even"],
            "straggler_study_even_ms": ms["even"],
            "straggler_study_straggler_ms": ms["straggler"],
            # The pages the two loads read (+1 per row: its call's own steps), their ratio
            # being the cost an attention-bound decode cannot go below.
            "straggler_tokens_read_ratio": ((batch - 1) * short + long) / (batch * short)}


def publish_memory(cfg: ModelConfig) -> dict:
    """What a weight publication allocates beyond the engine's weights (XLA's memory analysis
    of the engine's in-place write, lowered on abstract arrays at `cfg`'s shapes: a bfloat16
    engine fed a float32 master, as the pipeline publishes), over the engine's weight bytes.
    The former path (a cast copy swapped in) allocated one whole copy: 1.0. The engine holds
    a deep model's layers stacked (`EngineConfig.scan_layers`): the write then packs the
    master's per-layer leaves into the stacked buffers, as the engine does."""
    from jax.sharding import SingleDeviceSharding

    from agentax.engine._kernels import ModelDef, weight_writer
    from agentax.engine._runner import _layer_stack

    model = nnx.eval_shape(lambda: Transformer(
        dataclasses.replace(cfg, dtype="bfloat16", param_dtype="bfloat16"), rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    shapes, treedef = jax.tree.flatten(state)
    model_def = ModelDef(graphdef, treedef, _layer_stack(model, EngineConfig())[0])
    old = jax.eval_shape(model_def.pack, shapes)
    new = [jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in shapes]
    place = SingleDeviceSharding(jax.devices()[0])
    mem = weight_writer(model_def, [place] * len(old)).lower(old, new).compile().memory_analysis()
    weights = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in old)
    extra = mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes
    return {"publish_extra_bytes_over_weights": round(extra / weights, 4),
            "publish_engine_weight_bytes_qwen3_0_6b": weights}


def scan_compile(cfg: ModelConfig) -> dict:
    """The paged decode kernel of an engine of `cfg` (bfloat16; 16 slots of 1,024 tokens, 8
    fused steps) with its layers scanned (`EngineConfig.scan_layers`) and unrolled, lowered
    on abstract arrays (`lower_decode`: no weights): HLO ops of each and wall seconds to lower
    and compile each (XLA on this host's CPU)."""
    from agentax.engine._runner import lower_decode

    cfg = dataclasses.replace(cfg, dtype="bfloat16", param_dtype="bfloat16")
    out = {}
    for name, scan in (("", True), ("_unrolled", False)):
        t = time.perf_counter()
        lowered = lower_decode(cfg, EngineConfig(max_slots=16, max_seq_len=1024,
                                                 kv_cache_tokens="auto", scan_layers=scan))
        out[f"engine_decode_hlo_ops_qwen3_0_6b{name}"] = sum(
            1 for line in lowered.as_text().splitlines() if " = " in line)
        lowered.compile()
        out[f"engine_decode_compile_s_qwen3_0_6b{name}"] = round(time.perf_counter() - t, 2)
    out["engine_scan_compile_speedup"] = round(
        out["engine_decode_compile_s_qwen3_0_6b_unrolled"]
        / out["engine_decode_compile_s_qwen3_0_6b"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny preset, small workloads")
    parser.add_argument("--with-small", action="store_true",
                        help="full run: also the ~20M preset (adds ~15 min on 2 cores)")
    parser.add_argument("--window-study", action="store_true",
                        help="only compare decode with sliding-window layers and all global")
    parser.add_argument("--straggler-study", action="store_true",
                        help="only the ragged decode's cost with one long row (straggler)")
    parser.add_argument("--publish-memory", action="store_true",
                        help="only XLA's memory analysis of an in-place weight publication")
    parser.add_argument("--scan-compile", action="store_true",
                        help="only the decode kernel's size and compile time, scanned/unrolled")
    parser.add_argument("--tp-study", action="store_true",
                        help="only tensor parallelism over fake CPU devices (set XLA_FLAGS)")
    args = parser.parse_args()
    if args.tp_study:
        print(json.dumps({k: round(v, 4) for k, v in tp_study(len(jax.devices())).items()}))
        return
    if args.publish_memory:
        print(json.dumps(publish_memory(ModelConfig.qwen3_0_6b())))
        return
    if args.scan_compile:
        print(json.dumps(scan_compile(ModelConfig.qwen3_0_6b())))
        return
    if args.straggler_study:
        model = Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0))
        print(json.dumps({k: round(v, 4) for k, v in straggler_study(model).items()}))
        return
    if args.window_study:
        print(json.dumps({k: round(v, 4) for k, v in window_study().items()}))
        return
    if args.quick:
        # The full run's engine (the same 18 kernels) on a shorter workload: an engine of
        # quick's own would time other prefill kernels than the full run, and its
        # continuous_over_static would disagree with it. 96 requests, two timed batching
        # pairs, one filled-decode pair and no scan-compile figures keep quick under 60 s on
        # 2 cores.
        plan = {"tiny": dict(slots=32, requests=96, hf_requests=0, episodes=8, steps_sweep=(),
                             repeats=2, filled_pairs=1, prefix_pairs=1, prefix_len=512)}
    else:
        plan = {"tiny": dict(slots=32, requests=256, hf_requests=64, episodes=64,
                             steps_sweep=("steps_1", "steps_4", "steps_8", "steps_16",
                                          "chunk_16", "chunk_32", "chunk_128", "rows_32"),
                             repeats=3, filled_pairs=5, prefix_pairs=3)}
        if args.with_small:
            # One pair: a small-preset decode step is ~150 ms on the shared CPU.
            plan["small"] = dict(slots=32, requests=256, hf_requests=64, episodes=64,
                                 steps_sweep=(), repeats=1, filled_pairs=0, prefix_pairs=0)
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
        if f"{head}/{key}" in figures:
            figures[key] = figures[f"{head}/{key}"]
    for key in ("decode_over_bare_filled", "decode_cost_growth", "group_prefill_fraction",
                "group_shared_over_unshared", "system_prompt_hit_fraction",
                "system_prompt_hits_across_update"):  # measured on tiny
        figures[key] = figures[f"tiny/{key}"]
    figures["continuous_over_static_tiny"] = figures["tiny/continuous_over_static"]
    # One long row among short ones: the ragged decode (quick: fewer calls, shorter slots).
    tiny_model = Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0))
    quick_study = dict(calls=4, max_seq_len=4096 + 128)
    figures.update({k: round(v, 4) for k, v in straggler_study(
        tiny_model, **(quick_study if args.quick else {})).items()})
    if not args.quick:
        figures.update(tp_figures())
    # The kernels a 64-slot, 32k-token engine may compile (what precompile compiles), with
    # the default prefill knobs, and with prefill rows and chunks sized for long prompts.
    long = EngineConfig(max_slots=64, max_seq_len=32768, kv_cache_tokens=64 * 32768)
    figures["engine_kernels_qwen3_0_6b_32k"] = len(long.kernel_shapes())
    figures["engine_kernels_qwen3_0_6b_32k_long_prefill"] = len(dataclasses.replace(
        long, max_prefill_rows=8, prefill_chunk=512, min_prefill_bucket=512).kernel_shapes())
    if not args.quick:  # ~5 s of compiling; quick has no room for it
        figures.update(publish_memory(ModelConfig.qwen3_0_6b()))
    if not args.quick:  # layers under a scan: lowering and compiling both layouts, ~20 s
        figures.update(scan_compile(ModelConfig.qwen3_0_6b()))
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
