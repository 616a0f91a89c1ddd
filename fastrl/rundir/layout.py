"""The run directory a user gets: runs/<name>/ with config.json, TensorBoard events,
checkpoints/, train.log, run.lock (the pid of the `fastrl train` that holds it), episodes.json
(fastrl.rundir.episodes) and, at the end, summary.json.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import IO

LOCK_NAME = "run.lock"


class RunDirError(Exception):
    pass


def generate_name(env_id: str) -> str:
    return f"{env_id.replace('/', '_')}_{time.strftime('%Y%m%d_%H%M%S')}"


def resolve_run_dir(runs_dir: Path, name: str | None, env_id: str, resume: bool) -> Path:
    """Which directory this run uses, without writing anything. A fresh run's must not exist yet:
    claim_run_dir checks that as it makes it, in the one step that cannot race another start."""
    if resume and name is None:
        raise RunDirError("--resume needs --name of the run to continue")
    if name is None:
        name = generate_name(env_id)
        while (runs_dir / name).exists():
            name += "_1"
    run_dir = runs_dir / name
    if resume and not (run_dir / "config.json").exists():
        raise RunDirError(f"--resume: no run at {run_dir} (config.json missing)")
    return run_dir


def claim_run_dir(run_dir: Path, resume: bool) -> IO[str]:
    """Hold `run_dir` for this process until the returned file is closed or the process ends.

    Without it, a `--resume` started while the run was still going (a second terminal) trained
    beside it into the same directory: two writers of its checkpoints and metrics, and, before
    the first checkpoint, a second network from scratch. The hold is an exclusive flock, which
    the kernel releases however the holder ends (kill -9 included), so it never goes stale. A
    fresh run makes its directory here, exclusively: two fresh runs of one --name cannot both
    have it."""
    if not resume:
        try:
            run_dir.mkdir(parents=True)
        except FileExistsError:
            raise RunDirError(f"run directory {run_dir} already exists; use --resume to continue it "
                              "or choose another --name") from None
        except OSError as e:  # --runs-dir is a file, on a read-only or full file system, ...
            raise RunDirError(f"cannot make run directory {run_dir}: {e}") from None
    lock = None
    try:
        lock = open(run_dir / LOCK_NAME, "a+")
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(lock.fileno(), 0)
        os.write(lock.fileno(), f"{os.getpid()}\n".encode())  # unbuffered: a failure shows here, not at close
        return lock
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise RunDirError(f"run directory {run_dir} is in use by another fastrl train (pid {holder}); "
                          "stop that one first, or choose another --name") from None
    except OSError as e:  # a full disk
        if lock is not None:
            lock.close()
        if not resume:
            abandon_fresh_run_dir(run_dir)
        raise RunDirError(f"cannot write in run directory {run_dir}: {e}") from None


def abandon_fresh_run_dir(run_dir: Path) -> None:
    """Remove the directory a fresh run made before it could write its config (a full disk): left
    there, it would make the same command, once there is room, fail with "already exists"."""
    shutil.rmtree(run_dir, ignore_errors=True)


def write_run_config(run_dir: Path, config_dict: dict) -> None:
    """Create the run directory (if new) and save the fully resolved config, atomically."""
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "config.json", config_dict, sort_keys=True)
    except OSError as e:  # a full disk
        raise RunDirError(f"cannot write the run's config into {run_dir}: {e}") from None


def write_json(path: Path, data: dict, sort_keys: bool = False, indent: int | None = 2) -> None:
    """`data` as JSON at `path`, whole or not at all (a temp file renamed into place)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=indent, sort_keys=sort_keys) + "\n")
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # no half-written file left beside the run's (a full disk)
        raise
