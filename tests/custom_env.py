"""A user-registered gymnasium env that envpool does not have: walk right along a chain to the goal."""

import gymnasium as gym
import numpy as np


class ChainEnv(gym.Env):
    def __init__(self, length: int = 8):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0
        self.steps = 0

    def _obs(self):
        obs = np.zeros(self.length, dtype=np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.steps = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.pos = max(0, min(self.length - 1, self.pos + (1 if action == 1 else -1)))
        self.steps += 1
        terminated = self.pos == self.length - 1
        return self._obs(), float(terminated), terminated, self.steps >= 50, {}


gym.register("FastrlTestChain-v0", entry_point=ChainEnv)
