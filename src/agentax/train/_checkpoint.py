"""Orbax checkpoints of a trainer: params, optimizer state, RNG, step, data position, version.

Layout: `DIR/step_<N>/state` (an Orbax StandardCheckpointer pytree) and
`DIR/step_<N>/meta.json` (counters, the model config and the LoRA setup). Restoring checks the
metadata first, so a checkpoint from a different model fails with a message naming the
mismatched fields instead of an opaque shape error; arrays are restored onto the shardings of
the live trainer (so a checkpoint written on 8 devices restores on 1 and vice versa).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import orbax.checkpoint as ocp

__all__ = ["save_trainer_checkpoint", "restore_trainer_checkpoint", "latest_checkpoint_step"]

_STEP_DIR = re.compile(r"^step_(\d+)$")


def latest_checkpoint_step(directory) -> int | None:
    """The largest N with a complete DIR/step_N checkpoint, or None."""
    d = Path(directory)
    if not d.is_dir():
        return None
    steps = [int(m.group(1)) for p in d.iterdir() if (m := _STEP_DIR.match(p.name))
             and (p / "meta.json").exists()]
    return max(steps) if steps else None


def save_trainer_checkpoint(trainer, directory, step: int) -> Path:
    path = Path(directory).absolute() / f"step_{int(step)}"
    path.mkdir(parents=True, exist_ok=True)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path / "state", trainer._checkpoint_state(), force=True)
    ckptr.wait_until_finished()
    ckptr.close()
    # meta.json last: its presence marks the checkpoint complete.
    (path / "meta.json").write_text(json.dumps(trainer._checkpoint_meta(), indent=1))
    return path


def _diff(saved: dict, live: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(saved) | set(live)):
        a, b = saved.get(k), live.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: checkpoint={a!r} trainer={b!r}")
    return out


def restore_trainer_checkpoint(trainer, directory, step: int | None = None) -> int:
    d = Path(directory).absolute()
    if step is None:
        step = latest_checkpoint_step(d)
        if step is None:
            raise FileNotFoundError(f"no checkpoint (step_N/meta.json) under {d}")
    path = d / f"step_{int(step)}"
    if not (path / "meta.json").exists():
        raise FileNotFoundError(f"no checkpoint at {path} (missing meta.json)")
    meta = json.loads((path / "meta.json").read_text())
    live = trainer._checkpoint_meta()
    problems = _diff({k: meta.get(k) for k in ("kind", "model_config", "lora")},
                     {k: live[k] for k in ("kind", "model_config", "lora")})
    if problems:
        raise ValueError(f"checkpoint {path} does not fit this trainer: "
                         + "; ".join(problems[:6])
                         + " — build the trainer with the model/LoRA config it was saved from")
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, trainer._checkpoint_state())
    ckptr = ocp.StandardCheckpointer()
    try:
        state = ckptr.restore(path / "state", target)
    except (ValueError, KeyError) as e:
        raise ValueError(f"checkpoint {path} has a different parameter/optimizer tree than this "
                         f"trainer ({e}); build the trainer with the same config it was saved "
                         "from") from e
    finally:
        ckptr.close()
    trainer._load_checkpoint(state, meta)
    return int(step)
