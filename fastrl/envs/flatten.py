"""Observations that are not one array, made one float32 vector by each split: Dicts, the way Sample
Factory and CleanRL users meet DeepMind Control (`CheetahRun-v1`: position and velocity), MiniGrid (image,
direction, mission) or Jumanji; and a bare Discrete, the state index of FrozenLake, Taxi or CliffWalking.

The spec resolves the Dict once into its keys and their sizes (`dict_layout`); each split then copies
its batch's arrays, key after key, into one [num_envs, size] buffer it owns (`DictFlattener`), so
everything after the env (slots, recorders, networks) sees an ordinary vector observation. A Discrete
entry is its value, not a one-hot: a step counter of 4,000 values would otherwise be 4,000 inputs.
A Discrete observation is the whole state, an index whose value means nothing (Taxi's 499 is not near
498), so it is stored one-hot (`OneHot`), as Stable-Baselines3 and CleanRL's tabular examples feed it.
"""

from __future__ import annotations

import math

import numpy as np


def dict_layout(space) -> tuple | None:
    """((key, size), ...) for a Dict of Box, Discrete and MultiBinary entries, in the space's own order;
    None for any other space. A nested Dict's entries are named with dots ("agent_position.row"), as
    envpool names its outputs (Jumanji's Maze). Raises ValueError naming an entry that cannot be flattened."""
    import gymnasium as gym

    if not isinstance(space, gym.spaces.Dict):
        return None
    layout = []

    def add(prefix: str, entries: dict) -> None:
        for key, entry in entries.items():
            name = prefix + key
            if isinstance(entry, gym.spaces.Dict):
                add(name + ".", entry.spaces)
            elif isinstance(entry, (gym.spaces.Box, gym.spaces.MultiBinary)):
                layout.append((name, math.prod(entry.shape)))
            elif isinstance(entry, gym.spaces.Discrete):
                layout.append((name, 1))
            else:
                raise ValueError(f"its entry '{name}' is {entry}; only Box, Discrete and MultiBinary entries (in "
                                 "Dicts) can be flattened into one vector")

    add("", space.spaces)
    if not layout:
        raise ValueError("it has no entries")
    return tuple(layout)


def _dotted(obs, prefix: str = "") -> dict:
    """A (nested) mapping's leaves by their dotted names."""
    leaves = {}
    for key, value in obs.items():
        if hasattr(value, "items"):
            leaves.update(_dotted(value, f"{prefix}{key}."))
        else:
            leaves[prefix + key] = value
    return leaves


class DictFlattener:
    """A batch of Dict observations ({key: [num_envs, ...]}) -> one [num_envs, size] float32 array.

    The array is this object's and is rewritten by the next call: the recorders copy a step's
    observation into its slot before the split's next `recv`, which is all the envs promise anyway."""

    def __init__(self, layout: tuple, num_envs: int):
        self.num_envs = num_envs
        self.keys = [key for key, _ in layout]
        self.nested = any("." in key for key in self.keys)
        self.columns = []
        start = 0
        for _, size in layout:
            self.columns.append((start, start + size))
            start += size
        self.out = np.empty((num_envs, start), dtype=np.float32)

    @property
    def envpool_keys(self) -> list:
        """envpool's state keys of the entries, in this flattener's order."""
        return [f"obs:{key}" for key in self.keys]

    def __call__(self, obs) -> np.ndarray:
        """From a mapping of key to batch, nested for a nested Dict (envpool's and gymnasium's public API)."""
        leaves = _dotted(obs) if self.nested else obs
        return self.gather([leaves[key] for key in self.keys], range(len(self.keys)))

    def gather(self, arrays, positions) -> np.ndarray:
        """From a sequence holding the entries' batches at `positions`, in key order (envpool's `_recv`)."""
        for (start, stop), i in zip(self.columns, positions):
            self.out[:, start:stop] = np.asarray(arrays[i]).reshape(self.num_envs, stop - start)
        return self.out


class OneHot:
    """A batch of Discrete observations (one integer per env, from `start` to `start + n - 1`) -> one
    [num_envs, n] float32 array, one-hot; the array is this object's, as DictFlattener's is."""

    envpool_keys = ("obs",)

    def __init__(self, n: int, start: int, num_envs: int):
        self.n, self.start, self.num_envs = n, start, num_envs
        self.rows = np.arange(num_envs)
        self.hot = np.zeros(num_envs, dtype=np.intp)  # each row's 1, cleared at the next call
        self.out = np.zeros((num_envs, n), dtype=np.float32)

    def __call__(self, obs) -> np.ndarray:
        return self.gather([obs], (0,))

    def gather(self, arrays, positions) -> np.ndarray:
        """From the sequence holding the batch at positions[0] (envpool's `_recv`, as DictFlattener.gather)."""
        self.out[self.rows, self.hot] = 0.0
        np.subtract(np.asarray(arrays[positions[0]]).reshape(self.num_envs), self.start, out=self.hot,
                    casting="unsafe")
        # a negative index would silently light the wrong end of the row
        if self.hot.min() < 0 or self.hot.max() >= self.n:
            raise ValueError(f"a Discrete observation outside {self.start}..{self.start + self.n - 1}: "
                             f"{self.hot.min() + self.start}..{self.hot.max() + self.start}")
        self.out[self.rows, self.hot] = 1.0
        return self.out


def flattener_for(spec, num_envs: int) -> DictFlattener | OneHot | None:
    """A split's flattener for its EnvSpec's Dict (obs_dict) or Discrete (obs_one_hot) observation, or None
    for an observation that is one array already."""
    if spec.obs_dict:
        return DictFlattener(spec.obs_dict, num_envs)
    if spec.obs_one_hot:
        return OneHot(*spec.obs_one_hot, num_envs)
    return None
