"""Fault-injection envs, for our tests and for users who want to see fastrl survive a bad env.

`fastrl/Faulty-v0` wraps a gymnasium env (CartPole-v1 by default) and, after a number of steps
counted per process, raises an exception, hangs, segfaults in native code, or emits NaN
observations and rewards; `make_delay_s` makes each env slow to make, as hundreds of Atari envs
are. With `fault_dir` set, each fault fires at most `max_faults` times over the whole run (all
processes, replacements included), coordinated through marker files:

    fastrl train --config configs/cartpole.yaml --set env.id=fastrl/Faulty-v0 \\
        --set 'env.kwargs={crash_after: 20000, fault_dir: /tmp/faults}'
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

ENV_ID = "fastrl/Faulty-v0"
_steps_in_process = 0  # shared by every Faulty env of this process


class InjectedFault(RuntimeError):
    """Raised on purpose by a Faulty env."""


class FaultyEnv(gym.Wrapper):
    def __init__(self, base: str = "CartPole-v1", crash_after: int | None = None, hang_after: int | None = None,
                 segfault_after: int | None = None, nan_every: int | None = None, fault_dir: str | None = None,
                 max_faults: int = 1, make_delay_s: float = 0.0):
        time.sleep(make_delay_s)
        super().__init__(gym.make(base))
        self.crash_after, self.hang_after, self.segfault_after = crash_after, hang_after, segfault_after
        self.nan_every = nan_every
        self.fault_dir = None if fault_dir is None else Path(fault_dir)
        self.max_faults = max_faults
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, self.env.observation_space.shape, np.float32)

    def _claim(self, kind: str) -> bool:
        """May this fault fire now? Unlimited without fault_dir; else at most max_faults times per run."""
        if self.fault_dir is None:
            return True
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.max_faults):
            try:
                fd = os.open(self.fault_dir / f"{kind}_{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            os.write(fd, f"pid {os.getpid()} at {time.time():.3f}\n".encode())
            os.close(fd)
            return True
        return False

    def step(self, action):
        global _steps_in_process
        _steps_in_process += 1
        n = _steps_in_process
        if self.crash_after is not None and n == self.crash_after and self._claim("crash"):
            raise InjectedFault(f"injected env crash after {n} steps in pid {os.getpid()}")
        if self.hang_after is not None and n == self.hang_after and self._claim("hang"):
            while True:  # a step that never returns
                time.sleep(3600)
        if self.segfault_after is not None and n == self.segfault_after and self._claim("segfault"):
            ctypes.string_at(0)  # a real SIGSEGV, as a bug in native env code would give
        obs, reward, terminated, truncated, info = self.env.step(action)
        obs = np.asarray(obs, dtype=np.float32)
        if self.nan_every is not None and n % self.nan_every == 0:
            obs = np.full_like(obs, np.nan)
            reward = float("nan")
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return np.asarray(obs, dtype=np.float32), info


def register() -> None:
    if ENV_ID not in gym.envs.registry:
        gym.register(ENV_ID, entry_point=FaultyEnv)
