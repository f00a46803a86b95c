"""JAX's persistent compilation cache, switched on for a run (engine and trainer kernels alike)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["enable_compilation_cache"]


def enable_compilation_cache(path: str | os.PathLike) -> Path:
    """Makes JAX keep compiled executables in `path`, so a second run or a resume of the
    same shapes loads them instead of compiling (every kernel: engine and trainer).

    Every executable is kept, however fast it compiled (JAX's defaults skip those under 1 s,
    which on a small model is most of them). Call before the first compilation; later calls
    with another path are ignored by JAX once its cache is initialised.

    Args:
      path: a directory (created if missing), e.g. `~/.cache/agentax/jax`.

    Returns:
      The directory, resolved.
    """
    import jax

    directory = Path(path).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return directory
