"""Reading config files: strict YAML (duplicate keys and alias expansion bounded), errors that
name the file and line, and what a file's paths and `base:` refer to. Knows nothing of the
RunConfig schema (agentax.run._config builds and checks that)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import yaml

from agentax.config import ConfigError

__all__ = ["FILE_PATH_FIELDS", "MAX_YAML_VALUES", "base_path", "paths_relative_to_file",
           "read_yaml", "read_yaml_file", "resolve_paths"]


MAX_YAML_VALUES = 100_000
"""The most values (scalars, lists, mappings) a YAML document may expand to through its
anchors and aliases; more is a "billion laughs" (a few lines that expand exponentially)."""


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that rejects a key given twice in one mapping (PyYAML keeps the last),
    and a document whose anchors/aliases expand past MAX_YAML_VALUES values or into itself.
    """

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"key {key!r} appears twice (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); keep one")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node) -> None:
    """Rejects a node graph whose aliases add more than MAX_YAML_VALUES values, or a cycle.

    An alias is the very node its anchor names, so the graph stays as small as the text;
    what grows is the tree every later step (merge, checks, dump) walks. Sizes are memoised
    per distinct node, so the check is linear in the text however far the tree expands.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ConfigError(f"the YAML value at line {node.start_mark.line + 1} contains an "
                              "alias of itself (a cycle); write the value out")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        active.discard(key)
        sizes[key] = total
        return total

    total = size(root)
    if total - len(sizes) > MAX_YAML_VALUES:  # what the aliases add to the written values
        raise ConfigError(
            f"YAML anchors/aliases expand {len(sizes):,} written values to {total:,} (at most "
            f"{MAX_YAML_VALUES:,} more are allowed): write the values out or use fewer aliases")


def read_yaml(text_or_file: Any) -> Any:
    """YAML -> Python objects, strictly (safe types only, no duplicate keys, aliases bounded).

    Raises:
      yaml.YAMLError: not YAML. ConfigError: a duplicate key, or aliases that expand past
      MAX_YAML_VALUES values or into a cycle.
    """
    return yaml.load(text_or_file, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(error: Any) -> str:
    return " ".join(str(error).split())


FILE_PATH_FIELDS = (("init", "model_path"), ("init", "from_run"), ("init", "tokenizer"),
                    ("tasks", "train_file"), ("tasks", "eval_file"), ("sft", "data"))
"""The path-valued fields whose relative values in a config file resolve against the file's
directory. Not run.runs_dir: where runs are written follows the current directory, like the
default 'runs'. Import paths ('package.module:callable') and URLs are left as they are."""


def read_yaml_file(path: str) -> Any:
    """The YAML document in the file at `path`; every error names the file (and the line)."""
    if not os.path.isfile(path):
        what = "is a directory, not a YAML file" if os.path.isdir(path) else "does not exist"
        raise ConfigError(f"config file {path!r} {what}")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                          f"{e.start}); save the file as UTF-8") from None
    try:
        return read_yaml(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        what = "; ".join(x for x in (e.context, e.problem) if x) or str(e)
        raise ConfigError(f"{where}: not valid YAML: {_one_line(what)}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {_one_line(e)}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: the YAML is nested too deeply to read") from None


def base_path(base: Any, path: str) -> str:
    """The YAML file that `base: NAME|PATH` in the file at `path` names."""
    from agentax.recipes import RECIPES, recipe_path

    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: base must be a recipe name ({', '.join(RECIPES)}) or a YAML "
                          f"file's path, got {base!r}")
    target = os.path.join(os.path.dirname(path), os.path.expanduser(base))
    is_path = base.endswith((".yaml", ".yml")) or "/" in base or os.sep in base
    if not is_path and base in RECIPES:
        return str(recipe_path(base))
    if os.path.isfile(target):
        return target
    if is_path:
        if os.path.isdir(target):
            raise ConfigError(f"{path}: base {base!r} is a directory ({target}), not a YAML file")
        raise ConfigError(f"{path}: base {base!r} does not exist (looked for {target}; a "
                          "relative base is relative to the file that names it)")
    raise ConfigError(f"{path}: base {base!r} is neither a shipped recipe ({', '.join(RECIPES)}) "
                      f"nor a file next to {os.path.basename(path)}")


def paths_relative_to_file(path: str) -> bool:
    """False for the shipped recipes (their paths are where you put checkpoints and data,
    relative to where agentax runs) and for a run directory's config.yaml (written as given)."""
    from agentax.recipes import RECIPE_DIR
    from agentax.trace import CONFIG_FILENAME, METRICS_FILENAME

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.realpath(folder) == os.path.realpath(RECIPE_DIR):
        return False
    return not (os.path.basename(path) == CONFIG_FILENAME and any(
        os.path.exists(os.path.join(folder, name)) for name in (METRICS_FILENAME, "checkpoints")))


def resolve_paths(data: Mapping[str, Any], folder: str) -> dict[str, Any]:
    """`data` with the relative FILE_PATH_FIELDS joined onto `folder` (made absolute)."""
    from agentax.run._imports import is_import_path

    out = dict(data)
    for section, key in FILE_PATH_FIELDS:
        part = out.get(section)
        value = part.get(key) if isinstance(part, Mapping) else None
        if (not isinstance(value, str) or not value or value == "byte" or "://" in value
                or os.path.isabs(value) or value.startswith("~") or is_import_path(value)):
            continue
        out[section] = {**part, key: os.path.abspath(os.path.join(folder, value))}
    return out
