"""Running the real `fastrl` command in a subprocess and checking what it leaves behind; small env specs
for learner tests that need no env."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from fastrl.config.checks import samples_per_slot
from fastrl.config.loader import config_from_dict
from fastrl.envs.spec import EnvSpec

ROOT = Path(__file__).resolve().parents[1]
# Stand-ins for the presets' envs at a fraction of their size: Pong's uint8 frame stack (2 frames of 36x36,
# 3 actions) for the Nature CNN, and HalfCheetah's Gaussian policy (5 observations, 2 actions in [-1, 1])
TINY_FRAMES = EnvSpec("Tiny-frames", "envpool", (2, 36, 36), np.dtype(np.uint8), True, 3)
TINY_CHEETAH = EnvSpec("Tiny-cheetah", "envpool", (5,), np.dtype(np.float32), False, 2, (-1.0,) * 2, (1.0,) * 2)
# The presets' own shapes, for tests that time or compare the real networks without making an env
PONG = EnvSpec("Pong-v5", "envpool", (4, 84, 84), np.dtype(np.uint8), True, 6, frames_per_env_step=4)
HALFCHEETAH = EnvSpec("HalfCheetah-v5", "envpool", (17,), np.dtype(np.float32), False, 6, (-1.0,) * 6, (1.0,) * 6)
# A small discrete vector env (4 observations, 3 actions) for the acting and recording paths
SMALL_DISCRETE = EnvSpec("Discrete-v0", "envpool", (4,), np.dtype(np.float32), True, 3)
# observation columns 2..6 hold an action mask of its 5 actions (> 0.5: allowed), as a Dict's "action_mask" flattens
MASKED_DISCRETE = EnvSpec("Masked-v0", "envpool", (9,), np.dtype(np.float32), True, 5, action_mask=(2, 5))
# two discrete choices at once, of 3 and 4 options (EnvSpec.action_nvec), from 6 observations
TWO_CHOICES = EnvSpec("Choices-v0", "envpool", (6,), np.dtype(np.float32), True, 7, (0, 0), action_nvec=(3, 4))
# the same choices with a mask over all 7 logits in observation columns 1..7 (Connector's one row per agent)
MASKED_CHOICES = EnvSpec("MaskedChoices-v0", "envpool", (10,), np.dtype(np.float32), True, 7, (0, 0),
                         action_nvec=(3, 4), action_mask=(1, 7))


def assert_same_steps_up_to_rounding(expected: list, got: list, lr: float, rtol: float, atol: float,
                                     max_flipped_fraction: float = 0.01) -> None:
    """Weights after the same optimizer steps taken two ways that differ only in rounding (summation order,
    a clip's divide for a multiply): every element within rtol/atol, except that a rounding can switch a
    ReLU whose input sits at 0, after which that unit's gradient differs by a whole sample's term and
    Adam turns it into a step of up to lr. So at most `max_flipped_fraction` of the elements may differ
    more, each by less than one step (lr). Seen on an AMX Xeon: relative gradient noise of 1e-7 moved a
    reference run's weights by 6e-5, with lr 2.5e-4; the two ways agree to 3e-8 elsewhere."""
    import torch

    total = sum(e.numel() for e in expected)
    outside = sum(int((~torch.isclose(e, g.detach(), rtol=rtol, atol=atol)).sum()) for e, g in zip(expected, got))
    worst = max(float((e - g.detach()).abs().max()) for e, g in zip(expected, got))
    assert outside <= max_flipped_fraction * total and worst < lr, (outside, total, worst, lr)


def load_bench_script(name: str):
    """bench/<name>.py as a module: the scripts are not a package, and their tests check their pure parts."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def modules_load_torch(*modules: str) -> bool:
    """Whether importing `modules` in a fresh interpreter loads torch (~2 s a process that does)."""
    code = f"import sys, {', '.join(modules)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() in ("True", "False"), out.stdout + out.stderr
    return out.stdout.strip() == "True"


class RunProcess:
    """`python -m fastrl train ...` (or another command) with its output collected and its children tracked.
    One still running when its test ends, which a failed assertion leaves so, is killed then (conftest.py)."""

    started: list["RunProcess"] = []

    def __init__(self, *args: str, runs_dir: Path | None = None, name: str = "run", env: dict | None = None,
                 command: str = "train"):
        self.run_dir = None if runs_dir is None else runs_dir / name
        cmd = [sys.executable, "-m", "fastrl", command, *args]
        if command == "train":
            cmd[4:4] = ["--runs-dir", str(runs_dir), "--name", name]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                     env=None if env is None else {**os.environ, **env})
        self.lines: list[str] = []
        self.children: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        RunProcess.started.append(self)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def track_children(self) -> None:
        try:
            self.children |= {c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def child_names(self) -> set[str]:
        self.track_children()
        names = set()
        for pid in self.children:
            try:
                names.add(psutil.Process(pid).name())
            except psutil.NoSuchProcess:
                pass
        return names

    def wait_for_child_names(self, prefixes: set[str], timeout_s: float) -> set[str]:
        """The children's names once every prefix is among them (or at the timeout). A child names
        itself only after its imports: the learner's take ~2.5 CPU-s, and samples can flow before."""
        deadline = time.monotonic() + timeout_s
        while True:
            names = self.child_names()
            if all(any(n.startswith(p) for n in names) for p in prefixes) or time.monotonic() > deadline:
                return names
            time.sleep(0.2)

    def wait_for(self, text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.track_children()
            if text in self.output:
                return True
            if self.proc.poll() is not None:
                return text in self.output
            time.sleep(0.2)
        return False

    def wait(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.track_children()
            time.sleep(0.2)
        if self.proc.poll() is None:
            self.proc.kill()
            raise AssertionError(f"run did not finish within {timeout_s} s; output:\n{self.output}")
        self._reader.join(5)
        if not self._reader.is_alive():
            self.proc.stdout.close()  # read to its end; the pipe would otherwise close only when collected
        return self.proc.returncode

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def assert_stopped_at_env_step_target(self, races: int = 0) -> None:
        """The run counted its train_for_env_steps and at most a slot per rollout worker more (each worker
        steps no further once a hand-over of its own finds the count there), plus `races` slots per
        worker for hand-overs that coincided (each worker adds to its own count, then reads the others',
        and a store may not yet be seen by the other side's read)."""
        cfg = config_from_dict(json.loads((self.run_dir / "config.json").read_text()))
        summary, target, slot_env_steps = self.summary(), cfg.run.train_for_env_steps, samples_per_slot(cfg)
        assert summary["stop_reason"] == f"reached train_for_env_steps={target:,}", summary
        assert target <= summary["env_steps"] < target + (1 + races) * cfg.sampler.num_rollout_workers * slot_env_steps, \
            (summary["env_steps"], target, slot_env_steps)

    def leftover_children(self, grace_s: float = 3.0) -> list[int]:
        """Children still running `grace_s` after the run exited. The grace is for multiprocessing's
        resource tracker, which exits once it reads EOF from the parent's pipe: on a loaded box that
        can come a moment after the parent's exit (seen once in ~10 SIGTERM runs beside a training run)."""
        deadline = time.monotonic() + grace_s
        while True:
            alive = []
            for pid in self.children:
                try:
                    p = psutil.Process(pid)
                    if p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(pid)
                except psutil.NoSuchProcess:
                    pass
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.1)

    def leftover_segments(self) -> list[str]:
        return [p.name for p in Path("/dev/shm").glob(f"fastrl.{self.proc.pid}.*")]
