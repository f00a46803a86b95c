"""RunConfig: strict YAML/override loading, validation with fixes, and the generated reference."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from agentax.cli import RunConfig, config_reference, dump_config, load_config, parse_overrides
from agentax.cli._docs import field_docs
from agentax.config import ConfigError

DOC = Path(__file__).parents[2] / "docs" / "config.md"


def test_overrides_are_typed_and_nested():
    data = parse_overrides(["trainer.learning_rate=1e-3", "pipeline.filters=[]",
                            "tracing.console=false", "run.name=abc", "model.num_layers=3"])
    assert data == {"trainer": {"learning_rate": "1e-3"}, "pipeline": {"filters": []},
                    "tracing": {"console": False}, "run": {"name": "abc"},
                    "model": {"num_layers": 3}}
    cfg = load_config(None, ["trainer.learning_rate=1e-3", "pipeline.filters=[]",
                             "tracing.console=false", "model.num_layers=3"])
    assert cfg.trainer.learning_rate == pytest.approx(1e-3)
    assert cfg.pipeline.filters == () and cfg.tracing.console is False
    assert cfg.model.num_layers == 3


@pytest.mark.parametrize("bad", ["learning_rate=3", "trainer", "=3", "trainer.=x"])
def test_malformed_override_says_the_form(bad):
    with pytest.raises(ConfigError, match="section.field=value|unknown config key"):
        load_config(None, [bad])


@pytest.mark.parametrize("override,nearest", [
    ("trainer.learnin_rate=3", "learning_rate"),
    ("piepline.mode=sync", "pipeline"),
    ("pipeline.max_stalenes=2", "max_staleness"),
    ("engine.max_slot=4", "max_slots"),
])
def test_unknown_key_names_the_nearest(override, nearest):
    with pytest.raises(ConfigError, match=f"Did you mean '{nearest}'"):
        load_config(None, [override])


def test_unknown_key_in_yaml_names_file_and_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("pipeline:\n  group_sise: 4\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*pipeline\.group_sise.*'group_size'"):
        load_config(path)


@pytest.mark.parametrize("overrides,reason,fix", [
    (["pipeline.group_size=1"], "zero advantage", "pipeline.group_size>=2"),
    (["pipeline.max_staleness=-1"], "max_staleness must be >= 0", ""),
    (["engine.max_slots=8"], "holds an engine slot", "engine.max_slots=32"),
    (["sampling.temperature=0"], "identical", "sampling.temperature>0"),
    (["engine.max_seq_len=100"], "holds the whole episode", "engine.max_seq_len"),
    (["trainer.max_seq_len=64", "trainer.min_seq_bucket=64"], "would be cut",
     "trainer.max_seq_len=150"),
    (["env.task=math"], "JSONL", "env.train_file=PATH"),
    (["model.vocab_size=1000"], "byte tokenizer", "model.vocab_size=272"),
    (["collector.max_turns=2"], "collector would cut", "collector.max_turns=3"),
    (["sft.schedule=linear"], "sft.schedule must be 'cosine' or 'constant'", ""),
])
def test_invalid_combinations_give_reason_and_fix(overrides, reason, fix):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert reason in str(err.value) and fix in str(err.value)


def test_sft_schedule_reaches_the_trainer():
    from agentax.cli._runner import sft_trainer_config

    demo = sft_trainer_config(load_config(None, []))
    assert demo.decay_steps == 0 and demo.warmup_steps == 10  # the demo: constant after warmup
    cosine = sft_trainer_config(load_config(None, ["sft.schedule=cosine", "sft.steps=100"]))
    assert cosine.decay_steps == 90


def test_fixing_one_field_in_the_same_override_set_is_accepted():
    # Validation sees the merged config, not each override alone.
    cfg = load_config(None, ["engine.max_slots=8", "pipeline.max_concurrency=8",
                             "eval.max_concurrency=8"])
    assert cfg.engine.max_slots == 8


def test_yaml_round_trip_and_precedence(tmp_path):
    cfg = load_config(None, ["pipeline.mode=sync", "pipeline.max_staleness=0", "run.steps=5"])
    path = tmp_path / "run.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg
    again = load_config(path, ["run.steps=7"])  # overrides beat the file
    assert again.run.steps == 7 and again.pipeline.mode == "sync"
    partial = tmp_path / "partial.yaml"
    partial.write_text(yaml.safe_dump({"trainer": {"learning_rate": 0.5}}))
    got = load_config(partial)
    assert got.trainer.learning_rate == 0.5
    assert got.trainer.micro_batch_size == RunConfig().trainer.micro_batch_size  # rest kept


def _config_classes():
    seen, todo = {}, [RunConfig]
    while todo:
        cls = todo.pop()
        if cls.__name__ in seen:
            continue
        seen[cls.__name__] = cls
        for tp in typing.get_type_hints(cls).values():
            for arg in (tp, *typing.get_args(tp)):
                if dataclasses.is_dataclass(arg):
                    todo.append(arg)
    return list(seen.values())


@pytest.mark.parametrize("cls", _config_classes(), ids=lambda c: c.__name__)
def test_every_config_field_is_documented(cls):
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.init and not docs.get(f.name)]
    assert not missing, f"{cls.__name__} fields without a docstring: {missing}"


def test_committed_reference_matches_the_dataclasses():
    assert DOC.read_text() == config_reference(), (
        "docs/config.md is stale: regenerate with `agentax config --reference > docs/config.md`")
