"""Every bad input to `agentax` gets one line naming what is wrong, a non-zero exit, and no
traceback; the config, checkpoint files and run directories are left as they were."""

from __future__ import annotations

import pytest

from agentax.cli import main
from tests.faults.fault_helpers import bad_inputs, error_lines


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    return {name: (args, needle) for name, args, needle in bad_inputs(root)}


def test_each_bad_input_is_one_line_with_a_nonzero_exit(cases, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a run directory that is created by mistake lands here
    failures = []
    for name, (args, needle) in cases.items():
        status = main(args)
        err = capsys.readouterr().err
        # One error line; warnings on the way to it (e.g. a damaged newest checkpoint before
        # the older one is tried) are `warning: ...` lines of their own.
        lines = error_lines(err)
        ok = (status not in (0, None) and len(lines) == 1 and needle in lines[0]
              and lines[0].startswith(f"agentax {args[0]}: error:") and "Traceback" not in err)
        if not ok:
            failures.append(f"{name}: status={status} stderr={err[-600:]!r}")
    assert failures == []


def test_debug_prints_the_traceback(cases, capsys):
    args, _ = cases["damaged meta.json"]
    assert main(["export", "--debug", *args[1:]]) != 0
    assert "Traceback" in capsys.readouterr().err
