"""RL across a Ray cluster: the trainer in this driver, engine replicas and environments in actors.

What runs where (docs/scaling.md, "A Ray cluster"):

* this process (the Ray job's driver, on a node with the trainer's accelerators): the model's
  master weights, `RLTrainer`, the `Pipeline` and its collector (an asyncio loop: cheap);
* `--replicas` `RayEngineReplica` actors (`--gpus-per-replica` each): one `Engine` each,
  behind an `EngineRouter`, which publishes every new version to all of them at once (one
  shared object-store transfer, in the background) and drops a replica that hangs or dies;
* `--env-workers` `RayEnvPool` actors: the environments (here `SleepyEnv`, a stand-in for a
  sandbox whose steps take `--env-step-s`).

Run it on a cluster (`ray start --head` on one node, `ray start --address=HEAD:6379` on the
others, then `python examples/ray_cluster.py --address auto`), or on one machine with a local
Ray (`--address local`, the default; the tiny byte model on CPU, which is what the test runs).

This is the library route, for a job that needs its own driver script. `agentax train` builds
the same layout from its config's `scale` section (`agentax train RECIPE scale.ray=auto
scale.engine_replicas=4 scale.env_workers=64`; examples/kuberay_rayjob.yaml does that in a
KubeRay RayJob): see docs/scaling.md, "The scale section".
"""

from __future__ import annotations

import argparse
import functools
import os

from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.scale import EngineRouter, RayEngineReplica, RayEnvPool, WeightSyncConfig, connect_ray
from agentax.scale.testing import SleepyEnv
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, TrainerConfig

MODEL = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                         num_kv_heads=1, head_dim=32)
TOKENIZER = ByteTokenizer()


def build_engine() -> Engine:
    """Runs in each replica actor, on its own devices. The weights are replaced by the first
    publication; a real job loads a checkpoint here instead of a random init."""
    return Engine(Transformer(MODEL, rngs=nnx.Rngs(0)),
                  EngineConfig(max_slots=16, max_seq_len=128, prefill_chunk=64),
                  eos_token_ids=TOKENIZER.eos_token_ids, tokenizer=TOKENIZER)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="local",
                    help="'auto' joins the cluster this node belongs to; 'local' starts one here")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--gpus-per-replica", type=float, default=0.0)
    ap.add_argument("--env-workers", type=int, default=4)
    ap.add_argument("--env-step-s", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()

    import ray  # noqa: PLC0415 - the `ray` extra

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.address == "local":
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    else:
        connect_ray(args.address)  # ray.init, with the cluster's token authentication
    ray.cloudpickle.register_pickle_by_value(__import__(__name__))  # the actors need build_engine

    model = Transformer(MODEL, rngs=nnx.Rngs(0))
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=4, max_seq_len=128))
    replicas = [RayEngineReplica(build_engine, num_cpus=0.25, num_gpus=args.gpus_per_replica)
                for _ in range(args.replicas)]
    router = EngineRouter(replicas, weight_sync=WeightSyncConfig())
    pool = RayEnvPool(functools.partial(SleepyEnv, num_steps=2, step_latency_s=args.env_step_s),
                      args.env_workers, num_cpus=0.25)
    try:
        router.update_weights(trainer.params_for_engine(), 0)  # the replicas start from ours
        collector = Collector(router, TOKENIZER, pool.factory, lambda: ModelAgent(system_prompt=None),
                              SamplingParams(temperature=1.0, max_tokens=8),
                              CollectorConfig(max_turns=2, max_episode_tokens=120))
        tasks = [Task(id=f"t{i}", prompt=f"Say {w}.") for i, w in enumerate(["hi", "yes", "abc", "ok"])]
        config = PipelineConfig(group_size=2, groups_per_step=2, max_concurrency=8, filters=(),
                                mode="async", max_staleness=1)
        pipeline = Pipeline(collector, trainer, router, tasks, config)
        result = pipeline.run(args.steps)
        router.wait_published(120)
        stats = router.stats()
        print(f"steps={len(result.steps)} accounting={result.accounting} "
              f"policy_version={stats.policy_version} routed={stats.routed} down={stats.down} "
              f"publications={stats.weight_sync.publications} "
              f"superseded={stats.weight_sync.superseded} reruns={stats.reruns}")
    finally:
        pool.shutdown()
        router.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
