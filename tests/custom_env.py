"""User-registered gymnasium envs that envpool does not have: a chain to walk right along to the goal
(observed as an array or as a Dict), images in gymnasium's [H, W, C] order whose colour names the
rewarded action, a pair of targets to name with one action of two choices, actions an observed mask
forbids, and states observed as a bare Discrete index."""

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


class TwentyStepsEnv(gym.Env):
    """Twenty steps an episode, each showing a fresh observation (`_obs`) to be named by the action."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._obs(), {}

    def _step(self, reward: float):
        self.steps += 1
        return self._obs(), reward, False, self.steps >= 20, {}


class ColourEnv(TwentyStepsEnv):
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

    def step(self, action):
        return self._step(float(int(action) == self.colour))


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


class TwoChoicesEnv(TwentyStepsEnv):
    """Each step shows two targets, one-hot: a shape of 3 and a colour of 4. The action names both at once,
    a MultiDiscrete whose first choice counts from 1 (gymnasium's `start`), and earns 0.5 per choice named
    right. Twenty steps an episode: a policy that reads both earns 20, one that guesses ~5.8, one that reads
    only one choice ~12.5. An action outside the space (a choice not offset by its start) raises."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (7,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete([3, 4], start=[1, 0])
        self.targets = (1, 0)
        self.steps = 0

    def _obs(self):
        self.targets = (1 + int(self.np_random.integers(3)), int(self.np_random.integers(4)))
        obs = np.zeros(7, dtype=np.float32)
        obs[self.targets[0] - 1] = obs[3 + self.targets[1]] = 1.0
        return obs

    def step(self, action):
        if not self.action_space.contains(np.asarray(action, dtype=np.int64)):
            raise ValueError(f"action {action} is outside {self.action_space}")
        return self._step(0.5 * (int(action[0]) == self.targets[0]) + 0.5 * (int(action[1]) == self.targets[1]))


gym.register("FastrlTestTwoChoices-v0", entry_point=TwoChoicesEnv)


class MaskedEnv(TwentyStepsEnv):
    """A Dict observation carrying an "action_mask" (Jumanji's convention: 1 = allowed): each step allows a
    random two of four actions, rewards the higher allowed one with 1, and raises on a forbidden action, so
    a policy that ignored the mask would kill its rollout worker at once."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(4),
                                                  "bias": gym.spaces.Box(0.0, 1.0, (1,), np.float32)})
        self.action_space = gym.spaces.Discrete(4)
        self.allowed = np.ones(4, dtype=np.int8)
        self.steps = 0

    def _obs(self):
        self.allowed = np.zeros(4, dtype=np.int8)
        self.allowed[self.np_random.choice(4, 2, replace=False)] = 1
        return {"action_mask": self.allowed.copy(), "bias": np.ones(1, np.float32)}

    def step(self, action):
        if not self.allowed[int(action)]:
            raise ValueError(f"action {action} is forbidden by the mask {self.allowed}")
        return self._step(float(int(action) == int(np.flatnonzero(self.allowed)[-1])))


gym.register("FastrlTestMasked-v0", entry_point=MaskedEnv)


class JointMaskEnv(TwentyStepsEnv):
    """Two choices at once (a row counted from 1, and a column) whose "action_mask" marks cells, not rows and
    columns, as Jumanji's Minesweeper does: each step allows a random two of the six cells, rewards the later
    one (row-major) with 1, and raises on a forbidden cell or an action outside the space, so a policy that
    drew row and column apart, or left the row's start off, would kill its rollout worker at once."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary((2, 3)),
                                                  "bias": gym.spaces.Box(0.0, 1.0, (1,), np.float32)})
        self.action_space = gym.spaces.MultiDiscrete([2, 3], start=[1, 0])
        self.allowed = np.ones((2, 3), dtype=np.int8)
        self.steps = 0

    def _obs(self):
        self.allowed = np.zeros(6, dtype=np.int8)
        self.allowed[self.np_random.choice(6, 2, replace=False)] = 1
        self.allowed = self.allowed.reshape(2, 3)
        return {"action_mask": self.allowed.copy(), "bias": np.ones(1, np.float32)}

    def step(self, action):
        if not self.action_space.contains(np.asarray(action, dtype=np.int64)):
            raise ValueError(f"action {action} is outside {self.action_space}")
        row, column = int(action[0]) - 1, int(action[1])
        if not self.allowed[row, column]:
            raise ValueError(f"cell {(row, column)} is forbidden by the mask {self.allowed.tolist()}")
        return self._step(float(row * 3 + column == int(np.flatnonzero(self.allowed)[-1])))


gym.register("FastrlTestJointMask-v0", entry_point=JointMaskEnv)


class IndexEnv(TwentyStepsEnv):
    """Each step shows a random state as a bare Discrete index counted from 3 (gymnasium's `start`), as
    FrozenLake and Taxi observe, and the action in ANSWERS for that state earns 1. The answers are scrambled,
    so nothing about the index's size says which to take. Twenty steps an episode: a policy that reads the
    state earns 20, one that guesses ~5."""

    ANSWERS = (2, 0, 3, 1, 1, 3, 0, 2, 3, 2, 0, 1)

    def __init__(self):
        self.observation_space = gym.spaces.Discrete(len(self.ANSWERS), start=3)
        self.action_space = gym.spaces.Discrete(4)
        self.state = 3
        self.steps = 0

    def _obs(self):
        self.state = 3 + int(self.np_random.integers(len(self.ANSWERS)))
        return self.state

    def step(self, action):
        return self._step(float(int(action) == self.ANSWERS[self.state - 3]))


gym.register("FastrlTestIndex-v0", entry_point=IndexEnv)
