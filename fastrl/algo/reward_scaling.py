"""Reward scaling by the running standard deviation of the discounted return (PPO's MuJoCo recipe).

Each env keeps its discounted return so far, G_t = gamma * G_{t-1} + r_t (reset to 0 when its
episode ends); the rewards are divided by the running std of G over every env and step, and
clipped. Rewards of a few units per step add up to returns in the hundreds, and the value loss
they produce would otherwise dominate the global gradient-norm clip and starve the policy.
Plain numpy: it runs in the rollout workers, on the rewards as they are written. This is the
reference; fastrl_ext._record.scale_rewards does the same in place on the same state (`returns`,
`moments`), bit for bit, for the native recorder.
"""

from __future__ import annotations

import numpy as np


class ReturnScaler:
    def __init__(self, shape: tuple, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.returns = np.zeros(shape, dtype=np.float64)  # one per env
        # (count, mean, var) of every return seen, in one array so the native path updates it in place;
        # a weak prior (count 1e-4) keeps the first steps' scale near 1
        self.moments = np.array([1e-4, 0.0, 1.0], dtype=np.float64)

    @property
    def count(self) -> float:
        return float(self.moments[0])

    @property
    def mean(self) -> float:
        return float(self.moments[1])

    @property
    def var(self) -> float:
        return float(self.moments[2])

    def _update(self, x: np.ndarray) -> None:
        """Merge the moments of `x` (the parallel variance formula of Chan et al.)."""
        n = x.size
        if n == 0:
            return
        b_mean, b_var = float(x.mean()), float(x.var())
        count, mean, var = self.count, self.mean, self.var
        total = count + n
        delta = b_mean - mean
        self.moments[:] = (total, mean + delta * n / total,
                           (var * count + b_var * n + delta ** 2 * count * n / total) / total)

    def __call__(self, index, rewards: np.ndarray, valid: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Scaled rewards of the envs `index` selects. `valid` is False for envpool's reset steps
        (no reward, not a transition); `done` marks the last step of an episode."""
        ret = self.returns[index]
        ret[:] = np.where(valid, self.gamma * ret + rewards, ret)
        self._update(ret[valid])
        scaled = np.clip(rewards / np.sqrt(self.var + self.eps), -self.clip, self.clip)
        ret[done] = 0.0
        return scaled.astype(np.float32, copy=False)
