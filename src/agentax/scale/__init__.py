"""agentax.scale: scale out past one process — remote environment pools and engine replicas.

* `RayEnvPool(env_factory, size, num_cpus=...)`: environments in Ray actors; `pool.factory`
  is an `env_factory` whose `Environment`s proxy to leased, warm, reused actors (a dead or
  hung actor ends its episode as `EnvError` and is replaced).
* `EngineRouter(replicas)`: several engines behind one engine API, conversation-affine
  routing, least-loaded placement of new conversations, one version published to all;
  `EngineRouter.on_devices(model, make_engine, n)` builds replicas on disjoint local devices.
* `RayEngineReplica(make_engine, num_gpus=...)`: an engine in a Ray actor, for a router.
  Over Ray replicas the router publishes weights with one shared, chunked, parallel,
  background transfer (`WeightSyncConfig`), and drops replicas that hang or die (their
  requests re-run elsewhere, counted); with none left the run stops with `RunFailed`.

Ray is optional (`pip install 'agentax[ray]'`) and imported only when a Ray piece is built.
`connect_ray(address)` joins a running cluster with its token authentication handled.
See docs/scaling.md.
"""

from agentax.scale._env_pool import RayEnvPool, RayEnvPoolStats, RemoteEnvironment
from agentax.scale._ray import connect_ray
from agentax.scale._replica import RayEngineReplica
from agentax.scale._router import EngineRouter, RouterStats
from agentax.scale._weight_sync import WeightSyncConfig, WeightSyncStats

__all__ = [
    "EngineRouter",
    "RayEngineReplica",
    "RayEnvPool",
    "RayEnvPoolStats",
    "RemoteEnvironment",
    "RouterStats",
    "WeightSyncConfig",
    "WeightSyncStats",
    "connect_ray",
]
