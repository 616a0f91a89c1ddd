"""Checkpoints: written to a temp file and renamed into place, so a reader never sees half a file;
loaded with `weights_only=True`, so a checkpoint can never run code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

PATTERN = re.compile(r"^checkpoint_(\d{12})\.pt$")


def checkpoint_path(ckpt_dir: Path, train_steps: int) -> Path:
    return ckpt_dir / f"checkpoint_{train_steps:012d}.pt"


def save_checkpoint(ckpt_dir: Path, state: dict, keep: int) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(ckpt_dir, int(state["train_steps"]))
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    for old in list_checkpoints(ckpt_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if PATTERN.match(p.name))


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)
