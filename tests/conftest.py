"""Session-wide test settings."""

import os
import shutil
import tempfile

# One persistent JAX compilation cache for the whole test session: many tests build the same
# tiny models and compile identical kernels, which then load from disk instead of compiling
# again. Subprocesses (the CLI tests, multi-process runs) share it through the environment.
# A fresh directory per session, so nothing carries over between runs;
# AGENTAX_TEST_JAX_CACHE=off turns it off (e.g. to compare).
_CACHE_ENV = "AGENTAX_TEST_JAX_CACHE_DIR"
_created_cache: str | None = None


def _session_cache() -> str | None:
    global _created_cache
    if os.environ.get("AGENTAX_TEST_JAX_CACHE", "on") == "off":
        return None
    if not os.environ.get(_CACHE_ENV):  # the test session's own process
        _created_cache = tempfile.mkdtemp(prefix="agentax-test-jax-")
        os.environ[_CACHE_ENV] = _created_cache
    path = os.environ[_CACHE_ENV]
    os.environ.update({
        "JAX_COMPILATION_CACHE_DIR": path,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
        # A size bound turns on JAX's file lock, so concurrent processes never read a
        # half-written entry.
        "JAX_COMPILATION_CACHE_MAX_SIZE": str(8 << 30),
        "AGENTAX_COMPILATION_CACHE": path,  # what `agentax train` enables in a subprocess
    })
    return path


def pytest_configure(config):
    # Some tests leave a sync call hung on a stage thread on purpose (tests/faults); at exit the
    # test process waits for such calls at most this long, not the 5 s a real run gives one.
    import agentax._executors

    agentax._executors.EXIT_WAIT_S = 0.5
    path = _session_cache()
    if path is not None:
        import jax

        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        jax.config.update("jax_compilation_cache_max_size", 8 << 30)


def pytest_unconfigure(config):
    if _created_cache is not None:
        shutil.rmtree(_created_cache, ignore_errors=True)


# tests/data holds test data, including SWE-bench-format repository snapshots whose own test files
# (tests/data/swebench/*/tests/test_*.py) are run inside the sandbox by the SWE tests, never here.
collect_ignore = ["data"]
