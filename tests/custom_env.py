"""User-registered gymnasium envs that envpool does not have: a chain to walk right along to the goal
(observed as an array or as a Dict), and images in gymnasium's [H, W, C] order whose colour names the
rewarded action."""

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


class ColourEnv(gym.Env):
    """[H, W, 3] uint8 images, gymnasium's order: each step shows a red or a blue field, and the action
    that names its colour (0 red, 1 blue) earns 1. Twenty steps an episode: a policy that reads the
    image earns 20, one that guesses ~10."""

    SIDE = 40

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, 255, (self.SIDE, self.SIDE, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.colour = 0
        self.steps = 0

    def _obs(self):
        self.colour = int(self.np_random.integers(2))
        obs = np.zeros(self.observation_space.shape, dtype=np.uint8)
        obs[..., 0 if self.colour == 0 else 2] = 200
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.colour)
        self.steps += 1
        return self._obs(), reward, False, self.steps >= 20, {}


gym.register("FastrlTestColours-v0", entry_point=ColourEnv)


class DictChainEnv(ChainEnv):
    """ChainEnv observed as a Dict, as DeepMind Control and MiniGrid observe: the position one-hot
    (Box) and the steps taken (Discrete)."""

    def __init__(self, length: int = 8):
        super().__init__(length)
        self.observation_space = gym.spaces.Dict({"position": gym.spaces.Box(0.0, 1.0, (length,), np.float32),
                                                  "steps": gym.spaces.Discrete(51)})

    def _obs(self):
        return {"position": super()._obs(), "steps": self.steps}


gym.register("FastrlTestDictChain-v0", entry_point=DictChainEnv)
