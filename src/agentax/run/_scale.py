"""The `scale` section of a run: engines and environments in Ray actors, from the config.

Off by default (`scale.ray: ""`): one engine beside the trainer and the environments in the
trainer's process, as always. With `scale.ray` set, `agentax train` joins (or starts) a Ray
cluster and places `scale.engine_replicas` engines as `RayEngineReplica` actors behind an
`EngineRouter` and the environments in a `RayEnvPool` of `scale.env_workers` actors; the
trainer stays in this process (the job's driver). `engine_replicas: 0` keeps the engine in
this process, colocated with the trainer (publishing is a device copy). See docs/scaling.md,
"The scale section".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from agentax.config import ConfigError, frozen as _frozen

__all__ = ["RayLayout", "ScaleConfig"]

_ADDRESS = re.compile(r"(ray://)?[\w.\-]+:\d+")


@_frozen
class ScaleConfig:
    """Where engines and environments run: this process (default) or Ray actors."""

    ray: str = ""
    """Ray cluster: '' = no Ray (engine and environments in this process); 'local' = start one
    on this machine for the run; 'auto' = join the cluster this node belongs to (`ray start`,
    a KubeRay pod); 'HOST:6379' or 'ray://HOST:10001' = join that one. Token authentication
    is set up from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token."""
    engine_replicas: int = 0
    """Engines as RayEngineReplica actors behind an EngineRouter (needs scale.ray); 0 = one
    engine in this process, colocated with the trainer."""
    gpus_per_replica: float = 0.0
    """GPUs Ray reserves for each engine replica (fractions allowed)."""
    cpus_per_replica: float = 1.0
    """CPUs Ray reserves for each engine replica."""
    replica_resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Custom Ray resources per engine replica (e.g. {TPU: 4}, or a node label {engines: 1})."""
    env_workers: int = 0
    """Environments as actors of a RayEnvPool of this size, the most remote episodes at once
    (needs scale.ray); 0 = environments in this process."""
    env_cpus: float = 1.0
    """CPUs Ray reserves for each environment actor."""
    env_resources: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Custom Ray resources per environment actor (e.g. {sandbox: 1})."""
    check_feasible: bool = True
    """Refuse at start a request the live nodes cannot place (one actor on no node, or all
    of them on the whole cluster), naming the resource; false on an autoscaling cluster,
    whose nodes come later."""
    start_timeout_s: float = 600.0
    """Limit on the actors' start: building every environment, and each replica's engine
    with the first weights."""

    def __post_init__(self) -> None:
        ray = self.ray
        if ray not in ("", "local", "auto") and not _ADDRESS.fullmatch(ray):
            raise ConfigError(
                f"scale.ray={ray!r}: give '' (no Ray), 'local' (a cluster on this machine), "
                "'auto' (the cluster this node belongs to) or an address ('HOST:6379', "
                "'ray://HOST:10001')")
        for name in ("gpus_per_replica", "cpus_per_replica", "env_cpus"):
            if getattr(self, name) < 0:
                raise ConfigError(f"scale.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("replica_resources", "env_resources"):
            for key, amount in dict(getattr(self, name)).items():
                if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
                    raise ConfigError(f"scale.{name}.{key}={amount!r}: a resource amount is a "
                                      "number > 0 (e.g. {sandbox: 1})")
        used = [f"scale.{n}={getattr(self, n)}" for n in ("engine_replicas", "env_workers")
                if getattr(self, n)]
        if used and not ray:
            raise ConfigError(f"{' and '.join(used)} needs Ray, but scale.ray is "
                              "empty: set scale.ray=local (a cluster on this machine), "
                              "scale.ray=auto (join this node's cluster) or an address")
        if ray and not used:
            raise ConfigError(f"scale.ray={ray!r} but nothing runs in Ray: set "
                              "scale.engine_replicas=N and/or scale.env_workers=N, or "
                              "scale.ray='' to run in this process")

    @property
    def enabled(self) -> bool:
        return bool(self.ray)


class _EnvFromConfig:
    """The run's environment factory in a form that pickles to an actor: it imports
    run.imports there, resolves env.factory and calls it with env.kwargs."""

    def __init__(self, path: str, kwargs: Mapping[str, Any], imports: tuple[str, ...]):
        self.path, self.kwargs, self.imports = path, dict(kwargs), tuple(imports)
        self._fn: Callable[..., Any] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fn": None}

    def __call__(self) -> Any:
        if self._fn is None:
            from agentax.run._imports import import_modules, resolve_callable

            import_modules(self.imports)
            self._fn = resolve_callable(self.path, field="env.factory")
        return self._fn(**self.kwargs)


class _EngineFromConfig:
    """Builds the run's engine inside a replica actor: the config's tokenizer and architecture
    (randomly initialised: the first publication replaces the weights, so no checkpoint needs
    to be on the replica's node)."""

    def __init__(self, cfg: Any):
        self.cfg = cfg

    def __call__(self) -> Any:
        import os

        from flax import nnx

        from agentax.engine import enable_compilation_cache
        from agentax.models import Transformer
        from agentax.run._build import build_engine, build_tokenizer
        from agentax.run._imports import import_modules

        cfg = self.cfg
        import_modules(cfg.run.imports)
        cache_dir = os.environ.get("AGENTAX_COMPILATION_CACHE", "~/.cache/agentax/jax")
        if cache_dir:
            enable_compilation_cache(cache_dir)
        tokenizer = build_tokenizer(cfg)
        return build_engine(cfg, Transformer(cfg.model, rngs=nnx.Rngs(cfg.run.seed)), tokenizer)


def _needs(demands: list[tuple[str, int, dict[str, float]]]) -> dict[str, float]:
    need: dict[str, float] = {}
    for _, count, per_actor in demands:
        for key, amount in per_actor.items():
            need[key] = need.get(key, 0.0) + count * amount
    return need


def _check_totals(ray: Any, demands: list[tuple[str, int, dict[str, float]]]) -> None:
    """All actors at once must fit the cluster's total resources (each one alone fitting a
    node is checked by RayEnvPool / RayEngineReplica), else they would wait unplaced."""
    total = {str(k): float(v) for k, v in ray.cluster_resources().items()}
    for key, amount in _needs(demands).items():
        if amount > total.get(key, 0.0) + 1e-9:
            parts = ", ".join(f"{field} x {count} = {count * per[key]:g}"
                              for field, count, per in demands if per.get(key))
            raise ConfigError(
                f"the scale section asks Ray for {key}={amount:g} in all ({parts}), but the "
                f"cluster has {total.get(key, 0.0):g}: lower the request, add nodes, or set "
                "scale.check_feasible=false on an autoscaling cluster")


class RayLayout:
    """The Ray pieces of one run: the connection, the environment pool, the engine router.

    Built at the start of `train` (so a request that cannot be placed fails before the model
    is built), its actors start while the run loads and warms up; `engine()` publishes the
    trainer's weights to the replicas; `shutdown()` ends every actor and, if this run
    connected to Ray, the connection."""

    def __init__(self, cfg: Any):
        from agentax.scale import EngineRouter, RayEngineReplica, RayEnvPool, connect_ray

        s: ScaleConfig = cfg.scale
        self.scale, self.pool, self.router = s, None, None
        self._replicas: list[Any] = []  # until the router holds them
        # Resources that other work holds now, {name: (asked, free)}: the actors wait for them.
        self.busy: dict[str, tuple[float, float]] = {}
        try:
            import ray
        except ImportError as e:
            raise ImportError(f"scale.ray={s.ray!r} needs Ray: pip install 'agentax[ray]' "
                              f"(import failed: {e})") from e

        self._ray = ray
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            if s.ray == "local":
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                connect_ray(s.ray, log_to_driver=False)
        try:
            replica = {"CPU": s.cpus_per_replica, "GPU": s.gpus_per_replica,
                       **dict(s.replica_resources)}
            env = {"CPU": s.env_cpus, **dict(s.env_resources)}
            demands = [("scale.engine_replicas", s.engine_replicas, replica),
                       ("scale.env_workers", s.env_workers, env)]
            if s.check_feasible:
                _check_totals(ray, demands)
            free = ray.available_resources()
            self.busy = {k: (v, float(free.get(k, 0.0))) for k, v in _needs(demands).items()
                         if v > float(free.get(k, 0.0)) + 1e-9}
            try:
                if s.env_workers:
                    self.pool = RayEnvPool(
                        _EnvFromConfig(cfg.env.factory, cfg.env.kwargs, cfg.run.imports),
                        s.env_workers, num_cpus=s.env_cpus, resources=dict(s.env_resources),
                        start_timeout_s=s.start_timeout_s, check_feasible=s.check_feasible)
                if s.engine_replicas:
                    make = _EngineFromConfig(cfg)
                    for i in range(s.engine_replicas):
                        self._replicas.append(RayEngineReplica(
                            make, num_cpus=s.cpus_per_replica, num_gpus=s.gpus_per_replica,
                            resources=dict(s.replica_resources),
                            check_feasible=s.check_feasible,
                            # A name operators can find (`ray list actors`, ray.get_actor)
                            # in the job's own namespace.
                            actor_options={"name": f"agentax-engine-{i}"}))
                    self.router = EngineRouter(self._replicas, start_timeout_s=s.start_timeout_s)
                    self._replicas = []
            except ValueError as e:  # check_feasible: one actor fits on no node
                raise ConfigError(f"the scale section: {e}") from None
        except BaseException:
            self.shutdown()
            raise

    def engine(self, trainer: Any, version: int) -> Any:
        """The router over the replicas, holding the trainer's weights as `version` (waits,
        within scale.start_timeout_s, until every replica built its engine and has them)."""
        self.router.update_weights(trainer.params_for_engine(), version)
        if not self.router.wait_published(self.scale.start_timeout_s):
            raise TimeoutError(f"the engine replicas did not take the first weights within "
                               f"scale.start_timeout_s={self.scale.start_timeout_s:g} s")
        return self.router

    def stats(self) -> dict[str, Any]:
        """What the Ray pieces did, for summary.json."""
        out: dict[str, Any] = {"ray": self.scale.ray}
        if self.router is not None:
            r = self.router.stats()
            out["engines"] = {"replicas": len(r.routed), "routed": list(r.routed),
                              "down": list(r.down), "dropped": list(r.dropped),
                              "reruns": dict(r.reruns), "moved": dict(r.moved),
                              "policy_version": r.policy_version}
            if r.weight_sync is not None:  # committed: handed to every live replica's engine,
                # which swaps it in at its next step (policy_version may lag a moment)
                out["engines"]["publications"] = r.weight_sync.publications
                out["engines"]["committed_version"] = r.weight_sync.committed_version
        if self.pool is not None:
            out["envs"] = dataclasses.asdict(self.pool.stats())
        return out

    def shutdown(self) -> None:
        """Ends the actors (each bounded) and the connection this run made."""
        for part in (self.pool, self.router, *self._replicas):
            if part is not None:
                try:
                    part.shutdown()
                except Exception:  # noqa: BLE001 - the run is over; a dead actor has nothing to end
                    pass
        self.pool = self.router = None
        self._replicas = []
        if self.owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
