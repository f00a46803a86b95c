"""The `agentax` command: train | sft | eval | doctor | export | serve | config."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from agentax.config import ConfigError

__all__ = ["main"]

_EPILOG = """\
CONFIG is a YAML file, a shipped recipe name (see `agentax config --recipes`), or (train only)
a run directory to resume. Overrides are section.field=value, e.g.
  agentax train pipeline.mode=sync trainer.learning_rate=1e-3 run.steps=40
With no CONFIG, `agentax train` runs the embedded CPU demo (calculator tool task).
"""


def _split(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The optional CONFIG positional and the overrides."""
    args = list(args)
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _resolve_source(config: str | None, *, allow_run_dir: bool):
    """(yaml path or None, run dir to resume or None)."""
    from agentax.cli._rundir import is_run_dir
    from agentax.recipes import RECIPES, recipe_path

    if config is None:
        return None, None
    if os.path.isdir(config):
        if allow_run_dir and is_run_dir(config):
            return None, Path(config)
        raise ConfigError(f"{config} is a directory but not a run directory (no config.yaml)")
    if os.path.isfile(config):
        return config, None
    if config in RECIPES:
        return str(recipe_path(config)), None
    raise ConfigError(f"{config!r} is neither a YAML file nor a recipe; recipes: {', '.join(RECIPES)}")


def _load(args: argparse.Namespace, command: str):
    from agentax.cli._build import resolve_config
    from agentax.cli._config import load_config
    from agentax.cli._rundir import make_run_dir, run_config

    config, overrides = _split(args.args)
    path, resume_dir = _resolve_source(config, allow_run_dir=(command in ("train", "eval")))
    if resume_dir is not None:
        cfg = resolve_config(run_config(resume_dir, overrides))
        return cfg, resume_dir
    cfg = resolve_config(load_config(path, overrides))
    return cfg, None


def _cmd_train(args) -> int:
    from agentax.cli._rundir import make_run_dir
    from agentax.cli._runner import run_train

    cfg, resume_dir = _load(args, "train")
    run_dir = resume_dir or make_run_dir(cfg, "train")
    summary = run_train(cfg, run_dir, resume=resume_dir is not None, quiet=args.quiet)
    _print_summary(summary)
    return 0


def _cmd_sft(args) -> int:
    from agentax.cli._rundir import make_run_dir
    from agentax.cli._runner import run_sft

    cfg, _ = _load(args, "sft")
    run_sft(cfg, make_run_dir(cfg, "sft"), quiet=args.quiet)
    return 0


def _cmd_eval(args) -> int:
    from agentax.cli._build import load_run_model
    from agentax.cli._rundir import make_run_dir
    from agentax.cli._runner import run_eval

    cfg, source_run = _load(args, "eval")
    model = load_run_model(source_run, cfg) if source_run is not None else None
    if source_run is not None:
        cfg = _fresh_name(cfg)
    summary = run_eval(cfg, make_run_dir(cfg, "eval"), model=model, quiet=args.quiet)
    _print_summary(summary)
    return 0


def _fresh_name(cfg):
    from agentax.config import replace

    return replace(cfg, run=replace(cfg.run, name=""))


def _cmd_doctor(args) -> int:
    from agentax.trace import doctor

    report = doctor.analyze(args.run_dir)
    print(doctor.format_report(report))
    if args.timeline:
        print(f"timeline: {doctor.render_timeline_png(report)}")
    return 0


def _cmd_export(args) -> int:
    from agentax.cli._build import build_tokenizer, load_run_model
    from agentax.cli._rundir import run_config
    from agentax.models import save_pretrained

    cfg = run_config(args.run_dir)
    model = load_run_model(args.run_dir, cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _copy_tokenizer(cfg, out)  # first: save_pretrained adds the token ids to generation_config
    save_pretrained(model, out, tokenizer=build_tokenizer(cfg))
    print(f"exported {args.run_dir} -> {args.out} (Hugging Face safetensors)")
    return 0


def _copy_tokenizer(cfg, out: Path) -> None:
    import shutil

    src = cfg.init.tokenizer_source
    if src == "byte" or not os.path.isdir(src):
        return
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json", "chat_template.jinja"):
        if os.path.isfile(os.path.join(src, name)) and not (out / name).exists():
            shutil.copy(os.path.join(src, name), out / name)


def _cmd_config(args) -> int:
    from agentax.cli._config import dump_config, load_config
    from agentax.recipes import RECIPES

    if args.recipes:
        print("\n".join(RECIPES))
        return 0
    if args.reference:
        from agentax.cli._docs import config_reference

        print(config_reference(), end="")
        return 0
    config, overrides = _split(args.args)
    path, _ = _resolve_source(config, allow_run_dir=False)
    print(dump_config(load_config(path, overrides)), end="")
    return 0


def _print_summary(summary: dict) -> None:
    import json

    keep = {k: summary[k] for k in ("run_dir", "eval_before", "eval_after", "eval", "wall_s")
            if k in summary}
    print(json.dumps(keep, default=str))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentax", description="Asynchronous agentic RL in JAX.",
                                     epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(name: str, help_: str):
        p = sub.add_parser(name, help=help_, epilog=_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("args", nargs="*", metavar="[CONFIG] [section.field=value ...]")
        p.add_argument("-q", "--quiet", action="store_true", help="no live console output")
        return p

    with_config("train", "RL training (SFT warm start first if sft.steps > 0); resumes a run dir"
                ).set_defaults(fn=_cmd_train)
    with_config("sft", "supervised warm start only").set_defaults(fn=_cmd_sft)
    with_config("eval", "success rate and reward on held-out tasks (CONFIG may be a run dir)"
                ).set_defaults(fn=_cmd_eval)
    p = sub.add_parser("doctor", help="explain a run from its trace and metrics")
    p.add_argument("run_dir")
    p.add_argument("--timeline", action="store_true", help="also write RUN_DIR/timeline.png")
    p.set_defaults(fn=_cmd_doctor)
    p = sub.add_parser("export", help="write a run's policy as Hugging Face safetensors")
    p.add_argument("run_dir")
    p.add_argument("out")
    p.set_defaults(fn=_cmd_export)
    from agentax.cli._serve import add_parser as add_serve_parser

    add_serve_parser(sub)
    p = sub.add_parser("config", help="print the resolved config (YAML) or the recipe names")
    p.add_argument("args", nargs="*", metavar="[CONFIG] [section.field=value ...]")
    p.add_argument("--recipes", action="store_true", help="list the shipped recipes")
    p.add_argument("--reference", action="store_true",
                   help="print the config reference (docs/config.md)")
    p.set_defaults(fn=_cmd_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `agentax` script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"agentax {args.command}: error: {e}", file=sys.stderr)
        return 2
