"""One process of a multi-process trainer test (tests/train/test_multiprocess.py runs it).

    python tests/train/multiprocess_worker.py MODE OUT_DIR [--coordinator 127.0.0.1:PORT
        --num-processes 2 --process-id I] [--checkpoint DIR]

MODE: `train` (one RL step, a checkpoint of it to --checkpoint, one SFT step) or `restore`
(restore the checkpoint, then one RL step); `train` also exports the RL policy as Hugging Face
safetensors to OUT_DIR/hf. Every process takes its share of the same
global batch; each writes OUT_DIR/process_<I>.npz with the loss, gradient norm, the updated
parameters and the optimizer state (Adam's first moment after one update is (1 - b1) x the
gradient), all read back to the host. XLA_FLAGS sets the devices per process; the mesh is
data=2 x fsdp=2 x tensor=2 over all 8 devices either way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def _flat(tree, prefix: str) -> dict[str, np.ndarray]:
    import jax

    from agentax.train._distributed import to_host
    leaves = jax.tree_util.tree_flatten_with_path(to_host(tree))[0]
    return {prefix + jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("train", "restore"))
    ap.add_argument("out")
    ap.add_argument("--coordinator")
    ap.add_argument("--num-processes", type=int)
    ap.add_argument("--process-id", type=int)
    ap.add_argument("--checkpoint", required=True)
    args = ap.parse_args()

    from agentax.train import initialize_distributed
    initialize_distributed(args.coordinator, args.num_processes, args.process_id)

    import jax

    from agentax.train import RLTrainer, SFTTrainer, local_share, make_mesh
    from conftest import base_config, make_groups, make_model

    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    out: dict[str, np.ndarray] = {}
    trainer = RLTrainer(make_model(0), base_config(kl_coef=0.05), mesh=mesh)
    if args.mode == "restore":
        out["restored_step"] = np.asarray(trainer.restore_checkpoint(args.checkpoint))
        out.update(_flat(trainer._params, "restored_params"))
        out.update(_flat(trainer._opt_state, "restored_opt"))
    groups = make_groups(seed=1 + trainer.step_count, num_groups=4, group_size=4)
    share = local_share(groups)
    metrics = trainer.step(share)
    out["rl_local_groups"] = np.asarray(len(share))
    out["rl_loss"] = np.asarray(metrics.loss)
    out["rl_grad_norm"] = np.asarray(metrics.grad_norm)
    out["rl_num_tokens"] = np.asarray(metrics.num_tokens)
    out["rl_advantage_abs_mean"] = np.asarray(metrics.advantage_abs_mean)
    out["rl_step_count"] = np.asarray(trainer.step_count)
    out["rl_data_position"] = np.asarray(trainer.data_position)
    out.update(_flat(trainer._params, "rl_params"))
    out.update(_flat(trainer._opt_state, "rl_opt"))
    if args.mode == "train":
        trainer.save_checkpoint(args.checkpoint)
        trainer.export_pretrained(Path(args.out) / "hf")  # every process calls; process 0 writes
        sft = SFTTrainer(make_model(0), base_config(), mesh=mesh)
        rng = np.random.default_rng(3)
        examples = []
        for _ in range(12):
            n = int(rng.integers(8, 30))
            ids = rng.integers(0, 256, n).astype(np.int32)
            mask = (np.arange(n) >= int(rng.integers(2, 6))).astype(np.float32)
            examples.append((ids, mask))
        batch = sft.take(examples, batch_size=8)  # this process's share
        sft_metrics = sft.step(batch).to_dict()
        out["sft_local_examples"] = np.asarray(len(batch))
        for k in ("loss", "grad_norm", "accuracy"):
            out[f"sft_{k}"] = np.asarray(sft_metrics[k])
        out["sft_data_position"] = np.asarray(sft.data_position)
        out.update(_flat(sft._params, "sft_params"))
        out.update(_flat(sft._opt_state, "sft_opt"))
    out["process_count"] = np.asarray(jax.process_count())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    np.savez(Path(args.out) / f"process_{jax.process_index()}.npz", **out)


if __name__ == "__main__":
    main()
