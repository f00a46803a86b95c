"""Bad config inputs (issue 44, F8-F11): each is one line naming the file, line or field.

A NaN inside a `*_kwargs` mapping, a YAML "billion laughs", a section written as a scalar,
a file that is not UTF-8 or not YAML, and a bad line of `sft.data` JSONL. The cases that
once hung or passed silently run the real `agentax` in a child process.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from agentax.run import _yaml as cli_yaml
from agentax.cli import load_config
from agentax.config import ConfigError
from agentax.recipes import load_demos_jsonl, load_tasks
from tests.faults.fault_helpers import error_lines, start


def agentax(args, cwd: Path, timeout: float = 60) -> tuple[int, str, float]:
    """(exit status, the one error line, seconds) of `agentax ARGS` run in `cwd`."""
    began = time.monotonic()
    proc = start(args, cwd=cwd)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"agentax {' '.join(args)} still ran after {timeout} s")
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return proc.returncode, lines[0], time.monotonic() - began


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def billion_laughs(levels: int = 9) -> str:
    lines = ["env:", "  kwargs:", '    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- F8: finite


def test_nan_in_advantage_kwargs_names_the_field(tmp_path):
    path = write(tmp_path, "nan.yaml", "trainer:\n  advantage_kwargs: {eps: .nan}\n")
    status, line, _ = agentax(["config", path.name], tmp_path)
    assert status == 2
    assert line.startswith("agentax config: error:")
    assert "nan.yaml" in line and "trainer.advantage_kwargs.eps: nan is not a finite number" in line


def test_inf_deep_inside_kwargs_names_the_path(tmp_path):
    path = write(tmp_path, "inf.yaml", "env:\n  kwargs:\n    a: [1, {b: [2, -.inf]}]\n")
    with pytest.raises(ConfigError, match=r"env\.kwargs\.a\[1\]\.b\[1\]: -inf is not a finite"):
        load_config(path)


def test_nan_in_kwargs_override_is_rejected():
    with pytest.raises(ConfigError, match=r"agent\.kwargs\.t: nan is not a finite number"):
        load_config(None, ["agent.kwargs.t=.nan"])


@pytest.mark.parametrize("override,field", [
    ("trainer.advantage_kwargs={eps: nan}", "trainer.advantage_kwargs.eps"),
    ("trainer.advantage_kwargs.eps=-Infinity", "trainer.advantage_kwargs.eps"),
    ("env.kwargs={a: [1, {b: inf}]}", r"env.kwargs.a\[1\].b"),
    ("agent.kwargs.t=NaN", "agent.kwargs.t"),
    ("tasks.kwargs.limit=' -inf '", "tasks.kwargs.limit"),
    ("sft.demos_kwargs.x=.Inf", "sft.demos_kwargs.x"),
])
def test_a_string_that_spells_nan_or_inf_in_any_kwargs_is_rejected(override, field):
    # YAML reads `nan` / `inf` (no leading dot) as strings, which float() turns into NaN
    with pytest.raises(ConfigError, match=rf"^command-line overrides: {field}: .*(not a finite|non-finite)"):
        load_config(None, [override])


def test_string_nan_in_advantage_kwargs_fails_agentax_config(tmp_path):
    write(tmp_path, "strnan.yaml", "trainer:\n  advantage_kwargs: {eps: nan}\n")
    status, line, _ = agentax(["config", "strnan.yaml"], tmp_path)
    assert status == 2
    assert line.startswith("agentax config: error: strnan.yaml: trainer.advantage_kwargs.eps:")
    assert "not a finite number" in line


def test_typed_kwargs_values_are_numbers_and_other_strings_pass():
    cfg = load_config(None, ["trainer.advantage_kwargs={eps: 1e-6}",  # YAML 1.1: a string
                             "agent.kwargs={name: infant, note: nano}"])
    assert cfg.trainer.advantage_kwargs == {"eps": 1e-6}
    assert cfg.agent.kwargs == {"name": "infant", "note": "nano"}
    with pytest.raises(ConfigError, match=r"trainer\.advantage_kwargs\.eps: expected a number"):
        load_config(None, ["trainer.advantage_kwargs={eps: tiny}"])


def test_finite_kwargs_still_load():
    cfg = load_config(None, ["trainer.advantage_kwargs={eps: 1.0e-6}", "env.kwargs.x=[1, 2.5]"])
    assert cfg.trainer.advantage_kwargs == {"eps": 1e-6}
    assert cfg.env.kwargs == {"x": [1, 2.5]}


# ----------------------------------------------------------------------------- F9: aliases


@pytest.mark.parametrize("command", ["config", "train"])
def test_billion_laughs_stops_at_once_naming_the_file(tmp_path, command):
    write(tmp_path, "laughs.yaml", billion_laughs())
    status, line, seconds = agentax([command, "laughs.yaml"], tmp_path)
    assert status == 2 and seconds < 30
    assert line.startswith(f"agentax {command}: error: laughs.yaml:")
    assert "anchors/aliases expand" in line


def test_alias_cycle_is_rejected(tmp_path):
    path = write(tmp_path, "cycle.yaml", "env:\n  kwargs:\n    a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match=r"cycle\.yaml: .*line 3 .*alias of itself"):
        load_config(path)


def test_ordinary_anchors_and_aliases_still_work(tmp_path):
    path = write(tmp_path, "anchors.yaml",
                 "run: {steps: 3}\nenv:\n  kwargs: &common {max_steps: 8, tags: &t [a, b]}\n"
                 "tasks:\n  kwargs: {tags: *t}\nagent:\n  kwargs: {}\n")
    cfg = load_config(path)
    assert cfg.env.kwargs == {"max_steps": 8, "tags": ["a", "b"]}
    assert cfg.tasks.kwargs == {"tags": ["a", "b"]}


def test_the_bound_counts_only_what_aliases_add(tmp_path, monkeypatch):
    monkeypatch.setattr(cli_yaml, "MAX_YAML_VALUES", 1000)
    items = ", ".join(str(i) for i in range(3000))  # 3000 written values: not limited
    path = write(tmp_path, "big.yaml", f"env:\n  kwargs:\n    xs: &x [{items}]\n")
    assert len(load_config(path).env.kwargs["xs"]) == 3000
    path.write_text(f"env:\n  kwargs:\n    xs: &x [{items}]\n    ys: *x\n")  # +3001
    with pytest.raises(ConfigError, match=r"big\.yaml: YAML anchors/aliases expand"):
        load_config(path)


# ----------------------------------------------------------------------------- F10: sections


def test_scalar_section_with_an_override_is_not_dropped(tmp_path):
    write(tmp_path, "scalar.yaml", "run: 5\n")
    status, line, _ = agentax(["config", "scalar.yaml", "run.steps=3"], tmp_path)
    assert status == 2
    assert "scalar.yaml" in line and "section 'run' is 5, not a mapping" in line


@pytest.mark.parametrize("text", ["run: 5\n", "tracing: [1, 2]\n", "eval:\n", "sft: text\n"])
def test_scalar_section_without_overrides_names_file_and_section(tmp_path, text):
    path = write(tmp_path, "scalar.yaml", text)
    section = text.split(":")[0]
    with pytest.raises(ConfigError, match=rf"scalar\.yaml: section '{section}' is .*not a mapping"):
        load_config(path)


def test_override_inside_a_scalar_field_is_rejected(tmp_path):
    path = write(tmp_path, "field.yaml", "env:\n  kwargs: 5\n")
    with pytest.raises(ConfigError, match=r"field\.yaml: env\.kwargs is 5, not a mapping"):
        load_config(path, ["env.kwargs.max_steps=3"])


# ----------------------------------------------------------------------------- F11: files


def test_non_utf8_yaml_names_file_and_line(tmp_path):
    write(tmp_path, "latin1.yaml", b"run:\n  name: caf\xe9\n")
    status, line, _ = agentax(["config", "latin1.yaml"], tmp_path)
    assert status == 2
    assert "latin1.yaml:2: not UTF-8" in line


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "broken.yaml", "run:\n  steps: 3\n  name: [x\n  seed: 1\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml:4: not valid YAML"):
        load_config(path)


@pytest.mark.parametrize("content, problem", [
    (b'{"messages": []}\n\n{"messages": [\n', r"d\.jsonl:3: not JSON"),
    (b'{"messages": []}\n{"messages": "x\xff"}\n', r"d\.jsonl:2: not UTF-8"),
    (b'{"messages": []}\n[1, 2]\n', r"d\.jsonl:2: expected \{\"messages\": \[\.\.\.\]\}"),
    (b'{"messages": [{"role": "user"}, {"content": "x"}]}\n',
     r"d\.jsonl:1: messages\[1\] needs a string \"role\""),
    (b'{"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}\n',
     r"d\.jsonl:1: messages\[0\] lacks 'name'"),
])
def test_bad_sft_data_line_names_file_line_and_problem(tmp_path, content, problem):
    path = write(tmp_path, "d.jsonl", content)
    with pytest.raises(ValueError, match=problem):
        load_demos_jsonl(path)


def test_good_sft_data_still_loads(tmp_path):
    path = write(tmp_path, "d.jsonl", '{"messages": [{"role": "user", "content": "2+2"}, '
                 '{"role": "assistant", "content": "4"}]}\n\n')
    (conv,) = load_demos_jsonl(path)
    assert [m.role for m in conv] == ["user", "assistant"] and conv[1].content == "4"


def test_non_utf8_task_file_names_file_and_line(tmp_path):
    path = write(tmp_path, "tasks.jsonl", b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xff"}\n')
    with pytest.raises(ValueError, match=r"tasks\.jsonl:2: not UTF-8"):
        load_tasks(path)


# ----------------------------------------------------------------------------- failed starts


def _tasks_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tasks_folder"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    return folder


@pytest.mark.parametrize("name, args, needle", [
    ("sft, a bad sft.data line", ["sft", "sft.data=demos.jsonl"], "demos.jsonl:3: not JSON"),
    pytest.param("train, a bad sft.data line", ["train", "sft.steps=2", "sft.data=demos.jsonl"],
                 "demos.jsonl:3: not JSON", marks=pytest.mark.slow),  # builds the RL side first
    ("train, a task file that is a directory",
     ["train", "tasks.factory=null", "tasks.train_file=tasks_folder"],
     "task file 'tasks_folder' is a directory, not a file (tasks.train_file / tasks.eval_file)"),
    ("eval, an eval file that is a directory",
     ["eval", "tasks.factory=null", "tasks.train_file=tasks_folder/train.jsonl",
      "tasks.eval_file=tasks_folder"], "task file 'tasks_folder' is a directory"),
    ("sft, an sft.data that is a directory", ["sft", "sft.data=tasks_folder"],
     "demonstrations file 'tasks_folder' is a directory, not a file (sft.data)"),
])
def test_a_failed_start_leaves_no_run_directory(tmp_path, name, args, needle):
    write(tmp_path, "demos.jsonl", b'{"messages": []}\n\n{"messages": [\n')
    _tasks_dir(tmp_path)
    status, line, _ = agentax([*args, "run.runs_dir=runs", "-q"], tmp_path)
    assert status == 2 and needle in line, line
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == [], list(runs.iterdir())


def test_a_directory_is_named_as_one_where_a_file_is_wanted(tmp_path):
    folder = _tasks_dir(tmp_path)
    with pytest.raises(IsADirectoryError, match=r"task file .*tasks_folder' is a directory, not a "
                       r"file \(tasks\.train_file / tasks\.eval_file\): give the \.jsonl or "
                       r"\.parquet file itself"):
        load_tasks(folder)
    with pytest.raises(IsADirectoryError, match=r"demonstrations file .* is a directory"):
        load_demos_jsonl(folder)
    with pytest.raises(FileNotFoundError, match=r"task file .*nowhere\.jsonl' does not exist"):
        load_tasks(tmp_path / "nowhere.jsonl")
    with pytest.raises(ConfigError, match=r"config file .*tasks_folder' is a directory, not a YAML"):
        load_config(folder)
    write(tmp_path, "child.yaml", "base: tasks_folder/\n")
    with pytest.raises(ConfigError, match=r"child\.yaml: base 'tasks_folder/' is a directory"):
        load_config(tmp_path / "child.yaml")
