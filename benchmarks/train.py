"""Trainer benchmark: train-step throughput, compilations under varied lengths, packing gain.

Workload: synthetic GRPO groups (random byte tokens, prompt 8-32 tokens, generations of varied
length, 0/1 rewards) on the byte-vocabulary presets `ModelConfig.tiny()` (~0.8M params) and,
in the full run, `ModelConfig.small()` (~20M). Figures:

* `<model>_tokens_per_s` — trained positions (rows x padded length) per second of `step`.
* `compiles` — `trainer.num_compiles` after N steps with lengths drawn uniformly (buckets on),
  against `distinct_lengths` (the compilations an unbucketed trainer would need).
* `packed_over_padded` — trained (loss-mask) tokens per second with `pack=True` over the same
  groups padded one sequence per row (many short sequences, a few long ones).
* `attention_blocked_over_dense` — SFT steps per second on packed rows of the byte model the
  recipes train (`RunConfig().model`: 2 layers, head dim 32) with `attention='auto'` (on CPU
  the blocked kernel at its automatic block) over the same steps with `attention='dense'`, at
  the `mini_swe` recipe's shape (32 rows of 384; `--quick`: 16 rows of 384);
  `sft_auto_step_ms` and `sft_dense_step_ms` are the step times.

`python benchmarks/train.py --quick` (< 1 min on 2 cores) or the full run (writes
benchmarks/results/train.json). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from agentax.models import ModelConfig, Transformer
from agentax.models._attention import dense_attention_pays, resolve_attention_block
from agentax.records import Group, Trajectory, TrajectoryStatus
from agentax.run import RunConfig
from agentax.train import RLTrainer, SFTTrainer, TrainerConfig


def make_groups(rng, num_groups, group_size, gen_lo, gen_hi):
    groups = []
    for g in range(num_groups):
        trajs = []
        for j in range(group_size):
            p, n = int(rng.integers(8, 33)), int(rng.integers(gen_lo, gen_hi + 1))
            mask = np.r_[np.zeros(p), np.ones(n)].astype(np.int8)
            trajs.append(Trajectory(
                task_id=f"t{g}", token_ids=rng.integers(0, 256, p + n).astype(np.int32),
                loss_mask=mask, logprobs=np.where(mask > 0, -5.0, 0.0).astype(np.float32),
                versions=np.where(mask > 0, 0, -1).astype(np.int32),
                reward=float(rng.integers(0, 2)), status=TrajectoryStatus.OK, sample_index=j))
        groups.append(Group(group_id=f"g{g}", task_id=f"t{g}", trajectories=tuple(trajs)))
    return groups


def throughput(model_cfg, config, groups_list, warmup=1):
    trainer = RLTrainer(Transformer(model_cfg), config)
    for g in groups_list[:warmup]:
        trainer.step(g)
    t0 = time.perf_counter()
    positions = tokens = 0
    for g in groups_list[warmup:]:
        m = trainer.step(g)
        positions += m.num_positions
        tokens += m.num_tokens
    dt = time.perf_counter() - t0
    return positions / dt, tokens / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run, < 1 minute on 2 cores")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    quick = args.quick
    out: dict[str, float] = {}

    # 1. Throughput at a fixed shape (2 groups x 8 samples, 96-token generations).
    cfg = TrainerConfig(learning_rate=1e-5, micro_batch_size=8, max_seq_len=256)
    models = [("tiny", ModelConfig.tiny())] + ([] if quick else [("small", ModelConfig.small())])
    for name, mcfg in models:
        steps = 3 if quick else 10
        batches = [make_groups(rng, 2, 8, 96, 96) for _ in range(steps + 1)]
        out[f"{name}_tokens_per_s"], _ = throughput(mcfg, cfg, batches)

    # 2. Compilations over many steps with varied lengths.
    n_steps, hi = (30, 90) if quick else (200, 400)
    vcfg = TrainerConfig(learning_rate=1e-5, micro_batch_size=8, max_seq_len=512)
    mcfg = ModelConfig.tiny(num_layers=1) if quick else ModelConfig.tiny()
    trainer = RLTrainer(Transformer(mcfg), vcfg)
    lengths = set()
    t0 = time.perf_counter()
    for _ in range(n_steps):
        groups = make_groups(rng, int(rng.integers(1, 3)), 8, 4, hi)
        lengths |= {t.num_tokens - 1 for g in groups for t in g.trajectories}
        trainer.step(groups)
    out["varied_steps"] = n_steps
    out["compiles"] = trainer.num_compiles
    out["train_step_compiles"] = trainer.compiles_by_kernel.get("accumulate_grads", 0)
    out["distinct_lengths"] = len(lengths)
    out["varied_run_s"] = time.perf_counter() - t0

    # 3. Packing: many short generations plus a few long ones.
    def mixed(n):
        out_ = []
        for _ in range(n):
            gs = make_groups(rng, 3, 8, 8, 40) + make_groups(rng, 1, 2, 180, 200)
            out_.append(gs)
        return out_
    steps = 2 if quick else 8
    data = mixed(steps + 1)
    base = dict(learning_rate=1e-5, micro_batch_size=8, max_seq_len=256)
    _, padded = throughput(mcfg, TrainerConfig(**base), data)
    _, packed = throughput(mcfg, TrainerConfig(**base, pack=True, pack_length=256), data)
    out["padded_trained_tokens_per_s"] = padded
    out["packed_trained_tokens_per_s"] = packed
    out["packed_over_padded"] = packed / padded

    # 4. Attention on CPU: 'auto' (blocked, skipping masked blocks) vs the dense [T, T] pass.
    rows, length, steps = (16, 384, 3) if quick else (32, 384, 8)
    model_cfg = RunConfig().model
    block = resolve_attention_block(0, model_cfg.head_dim)
    if dense_attention_pays(rows, model_cfg.num_heads, length, block):
        raise SystemExit(f"'auto' runs the dense attention at {rows} x {length} on this backend: "
                         "nothing to compare")
    demos = []
    for _ in range(steps + 1):
        batch = []
        for _ in range(rows):  # (token ids, loss mask): the loss on the second half
            n = int(rng.integers(length // 2, length))
            batch.append((rng.integers(0, 256, n).astype(np.int32),
                          (np.arange(n) >= n // 2).astype(np.float32)))
        demos.append(batch)
    step_s = {}
    for attention in ("auto", "dense"):
        sft = SFTTrainer(Transformer(model_cfg), TrainerConfig(
            learning_rate=1e-3, micro_batch_size=rows, max_seq_len=length, pack=True,
            pack_length=length, attention=attention))
        float(sft.step(demos[0]).loss)  # compile
        t0 = time.perf_counter()
        for batch in demos[1:]:
            float(sft.step(batch).loss)
        step_s[attention] = (time.perf_counter() - t0) / steps
    out["sft_auto_step_ms"] = 1e3 * step_s["auto"]
    out["sft_dense_step_ms"] = 1e3 * step_s["dense"]
    out["attention_blocked_over_dense"] = step_s["dense"] / step_s["auto"]

    out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}
    if not quick:
        path = Path(__file__).parent / "results" / "train.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
