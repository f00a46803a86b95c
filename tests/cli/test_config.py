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
    (["engine.kv_cache_tokens=0"], "no longer supported", "use 'auto'"),
    (["sampling.temperature=0"], "identical", "sampling.temperature>0"),
    (["engine.max_seq_len=100"], "holds the whole episode", "engine.max_seq_len"),
    (["collector.max_episode_tokens=512"], "holds the whole episode",  # both knobs in one go
     "raise engine.max_seq_len to 513 or more, and trainer.max_seq_len=128 to 512"),
    (["trainer.max_seq_len=64", "trainer.min_seq_bucket=64"], "would be cut",
     "trainer.max_seq_len=128"),
    (["tasks.factory=null"], "no tasks", "tasks.train_file=PATH"),
    (["tasks.train_file=x.jsonl"], "both set", "tasks.factory=null"),
    (["env.factory=agentax.envs:TaskEnvironment"], "belong to the calculator demo",
     "name your agent and tasks"),
    (["env.factory=agentax.envs:TaskEnvironment", "agent.factory=agentax.agents:ModelAgent",
      "tasks.factory=null", "tasks.train_file=x.jsonl"], "needs demonstrations", "sft.steps=0"),
    (["model.vocab_size=1000"], "byte tokenizer", "model.vocab_size=272"),
    (["sft.schedule=linear"], "choose one of 'cosine', 'constant'", ""),
    (["sft.pack=false"], "sft.batch_tokens=2048 needs sft.pack=true", "sft.batch_tokens=0"),
    (["sft.batch_size=64"], "both set", "sft.batch_tokens=0 for 64 demonstrations a step"),
    (["sft.batch_tokens=0"], "set sft.batch_size", "or sft.batch_tokens"),
])
def test_invalid_combinations_give_reason_and_fix(overrides, reason, fix):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert reason in str(err.value) and fix in str(err.value)


def test_sft_schedule_reaches_the_trainer():
    from agentax.run._sft import sft_trainer_config

    demo = sft_trainer_config(load_config(None, []))
    assert demo.decay_steps == 0 and demo.warmup_steps == 10  # the demo: constant after warmup
    cosine = sft_trainer_config(load_config(None, ["sft.schedule=cosine", "sft.steps=100"]))
    assert cosine.decay_steps == 90
    assert (demo.pack_length, demo.min_seq_bucket) == (128, 128)
    # SFT rows are not lengthened to RL's shortest bucket: they stay pack_length long.
    long_rl = sft_trainer_config(load_config(None, ["trainer.max_seq_len=192",
                                                    "trainer.min_seq_bucket=160"]))
    assert (long_rl.pack_length, long_rl.min_seq_bucket) == (128, 128)


def test_fixing_one_field_in_the_same_override_set_is_accepted():
    # Validation sees the merged config, not each override alone.
    cfg = load_config(None, ["engine.max_slots=8", "pipeline.max_concurrency=8",
                             "eval.max_concurrency=8"])
    assert cfg.engine.max_slots == 8


def test_a_paged_cache_lets_episodes_outnumber_slots():
    # Parked episodes hold pages, not slots: 8 decode rows serve 32 episodes in flight.
    for tokens in ("auto", "4096"):
        cfg = load_config(None, ["engine.max_slots=8", f"engine.kv_cache_tokens={tokens}"])
        assert cfg.engine.max_slots == 8 < cfg.pipeline.max_concurrency


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


# ----------------------------------------------------------------------------- seeds


def test_run_seed_derives_the_pipeline_and_trainer_seeds_unless_set():
    cfg = load_config(None, ["run.seed=7"])
    assert (cfg.run.seed, cfg.pipeline.seed, cfg.trainer.seed) == (7, 7, 7)
    explicit = load_config(None, ["run.seed=7", "pipeline.seed=3"])
    assert (explicit.pipeline.seed, explicit.trainer.seed) == (3, 7)
    default = load_config(None, [])
    assert (default.pipeline.seed, default.trainer.seed) == (0, 0)


def test_run_seed_from_yaml_derives_too_and_the_resolved_yaml_keeps_it(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("run:\n  seed: 5\n")
    cfg = load_config(path)
    assert (cfg.pipeline.seed, cfg.trainer.seed) == (5, 5)
    again = tmp_path / "again.yaml"
    again.write_text(dump_config(cfg))
    assert load_config(again) == cfg


# ----------------------------------------------------------------------------- user code


def test_swapping_a_factory_drops_the_old_factorys_kwargs(tmp_path):
    path = tmp_path / "k.yaml"
    path.write_text("tasks:\n  kwargs: {max_digits: 3}\n")
    assert load_config(path).tasks.kwargs == {"max_digits": 3}
    assert load_config(path, ["tasks.factory=a.b:c"]).tasks.kwargs == {}
    same = load_config(path, ["tasks.factory=a.b:c", "tasks.kwargs={n: 1}"])
    assert same.tasks.kwargs == {"n": 1}


def test_run_imports_register_a_user_estimator_before_the_check(tmp_path, monkeypatch):
    (tmp_path / "my_estimators.py").write_text(
        "from agentax import algos\n"
        "def sign(*, rewards_b, loss_mask_bt, **_):\n"
        "    import jax.numpy as jnp\n"
        "    m = jnp.asarray(loss_mask_bt, jnp.float32)\n"
        "    return jnp.sign(rewards_b - 0.5)[:, None] * m, m\n"
        "algos.register_advantage('sign_test', sign, group_based=False, needs_values=False)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="unknown advantage estimator 'sign_test'"):
        load_config(None, ["trainer.advantage=sign_test"])
    cfg = load_config(None, ["run.imports=[my_estimators]", "trainer.advantage=sign_test"])
    assert cfg.trainer.advantage == "sign_test" and not cfg.trainer.uses_value_head
    with pytest.raises(ConfigError, match="run.imports: cannot import 'no_such_mod'"):
        load_config(None, ["run.imports=[no_such_mod]"])


@pytest.fixture
def task_file(tmp_path):
    import json

    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": "a"}) for i in range(4)))
    return path


@pytest.mark.parametrize("override,needle", [
    ("env.factory=agentax.envs.TaskEnvironment", "must name a callable as 'package.module:function'"),
    ("env.factory=no_such_pkg.mod:make", "env.factory: cannot import module 'no_such_pkg.mod'"),
    ("env.factory=agentax.envs:NoSuchEnv", "has no attribute 'NoSuchEnv'"),
    ("env.factory=agentax.envs:__doc__", "not a callable"),
    ("env.factory=agentax.agents:ModelAgent", "expected an agentax.envs.Environment"),
    ("agent.factory=agentax.recipes.calculator:make_env", "expected an agentax.agents.Agent"),
    ("env.kwargs={bogus: 1}", "failed when called with env.kwargs"),
    ("agent.kwargs={bogus: 1}", "failed when called with agent.kwargs"),
    ("env.reward=math_verifi", "Did you mean 'math_verify'"),
    ("sft.demos=agentax.recipes:nope", "has no attribute 'nope'"),
    ("tasks.factory=agentax.recipes.calculator:demos", "tasks.factory"),
])
def test_bad_user_code_fails_in_one_line_before_any_model(override, needle, task_file):
    from agentax.run._build import build_suite_for

    own = ["agent.factory=agentax.agents:ModelAgent", "tasks.factory=null",
           f"tasks.train_file={task_file}", "tasks.num_eval=1", "sft.steps=0"]
    with pytest.raises(ConfigError) as err:
        build_suite_for(load_config(None, [*own, override]))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_tasks_from_jsonl_and_parquet(tmp_path):
    import json

    from agentax.run._build import build_suite_for

    rows = [{"question": f"q{i}", "answer": f"x\n#### {i}", "level": i % 2} for i in range(6)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    base = ["env.factory=agentax.envs:TaskEnvironment", "env.kwargs={reward_fn: exact_match}",
            "agent.factory=agentax.agents:ModelAgent", "tasks.factory=null", "sft.steps=0",
            "tasks.num_eval=2"]
    suite = build_suite_for(load_config(None, [*base, f"tasks.train_file={path}"]))
    assert [t.prompt for t in suite.train_tasks] == ["q0", "q1", "q2", "q3"]
    assert [t.answer for t in suite.eval_tasks] == ["4", "5"]
    assert suite.eval_tasks[1].meta == {"level": 1}
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    ppath = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), ppath)
    again = build_suite_for(load_config(None, [*base, f"tasks.train_file={ppath}"]))
    assert again.train_tasks == suite.train_tasks and again.eval_tasks == suite.eval_tasks
