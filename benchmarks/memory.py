"""Trainer memory at real shapes, read off XLA without allocating the model.

`agentax.train.update_memory` lowers the trainer's own jitted kernels (`accumulate_grads`,
`apply_update`) on abstract arrays (`jax.ShapeDtypeStruct`) for real configurations built
from their Hugging Face `config.json` fields and reads XLA's `memory_analysis()`: per device,
arguments + outputs + temporaries - aliased bytes, the whole update (gradient, accumulation
and the Adam step) with float32 master weights and moments and bf16 compute. Meshes use fake
CPU devices (`--xla_force_host_platform_device_count=8`, set below before JAX is imported).

Figures (JSON keys):

* train_peak_gb_qwen3_0_6b_t32k — Qwen3-0.6B, 1 device, 1 x 32,768 tokens. Goal <= 24.
* train_peak_gb_qwen3_8b_t32k_fsdp8 — Qwen3-8B, 8 devices (fsdp), 8 rows x 32,768 tokens,
  per device. Goal <= 64.
* train_activation_growth_t8k_to_t32k — Qwen3-0.6B, the gradient kernel's peak less the
  state (activations, fresh gradients, LM-head chunks) at 32k over 8k: linear is 4,
  quadratic 16. Goal <= 4.5. (The whole update's peak less the state is no measure of it:
  at 8k the optimizer kernel's peak, which does not depend on tokens, is the larger.)
* train_compile_s_qwen3_8b — lowering + compiling the 36-layer step (both kernels, fsdp8).
  Goal <= 60.
* rss_over_predicted — a real RL step executed on the CPU at real width (Qwen3-0.6B dims,
  real vocabulary, 2 layers, 1 row x 4,096 tokens, half of them loss positions; float32
  compute, the CPU has no fast bf16; remat full and scanned layers, as real models resolve
  `remat: auto` and `scan_layers: auto`): the process's peak RSS growth from before the trainer
  is built to the end of the step, over the analysis' peak for the same step. Goal <= 1.3.
  Run in a child process (compiles are done first and their memory returned to the OS).
* recipe_<name> (full run) — each shipped real-checkpoint recipe's budget with trainer and
  engine on one device: the update at its micro-batch, the engine's weights and KV cache.
* also: Llama-3.1-8B and Gemma-3-4B (fsdp8, 8 x 32k) peaks, the 0.6B peak at 8k,
  and, in the full run, "today's code path" before this work (`_before` keys: no remat,
  layers unrolled, dense [T, T] attention, full [B, T, V] logits, bf16 master state) at
  2k and 8k tokens beside the same shapes now.

`python benchmarks/memory.py --quick` (the 0.6B figures only, rss at 1 x 512 tokens;
< 60 s) or the full run (writes benchmarks/results/memory.json). The last line printed is
one JSON object.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import ctypes  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_8B = {**QWEN3_0_6B, "hidden_size": 4096, "intermediate_size": 12288,
            "max_window_layers": 36, "num_attention_heads": 32, "num_hidden_layers": 36,
            "tie_word_embeddings": False}
LLAMA3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}
GEMMA3_4B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": [1, 106],
    "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 10240,
    "max_position_embeddings": 131072, "model_type": "gemma3_text", "num_attention_heads": 8,
    "num_hidden_layers": 34, "num_key_value_heads": 4, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_theta": 1000000.0,
    "sliding_window": 1024, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262208,
}
GB = 1e9


def trainer_config(seq_len: int, rows: int = 1, **knobs):
    from agentax.train import TrainerConfig
    # attention_block 512: the block `auto` takes on an accelerator (this host is a CPU, whose
    # automatic block is smaller), so the analysis is of the accelerator's kernels.
    knobs = {"compute_dtype": "bfloat16", "attention_block": 512, **knobs}
    return TrainerConfig(max_seq_len=seq_len, min_seq_bucket=min(64, seq_len),
                         micro_batch_size=rows, **knobs)


BEFORE = dict(remat="none", scan_layers=False, attention="dense", logits_chunk=0,
              master_dtype="bfloat16")
"""Today's code path before this work, as far as the knobs express it."""


def measure(hf: dict, seq_len: int, *, rows: int = 1, fsdp: int = 0, **knobs):
    from agentax.models import config_from_hf
    from agentax.train import make_mesh
    from agentax.train import update_memory
    mesh = make_mesh(fsdp=fsdp) if fsdp else None
    return update_memory(config_from_hf(hf), trainer_config(seq_len, rows, **knobs),
                         rows=rows, seq_len=seq_len, mesh=mesh)


REAL_RECIPES = {"math_tool_qwen3_0_6b": "qwen3-0.6b", "gsm8k_qwen2_5_0_5b": "qwen2.5-0.5b",
                "gsm8k_llama3_2_1b": "llama3.2-1b"}
"""The shipped real-checkpoint recipes and the preset of the checkpoint each names."""


def recipe_budget(name: str, preset: str) -> dict:
    """The device memory a real-checkpoint recipe needs with trainer and engine on one device:
    the update at its trainer's longest micro-batch (this analysis), the engine's weights in
    the model's dtype and its KV cache (`page_pool_bytes` of the engine's pages)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from agentax.run._config import load_config
    from agentax.models import ModelConfig, Transformer, page_pool_bytes
    from agentax.recipes import recipe_path
    from agentax.train import update_memory
    cfg = load_config(recipe_path(name))
    model = ModelConfig.preset(preset)
    t = cfg.trainer  # at the block an accelerator's automatic choice takes, as trainer_config
    t = dataclasses.replace(t, attention_block=t.attention_block or 512)
    update = update_memory(model, t, rows=t.micro_batch_size, seq_len=t.max_seq_len)
    e = cfg.engine
    kv = page_pool_bytes(model, e.kv_pages, e.cache_dtype)
    shapes = nnx.state(nnx.eval_shape(lambda: Transformer(model)))
    weights = sum(int(x.size) * jnp.dtype(model.dtype).itemsize for x in jax.tree.leaves(shapes))
    return {"trainer_peak_gb": round(update.peak_bytes / GB, 2),
            "trainer_state_gb": round(update.state_bytes / GB, 2),
            "engine_weights_gb": round(weights / GB, 2), "kv_cache_gb": round(kv / GB, 2),
            "total_gb": round((update.peak_bytes + weights + kv) / GB, 2),
            "micro_batch": f"{t.micro_batch_size} x {t.max_seq_len}",
            "kv_cache": f"{e.max_slots} slots x {e.max_seq_len}"}


def _rss_bytes() -> tuple[int, int]:
    """(current, peak) resident set of this process."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        fields[key] = rest.strip()
    return (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)


def _trim_and_reset_peak() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap back to the OS
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def rss_child(seq_len: int) -> dict:
    """A real RL step at real width in this process: RSS growth against the analysis."""
    import numpy as np

    from agentax.models import Transformer, config_from_hf
    from agentax.records import Group, Trajectory, TrajectoryStatus
    from agentax.train import RLTrainer
    from agentax.train import update_memory

    cfg = dataclasses.replace(config_from_hf(QWEN3_0_6B), num_layers=2, dtype="float32",
                              param_dtype="float32")
    # remat and scan pinned to what real models at real lengths resolve to ('auto' would run
    # this 2-layer model unrolled, keeping every activation).
    tc = trainer_config(seq_len, compute_dtype="float32", advantage="reinforce_pp",
                        remat="full", scan_layers=True)
    predicted = update_memory(cfg, tc, rows=1, seq_len=seq_len)
    rng = np.random.default_rng(0)
    n = seq_len + 1
    mask = np.zeros(n, np.int8)
    for start in range(n // 8, n, n // 4):  # four turns: half of the positions are trained
        mask[start:start + n // 8] = 1
    traj = Trajectory(task_id="t", token_ids=rng.integers(0, cfg.vocab_size, n).astype(np.int32),
                      loss_mask=mask, logprobs=np.where(mask > 0, -3.0, 0.0).astype(np.float32),
                      versions=np.where(mask > 0, 0, -1).astype(np.int32), reward=1.0,
                      status=TrajectoryStatus.OK, sample_index=0)
    group = Group(group_id="g", task_id="t", trajectories=(traj,))
    model = Transformer(cfg)
    # Compile first (the memory of compiling is not the step's), then free the trainer's
    # state: the measured growth is its state coming back (load_weights) and the step.
    trainer = RLTrainer(model, tc)
    trainer.precompile([group])
    trainer.release()
    _trim_and_reset_peak()
    before, _ = _rss_bytes()
    trainer.load_weights(model)
    t0 = time.perf_counter()
    metrics = trainer.step([group])
    step_s = time.perf_counter() - t0
    _, peak = _rss_bytes()
    return {"rss_growth_gb": (peak - before) / GB, "predicted_peak_gb": predicted.peak_bytes / GB,
            "predicted_state_gb": predicted.state_bytes / GB,
            "rss_over_predicted": (peak - before) / predicted.peak_bytes,
            "trained_tokens": int(metrics.num_tokens), "step_s": step_s,
            "kernels": trainer.num_compiles}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the 0.6B figures only (< 60 s)")
    ap.add_argument("--rss-child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        print(json.dumps(rss_child(args.rss_child)))
        return
    t_start = time.perf_counter()
    out: dict = {"quick": args.quick}
    # The real step runs in a child process beside the analyses (its RSS is its own).
    rss_len = 512 if args.quick else 4096
    child = subprocess.Popen([sys.executable, __file__, "--rss-child", str(rss_len)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def record(key, mem):
        out[key] = round(mem.peak_bytes / GB, 3)
        out[key.replace("train_peak_gb", "detail")] = {
            k: round(v, 3) for k, v in mem.summary().items()}
        print(f"{key}: {out[key]:.2f} GB (state {mem.state_bytes / GB:.2f}, activations "
              f"{mem.activation_bytes / GB:.2f}; compiled in {mem.compile_s:.1f} s)", flush=True)
        return mem

    m8 = record("train_peak_gb_qwen3_0_6b_t8k", measure(QWEN3_0_6B, 8192))
    m32 = record("train_peak_gb_qwen3_0_6b_t32k", measure(QWEN3_0_6B, 32768))
    out["train_activation_growth_t8k_to_t32k"] = round(m32.activation_bytes / m8.activation_bytes, 3)
    if not args.quick:
        big = record("train_peak_gb_qwen3_8b_t32k_fsdp8",
                     measure(QWEN3_8B, 32768, rows=8, fsdp=8))
        out["train_compile_s_qwen3_8b"] = round(big.compile_s, 1)
        record("train_peak_gb_llama3_1_8b_t32k_fsdp8", measure(LLAMA3_1_8B, 32768, rows=8, fsdp=8))
        record("train_peak_gb_gemma3_4b_t32k_fsdp8", measure(GEMMA3_4B, 32768, rows=8, fsdp=8))
        for recipe, preset in REAL_RECIPES.items():
            out[f"recipe_{recipe}"] = recipe_budget(recipe, preset)
            print(f"recipe {recipe}: {out[f'recipe_{recipe}']}", flush=True)
        for t, name in ((2048, "t2k"), (8192, "t8k")):
            if t != 8192:
                record(f"train_peak_gb_qwen3_0_6b_{name}", measure(QWEN3_0_6B, t))
            record(f"train_peak_gb_qwen3_0_6b_{name}_before", measure(QWEN3_0_6B, t, **BEFORE))
    stdout, stderr = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"the RSS child failed:\n{stderr[-4000:]}")
    rss = json.loads(stdout.strip().splitlines()[-1])
    out["rss_over_predicted"] = round(rss.pop("rss_over_predicted"), 3)
    out["rss_detail"] = {"tokens": rss_len, **{k: round(v, 3) if isinstance(v, float) else v
                                               for k, v in rss.items()}}
    print(f"rss_over_predicted: {out['rss_over_predicted']:.3f} ({rss})", flush=True)
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    if not args.quick:
        path = Path(__file__).parent / "results" / "memory.json"
        path.write_text(json.dumps(out, indent=1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
