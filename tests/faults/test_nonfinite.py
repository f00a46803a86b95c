"""A NaN loss stops `agentax train` before anything after it is checkpointed or exported."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from agentax.cli import RunConfig
from agentax.models import Transformer, save_pretrained
from tests.faults.fault_helpers import TINY, checkpoint_dirs, error_lines, rl_steps, run


def test_nan_weights_stop_the_run_with_one_line_and_no_checkpoint(tmp_path):
    model = Transformer(RunConfig().model, rngs=nnx.Rngs(0))
    weight = model.final_norm.weight
    weight.value = jnp.full_like(weight.value, jnp.nan)  # every logit is NaN, so is the loss
    save_pretrained(model, tmp_path / "nan_model")
    result = run(["train", *TINY, f"run.runs_dir={tmp_path}", "run.name=n", "run.steps=3",
                  "run.checkpoint_every=1", f"init.model_path={tmp_path / 'nan_model'}",
                  "init.tokenizer=byte"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    last = error_lines(result.stderr)[-1]
    assert last.startswith("agentax train: error: RL step 1:") and "on_nonfinite" in last
    assert rl_steps(tmp_path / "n") == []
    assert [d for d in checkpoint_dirs(tmp_path / "n") if d.startswith("step_")] == []
