"""The Python blocks of docs/environments.md and docs/agents.md run, in order, as one program."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[2] / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("doc", ["environments.md", "agents.md"])
def test_doc_code_runs(doc, tmp_path):
    blocks = python_blocks(DOCS / doc)
    assert len(blocks) >= 2, f"{doc} lost its code blocks"
    script = tmp_path / "doc.py"
    script.write_text("\n\n".join(blocks) + "\nprint('DOC-OK')\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "DOC-OK" in proc.stdout, proc.stderr[-3000:]
