"""Repository-style tasks: a populated workdir that persists, and the SWE agent's file tools."""

import asyncio
import os

import pytest

from agentax.records import ToolCall
from agentax.tools import Sandbox, SandboxConfig, SandboxPathError, SandboxUnavailableError, ToolRegistry
from agentax.tools import bash_tool, check_sandbox_available, repo_tools

try:
    check_sandbox_available()
    _REASON = None
except SandboxUnavailableError as e:
    _REASON = str(e)
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"sandbox unavailable: {_REASON}")

FILES = {
    "calc/ops.py": "def double(x):\n    return x + x + 1\n",
    "calc/__init__.py": "",
    "test_ops.py": "from calc.ops import double\nassert double(2) == 4, double(2)\nprint('TESTS OK')\n",
}


def call(reg, name, **args):
    return asyncio.run(reg.call(ToolCall(name=name, arguments=args)))


def test_edit_then_run_tests_flow():
    with Sandbox(SandboxConfig(timeout_s=5.0), files=FILES) as sb:
        reg = ToolRegistry(repo_tools(sb, test_command="python test_ops.py") + [bash_tool(sb)])
        assert reg.names == ("list_files", "read_file", "search", "write_file", "replace_in_file", "run_tests", "bash")
        assert call(reg, "list_files").content.splitlines() == ["calc/__init__.py", "calc/ops.py", "test_ops.py"]
        r = call(reg, "search", pattern="x + x")
        assert r.ok and r.content == "./calc/ops.py:2:    return x + x + 1"
        assert call(reg, "search", pattern=r"return [a-z]+ \+", regex=True).content.startswith("./calc/ops.py:2:")
        assert call(reg, "search", pattern="nowhere").content == "(no matches)"
        assert call(reg, "read_file", path="calc/ops.py", start_line=2).content == "2|     return x + x + 1"
        r = call(reg, "run_tests")
        assert not r.ok and r.error == "nonzero_exit" and "AssertionError: 5" in r.content
        r = call(reg, "replace_in_file", path="calc/ops.py", old="x + x + 1", new="2 * x")
        assert r.ok and "line 2" in r.content
        r = call(reg, "replace_in_file", path="calc/ops.py", old="missing", new="y")
        assert not r.ok and "does not occur" in r.content
        r = call(reg, "run_tests")
        assert r.ok and r.content == "TESTS OK"
        assert call(reg, "write_file", path="new/dir/f.txt", content="data").ok
        assert call(reg, "bash", command="cat new/dir/f.txt; echo more >> new/dir/f.txt").content == "data"
        assert call(reg, "read_file", path="/workspace/new/dir/f.txt").content == "1| datamore"


def test_file_helpers_stay_inside_workdir(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    with Sandbox(SandboxConfig(timeout_s=5.0), files={"a.txt": "A"}) as sb:
        reg = ToolRegistry(repo_tools(sb, test_command=None))
        assert "run_tests" not in reg
        asyncio.run(sb.run_bash(f"ln -s {secret} link; ln -s / rootlink; mkfifo fifo"))
        for args in [{"path": "../../etc/passwd"}, {"path": "link"}, {"path": "rootlink/etc/passwd"}, {"path": "fifo"}]:
            r = call(reg, "read_file", **args)
            assert not r.ok and r.error == "bad_arguments", args
            assert "host secret" not in r.content
        r = call(reg, "write_file", path="link", content="overwritten")
        assert not r.ok and secret.read_text() == "host secret"
        r = call(reg, "search", pattern="x", path="../..")
        assert not r.ok and "outside" in r.content
        with pytest.raises(SandboxPathError):
            sb.read_file("rootlink/etc/hostname")


def test_workdir_is_copied_not_modified(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("X = 1\n")
    with Sandbox(SandboxConfig(timeout_s=5.0), workdir=tmp_path) as sb:
        r = asyncio.run(sb.run_bash("cat src/m.py && echo 'X = 2' > src/m.py && touch extra"))
        assert r.ok and r.stdout == "X = 1\n"
        assert sb.read_file("src/m.py") == "X = 2\n"
        root = sb.workdir
    assert (tmp_path / "src" / "m.py").read_text() == "X = 1\n" and not (tmp_path / "extra").exists()
    assert not root.exists()
    with pytest.raises(ValueError, match="not a directory"):
        Sandbox(workdir=tmp_path / "missing")
    assert os.path.isdir(tmp_path)


def test_host_file_operations_never_follow_links(tmp_path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "h.txt").write_text("host")
    with Sandbox(SandboxConfig(timeout_s=5.0), files={"a/b.txt": "B", "a/c/d.txt": "D"}) as sb:
        asyncio.run(sb.run_bash(f"ln -s {host} a/out; ln -s b.txt a/inner; chmod +x a/b.txt"))
        assert sb.list_files() == ["a/b.txt", "a/c/d.txt", "a/inner", "a/out"]
        for bad in ("a/out/h.txt", "a/inner", "/etc/passwd", "a/../../x", "a/\0"):
            with pytest.raises(SandboxPathError):
                sb.read_file(bad)
        with pytest.raises(SandboxPathError, match="link"):
            sb.write_file("a/out/new.txt", "x")
        with pytest.raises(SandboxPathError, match="link"):
            sb.write_file("a/inner", "x")
        with pytest.raises(SandboxPathError, match="directory"):
            sb.write_file("a/c", "x")
        sb.write_file("a/b.txt", "B2")  # replaced, keeping the file's mode
        assert sb.read_file("/workspace/a/x/../b.txt") == "B2"
        assert os.stat(sb.workdir / "a" / "b.txt").st_mode & 0o777 == 0o755
        sb.rename("a/c", "e/f")
        assert sb.read_file("e/f/d.txt") == "D"
        n = sb.copy_out("a", tmp_path / "copy")
        assert n == 2 and sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["b.txt"]
        sb.remove("a/out")  # the link, not what it points to
        sb.remove("e")
        assert sb.list_files() == ["a/b.txt", "a/inner"]
        with pytest.raises(SandboxPathError, match="no such"):
            sb.remove("e")
    assert (host / "h.txt").read_text() == "host" and sorted(os.listdir(host)) == ["h.txt"]
