"""The policy's actions as the env takes them.

A policy acts in its own terms: a 0-based index per categorical (one per choice, or one over every
combination of the choices where the env's action mask is joint: EnvSpec.action_joint), or a Gaussian's
unbounded values. The trajectory buffers keep those, since the learner scores them; the env gets them
clipped to its Box, unravelled into its choices and offset by each choice's start. This is the one place
that does it, for the rollout workers' Python steps, evaluation and the bench; fastrl_ext's rollout loop
(fastrl.workers.native_steps) is handed `low`, `high`, `start` and `joint` and does the same in C++.
"""

from __future__ import annotations

import numpy as np

from fastrl.envs.spec import EnvSpec


class EnvActions:
    def __init__(self, spec: EnvSpec):
        continuous = not spec.discrete
        self.low = np.asarray(spec.action_low, dtype=np.float32) if continuous else None
        self.high = np.asarray(spec.action_high, dtype=np.float32) if continuous else None
        self.start = spec.action_start  # int32, one per choice the env takes; None where all start at 0
        self.joint = np.asarray(spec.action_joint, dtype=np.int32) if spec.action_joint else None
        self.identity = self.low is None and self.start is None and self.joint is None

    def __call__(self, actions: np.ndarray) -> np.ndarray:
        """[N] or [N, K] policy actions -> what the env's `send` takes for those N envs."""
        if self.identity:
            return actions
        if self.low is not None:
            return np.clip(actions, self.low, self.high)
        if self.joint is not None:
            actions = np.stack(np.unravel_index(actions, self.joint), axis=-1).astype(np.int32)
        return actions if self.start is None else actions + self.start
