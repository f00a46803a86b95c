"""Device benchmark: the engine's decode and prefill kernels and a train step on a GPU or TPU.

Model: Qwen3-0.6B-shaped (`ModelConfig.qwen3_0_6b()`), random weights, bfloat16. Figures:

* decode_tokens_per_s_b{B}_ctx{C} — the engine's fused decode kernel (`decode_steps`, 8 steps
  per call, the default) over B slots whose sequences sit at C tokens (a page pool of B
  sequences of C + 64 positions; each row reads its own pages). Timed after a warm-up call;
  the host fetches each call's tokens, as the engine does. B in (64, 256), C in (1k, 8k).
* decode_roofline_frac_b{B}_ctx{C} — achieved HBM traffic over the device's bandwidth, the
  traffic of one step being every weight once (bf16) plus the K/V the step reads (B x C x
  layers x 2 x K x H x 2 bytes). 1.0 is the memory-bandwidth limit of decoding.
* A (B, C) whose KV cache does not fit the device is reported as `does_not_fit_b{B}_ctx{C}`
  with the bytes it needs (256 x 8k x 112 KiB per token = 235 GB for this model).
* prefill_mfu — the engine's prefill kernel (`prefill_chunk`) over 16 fresh rows of 1024
  tokens: model FLOPs (2 x non-embedding params x tokens + LM head on the sampled rows +
  causal attention) per second over the device's dense bf16 peak.
* train_step_mfu_{R}x{T} — the library's own RL step (`RLTrainer.step`: float32 master
  weights and moments, bf16 compute, remat, the training attention, chunked LM head) on R
  episodes of T tokens, half of them trained: 3 x the forward FLOPs (LM head on the trained
  positions) per second over peak; with `train_predicted_peak_bytes_*` (`update_memory`, the
  analysis of benchmarks/memory.py) beside the device's peak memory
  (`train_peak_device_memory_bytes_*`: the train steps run first, smallest first, so each
  peak is its own step's) and `train_measured_over_predicted_*` (that peak less the bytes
  held before the trainer existed, over the prediction). (R, T) in (8 x 1,024, 1 x 32,768).
* engine_compiles (kernel compilations of the run), peak_device_memory_bytes.
* `--prefix-only`: gpu_group_prefill_fraction and gpu_group_shared_over_unshared — one GRPO
  group of 16 samples of a 1,024-token prompt on a paged engine, prefix sharing on and off
  (`bench_prefix_group`), written to results/device_prefix.json.

On CPU it prints why it skips and exits 0 (the last line is still JSON). `--cpu-smoke` runs
the same code with a tiny model and shapes on any backend (a test of the script, not a figure).
One command, under 5 minutes on one accelerator: `python benchmarks/device.py`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentax.engine import EngineConfig
from agentax.engine._kernels import compiled_count, decode_steps, prefill_chunk
from agentax.engine._runner import Runner
from agentax.engine._sampling import RowSampling
from agentax.models import ModelConfig, Transformer, page_pool_bytes

# Per-chip HBM bandwidth (bytes/s) and dense bf16 peak (FLOP/s), from the vendors' sheets.
# Matched as substrings of `device.device_kind`, most specific first.
DEVICES = (
    ("H200", 4.8e12, 989e12),
    ("H100 PCIe", 2.0e12, 756e12),
    ("H100", 3.35e12, 989e12),
    ("A100-SXM4-80GB", 2.039e12, 312e12),
    ("A100", 1.555e12, 312e12),
    ("L4", 0.3e12, 121e12),
    ("TPU v6", 1.64e12, 918e12),
    ("TPU v5p", 2.765e12, 459e12),
    ("TPU v5 lite", 0.819e12, 197e12),
    ("TPU v5e", 0.819e12, 197e12),
    ("TPU v4", 1.2e12, 275e12),
)
DECODE_STEPS = 8


def device_peaks(device, hbm_bytes_s: float | None, peak_flops: float | None):
    """(bandwidth, peak FLOP/s, matched name) for `device`; command-line values win."""
    kind = getattr(device, "device_kind", "")
    for name, bw, flops in DEVICES:
        if name.lower() in kind.lower():
            return hbm_bytes_s or bw, peak_flops or flops, name
    return hbm_bytes_s, peak_flops, None


def param_counts(model) -> tuple[int, int]:
    """(all parameters, parameters outside the embedding table)."""
    state = nnx.state(model, nnx.Param)
    total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))
    embed = int(np.prod(model.embed.embedding.shape))
    return total, total - embed


def _page_table(config: EngineConfig) -> jax.Array:
    """Slot s's pages: the s-th run of consecutive pages of the pool ("auto")."""
    per_slot = config.kv_pages // config.max_slots
    return jnp.arange(config.kv_pages, dtype=jnp.int32).reshape(config.max_slots, per_slot)


def kv_bytes_per_token(cfg: ModelConfig) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize


def forward_flops(cfg: ModelConfig, body_params: int, rows: int, tokens: int,
                  logits_rows: int, prefill: bool = False) -> float:
    """Model FLOPs of a causal forward over rows x tokens (matmuls only). `prefill`: as the
    engine's prefill computes it, whose last layer runs its output projection and MLP only
    for each row's last token (nothing reads the others)."""
    dense = 2.0 * body_params * rows * tokens
    if prefill:
        qkv = cfg.hidden_size * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        dense -= 2.0 * (body_params / cfg.num_layers - qkv) * rows * (tokens - 1)
    head = 2.0 * cfg.hidden_size * cfg.vocab_size * logits_rows
    # QK^T and PV, causal: each of the two is 2 * N * H * T^2 / 2 per row and layer.
    attn = 2.0 * cfg.num_layers * rows * cfg.num_heads * cfg.head_dim * tokens * tokens
    return dense + head + attn


def bench_decode(model, batch: int, ctx: int, calls: int, hbm: float | None,
                 weight_bytes: int, free_bytes: int | None) -> dict:
    cfg = model.config
    seq_len = ctx + 64
    config = EngineConfig(max_slots=batch, max_seq_len=seq_len, decode_steps_per_call=DECODE_STEPS)
    need = page_pool_bytes(cfg, config.kv_pages)
    key = f"b{batch}_ctx{ctx // 1024}k" if ctx >= 1024 else f"b{batch}_ctx{ctx}"
    if free_bytes is not None and need + weight_bytes > 0.9 * free_bytes:
        return {f"does_not_fit_{key}": need}
    runner = Runner(model, config)
    table = _page_table(config)
    state = np.stack([
        np.ones(batch, np.int32),  # pending token
        np.full(batch, ctx - DECODE_STEPS * (calls + 1), np.int32),  # positions: end near ctx
        np.ones(batch, np.int32),  # all active
        np.full(batch, 1 << 30, np.int32),  # no budget stop
    ])
    sampling = RowSampling(jnp.zeros(batch), jnp.zeros(batch, jnp.int32), jnp.ones(batch),
                           jnp.zeros(batch, jnp.uint32))
    stop = jnp.full((batch, config.max_stop_ids), -1, jnp.int32)

    def call(state):
        out_tok, _, counts, runner.cache = decode_steps(
            runner.model_def, runner.weights, runner.cache, table, jnp.asarray(state), sampling,
            stop, DECODE_STEPS, seq_len)
        tok, counts = jax.device_get((out_tok, counts))
        state = state.copy()
        state[0], state[1] = tok[:, -1], state[1] + counts
        return state

    state = call(state)  # compiles
    t = time.perf_counter()
    for _ in range(calls):
        state = call(state)
    dt = time.perf_counter() - t
    steps = calls * DECODE_STEPS
    tokens_per_s = batch * steps / dt
    kv_read = batch * ctx * kv_bytes_per_token(cfg)
    out = {f"decode_tokens_per_s_{key}": tokens_per_s, f"decode_ms_per_step_{key}": 1e3 * dt / steps,
           f"decode_bytes_per_step_{key}": weight_bytes + kv_read}
    if hbm:
        out[f"decode_roofline_frac_{key}"] = (weight_bytes + kv_read) * steps / dt / hbm
    del runner
    return out


def bench_prefill(model, rows: int, tokens: int, reps: int, peak: float | None,
                  body_params: int) -> dict:
    cfg = model.config
    config = EngineConfig(max_slots=rows, max_seq_len=tokens + 64, prefill_chunk=tokens,
                          min_prefill_bucket=tokens)
    runner = Runner(model, config)
    ids = jnp.ones((rows, tokens), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(tokens, dtype=jnp.int32), (rows, tokens))
    slots = jnp.arange(rows, dtype=jnp.int32)
    sampling = RowSampling(jnp.ones(rows), jnp.zeros(rows, jnp.int32), jnp.ones(rows),
                           jnp.zeros(rows, jnp.uint32))
    table = _page_table(config)

    def call():
        tok, _, runner.cache = prefill_chunk(runner.model_def, runner.weights, runner.cache,
                                             table, ids, positions, slots, sampling,
                                             config.max_seq_len)
        return jax.device_get(tok)

    call()
    t = time.perf_counter()
    for _ in range(reps):
        call()
    dt = (time.perf_counter() - t) / reps
    flops = forward_flops(cfg, body_params, rows, tokens, logits_rows=rows, prefill=True)
    out = {"prefill_tokens_per_s": rows * tokens / dt, "prefill_tflops": flops / dt / 1e12}
    if peak:
        out["prefill_mfu"] = flops / dt / peak
    return out


def bench_train(model, rows: int, tokens: int, reps: int, peak: float | None,
                body_params: int) -> dict:
    """The library's own RL step (`RLTrainer.step`: float32 master weights and Adam moments,
    bf16 compute, remat, blocked/cuDNN attention, chunked LM head) on `rows` episodes of
    `tokens` positions whose second half of each quarter is trained (model turns between
    observations), against `update_memory`'s prediction of its peak."""
    from agentax.records import Group, Trajectory, TrajectoryStatus
    from agentax.train import RLTrainer, TrainerConfig, update_memory

    cfg = model.config
    config = TrainerConfig(micro_batch_size=rows, max_seq_len=tokens,
                           min_seq_bucket=min(64, tokens), compute_dtype="bfloat16",
                           advantage="reinforce_pp", learning_rate=1e-6)
    rng = np.random.default_rng(0)
    n = tokens + 1
    mask = np.zeros(n, np.int8)
    for start in range(n // 8, n, n // 4):
        mask[start:start + n // 8] = 1
    trajs = tuple(Trajectory(
        task_id="t", token_ids=rng.integers(0, cfg.vocab_size, n).astype(np.int32),
        loss_mask=mask, logprobs=np.where(mask > 0, -3.0, 0.0).astype(np.float32),
        versions=np.where(mask > 0, 0, -1).astype(np.int32), reward=float(i % 2),
        status=TrajectoryStatus.OK, sample_index=i) for i in range(rows))
    group = [Group(group_id="g", task_id="t", trajectories=trajs)]
    predicted = update_memory(cfg, config, rows=rows, seq_len=tokens)
    trainer = RLTrainer(model, config)
    m = trainer.step(group)  # compiles
    t = time.perf_counter()
    for _ in range(reps):
        m = trainer.step(group)
    dt = (time.perf_counter() - t) / reps
    trained = int(mask[1:].sum()) * rows
    flops = 3.0 * forward_flops(cfg, body_params, rows, tokens, logits_rows=trained)
    key = f"{rows}x{tokens}"
    out = {f"train_tokens_per_s_{key}": rows * tokens / dt,
           f"train_tflops_{key}": flops / dt / 1e12,
           f"train_predicted_peak_bytes_{key}": predicted.peak_bytes,
           f"train_loss_finite_{key}": bool(np.isfinite(m.loss))}
    if peak:
        out[f"train_step_mfu_{key}"] = flops / dt / peak
    return out


def bench_prefix_group(model, group: int, prompt_len: int, max_tokens: int = 16,
                       pairs: int = 2) -> dict:
    """Prefix sharing at this model's size: one group of `group` samples of a
    `prompt_len`-token prompt submitted together to a paged engine with `prefix_sharing` on
    and off (same kernels; a warm-up of each first; a fresh random prompt every run).
    gpu_group_prefill_fraction: prompt tokens prefilled over group x prompt_len;
    gpu_group_shared_over_unshared: the group's wall time off over on (median of pairs)."""
    import asyncio
    import dataclasses

    from agentax.engine import Engine
    from agentax.records import SamplingParams

    config = EngineConfig(max_slots=group, max_seq_len=prompt_len + 64, prefill_chunk=prompt_len,
                          min_prefill_bucket=16, kv_cache_tokens=group * (prompt_len + 64))
    rng = np.random.default_rng(0)
    params = [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=j) for j in range(group)]

    def run(engine) -> float:
        prompt = rng.integers(0, model.config.vocab_size, prompt_len).tolist()

        async def go():
            return await asyncio.gather(*(engine.generate(prompt, p) for p in params))

        t = time.perf_counter()
        for out in asyncio.run(go()):
            engine.release(out.sequence_id)
        return time.perf_counter() - t

    shared = Engine(model, config)
    unshared = Engine(model, dataclasses.replace(config, prefix_sharing=False))
    try:
        run(shared)  # compiles; on a fresh engine, also the prefill measurement
        out = {"gpu_group_prefill_fraction": shared.stats().prefill_tokens / (group * prompt_len)}
        run(unshared)
        times = [(run(shared), run(unshared)) for _ in range(pairs)]
    finally:
        shared.shutdown()
        unshared.shutdown()
    out["gpu_group_shared_over_unshared"] = float(np.median([b / a for a, b in times]))
    out["gpu_group_shared_s"], out["gpu_group_unshared_s"] = times[-1]
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hbm-gbps", type=float, default=None,
                        help="device memory bandwidth in GB/s (default: looked up by device kind)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="dense bf16 peak in TFLOP/s (default: looked up by device kind)")
    parser.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prefix-only", action="store_true",
                        help="only the prefix-sharing group figures (results/device_prefix.json)")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    if device.platform == "cpu" and not args.cpu_smoke:
        msg = "no GPU or TPU found (JAX backend: cpu); this benchmark needs an accelerator"
        print(f"benchmarks/device.py: skipped: {msg}", flush=True)
        out = {"skipped": msg}
        print(json.dumps(out))
        return out

    hbm = args.hbm_gbps * 1e9 if args.hbm_gbps else None
    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    if args.cpu_smoke:  # the script's logic on tiny shapes; figures mean nothing
        cfg = ModelConfig.tiny(dtype="bfloat16", param_dtype="bfloat16")
        shapes = dict(batches=(4, 8), contexts=(128, 512), calls=2, prefill=(2, 64),
                      train=((2, 64),), reps=1)
        hbm, peak = hbm or 1e11, peak or 1e12
    else:
        cfg = ModelConfig.qwen3_0_6b()
        shapes = dict(batches=(64, 256), contexts=(1024, 8192), calls=8, prefill=(16, 1024),
                      train=((8, 1024), (1, 32768)), reps=3)
        hbm, peak, matched = device_peaks(device, hbm, peak)
        if matched is None:
            print(f"unknown device kind '{device.device_kind}': pass --hbm-gbps and "
                  "--peak-tflops for the roofline and MFU figures", flush=True)
    t0 = time.perf_counter()
    compiles0 = compiled_count()
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    if args.prefix_only:
        group, prompt_len = (4, 64) if args.cpu_smoke else (16, 1024)
        out = {"device": str(getattr(device, "device_kind", device.platform)),
               **bench_prefix_group(model, group, prompt_len),
               "wall_s": time.perf_counter() - t0}
        if not args.cpu_smoke:
            path = Path(__file__).parent / "results" / "device_prefix.json"
            path.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out))
        return out
    total, body = param_counts(model)
    weight_bytes = total * jnp.dtype(cfg.param_dtype).itemsize
    stats = device.memory_stats() or {}
    free = stats.get("bytes_limit")
    out: dict = {"device": str(getattr(device, "device_kind", device.platform)),
                 "model": "tiny (cpu smoke)" if args.cpu_smoke else "qwen3-0.6b shape, random bf16",
                 "params": total, "hbm_bytes_per_s": hbm, "peak_flops": peak}
    # The train steps run first, largest last: the device's peak counter only grows, so each
    # step's peak is read before any engine cache exists, over the bytes already held (the
    # bf16 model the trainer copies its float32 master weights from).
    for rows, tokens in shapes["train"]:
        held = (device.memory_stats() or {}).get("bytes_in_use")
        out.update(bench_train(model, rows, tokens, shapes["reps"], peak, body))
        key = f"{rows}x{tokens}"
        peak_now = (device.memory_stats() or {}).get("peak_bytes_in_use")
        out[f"train_peak_device_memory_bytes_{key}"] = peak_now
        if peak_now is not None and held is not None:
            out[f"train_measured_over_predicted_{key}"] = (
                (peak_now - held) / out[f"train_predicted_peak_bytes_{key}"])
        print(json.dumps({k: v for k, v in out.items() if key in k}), flush=True)
    for batch in shapes["batches"]:
        for ctx in shapes["contexts"]:
            out.update(bench_decode(model, batch, ctx, shapes["calls"], hbm, weight_bytes, free))
            print(json.dumps({k: v for k, v in out.items() if f"b{batch}_" in k}), flush=True)
    out.update(bench_prefill(model, *shapes["prefill"], shapes["reps"], peak, body))
    out["engine_compiles"] = compiled_count() - compiles0
    out["peak_device_memory_bytes"] = (device.memory_stats() or {}).get("peak_bytes_in_use")
    out["wall_s"] = time.perf_counter() - t0
    if not args.cpu_smoke:
        path = Path(__file__).parent / "results" / "device.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
