"""One split of envs behind a uniform send/recv interface, whichever backend steps them.

Both backends follow envpool's auto-reset: the call after a terminated or truncated step is a
reset step whose action is ignored. `recv` also returns what is reported to the user: the
unclipped score and the real end of a game, which differ from the training reward and the
life-loss episode ends on Atari.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastrl.config.schema import EnvConfig
from fastrl.envs.spec import EnvSpec


@dataclass
class Step:
    obs: np.ndarray
    reward: np.ndarray        # float32, what training uses (clipped on Atari if configured)
    terminated: np.ndarray    # bool, episode ended for training purposes (life loss counts)
    truncated: np.ndarray     # bool, time limit: bootstrap from the final observation
    score: np.ndarray         # float32, reward as published results count it (unclipped)
    game_over: np.ndarray     # bool, the real end of the game for reporting


class EnvpoolSplit:
    """An envpool instance in sync-batch mode: `send` returns at once, envs step in C++ threads."""

    def __init__(self, env_cfg: EnvConfig, spec: EnvSpec, num_envs: int, num_threads: int, seed: int):
        from fastrl.envs.envpool_loader import load_envpool

        self.num_envs = num_envs
        self._env = load_envpool(spec.env_id).make(spec.env_id, env_type="gymnasium", num_envs=num_envs,
                                                   batch_size=num_envs, num_threads=num_threads, seed=seed,
                                                   **env_cfg.kwargs)
        self._ids = np.arange(num_envs, dtype=np.int32)

    def reset(self) -> Step:
        self._env.async_reset()
        return self.recv()

    def send(self, actions: np.ndarray) -> None:
        self._env.send(actions, self._ids)

    def recv(self) -> Step:
        obs, reward, terminated, truncated, info = self._env.recv()
        env_id = info["env_id"]
        if np.any(env_id[1:] < env_id[:-1]):  # sync mode returns env-id order; guard the assumption
            order = np.argsort(env_id)
            obs, reward, terminated, truncated = obs[order], reward[order], terminated[order], truncated[order]
            info = {k: v[order] for k, v in info.items() if isinstance(v, np.ndarray) and len(v) == len(order)}
        if "lives" in info:  # Atari: report whole-game, unclipped scores
            score = info["reward"].astype(np.float32, copy=False)
            game_over = info["terminated"].astype(bool) | truncated
        else:
            score = reward
            game_over = terminated | truncated
        return Step(obs, reward.astype(np.float32, copy=False), terminated, truncated, score, game_over)

    def close(self) -> None:
        self._env.close()


class GymnasiumSplit:
    """gymnasium envs stepped in this process; for ids envpool does not have."""

    def __init__(self, env_cfg: EnvConfig, spec: EnvSpec, num_envs: int, num_threads: int, seed: int):
        import gymnasium as gym

        self.num_envs = num_envs
        self._seed = seed
        self._env = gym.vector.SyncVectorEnv([lambda: gym.make(spec.env_id, **env_cfg.kwargs)] * num_envs,
                                             autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
        self._actions = None

    def reset(self) -> Step:
        obs, _ = self._env.reset(seed=self._seed)
        zeros = np.zeros(self.num_envs, dtype=np.float32)
        no = np.zeros(self.num_envs, dtype=bool)
        return Step(obs, zeros, no, no, zeros, no)

    def send(self, actions: np.ndarray) -> None:
        self._actions = actions

    def recv(self) -> Step:
        obs, reward, terminated, truncated, _ = self._env.step(self._actions)
        reward = np.asarray(reward, dtype=np.float32)
        return Step(obs, reward, terminated, truncated, reward, terminated | truncated)

    def close(self) -> None:
        self._env.close()


def make_split(env_cfg: EnvConfig, spec: EnvSpec, num_envs: int, num_threads: int, seed: int):
    cls = EnvpoolSplit if spec.backend == "envpool" else GymnasiumSplit
    return cls(env_cfg, spec, num_envs, num_threads, seed)
