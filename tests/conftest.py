"""Session-wide test settings."""

import os


def pytest_configure(config):
    # The default suite's programs are tiny, so XLA's compiling dominates its time on CPU: they
    # compile with tests/compile_flags.py's flags (faster to compile, slower to run). Not in a
    # session that selects the `slow` tests: their learning runs execute long enough that the
    # slower code costs more than it saves. Set before JAX starts its backend, so that the
    # subprocesses tests start inherit them too.
    if not _selects_slow_tests(config):
        from tests.compile_flags import fast_compile_xla_flags

        os.environ["XLA_FLAGS"] = fast_compile_xla_flags(os.environ.get("XLA_FLAGS", ""))
    # The tests' own programs share JAX's persistent compilation cache with the `agentax`
    # processes they start (the CLI's, `$AGENTAX_COMPILATION_CACHE`, default
    # ~/.cache/agentax/jax; empty = off): a kernel another test, worker or stage compiled
    # already is loaded, not compiled again.
    cache_dir = os.environ.get("AGENTAX_COMPILATION_CACHE", "~/.cache/agentax/jax")
    if cache_dir:
        from agentax.engine import enable_compilation_cache

        enable_compilation_cache(cache_dir)
    # Some tests leave a sync call hung on a stage thread on purpose (tests/faults); at exit the
    # test process waits for such calls at most this long, not the 5 s a real run gives one.
    import agentax._executors

    agentax._executors.EXIT_WAIT_S = 0.5


def _selects_slow_tests(config) -> bool:
    """Whether the session's `-m` expression selects a test marked `slow` (and nothing else)."""
    markexpr = config.getoption("markexpr")
    if not markexpr:
        return True
    try:  # pytest's own evaluation of `-m` (a private module: if it moves, -O0 is left off)
        from _pytest.mark.expression import Expression

        return bool(Expression.compile(markexpr).evaluate(lambda name, **_: name == "slow"))
    except Exception:  # noqa: BLE001
        return True


# The slow stage's longest modules, longest first (by a cold run's durations). On pytest-xdist
# workers with `--dist loadfile` a module is handed out whole, in collection order, so these go
# first: a long module started last would leave the other worker idle for its whole length.
LONGEST_FIRST = [
    "tests/recipes/test_frozen_lake_learns.py", "tests/recipes/test_mini_swe.py",
    "tests/recipes/test_web_learns.py", "tests/recipes/test_agents_sdk_calculator.py",
    "tests/recipes/test_solver_verifier_learns.py", "tests/engine/test_tensor_parallel.py",
    "tests/recipes/test_selfplay_learns.py", "tests/envs/test_env_examples.py",
    "tests/cli/test_demo.py", "tests/recipes/test_mcp_tools.py", "tests/train/test_dead_peer.py",
    "tests/scale/test_weight_sync.py", "tests/recipes/test_swe_real.py",
    "tests/train/test_multiprocess.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # A stable sort: the rest keep their order, after the listed modules.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


# tests/data holds test data, including SWE-bench-format repository snapshots whose own test files
# (tests/data/swebench/*/tests/test_*.py) are run inside the sandbox by the SWE tests, never here.
collect_ignore = ["data"]
