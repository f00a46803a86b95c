"""Lazy access to Ray: agentax imports and runs without it; the Ray pieces say how to get it."""

from __future__ import annotations

from typing import Any

__all__ = ["require_ray", "check_feasible", "connect_ray"]

_INSTALL_HINT = "agentax's Ray pieces need the optional extra: pip install 'agentax[ray]'"


def require_ray() -> Any:
    """Returns the `ray` module, importing it on first use.

    Raises:
      ImportError: Ray is not installed; the message says `pip install 'agentax[ray]'`.
    """
    try:
        import ray  # noqa: PLC0415 - optional dependency, imported only when used
    except ImportError as e:
        raise ImportError(f"{_INSTALL_HINT} (import failed: {e})") from e
    return ray


def ensure_ray_initialized(ray: Any) -> None:
    """Raises a clear error when no Ray cluster is connected (instead of silently starting one)."""
    if not ray.is_initialized():
        raise RuntimeError(
            "Ray is not initialized: call ray.init() (local cluster) or "
            "ray.init(address='auto') (join a running cluster) before building Ray pools"
        )


def check_feasible(ray: Any, options: dict, what: str) -> None:
    """Raises at once when no node of the connected cluster could ever place one actor with
    `options` (its `num_cpus`, `num_gpus` and custom `resources`), instead of the actor waiting
    unplaced until a start timeout with a generic message.

    A node's *total* resources count (busy ones free up later). A cluster whose autoscaler adds
    nodes later cannot be judged from the nodes alive now: pass `check_feasible=False` to the
    pool or replica there.

    Raises:
      ValueError: naming the resource, the amount asked, and what the nodes offer.
    """
    demand = {"CPU": float(options.get("num_cpus") or 0.0), "GPU": float(options.get("num_gpus") or 0.0),
              **{str(k): float(v) for k, v in dict(options.get("resources") or {}).items()}}
    demand = {k: v for k, v in demand.items() if v > 0}
    if not demand:
        return
    nodes = [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]
    if any(all(node.get(k, 0.0) >= v for k, v in demand.items()) for node in nodes):
        return
    short = next(k for k, v in demand.items() if not any(node.get(k, 0.0) >= v for node in nodes))
    most = max((node.get(short, 0.0) for node in nodes), default=0.0)
    offered = f"the most any of the {len(nodes)} live node(s) has is {most:g}" if most else \
        f"none of the {len(nodes)} live node(s) has it"
    raise ValueError(
        f"{what} asks for {short}={demand[short]:g} per actor, but {offered}: start nodes with it "
        f"(`ray start --resources='{{\"{short}\": N}}'`, or --num-cpus/--num-gpus), lower the request, "
        f"or pass check_feasible=False on an autoscaling cluster")


def _token_available() -> bool:
    import os

    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return True
    return os.path.isfile(os.path.expanduser("~/.ray/auth_token"))


def connect_ray(address: str, **init_kwargs: Any) -> Any:
    """`ray.init(address=...)` to a running cluster, with its token authentication handled.

    Ray clusters started by `ray start` use token authentication (Ray 2.59+), and a driver
    without `RAY_AUTH_MODE=token` is refused with a bare ConnectionError. When RAY_AUTH_MODE is
    unset and a token is at hand (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token,
    where `ray start --head` writes it), this connects with token mode on; a refusal says what to
    set. Returns the `ray` module.

    Raises:
      ConnectionError: the cluster cannot be reached or refused us; the message says why.
    """
    import os

    ray = require_ray()
    if not os.environ.get("RAY_AUTH_MODE") and _token_available():
        os.environ["RAY_AUTH_MODE"] = "token"
    try:
        ray.init(address=address, **init_kwargs)
    except ConnectionError as e:
        mode = os.environ.get("RAY_AUTH_MODE", "")
        hint = ("the cluster uses token authentication (Ray 2.59+): on the head run `ray get-auth-token` "
                "and export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<that token> here (or copy it to "
                "~/.ray/auth_token)") if mode != "token" or not _token_available() else (
                "RAY_AUTH_MODE=token is set: check that this token is the cluster's "
                "(`ray get-auth-token` on the head), and that the address and port are right")
        raise ConnectionError(f"could not connect to the Ray cluster at {address}: {e}; {hint}") from None
    return ray
