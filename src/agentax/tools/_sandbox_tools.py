"""Tools backed by a `Sandbox`: python, bash, and the repository helpers a SWE agent uses.

Each tool reports a failed program (non-zero exit, timeout, output flood) as `ok=False` with
the program's output, so the model sees what happened and the caller never gets an exception.
"""

from __future__ import annotations

import re
import shlex

from agentax.records import ToolResult
from agentax.tools._sandbox import Sandbox, SandboxPathError, SandboxResult
from agentax.tools._tool import DEFAULT_MAX_OUTPUT_CHARS, Tool, tool

__all__ = ["python_tool", "bash_tool", "repo_tools", "format_sandbox_result"]

_GRACE_S = 5.0  # the sandbox enforces its own timeout; the Tool's bound is a backstop


def format_sandbox_result(result: SandboxResult, name: str) -> ToolResult:
    """The model-facing text of a run: stdout, stderr, and a status line when it failed."""
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    error = None
    if result.killed_reason == "timeout":
        error = "timeout"
        parts.append(f"[timed out after {result.elapsed_s:.1f} s; the process was killed]")
    elif result.killed_reason == "output_limit":
        error = "output_limit"
        parts.append("[killed: the program printed too much output]")
    elif result.killed_reason == "memory_limit":
        error = "memory_limit"
        parts.append("[killed: the sandbox reached its memory limit (files written count too)]")
    elif result.exit_code is None:
        error = "crashed"
        parts.append("[the sandbox could not run the program]")
    elif result.exit_code != 0:
        error = "nonzero_exit"
        parts.append(f"[exit code {result.exit_code}]")
    content = "\n".join(parts) if parts else "[no output]"
    return ToolResult(name=name, content=content, ok=error is None, error=error, elapsed_s=result.elapsed_s)


def python_tool(sandbox: Sandbox, *, name: str = "python", max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> Tool:
    """A tool `name(code: str)` that runs Python in `sandbox` and returns its output."""

    async def run_python(code: str) -> ToolResult:
        """Runs a Python program in a sandbox (no network) and returns what it printed.

        The working directory persists between calls; print() what you want to see.

        Args:
            code: The complete Python source to run.
        """
        return format_sandbox_result(await sandbox.run_python(code), name)

    return tool(run_python, name=name, timeout_s=sandbox.config.timeout_s + _GRACE_S,
                max_output_chars=max_output_chars)


def bash_tool(sandbox: Sandbox, *, name: str = "bash", max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> Tool:
    """A tool `name(command: str)` that runs a bash command line in `sandbox`."""

    async def run_bash(command: str) -> ToolResult:
        """Runs a bash command in a sandbox (no network) and returns its output.

        The working directory persists between calls.

        Args:
            command: The bash command line to run.
        """
        return format_sandbox_result(await sandbox.run_bash(command), name)

    return tool(run_bash, name=name, timeout_s=sandbox.config.timeout_s + _GRACE_S,
                max_output_chars=max_output_chars)


def _error(name: str, message: str, kind: str = "bad_arguments") -> ToolResult:
    return ToolResult(name=name, content=f"Error: {message}", ok=False, error=kind)


def repo_tools(
    sandbox: Sandbox,
    *,
    test_command: str | None = "python -m pytest -q -x --no-header -p no:cacheprovider",
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> list[Tool]:
    """Tools over the sandbox's working directory, for repository-style tasks.

    Returns, in order: list_files(path), read_file(path, start_line, end_line),
    search(pattern, path, regex), write_file(path, content),
    replace_in_file(path, old, new), and run_tests(target) if `test_command` is not None.
    File access is confined to the workdir and never follows links, so code running in the
    sandbox at the same time cannot redirect it (docs/sandbox.md).
    """
    timeout = sandbox.config.timeout_s + _GRACE_S

    def list_files(path: str = ".") -> ToolResult | str:
        """Lists the files under a directory of the repository, one relative path per line.

        Args:
            path: Directory relative to the repository root.
        """
        try:
            files = sandbox.list_files(path)
        except SandboxPathError as e:
            return _error("list_files", str(e))
        return "\n".join(files) if files else "(no files)"

    def read_file(path: str, start_line: int = 1, end_line: int = 0) -> ToolResult | str:
        """Shows a file of the repository with line numbers.

        Args:
            path: File path relative to the repository root.
            start_line: First line to show (1-based).
            end_line: Last line to show; 0 means the end of the file.
        """
        try:
            lines = sandbox.read_file(path).splitlines()
        except SandboxPathError as e:
            return _error("read_file", str(e))
        if start_line < 1 or (end_line and end_line < start_line):
            return _error("read_file", f"bad line range {start_line}..{end_line}")
        stop = len(lines) if end_line == 0 else min(end_line, len(lines))
        width = len(str(stop))
        shown = [f"{i:>{width}}| {lines[i - 1]}" for i in range(start_line, stop + 1)]
        return "\n".join(shown) if shown else f"(file has {len(lines)} lines)"

    async def search(pattern: str, path: str = ".", regex: bool = False) -> ToolResult:
        """Searches the repository for a string (like grep -rn) and lists matching lines.

        Args:
            pattern: Text to look for (a POSIX extended regular expression if regex is true).
            path: File or directory to search, relative to the repository root.
            regex: Treat the pattern as a regular expression.
        """
        try:
            sandbox.resolve(path)
        except SandboxPathError as e:
            return _error("search", str(e))
        flag = "-E" if regex else "-F"
        cmd = (f"grep -rnI {flag} --exclude-dir=.git -e {shlex.quote(pattern)} -- {shlex.quote(path)}"
               " | head -n 200")
        r = await sandbox.run_bash(cmd)
        if r.killed_reason:
            return format_sandbox_result(r, "search")
        if not r.stdout.strip():
            return ToolResult(name="search", content="(no matches)" + (f"\n{r.stderr}" if r.stderr else ""))
        return ToolResult(name="search", content=r.stdout.rstrip("\n"))

    def write_file(path: str, content: str) -> ToolResult | str:
        """Creates or overwrites a file in the repository.

        Args:
            path: File path relative to the repository root.
            content: The complete new content of the file.
        """
        try:
            sandbox.write_file(path, content)
        except (SandboxPathError, OSError) as e:
            return _error("write_file", str(e))
        return f"Wrote {len(content)} characters to {path}"

    def replace_in_file(path: str, old: str, new: str) -> ToolResult | str:
        """Replaces one exact occurrence of a text in a file of the repository.

        Args:
            path: File path relative to the repository root.
            old: The exact text to replace; it must occur exactly once in the file.
            new: The replacement text.
        """
        try:
            text = sandbox.read_file(path, max_bytes=sandbox.config.max_file_mb * 2**20)
        except SandboxPathError as e:
            return _error("replace_in_file", str(e))
        if not old:
            return _error("replace_in_file", "'old' must not be empty")
        count = text.count(old)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times (make it unique)"
            return _error("replace_in_file", f"the text to replace {where} in {path}")
        try:
            sandbox.write_file(path, text.replace(old, new, 1))
        except (SandboxPathError, OSError) as e:
            return _error("replace_in_file", str(e))
        line = text[: text.index(old)].count("\n") + 1
        return f"Replaced 1 occurrence in {path} at line {line}"

    tools = [
        tool(list_files, timeout_s=timeout, max_output_chars=max_output_chars),
        tool(read_file, timeout_s=timeout, max_output_chars=max_output_chars),
        tool(search, timeout_s=timeout, max_output_chars=max_output_chars),
        tool(write_file, timeout_s=timeout, max_output_chars=max_output_chars),
        tool(replace_in_file, timeout_s=timeout, max_output_chars=max_output_chars),
    ]
    if test_command is not None:

        async def run_tests(target: str = "") -> ToolResult:
            """Runs the repository's tests and returns their output.

            Args:
                target: Optional test file or test id to run instead of the whole suite.
            """
            if target and not re.fullmatch(r"[\w./:\[\]-]+", target):
                return _error("run_tests", f"target {target!r} is not a test path or id")
            cmd = test_command + (f" {shlex.quote(target)}" if target else "")
            return format_sandbox_result(await sandbox.run_bash(cmd), "run_tests")

        tools.append(tool(run_tests, timeout_s=timeout, max_output_chars=max_output_chars))
    return tools
