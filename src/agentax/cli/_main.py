"""The `agentax` command: train | sft | eval | show | doctor | export | serve | config."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from agentax.config import ConfigError
from agentax.trace import CONFIG_FILENAME

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
    """(yaml path or None, run dir to resume or None).

    A run directory where none is resumed (`sft`, `config`) stands for its config.yaml.
    """
    from agentax.run import is_run_dir
    from agentax.recipes import RECIPES, recipe_path

    if config is None:
        return None, None
    if os.path.isdir(config):
        if is_run_dir(config):
            if allow_run_dir:
                return None, Path(config)
            return os.path.join(config, CONFIG_FILENAME), None
        raise ConfigError(f"{config} is a directory but not a run directory (no "
                          f"{CONFIG_FILENAME}); give a YAML file, a recipe or a run directory")
    if os.path.isfile(config):
        return config, None
    if config in RECIPES:
        return str(recipe_path(config)), None
    raise ConfigError(f"{config!r} is neither a YAML file nor a recipe; recipes: {', '.join(RECIPES)}")


def _file_relative(config: str | None) -> bool | None:
    """False for a run directory (its config.yaml keeps paths as given); None = per file."""
    return False if config is not None and os.path.isdir(config) else None


def _load(args: argparse.Namespace, command: str):
    from agentax.run import is_run_dir, load_config, resolve_config, run_config

    config, overrides = _split(args.args)
    path, resume_dir = _resolve_source(config, allow_run_dir=(command in ("train", "eval")))
    if resume_dir is not None:
        cfg = resolve_config(run_config(resume_dir, overrides))
        return cfg, resume_dir
    cfg = resolve_config(load_config(path, overrides, relative_to_file=_file_relative(config)))
    if path is not None and os.path.basename(path) == CONFIG_FILENAME and is_run_dir(
            os.path.dirname(path) or "."):
        cfg = _fresh_name(cfg)  # another run's config: this command writes a new run dir
    return cfg, None


def _cmd_train(args) -> int:
    from agentax.run import train
    from agentax.train import initialize_distributed, is_main_process

    # Several processes (flags, JAX_COORDINATOR_ADDRESS, or srun): joined before anything
    # touches a device. Process 0 names the run directory; every process uses it.
    several = initialize_distributed(args.coordinator, args.num_processes, args.process_id,
                                     timeout_s=args.join_timeout)
    main_process = is_main_process() if several else True
    results_out = _stdout_for_results() if several else None
    try:
        cfg, resume_dir = _load(args, "train")
        result = train(cfg, resume_dir, resume=resume_dir is not None, quiet=args.quiet)
    except BaseException as e:
        if several:
            from agentax.run import Interrupted
            from agentax.train import fail_job, leave_job

            if isinstance(e, Interrupted):
                # A signal: every process stops at the same step with its checkpoint; telling
                # the others to stop now could cut process 0's rename of that checkpoint short.
                leave_job()
            else:  # the other processes stop now instead of waiting for this one
                fail_job(type(e).__name__)
        raise
    if several:
        from agentax.train import leave_job

        leave_job()
    if main_process:
        _print_summary(dict(result.summary), file=results_out)
    return 0


def _cmd_sft(args) -> int:
    from agentax.run import sft

    cfg, _ = _load(args, "sft")
    sft(cfg, quiet=args.quiet)
    return 0


def _cmd_eval(args) -> int:
    from agentax.run import evaluate, load_run_model

    cfg, source_run = _load(args, "eval")
    model = load_run_model(source_run, cfg) if source_run is not None else None
    if source_run is not None:
        cfg = _fresh_name(cfg)
    result = evaluate(cfg, model=model, quiet=args.quiet)
    _print_summary(dict(result.summary))
    return 0


def _fresh_name(cfg):
    from agentax.config import replace

    return replace(cfg, run=replace(cfg.run, name=""))


def _cmd_doctor(args) -> int:
    from agentax.run import render_timeline_png
    from agentax.trace import doctor

    if not os.path.isdir(args.run_dir):
        raise FileNotFoundError(f"{args.run_dir} is not a directory; give a run directory "
                                "(the folder `agentax train` wrote)")
    report = doctor.analyze(args.run_dir)
    print(doctor.format_report(report))
    if args.timeline:
        print(f"timeline: {render_timeline_png(report)}")
    return 0


def _cmd_export(args) -> int:
    from agentax.run import build_tokenizer, load_run_model
    from agentax.models import save_pretrained

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists; export into a new (or empty) directory, "
                              "or remove it first")
    cfg = _run_dir_config(args.run_dir)
    model = load_run_model(args.run_dir, cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _copy_tokenizer(cfg, out)  # first: save_pretrained adds the token ids to generation_config
    save_pretrained(model, out, tokenizer=build_tokenizer(cfg))
    print(f"exported {args.run_dir} -> {args.out} (Hugging Face safetensors)")
    return 0


def _run_dir_config(run_dir: str):
    from agentax.run import is_run_dir, run_config

    if not is_run_dir(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {CONFIG_FILENAME}); "
                                "give the folder `agentax train` wrote")
    return run_config(run_dir)


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
    from agentax.run import dump_config, load_config
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
    print(dump_config(load_config(path, overrides, relative_to_file=_file_relative(config))),
          end="")
    return 0


def _print_summary(summary: dict, file=None) -> None:
    import json

    keep = {k: summary[k] for k in ("run_dir", "eval_before", "eval_after", "eval", "wall_s")
            if k in summary}
    print(json.dumps(keep, default=str), file=file, flush=True)


def _stdout_for_results():
    """With several processes, native libraries (gloo) print their connection lines on file
    descriptor 1: point it at stderr, so stdout carries only the run's JSON summary, which is
    written to the returned duplicate of the original stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(saved, "w")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="print the full traceback of an error")
    parser = argparse.ArgumentParser(prog="agentax", description="Asynchronous agentic RL in JAX.",
                                     epilog=_EPILOG, parents=[common],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, **kwargs):
        return sub.add_parser(name, parents=[common], **kwargs)

    def with_config(name: str, help_: str):
        p = add(name, help=help_, epilog=_EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("args", nargs="*", metavar="[CONFIG] [section.field=value ...]")
        p.add_argument("-q", "--quiet", action="store_true", help="no live console output")
        return p

    p = with_config("train", "RL training (SFT warm start first if sft.steps > 0); resumes a "
                    "run dir")
    p.set_defaults(fn=_cmd_train)
    p.add_argument("--coordinator", metavar="HOST:PORT",
                   help="several processes (one per host): process 0's address for JAX's "
                   "coordinator (default: JAX_COORDINATOR_ADDRESS, or found under srun)")
    p.add_argument("--num-processes", type=int, metavar="N",
                   help="processes in the job (default: JAX_NUM_PROCESSES)")
    p.add_argument("--process-id", type=int, metavar="I",
                   help="this process's index, 0..N-1 (default: JAX_PROCESS_ID)")
    p.add_argument("--join-timeout", type=float, default=60.0, metavar="S",
                   help="seconds to wait for every process to join before failing with what is "
                   "missing (default: 60)")
    with_config("sft", "supervised warm start only").set_defaults(fn=_cmd_sft)
    with_config("eval", "success rate and reward on held-out tasks (CONFIG may be a run dir)"
                ).set_defaults(fn=_cmd_eval)
    from agentax.cli._show import add_parser as add_show_parser

    add_show_parser(add)
    p = add("doctor", help="explain a run from its trace and metrics")
    p.add_argument("run_dir")
    p.add_argument("--timeline", action="store_true", help="also write RUN_DIR/timeline.png")
    p.set_defaults(fn=_cmd_doctor)
    p = add("export", help="write a run's policy as Hugging Face safetensors")
    p.add_argument("run_dir")
    p.add_argument("out")
    p.set_defaults(fn=_cmd_export)
    from agentax.cli._serve import add_parser as add_serve_parser

    add_serve_parser(sub)
    p = add("config", help="print the resolved config (YAML) or the recipe names")
    p.add_argument("args", nargs="*", metavar="[CONFIG] [section.field=value ...]")
    p.add_argument("--recipes", action="store_true", help="list the shipped recipes")
    p.add_argument("--reference", action="store_true",
                   help="print the config reference (docs/config.md)")
    p.set_defaults(fn=_cmd_config)
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Options may sit anywhere among the positionals (`agentax train RUN -q k=v`)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "args") or any(x.startswith("-") for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.args = [*args.args, *extra]
    return args


# Errors whose message is the whole story: the user's input (a config, a file, a path).
_USER_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, NotADirectoryError,
                IsADirectoryError, PermissionError, ValueError)


def _explains_itself(error: Exception) -> bool:
    """Run failures whose message names the cause and the knob (exit 1, no type name)."""
    from agentax.run import StartupHang

    if isinstance(error, StartupHang):
        return True
    if "agentax.pipeline" in sys.modules:
        from agentax.pipeline import RunFailed

        if isinstance(error, RunFailed):
            return True
    if "agentax.train" in sys.modules:
        from agentax.train import DiskFullError, JoinError, NonFiniteUpdateError

        return isinstance(error, (NonFiniteUpdateError, DiskFullError, JoinError))
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `agentax` script; returns the exit status.

    Every failure is one line on stderr (`agentax CMD: error: ...`) and a non-zero status: 2
    for bad input (config, files, paths), 1 for anything else, 128 + N after signal N (130
    Ctrl-C, 143 SIGTERM). `--debug` prints the traceback instead.
    """
    from agentax.run._console import log_lines
    from agentax.run._signals import Interrupted, received

    args = _parse(argv)
    previous = _install_interrupt_handlers()
    try:
        with log_lines():
            return args.fn(args)
    except Interrupted as e:
        print(f"agentax {args.command}: {e}", file=sys.stderr)
        _release_quietly(e)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"agentax {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into one line
        if getattr(args, "debug", False):
            traceback.print_exc()
        signum = received()
        if signum is not None:  # the interruption surfaced as another error (e.g. from XLA)
            print(f"agentax {args.command}: interrupted by {signal.Signals(signum).name} "
                  f"({type(e).__name__} while stopping)", file=sys.stderr)
            return 128 + signum
        user = isinstance(e, _USER_ERRORS)
        text = " ".join(str(e).split()) or "(no message)"
        plain = user or _explains_itself(e)
        name = "" if plain else f"{type(e).__name__}: "
        debug = getattr(args, "debug", False)
        hint = "" if plain or debug else " (run again with --debug for the traceback)"
        print(f"agentax {args.command}: error: {name}{text}{hint}", file=sys.stderr)
        return 2 if user else 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _release_quietly(error: BaseException) -> None:
    """After the interruption's one line: what the signal cut short (an event loop half
    built, a coroutine never awaited) is freed now, without each object's complaint."""
    import gc
    import warnings

    hook = sys.unraisablehook
    sys.unraisablehook = lambda args: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            error.__traceback__ = None  # the frames the signal cut through, with their locals
            error.__context__ = error.__cause__ = None
            gc.collect()
    finally:
        sys.unraisablehook = hook


def _install_interrupt_handlers() -> dict:
    """SIGINT / SIGTERM raise `Interrupted` (exit 130 / 143 with one line) in every command;
    `agentax train` installs its own around the run (`StopGuard`). Returns the previous ones."""
    import threading

    from agentax.run._signals import _received, interrupt

    _received.clear()  # main() may run more than once in a process (tests, notebooks)
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
