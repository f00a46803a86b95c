"""Session-wide test settings."""


def pytest_configure(config):
    # Some tests leave a sync call hung on a stage thread on purpose (tests/faults); at exit the
    # test process waits for such calls at most this long, not the 5 s a real run gives one.
    import agentax._executors

    agentax._executors.EXIT_WAIT_S = 0.5


# tests/data holds test data, including SWE-bench-format repository snapshots whose own test files
# (tests/data/swebench/*/tests/test_*.py) are run inside the sandbox by the SWE tests, never here.
collect_ignore = ["data"]
