"""Checkpoints: written to a temp file and renamed into place, so a reader never sees half a file;
loaded with `weights_only=True`, so a checkpoint can never run code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PATTERN = re.compile(r"^checkpoint_(\d{12})\.pt$")


def checkpoint_path(ckpt_dir: Path, train_steps: int) -> Path:
    return ckpt_dir / f"checkpoint_{train_steps:012d}.pt"


def save_checkpoint(ckpt_dir: Path, state: dict, keep: int) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(ckpt_dir, int(state["train_steps"]))
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    import torch  # here, not at the top: `fastrl train` reaches its first sample sooner without it

    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except (OSError, RuntimeError) as e:
        # a full disk: the partial file would hold the very space the run's other writes need, and
        # torch's own error ("unexpected pos ...") hides the OSError that caused it
        tmp.unlink(missing_ok=True)
        newest = latest_checkpoint(ckpt_dir)
        raise CheckpointWriteError(f"could not write {final}: {_root_cause(e)}; the partial file was removed; "
                                   + (f"the newest complete checkpoint is {newest}" if newest
                                      else "there is no complete checkpoint yet")) from e
    for old in list_checkpoints(ckpt_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return final


class CheckpointWriteError(RuntimeError):
    """A checkpoint that could not be written (its partial file removed): one line saying why."""


def _root_cause(error: BaseException) -> BaseException:
    """The OSError behind `error` where there is one (torch wraps a failed write in its own error)."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return error


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if PATTERN.match(p.name) and p.is_file())


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


REQUIRED_KEYS = ("model", "optimizer", "policy_version", "train_steps", "env_steps")


class CheckpointError(Exception):
    """A checkpoint that cannot be used: one line saying why."""


def validate_checkpoint(path: Path, model: torch.nn.Module) -> dict:
    """Load `path` safely and check it fits `model`; CheckpointError (one line) otherwise."""
    import pickle
    import zipfile

    try:
        state = load_checkpoint(path)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"refusing {path}: it holds more than tensors and plain data, which could run "
                              f"code on load (weights_only): {first}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} is truncated or corrupt: {first}") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
        raise CheckpointError(f"{path} is not a fastrl checkpoint (missing {', '.join(missing)})")
    try:
        model.load_state_dict(state["model"], strict=True)
    except (RuntimeError, TypeError, AttributeError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = lines[1] if len(lines) > 1 else (lines[0] if lines else type(e).__name__)
        raise CheckpointError(f"{path} does not fit this model (another env or model config?): {detail}") from None
    return state


def remove_partial_files(ckpt_dir: Path) -> list[Path]:
    """Temp files of saves that were killed before the rename; never read, safe to delete when no run is live."""
    partial = list(ckpt_dir.glob(".checkpoint_*.tmp-*")) if ckpt_dir.is_dir() else []
    for p in partial:
        p.unlink(missing_ok=True)
    return partial
