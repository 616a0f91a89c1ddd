"""The run directory a user gets: runs/<name>/ with config.json, TensorBoard events,
checkpoints/, train.log and, at the end, summary.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class RunDirError(Exception):
    pass


def generate_name(env_id: str) -> str:
    return f"{env_id.replace('/', '_')}_{time.strftime('%Y%m%d_%H%M%S')}"


def resolve_run_dir(runs_dir: Path, name: str | None, env_id: str, resume: bool) -> Path:
    """Which directory this run uses; refuses, without writing anything, what would overwrite a run."""
    if resume and name is None:
        raise RunDirError("--resume needs --name of the run to continue")
    if name is None:
        name = generate_name(env_id)
        while (runs_dir / name).exists():
            name += "_1"
    run_dir = runs_dir / name
    if resume:
        if not (run_dir / "config.json").exists():
            raise RunDirError(f"--resume: no run at {run_dir} (config.json missing)")
    elif run_dir.exists():
        raise RunDirError(f"run directory {run_dir} already exists; use --resume to continue it or choose another --name")
    return run_dir


def write_run_config(run_dir: Path, config_dict: dict) -> None:
    """Create the run directory (if new) and save the fully resolved config, atomically."""
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.json"
    tmp = config_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    tmp.replace(config_path)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
