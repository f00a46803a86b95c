"""The sandbox's host-side file helpers under a path race: zero host effects.

Sandboxed code swaps a directory and a file of its workdir for symlinks to host folders, to
/proc/self/root and to another sandbox's workdir in a tight loop while the host reads, writes,
edits, lists, deletes, renames and copies out paths inside that directory (sandbox_race.py).
The default suite races each operation briefly; the slow stage for 10 s each.
"""

import pytest

from agentax.tools import SandboxUnavailableError, check_sandbox_available

from sandbox_race import OPERATIONS, race

try:
    check_sandbox_available()
    _REASON = None
except SandboxUnavailableError as e:
    _REASON = str(e)
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"sandbox unavailable: {_REASON}")


def _check(result: dict) -> None:
    assert result["host_files_created"] == 0, result
    assert result["host_files_changed"] == 0, result
    assert result["host_bytes_read"] == 0, result
    assert result["other_errors"] == 0, result
    # The race really ran: the attacker swapped, the host kept calling, and the swaps were
    # seen (some calls refused) while others went through.
    assert result["swaps"] > 100 and result["calls"] > 50, result
    assert result["refused"] > 0, result
    assert result["calls"] - result["refused"] > 0, result


@pytest.mark.parametrize("op", OPERATIONS)
def test_race_short(op):
    _check(race(op, seconds=1.5))


@pytest.mark.slow
@pytest.mark.parametrize("op", OPERATIONS)
def test_race_long(op):
    _check(race(op, seconds=10.0))
