"""Lazy access to Ray: agentax imports and runs without it; the Ray pieces say how to get it."""

from __future__ import annotations

from typing import Any

__all__ = ["require_ray"]

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
