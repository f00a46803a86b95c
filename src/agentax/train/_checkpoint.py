"""Orbax checkpoints of a trainer: params, optimizer state, RNG, step, data position, version.

Layout: `DIR/step_<N>/state` (an Orbax StandardCheckpointer pytree) and
`DIR/step_<N>/meta.json` (counters, the model config, the LoRA setup and, optionally, the
caller's `run` record). Restoring checks the metadata first, so a checkpoint from a different
model fails with a message naming the mismatched fields instead of an opaque shape error;
arrays are restored onto the shardings of the live trainer (so a checkpoint written on 8
devices restores on 1 and vice versa).

Crash safety: a checkpoint is written under a temporary name (`DIR/.tmp-step_<N>-<pid>`),
flushed to disk, and renamed to `step_<N>` only when complete, so every `step_<N>` directory
is complete and a process killed mid-save leaves only a temporary directory (removed by the
next save). Replacing an existing `step_<N>` renames it aside to `step_<N>.replaced` first
and deletes it only after the new one is in place; a kill between the two renames leaves the
old one, which `checkpoint_steps` renames back. Nothing here deletes another step.

Disk space: a save first checks that the folder's file system has room for the checkpoint
(the state's bytes plus a margin) and raises `DiskFullError` — naming the folder, the bytes
needed and the bytes free — before writing anything; a save that still runs out of space
(another writer filled the disk meanwhile) removes its temporary directory and raises the same.
Either way the previous checkpoints are untouched, so the run stays resumable.

Several processes (`jax.distributed`): every process calls save and restore (they are
collectives). Process 0 prepares the folder, checks the space and names the temporary
directory (its pid), and every process learns the outcome before any writes; all processes
then write their own shards of the state into that one directory with Orbax's multi-host
save; process 0 alone writes meta.json and renames, and every process returns only once the
checkpoint is in place. A restore reads the step process 0 picks. The shards are resharded on
restore, so a checkpoint written by 2 processes restores in 1 and vice versa.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import sys
import threading
import warnings
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from agentax.train._distributed import broadcast_from_main, is_main_process, sync

__all__ = ["DamagedCheckpointError", "DiskFullError", "check_space", "checkpoint_bytes",
           "checkpoint_steps", "latest_checkpoint_step",
           "read_checkpoint_meta", "restore_trainer_checkpoint", "save_trainer_checkpoint"]

_STEP_DIR = re.compile(r"^step_(\d+)$")
_REPLACED = ".replaced"
_TMP_PREFIX = ".tmp-step_"


class DamagedCheckpointError(ValueError):
    """A checkpoint directory exists but cannot be read (truncated or corrupted files)."""


class DiskFullError(OSError):
    """There is not enough disk space for a checkpoint; the message names the folder, the
    bytes needed and the bytes free. Nothing was left behind."""

    def __init__(self, directory: Path, need: int, free: int | None):
        have = "" if free is None else f", {_mb(free)} free"
        super().__init__(errno.ENOSPC, f"no space for a checkpoint in {directory}: it needs "
                                       f"up to {_mb(need)}{have}; free disk space there (or "
                                       "move run.runs_dir) and resume")
        self.directory, self.need, self.free = directory, need, free

    def __str__(self) -> str:
        return self.strerror


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


_MARGIN = 1.05  # Orbax's metadata and OCDBT's index on top of the arrays
_MARGIN_BYTES = 1 << 20


def checkpoint_bytes(trainer) -> int:
    """About how many bytes `save_trainer_checkpoint(trainer, ...)` writes."""
    leaves = jax.tree.leaves(trainer._checkpoint_state())
    return int(sum(getattr(x, "nbytes", 0) for x in leaves) * _MARGIN) + _MARGIN_BYTES


def check_space(directory, need: int) -> None:
    """Raises `DiskFullError` if the file system of `directory` has less than `need` bytes."""
    d = Path(directory).absolute()
    probe = d
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:  # cannot tell: let the write find out
        return
    if free < need:
        raise DiskFullError(d, need, free)


def _out_of_space(error: BaseException) -> bool:
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(error)
        if "No space left" in text or "RESOURCE_EXHAUSTED" in text or "quota" in text.lower():
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def _held_stderr():
    """Holds what is written to file descriptor 2 while Orbax saves; yields a list that gets
    the bytes. On a full disk Orbax's writer threads print a traceback per failed chunk
    (hundreds of lines) straight to the descriptor, around the one error the caller gets;
    the caller re-emits the bytes unless the save failed for lack of space."""
    try:
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no descriptor 2 to hold
        yield []
        return
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            data = os.read(read_end, 65536)
            if not data:
                return
            chunks.append(data)

    os.dup2(write_end, 2)
    os.close(write_end)
    reader = threading.Thread(target=drain, name="agentax-checkpoint-stderr", daemon=True)
    reader.start()
    try:
        yield chunks
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes: the reader ends
        os.close(saved)
        reader.join(5.0)
        os.close(read_end)


def _is_closed_loop_error(exc_type, exc, tb) -> bool:
    if exc_type is not RuntimeError or str(exc) != "Event loop is closed":
        return False
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name == "_check_closed"


def _drop_late_orbax_errors() -> None:
    """After a failed save, the storage library's pending writes still complete one by one,
    each calling back into Orbax's event loop, already closed: one "Event loop is closed"
    traceback each (dozens), printed through `sys.excepthook` or `threading.excepthook` as
    they come, also while the save is returning (CI saw the tail of one),
    and Orbax logs each failed commit. From then on exactly those are dropped (and Orbax's
    logs below CRITICAL): the caller raises `DiskFullError`, which says it all."""
    # Their late "failed to commit" logs, and asyncio's "exception was never retrieved" for
    # Orbax's abandoned write futures (logged when they are collected), repeat it too.
    # concurrent.futures: "exception calling callback" of an executor future chained into
    # the closed loop, printed line by line from the finishing thread.
    for name in ("absl", "orbax", "asyncio", "concurrent.futures"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # ...and, at exit, "coroutine ... was never awaited" for the writes that never ran.
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited",
                            category=RuntimeWarning)
    _drop_closed_loop_tracebacks()


def _drop_closed_loop_tracebacks() -> None:
    """Installs (once) excepthooks that drop exactly the "Event loop is closed" tracebacks of
    late callbacks into a closed loop (`_is_closed_loop_error`); every other error still
    prints. Installed before a save begins: a write thread may print one while the save is
    failing, half into the held stderr and half out."""
    previous = sys.excepthook
    if getattr(previous, "_agentax_drops_closed_loop", False):
        return

    def hook(exc_type, exc, tb):
        if not _is_closed_loop_error(exc_type, exc, tb):
            previous(exc_type, exc, tb)

    hook._agentax_drops_closed_loop = True  # type: ignore[attr-defined]
    sys.excepthook = hook
    previous_unraisable = sys.unraisablehook

    def unraisable(args):
        if not _is_closed_loop_error(args.exc_type, args.exc_value, args.exc_traceback):
            previous_unraisable(args)

    sys.unraisablehook = unraisable
    previous_thread = threading.excepthook

    def thread_hook(args):  # a write thread's own callback into the closed loop
        if not _is_closed_loop_error(args.exc_type, args.exc_value, args.exc_traceback):
            previous_thread(args)

    threading.excepthook = thread_hook


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax logs each failed background write with a traceback (absl ERROR); the failure
    reaches the caller as one exception, so those logs only repeat it."""
    loggers = [logging.getLogger(n) for n in ("absl", "orbax")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _fsync_tree(path: Path) -> None:
    """Flushes every file under `path`, then the directories, to disk (power-loss safety)."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _recover_replaced(d: Path) -> None:
    """Renames back a `step_N.replaced` whose replacement never arrived (killed mid-swap).
    Only process 0 renames (the others read what it picked: `restore_trainer_checkpoint`)."""
    if not is_main_process():
        return
    for p in d.iterdir():
        if p.name.endswith(_REPLACED) and _STEP_DIR.match(p.name[: -len(_REPLACED)]):
            final = d / p.name[: -len(_REPLACED)]
            if final.exists():
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.rename(p, final)


def checkpoint_steps(directory) -> list[int]:
    """The N of every `DIR/step_N` that has a meta.json, ascending (empty when none)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    _recover_replaced(d)
    return sorted(int(m.group(1)) for p in d.iterdir() if (m := _STEP_DIR.match(p.name))
                  and (p / "meta.json").is_file())


def latest_checkpoint_step(directory) -> int | None:
    """The largest N with a complete DIR/step_N checkpoint, or None."""
    steps = checkpoint_steps(directory)
    return steps[-1] if steps else None


def read_checkpoint_meta(path) -> dict:
    """meta.json of the checkpoint directory `path` (`DIR/step_N`).

    Raises:
      DamagedCheckpointError: it is missing or not a JSON object.
    """
    file = Path(path) / "meta.json"
    try:
        meta = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DamagedCheckpointError(f"{file} cannot be read ({e}); delete {Path(path)} to "
                                     "fall back to the previous checkpoint") from None
    if not isinstance(meta, dict) or "kind" not in meta:
        raise DamagedCheckpointError(f"{file} is not a checkpoint's meta.json; delete "
                                     f"{Path(path)} to fall back to the previous checkpoint")
    return meta


def save_trainer_checkpoint(trainer, directory, step: int, *, run: dict | None = None) -> Path:
    """Writes `trainer`'s state to `directory/step_<step>` atomically (see module docstring).

    `run` is stored as meta.json's "run" record (the caller's position: pipeline step, data
    position, log offsets); `read_checkpoint_meta(path)["run"]` gives it back.
    """
    d = Path(directory).absolute()
    final = d / f"step_{int(step)}"
    need = checkpoint_bytes(trainer)
    tmp = _prepare(d, int(step), need)
    try:
        ckptr = ocp.StandardCheckpointer()
        failed: BaseException | None = None
        _drop_closed_loop_tracebacks()
        with _held_stderr() as held:
            try:
                with _quiet_orbax():
                    ckptr.save(tmp / "state", trainer._checkpoint_state())
                    ckptr.wait_until_finished()
            except BaseException as e:  # noqa: BLE001 - re-raised below, after stderr is back
                failed = e
                if _out_of_space(e):  # before stderr is back: a late write's traceback could
                    _drop_late_orbax_errors()  # slip out between the two (CI saw one)
            finally:
                with _quiet_orbax(), contextlib.suppress(Exception):
                    ckptr.close()
        if held and not (failed is not None and _out_of_space(failed)):
            os.write(2, b"".join(held))
        if failed is not None:
            raise failed
        meta = trainer._checkpoint_meta()
        if run is not None:
            meta["run"] = run
        if is_main_process():
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            _fsync_tree(tmp)
    except Exception as e:
        if not _out_of_space(e):
            raise
        _drop_late_orbax_errors()
        shutil.rmtree(tmp, ignore_errors=True)
        free = None
        with contextlib.suppress(OSError):
            free = shutil.disk_usage(d).free
        raise DiskFullError(d, need, free) from e
    if is_main_process():
        _swap_in(d, tmp, final)
    sync(f"checkpoint-saved-{int(step)}")  # nobody reads it before it is there
    return final


def _prepare(d: Path, step: int, need: int) -> Path:
    """Process 0 makes the folder, removes killed writers' leftovers, checks the space and
    creates the temporary directory; every process gets its path, or the same error."""
    outcome: tuple = ("ok", None)
    error: OSError | None = None
    if is_main_process():
        try:
            d.mkdir(parents=True, exist_ok=True)
            for stale in d.glob(_TMP_PREFIX + "*"):  # left by a writer that was killed
                shutil.rmtree(stale, ignore_errors=True)
            check_space(d, need)
            tmp = d / f"{_TMP_PREFIX}{step}-{os.getpid()}"
            tmp.mkdir()
            outcome = ("ok", tmp.name)
        except DiskFullError as e:
            error, outcome = e, ("disk_full", e.free)
        except OSError as e:
            error, outcome = e, ("error", f"{type(e).__name__}: {e}")
    kind, value = broadcast_from_main(outcome)
    if error is not None:
        raise error
    if kind == "disk_full":
        raise DiskFullError(d, need, value)
    if kind == "error":
        raise OSError(f"cannot prepare a checkpoint in {d} ({value})")
    return d / value


def _swap_in(d: Path, tmp: Path, final: Path) -> None:
    """Renames the complete `tmp` to `final` (replacing an old one safely)."""
    if final.exists():
        aside = d / (final.name + _REPLACED)
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
        os.rename(tmp, final)
        _fsync_dir(d)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(tmp, final)
        _fsync_dir(d)


def _diff(saved: dict, live: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(saved) | set(live)):
        a, b = saved.get(k), live.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: checkpoint={a!r} trainer={b!r}")
    return out


def restore_trainer_checkpoint(trainer, directory, step: int | None = None) -> int:
    """Loads `directory/step_<step>` (default: the newest) into `trainer`; returns the step.

    Raises:
      FileNotFoundError: no such checkpoint.
      ValueError: it was written by a different model / LoRA setup / trainer kind.
      DamagedCheckpointError: its files cannot be read.
    """
    d = Path(directory).absolute()
    if step is None:
        step = broadcast_from_main(latest_checkpoint_step(d))  # every process the same one
        if step is None:
            raise FileNotFoundError(f"no checkpoint (step_N/meta.json) under {d}")
    path = d / f"step_{int(step)}"
    if not (path / "meta.json").exists():
        raise FileNotFoundError(f"no checkpoint at {path} (missing meta.json)")
    meta = read_checkpoint_meta(path)
    live = trainer._checkpoint_meta()
    problems = _diff({k: meta.get(k) for k in ("kind", "model_config", "lora")},
                     {k: live[k] for k in ("kind", "model_config", "lora")})
    if problems:
        raise ValueError(f"checkpoint {path} does not fit this trainer: "
                         + "; ".join(problems[:6])
                         + " — build the trainer with the model/LoRA config it was saved from")
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, trainer._checkpoint_state())
    ckptr = ocp.StandardCheckpointer()
    try:
        state = ckptr.restore(path / "state", target)
    except (ValueError, KeyError) as e:
        raise DamagedCheckpointError(
            f"checkpoint {path / 'state'} cannot be restored into this trainer "
            f"({' '.join(str(e).split())[:200]}): it is damaged (delete {path} to fall back to "
            "the previous checkpoint) or was saved with a different trainer config") from None
    except Exception as e:  # noqa: BLE001 - tensorstore/OS errors of damaged files
        raise DamagedCheckpointError(
            f"checkpoint {path / 'state'} cannot be read ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:200]}); delete {path} to fall back to the previous "
            "checkpoint") from None
    finally:
        ckptr.close()
    trainer._load_checkpoint(state, meta)
    return int(step)
