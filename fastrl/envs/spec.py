"""What the rest of fastrl needs to know about an environment, and which backend runs it.

`resolve_env` is called once by the runner before anything is allocated: it picks the
backend, probes one env for its spaces, and turns an unknown id into a clear error with
close matches.
"""

from __future__ import annotations

import difflib
import importlib
import math
from dataclasses import dataclass

import numpy as np

from fastrl.config.schema import EnvConfig
from fastrl.envs.envpool_loader import load_envpool
from fastrl.envs.flatten import dict_layout


class EnvError(Exception):
    """The env cannot be made from this configuration."""


@dataclass(frozen=True)
class EnvSpec:
    env_id: str
    backend: str                 # "envpool" or "gymnasium"
    obs_shape: tuple
    obs_dtype: np.dtype          # dtype stored in the trajectory buffers (float64 becomes float32)
    discrete: bool               # categorical actions: one Discrete, or several choices at once (action_nvec)
    num_actions: int             # discrete: number of actions (all choices' together); continuous: action dimension
    action_low: tuple = ()       # continuous: the Box's bounds; discrete: each choice's first action (its start),
                                 # () when a single Discrete starts at 0
    action_high: tuple = ()
    frames_per_env_step: int = 1  # Atari frameskip: frames = env steps * this
    obs_channels_last: bool = False  # an image stored [H, W, C] (gymnasium's habit), not [C, H, W] (envpool Atari's)
    obs_dict: tuple = ()  # a Dict observation's ((key, size), ...), flattened in that order (fastrl.envs.flatten)
    # several discrete choices in one action (a MultiDiscrete, MultiBinary or integer Box: Jumanji's Minesweeper
    # picks a row and a column): each choice's number of options. The policy draws one categorical per choice
    # from its slice of the num_actions logits; an action is then [len(action_nvec)] int32, offset by action_low.
    action_nvec: tuple = ()
    # what an image's values are multiplied by before the CNN: 1 / the largest magnitude its Box allows
    # (1/255 for uint8 frames, 1 for a float image in [0, 1]; 1 when unbounded)
    image_scale: float = 1.0 / 255.0
    # (first column, count) of a Dict's "action_mask" entry in the flattened observation (Jumanji's TSP, Snake,
    # Connector), where it holds one entry per logit: the policy gives the actions it marks 0 no probability
    action_mask: tuple = ()
    # a Discrete observation's (n, start) (FrozenLake's cell, Taxi's state): one integer per env from the env,
    # stored one-hot as obs_shape (n,) float32 (fastrl.envs.flatten.OneHot)
    obs_one_hot: tuple = ()
    # several discrete choices acted as one: each choice's number of options where the policy draws one
    # categorical over every combination of them (num_actions = their product, action_nvec ()), because the env's
    # action_mask is joint over the choices (Minesweeper's [10, 10] marks cells, not rows and columns). The
    # policy's action is then an index into the combinations, unravelled to [len(action_joint)] on its way to the
    # env (fastrl.envs.actions.EnvActions), the last choice varying fastest as in the mask's layout.
    action_joint: tuple = ()

    @property
    def multi_discrete(self) -> bool:
        return bool(self.action_nvec)

    @property
    def action_cell(self) -> tuple:
        """One env's action in the trajectory buffers and acting's outputs: () for one categorical, (K,) for K
        discrete choices, (A,) for a Gaussian's A dimensions."""
        if self.multi_discrete:
            return (len(self.action_nvec),)
        return () if self.discrete else (self.num_actions,)

    @property
    def action_start(self) -> np.ndarray | None:
        """What the policy's 0-based discrete actions are offset by on their way to the env (gymnasium's
        `start`, an integer Box's low), one per choice; None where every choice starts at 0, or continuous."""
        if not self.discrete or not any(self.action_low):
            return None
        return np.asarray(self.action_low, dtype=np.int32)

    @property
    def action_mask_columns(self) -> slice | None:
        """The flattened observation's columns holding the action mask (action_mask), or None without one."""
        if not self.action_mask:
            return None
        first, count = self.action_mask
        return slice(first, first + count)

    def action_mask_note(self) -> str | None:
        """What the run does with a Dict's "action_mask" entry, for its first line; None without one."""
        size = dict(self.obs_dict).get(ACTION_MASK_KEY)
        if size is None:
            return None
        if self.action_joint:
            return (f"action_mask applied to one categorical over the {self.num_actions} combinations of "
                    f"{len(self.action_joint)} choices {list(self.action_joint)} (env.joint_actions)")
        if self.action_mask:
            return "action_mask applied to the logits"
        joint = self.multi_discrete and size == math.prod(self.action_nvec)
        return (f"action_mask of {size} entries read as an input only (the policy has {self.num_actions} logits"
                + (": a joint mask over its choices, applied under env.joint_actions=true" if joint else "") + ")")

    @property
    def is_image(self) -> bool:
        return len(self.obs_shape) == 3

    @property
    def image_chw(self) -> tuple:
        """An image observation's (channels, height, width), whichever order the env stores them in."""
        if self.obs_channels_last:
            h, w, c = self.obs_shape
            return c, h, w
        return tuple(self.obs_shape)


ACTION_MASK_KEY = "action_mask"  # Jumanji's name, and gymnasium's habit for a mask carried in the observation


def stores_channels_last(shape: tuple) -> bool:
    """Whether a 3-D observation is an [H, W, C] image: a last axis of 1-4 channels after a longer first
    one (CarRacing's 96x96x3, a gymnasium wrapper's 84x84x4). Atari through envpool is [4, 84, 84]."""
    return len(shape) == 3 and shape[2] <= 4 < shape[0]


def envpool_ids(env_id: str | None = None) -> list[str]:
    """The ids envpool registers: at least those of `env_id`'s family, all of them when `env_id` is
    None or unknown to envpool (see envpool_loader for why not always all)."""
    return list(load_envpool(env_id).list_all_envs())


def gymnasium_with_fastrl_envs():
    """gymnasium, with fastrl's own test env (fastrl/Faulty-v0) registered. Imported only where
    gymnasium envs are looked up or made: a process that never does (an inference worker or the
    learner, ~0.2 CPU-s on the path to the first sample) does not load it."""
    import gymnasium as gym

    from fastrl.envs import faults

    faults.register()
    return gym


def gymnasium_ids() -> list[str]:
    return list(gymnasium_with_fastrl_envs().envs.registry.keys())


def _spec_from_spaces(env_id: str, backend: str, obs_space, act_space, frames_per_env_step: int,
                      joint_actions: bool = True) -> EnvSpec:
    """The spec of an env with these spaces; `joint_actions` is EnvConfig.joint_actions."""
    import gymnasium as gym

    try:
        obs_dict = dict_layout(obs_space)
    except ValueError as e:
        raise EnvError(f"{env_id}: observation space {obs_space} cannot be used: {e}") from None
    obs_one_hot = ()
    if obs_dict is not None:
        obs_shape, obs_dtype = (sum(size for _, size in obs_dict),), np.dtype(np.float32)
    elif isinstance(obs_space, gym.spaces.Box):
        obs_shape = tuple(obs_space.shape)
        obs_dtype = np.dtype(np.float32) if np.issubdtype(obs_space.dtype, np.floating) else np.dtype(obs_space.dtype)
    elif isinstance(obs_space, gym.spaces.Discrete):
        obs_shape, obs_dtype = (int(obs_space.n),), np.dtype(np.float32)
        obs_one_hot = (int(obs_space.n), int(obs_space.start))
    else:
        raise EnvError(f"{env_id}: observation space {obs_space} is not a Box, a Discrete or a Dict of them; "
                       "fastrl supports array observations")
    layout = dict(frames_per_env_step=frames_per_env_step, obs_channels_last=stores_channels_last(obs_shape),
                  obs_dict=obs_dict or (), obs_one_hot=obs_one_hot)
    if len(obs_shape) == 3:
        layout["image_scale"] = _image_scale(obs_space)
    choices = _discrete_choices(act_space)
    if isinstance(act_space, gym.spaces.Discrete):
        start = int(act_space.start)  # gymnasium's Discrete(n, start) acts in start .. start + n - 1
        actions = dict(discrete=True, num_actions=int(act_space.n), action_low=(start,) if start else ())
    elif choices == "bad":
        raise EnvError(f"{env_id}: action space {act_space} is not supported: several discrete choices need "
                       "a 1-D space with at least 2 options per choice")
    elif choices is not None:
        nvec, start = choices
        combinations = math.prod(nvec)
        # a mask shaped like the choices and larger than their sum: one entry per combination, the last choice
        # varying fastest (a [K, n] mask of one row per choice is as large as their sum)
        if joint_actions and _mask_shape(obs_space) == nvec and combinations != sum(nvec):
            actions = dict(discrete=True, num_actions=combinations, action_low=start, action_joint=nvec)
        else:
            actions = dict(discrete=True, num_actions=sum(nvec), action_low=start, action_nvec=nvec)
    elif isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        actions = dict(discrete=False, num_actions=int(act_space.shape[0]),
                       action_low=tuple(float(x) for x in act_space.low),
                       action_high=tuple(float(x) for x in act_space.high))
    else:
        raise EnvError(f"{env_id}: action space {act_space} is not supported (Discrete, MultiDiscrete, MultiBinary, "
                       "or a 1-D Box)")
    # a categorical policy's logits are what an action mask must match, one entry each
    mask = _mask_columns(layout["obs_dict"], actions["num_actions"]) if actions["discrete"] else ()
    return EnvSpec(env_id, backend, obs_shape, obs_dtype, **actions, action_mask=mask, **layout)


def _mask_shape(obs_space) -> tuple | None:
    """The shape of a Dict observation's "action_mask" entry; None without one."""
    import gymnasium as gym

    if not isinstance(obs_space, gym.spaces.Dict) or ACTION_MASK_KEY not in obs_space.spaces:
        return None
    return tuple(int(n) for n in obs_space.spaces[ACTION_MASK_KEY].shape)


def _mask_columns(obs_dict: tuple, logits: int) -> tuple:
    """(first column, count) of the "action_mask" entry in the flattened Dict, where it has one entry per
    logit (a Discrete's mask, one per choice: Connector's [agents, 5], or one per combination of the choices
    under env.joint_actions: Minesweeper's [10, 10]); () otherwise (no mask, or a joint mask over choices
    drawn one by one, which stays an input)."""
    column = 0
    for key, size in obs_dict:
        if key == ACTION_MASK_KEY:
            return (column, size) if size == logits else ()
        column += size
    return ()


def _image_scale(obs_space) -> float:
    """1 / the largest magnitude an image's Box allows: 1/255 for uint8 frames as before, 1 for a float image
    already in [0, 1] (dividing it by 255 left the CNN inputs of at most 0.004), 1 for an unbounded one."""
    bound = float(np.max(np.maximum(np.abs(obs_space.low), np.abs(obs_space.high))))
    return 1.0 / bound if np.isfinite(bound) and bound > 0 else 1.0


def _discrete_choices(act_space):
    """(nvec, start) of an action space that makes several discrete choices at once (MultiDiscrete, MultiBinary,
    or an integer Box, as Jumanji declares its Minesweeper's row and column); "bad" for one fastrl cannot act in
    (not 1-D, or a choice of one option); None for any other space."""
    import gymnasium as gym

    if isinstance(act_space, gym.spaces.MultiDiscrete):
        nvec, start = np.asarray(act_space.nvec), np.asarray(act_space.start)
    elif isinstance(act_space, gym.spaces.MultiBinary):
        nvec = np.full(act_space.shape, 2)
        start = np.zeros_like(nvec)
    elif isinstance(act_space, gym.spaces.Box) and not np.issubdtype(act_space.dtype, np.floating):
        nvec, start = act_space.high.astype(np.int64) - act_space.low + 1, act_space.low.astype(np.int64)
    else:
        return None
    if nvec.ndim != 1 or nvec.size == 0 or (nvec < 2).any():
        return "bad"
    return tuple(int(n) for n in nvec), tuple(int(s) for s in start)


def resolve_env(env_cfg: EnvConfig) -> EnvSpec:
    """Probe the env named by the config; raise EnvError with a helpful message if it can't be made."""
    registered_id = env_cfg.id
    if ":" in env_cfg.id:
        # gymnasium's "module:EnvId": importing the user's module registers the env (every
        # rollout worker does the same import through gym.make)
        module, _, registered_id = env_cfg.id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise EnvError(f"env id '{env_cfg.id}': cannot import module '{module}': {e}") from e
        if env_cfg.backend == "envpool":
            raise EnvError(f"env id '{env_cfg.id}' names a Python module; only the gymnasium backend can run it")
    known_envpool = envpool_ids(None if ":" in env_cfg.id else env_cfg.id)
    known_gym = gymnasium_ids()
    backend = env_cfg.backend
    if backend == "auto":
        backend = "envpool" if env_cfg.id in known_envpool else "gymnasium"
    known = known_envpool if backend == "envpool" else known_gym
    if registered_id not in known:
        every_id = set(envpool_ids()) | set(known_gym)
        close = difflib.get_close_matches(env_cfg.id, sorted(every_id), n=5, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        where = "envpool" if env_cfg.backend == "envpool" else "envpool or gymnasium"
        raise EnvError(f"unknown env id '{env_cfg.id}' (not in {where}){hint}")
    try:
        if backend == "envpool":
            probe = load_envpool(env_cfg.id).make(env_cfg.id, env_type="gymnasium", num_envs=1, batch_size=1,
                                                  num_threads=1, **env_cfg.kwargs)
            # Only Atari's frameskip repeats rendered frames; MuJoCo's frame_skip is physics substeps.
            frames = int(probe.spec.config.frame_skip) if "Atari" in type(probe).__name__ else 1
            spec = _spec_from_spaces(env_cfg.id, backend, probe.observation_space, probe.action_space, frames,
                                     env_cfg.joint_actions)
            probe.close()
            return spec
        probe = gymnasium_with_fastrl_envs().make(env_cfg.id, **env_cfg.kwargs)
        spec = _spec_from_spaces(env_cfg.id, backend, probe.observation_space, probe.action_space, 1,
                                 env_cfg.joint_actions)
        probe.close()
        return spec
    except EnvError:
        raise
    except Exception as e:  # a bad kwarg or a broken user env: report, don't crash with a traceback
        raise EnvError(f"could not make env '{env_cfg.id}' with {backend}: {type(e).__name__}: {e}") from e
