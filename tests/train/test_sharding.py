"""Mesh and partition rules; the same train step on 1 and on 8 (fake CPU) devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

from agentax.train import RLTrainer, make_mesh
from tests.train.conftest import base_config, make_groups, make_model
from tests.compile_flags import fast_compile_xla_flags

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, jax
    from jax.sharding import PartitionSpec as P
    from agentax.train import RLTrainer, make_mesh
    from agentax.train._sharding import partition_spec_for
    from tests.train.conftest import base_config, make_groups, make_model
    assert jax.device_count() == 8, jax.devices()
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    out = {"specs": {
        "q": str(partition_spec_for("layers/0/attn/q_proj/kernel", (32, 32), mesh)),
        "o": str(partition_spec_for("layers/0/attn/o_proj/kernel", (32, 32), mesh)),
        "odd": str(partition_spec_for("layers/0/attn/k_proj/kernel", (32, 3), mesh)),
        "norm": str(partition_spec_for("final_norm/weight", (32,), mesh)),
    }}
    groups = [make_groups(seed=40 + i) for i in range(2)]
    trainer = RLTrainer(make_model(0), base_config(), mesh=mesh)
    out["eight"] = [(s.loss, s.grad_norm, s.entropy) for s in map(trainer.step, groups)]
    kernel = trainer._params["model"]["layers"][0]["attn"]["q_proj"]["kernel"].value
    out["q_spec"] = str(kernel.sharding.spec)
    out["devices"] = len(kernel.sharding.device_set)
    out["acc_spec"] = str(trainer._acc["grads"]["model"]["layers"][0]["attn"]["q_proj"]
                          ["kernel"].value.sharding.spec)
    from agentax.train._step import accumulate_grads, apply_update
    out["jit_cache"] = [accumulate_grads._cache_size(), apply_update._cache_size()]
    print("RESULT " + json.dumps(out))
""")


def test_make_mesh_needs_the_devices():
    mesh = make_mesh()
    assert mesh.axis_names == ("data", "fsdp", "tensor") and mesh.size == 1
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        make_mesh(data=2, fsdp=2, tensor=64)


def test_same_losses_on_one_and_eight_devices():
    # 1 device here (the kernels are shared with the other tests), 8 in a subprocess.
    trainer = RLTrainer(make_model(0), base_config())
    one = [(s.loss, s.grad_norm, s.entropy)
           for s in map(trainer.step, [make_groups(seed=40 + i) for i in range(2)])]
    env = dict(os.environ, XLA_FLAGS=fast_compile_xla_flags("--xla_force_host_platform_device_count=8"),
               JAX_PLATFORMS="cpu", PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    assert out["specs"] == {"q": str(P("fsdp", "tensor")), "o": str(P("tensor", "fsdp")),
                            "odd": str(P("fsdp")), "norm": str(P())}
    assert out["q_spec"] == str(P("fsdp", "tensor")) and out["devices"] == 8
    assert out["acc_spec"] == out["q_spec"]  # gradients stay sharded like their params
    assert out["jit_cache"] == [1, 1]  # two steps, one compilation each (fresh process)
    for (l1, g1, e1), (l8, g8, e8) in zip(one, out["eight"]):
        assert l8 == pytest.approx(l1, abs=1e-5)
        assert g8 == pytest.approx(g1, rel=1e-4)
        assert e8 == pytest.approx(e1, rel=1e-4)
