"""`agentax serve` under load gets a signal: it drains and exits 128 + N, and every call of
every client is answered (200, or 503 `server_shutting_down`), none lost
(tests/faults/serve_signal.py has the load)."""

from __future__ import annotations

import re
import signal

import pytest

from tests.faults.serve_signal import save_tiny_model, serve_under_signal, survived


@pytest.mark.parametrize("sig", [signal.SIGTERM,
                                 pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_serve_drains_on_a_signal_and_exits_128_plus_n(tmp_path, sig):
    result = serve_under_signal(save_tiny_model(tmp_path / "tiny"), sig)
    assert survived(result, sig), result
    # the server's own account agrees with the clients': every 503 they got, nothing cut
    line = result["stderr_tail"][-1]
    m = re.search(r"finished (\d+), answered 503 \(queued or new\) (\d+), cut .* (\d+)$", line)
    assert m, result
    finished, refused, cut = map(int, m.groups())
    assert refused == 3 + result["workers"]["503"] and cut == 0, line
    assert finished >= 1, line  # the long call at least
