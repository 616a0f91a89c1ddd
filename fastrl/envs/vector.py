"""A rollout worker's groups ("splits") of envs behind one send/recv interface, whichever backend steps
them: an envpool per group, one envpool shared by a worker's groups (sampler.env_pool), or gymnasium.

Both backends follow envpool's auto-reset: the call after a terminated or truncated step is a
reset step whose action is ignored. `recv` also returns what is reported to the user: the
unclipped score and the real end of a game, which differ from the training reward and the
life-loss episode ends on Atari.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastrl.config.schema import EnvConfig, SamplerConfig
from fastrl.envs.atari_frames import FrameStacks, envpool_kwargs
from fastrl.envs.spec import EnvSpec, gymnasium_with_fastrl_envs
from fastrl.envs.flatten import DictFlattener, OneHot, flattener_for


@dataclass
class Step:
    obs: np.ndarray
    reward: np.ndarray        # float32, what training uses (clipped on Atari if configured)
    terminated: np.ndarray    # bool, episode ended for training purposes (life loss counts)
    truncated: np.ndarray     # bool, time limit: bootstrap from the final observation
    score: np.ndarray         # float32, reward as published results count it (unclipped)
    game_over: np.ndarray     # bool, the real end of the game for reporting


def step_from_raw(obs, reward, done, trunc, env_id, score=None, game_over=None) -> Step:
    """A Step from envpool's outputs (the fields of `EnvpoolSplit.recv_raw`): rows put in env-id order,
    gymnasium's terminated (done and not truncated), and on Atari (`score` and `game_over` given: the
    unclipped info reward and the info terminated flag) whole-game scores. fastrl_ext._record does the
    same for the rollout worker's slots (fastrl.workers.recording)."""
    if np.any(env_id[1:] < env_id[:-1]):  # sync mode returns env-id order; guard the assumption
        order = np.argsort(env_id)
        obs, reward, done, trunc = obs[order], reward[order], done[order], trunc[order]
        if score is not None:
            score, game_over = score[order], game_over[order]
    terminated = done & ~trunc
    if score is not None:  # Atari: report whole-game, unclipped scores
        score = score.astype(np.float32, copy=False)
        game_over = game_over.astype(bool) | trunc
    else:
        score = reward
        game_over = terminated | trunc
    return Step(obs, reward.astype(np.float32, copy=False), terminated, trunc, score, game_over)


# What envpool's C++ send takes and recv returns, for the single-player envs fastrl steps.
_ACTION_KEYS = ["env_id", "players.env_id", "action"]
_STATE_KEYS_NEEDED = ("info:env_id", "reward", "done", "trunc")
_ATARI_KEYS = ("info:lives", "info:reward", "info:terminated")
_FRAME_KEYS = ("obs", "elapsed_step", "info:lives", "done", "info:env_id")  # FrameStacks.push's inputs, in order


class _DirectCalls:
    """envpool's C++ `_send`/`_recv` called without its Python wrapper.

    The wrapper costs ~70-100 µs a call whatever the batch (it rebuilds the config dict, converts
    the action through a dict, rebuilds the state with optree): at 16 CartPole envs per call that
    is 4-6 µs per env step, more than stepping the envs. This keeps the same semantics for
    the one case fastrl uses (single player, every env in every call, gymnasium's
    terminated = done and not truncated) and is only built when envpool's private layout is the
    one checked here; otherwise the split goes through the public API.

    A Dict observation comes out of `_recv` as one array per key ("obs:position", ...): `recv_raw`
    then appends their flattening (DictFlattener) to `_recv`'s list and reads it from there, and so does
    fastrl_ext._rollout, which calls `recv_raw`. A Discrete observation's one-hot (OneHot) is appended alike,
    and so are Atari's frame stacks where fastrl_ext keeps them (FrameStacks, from envpool's raw frames).
    """

    def __init__(self, env, ids: np.ndarray, flatten: DictFlattener | OneHot | None = None,
                 frames: FrameStacks | None = None):
        """`ids`: every env of the split, in order (each call carries all of them); `flatten`: the
        split's flattener of a Dict or Discrete observation; `frames`: its Atari frame stacks."""
        self.send_raw, self.recv_raw = env._send, env._recv
        self.index = {key: i for i, key in enumerate(env._state_keys)}
        if frames is not None:
            envpool_recv = env._recv
            frame_inputs = tuple(self.index[key] for key in _FRAME_KEYS)

            def recv_stacked() -> list:
                values = envpool_recv()
                values.append(frames.push(*(values[i] for i in frame_inputs)))
                return values

            self.recv_raw = recv_stacked
            self.index["obs"] = len(env._state_keys)  # where recv_stacked puts the stacks
        if flatten is not None:
            envpool_recv, obs_positions = env._recv, tuple(self.index[key] for key in flatten.envpool_keys)

            def recv_flattened() -> list:
                values = envpool_recv()
                values.append(flatten.gather(values, obs_positions))
                return values

            self.recv_raw = recv_flattened
            self.index["obs"] = len(env._state_keys)  # where recv_flattened puts it
        action_type = env._spec._action_spec[-1][0]
        # envpool's gym spaces drop every -1 (the players' axis) from a spec's shape: MuJoCo declares
        # [-1, 6], Box2D's continuous envs [2] with no such axis
        action_shape = [len(ids), *(n for n in env._spec._action_spec[-1][1] if n != -1)]
        self.ids = ids
        # envpool reads the action from this memory in its own threads after `send` returns, so it
        # must be ours and stay unchanged until the matching recv
        self.actions = np.zeros(action_shape, dtype=action_type)
        self.atari = all(k in self.index for k in _ATARI_KEYS)
        i = self.index
        # where `_recv`'s list holds (obs, reward, done, trunc, env_id, score, game_over): -1 for the last
        # two off Atari; `recv` reads them, and so does fastrl_ext._rollout
        self.positions = (i["obs"], i["reward"], i["done"], i["trunc"], i["info:env_id"],
                          i["info:reward"] if self.atari else -1, i["info:terminated"] if self.atari else -1)
        self.send_args = [self.ids, self.ids, self.actions]  # envpool reads the actions after `_send` returns

    @staticmethod
    def supported(env, flatten: DictFlattener | OneHot | None = None, frames: FrameStacks | None = None) -> bool:
        """Whether envpool's private layout is the one this class was written against (1.2.5's), with the
        observation as one "obs" output or, given `flatten`, as the outputs it names (a Dict's "obs:<key>");
        given `frames`, with the outputs its stacks need."""
        try:
            action_keys, state_keys = list(env._action_keys), list(env._state_keys)
            calls = callable(env._send) and callable(env._recv)
            action_spec = env._spec._action_spec
            players = env.config.get("max_num_players", 1)
        except (AttributeError, TypeError):
            return False
        needed = (*_STATE_KEYS_NEEDED, *(flatten.envpool_keys if flatten is not None else ["obs"]),
                  *(_FRAME_KEYS if frames is not None else ()))
        return (calls and action_keys == _ACTION_KEYS and len(action_spec) == len(_ACTION_KEYS) and players == 1
                and all(k in state_keys for k in needed))

    def send(self, actions: np.ndarray) -> None:
        self.actions[...] = actions  # casts like envpool's own astype (HalfCheetah takes float64)
        self.send_raw(self.send_args)

    def recv(self) -> tuple:
        """envpool's outputs in the order `EnvpoolSplit.recv_raw` returns them."""
        values = self.recv_raw()
        obs, reward, done, trunc, env_id, score, game_over = self.positions
        return (values[obs], values[reward], values[done], values[trunc], values[env_id],
                values[score] if score >= 0 else None, values[game_over] if game_over >= 0 else None)


def _direct_calls(env, ids: np.ndarray, flatten: DictFlattener | OneHot | None, direct: bool,
                  frames: FrameStacks | None = None) -> _DirectCalls | None:
    return _DirectCalls(env, ids, flatten, frames) if direct and _DirectCalls.supported(env, flatten, frames) else None


class EnvpoolSplit:
    """An envpool instance in sync-batch mode: `send` returns at once, envs step in C++ threads."""

    def __init__(self, env_cfg: EnvConfig, spec: EnvSpec, num_envs: int, num_threads: int, seed: int,
                 direct: bool = True):
        """`direct`: call envpool's C++ send/recv without its Python wrapper when its layout allows."""
        from fastrl.envs.envpool_loader import load_envpool

        self.num_envs = num_envs
        kwargs, layout = envpool_kwargs(env_cfg, spec)
        self._env = load_envpool(spec.env_id).make(spec.env_id, env_type="gymnasium", num_envs=num_envs,
                                                   batch_size=num_envs, num_threads=num_threads, seed=seed, **kwargs)
        self._ids = np.arange(num_envs, dtype=np.int32)
        self._flatten = flattener_for(spec, num_envs)
        self._frames = FrameStacks(num_envs, layout) if layout is not None else None
        self._direct = _direct_calls(self._env, self._ids, self._flatten, direct, self._frames)

    @property
    def direct(self) -> bool:
        return self._direct is not None

    def raw_calls(self) -> tuple | None:
        """(send, its argument list, recv, the action array envpool reads, the output positions), for code
        that calls envpool's C++ itself (fastrl_ext._rollout); None when this split goes through the API."""
        d = self._direct
        return None if d is None else (d.send_raw, d.send_args, d.recv_raw, d.actions, d.positions)

    def reset(self) -> Step:
        self._env.async_reset()
        return self.recv()

    def send(self, actions: np.ndarray) -> None:
        if self._direct is not None:
            self._direct.send(actions)
        else:
            self._env.send(actions, self._ids)

    def recv_raw(self) -> tuple:
        """This step's outputs as envpool gives them: (obs, reward, done, trunc, env_id, score, game_over),
        the last two the Atari info fields (unclipped reward, game over) or None. Arrays envpool owns,
        valid until the next `recv`."""
        if self._direct is not None:
            return self._direct.recv()
        obs, reward, terminated, truncated, info = self._env.recv()
        if self._flatten is not None:
            obs = self._flatten(obs)
        if self._frames is not None:
            obs = self._frames.push(obs, info["elapsed_step"], info["lives"], terminated | truncated, info["env_id"])
        atari = "lives" in info
        return (obs, reward, terminated | truncated, truncated, info["env_id"],
                info["reward"] if atari else None, info["terminated"] if atari else None)

    def recv(self) -> Step:
        return step_from_raw(*self.recv_raw())

    def close(self) -> None:
        self._env.close()


class SharedEnvpool:
    """One envpool instance holding every group of a rollout worker (`sampler.env_pool: per_worker`).

    envpool's async mode with batch_size = envs per group and a single C++ thread: the thread steps
    envs in the order their actions were sent and `recv` hands back the first batch_size finished,
    so a group that sends its envs' actions gets exactly those envs back, as long as the groups collect
    in the order they sent (the rollout loop's alternation does). With more threads envs of different
    groups would finish interleaved and a batch would mix them, hence one thread. Against one envpool
    per group, the worker runs one env thread instead of one per group: fewer runnable threads for
    two cores to share and balance (bench/README, stop 49).
    """

    def __init__(self, env_cfg: EnvConfig, spec: EnvSpec, num_groups: int, envs_per_group: int, seed: int):
        from fastrl.envs.envpool_loader import load_envpool

        kwargs, self.frame_layout = envpool_kwargs(env_cfg, spec)  # the groups' FrameStacks, where fastrl_ext keeps them
        self.env = load_envpool(spec.env_id).make(spec.env_id, env_type="gymnasium",
                                                  num_envs=num_groups * envs_per_group, batch_size=envs_per_group,
                                                  num_threads=1, seed=seed, **kwargs)
        self.spec = spec
        self.reset_sent = False
        self.open_groups = num_groups


class PooledGroup(EnvpoolSplit):
    """Group `group` of a SharedEnvpool: envs group * n .. group * n + n - 1, through EnvpoolSplit's calls on the
    shared instance, whose ids come back as 0..n-1, so the recorders take its steps as they take a split's own."""

    def __init__(self, pool: SharedEnvpool, group: int, num_envs: int, direct: bool = True):
        self.pool, self.group, self.num_envs = pool, group, num_envs
        self._env = pool.env
        self.first_id = group * num_envs
        self._ids = np.arange(self.first_id, self.first_id + num_envs, dtype=np.int32)
        self._flatten = flattener_for(pool.spec, num_envs)
        layout = pool.frame_layout
        self._frames = FrameStacks(num_envs, layout, self.first_id) if layout is not None else None
        self._direct = _direct_calls(pool.env, self._ids, self._flatten, direct, self._frames)
        if self._direct is not None:
            # fastrl_ext._rollout calls this through raw_calls, so the ids are checked and made local there too
            envpool_recv, id_position = self._direct.recv_raw, self._direct.positions[4]

            def recv_own_envs() -> list:
                values = envpool_recv()
                values[id_position] = self._local_ids(values[id_position])
                return values

            self._direct.recv_raw = recv_own_envs

    def _local_ids(self, env_id: np.ndarray) -> np.ndarray:
        local = env_id - self.first_id
        if local.min() < 0 or local.max() >= self.num_envs:
            raise RuntimeError(f"group {self.group} of a shared envpool collected envs {env_id.min()}..{env_id.max()}, "
                               f"not its own {self.first_id}..{self.first_id + self.num_envs - 1}: the groups must be "
                               "reset and collected in the order they sent")
        return local

    def reset(self) -> Step:
        """The first group's reset resets every env of the pool; each group then collects its own, in order."""
        if not self.pool.reset_sent:
            self._env.async_reset()
            self.pool.reset_sent = True
        return self.recv()

    def recv_raw(self) -> tuple:
        """As EnvpoolSplit.recv_raw, env ids local to the group (the direct calls' recv makes them so)."""
        raw = super().recv_raw()
        if self._direct is None:
            raw = (*raw[:4], self._local_ids(raw[4]), *raw[5:])
        return raw

    def close(self) -> None:
        self.pool.open_groups -= 1
        if self.pool.open_groups == 0:
            self._env.close()


class GymnasiumSplit:
    """gymnasium envs stepped in this process; for ids envpool does not have."""

    def __init__(self, env_cfg: EnvConfig, spec: EnvSpec, num_envs: int, num_threads: int, seed: int):
        gym = gymnasium_with_fastrl_envs()
        self.num_envs = num_envs
        self._seed = seed
        self._env = gym.vector.SyncVectorEnv([lambda: gym.make(spec.env_id, **env_cfg.kwargs)] * num_envs,
                                             autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
        self._actions = None
        self._flatten = flattener_for(spec, num_envs)

    def reset(self) -> Step:
        obs, _ = self._env.reset(seed=self._seed)
        if self._flatten is not None:
            obs = self._flatten(obs)
        zeros = np.zeros(self.num_envs, dtype=np.float32)
        no = np.zeros(self.num_envs, dtype=bool)
        return Step(obs, zeros, no, no, zeros, no)

    def send(self, actions: np.ndarray) -> None:
        self._actions = actions

    def recv(self) -> Step:
        obs, reward, terminated, truncated, _ = self._env.step(self._actions)
        if self._flatten is not None:
            obs = self._flatten(obs)
        reward = np.asarray(reward, dtype=np.float32)
        return Step(obs, reward, terminated, truncated, reward, terminated | truncated)

    def close(self) -> None:
        self._env.close()


def make_split(env_cfg: EnvConfig, spec: EnvSpec, num_envs: int, num_threads: int, seed: int):
    cls = EnvpoolSplit if spec.backend == "envpool" else GymnasiumSplit
    return cls(env_cfg, spec, num_envs, num_threads, seed)


def shares_one_envpool(sampler: SamplerConfig, spec: EnvSpec) -> bool:
    """Whether a rollout worker's groups are batches of one SharedEnvpool (one env thread per worker)."""
    return sampler.env_pool == "per_worker" and spec.backend == "envpool"


def make_group(env_cfg: EnvConfig, spec: EnvSpec, sampler: SamplerConfig, seed: int, group: int):
    """Group `group` of a rollout worker as its own envpool (or gymnasium envs), env i seeded `seed + group * n + i`:
    the seeds a SharedEnvpool gives the same envs."""
    n = sampler.num_envs_per_worker // sampler.num_splits
    return make_split(env_cfg, spec, n, sampler.env_threads, seed + group * n)


def make_groups(env_cfg: EnvConfig, spec: EnvSpec, sampler: SamplerConfig, seed: int, first_only: bool = False) -> list:
    """A rollout worker's groups of envs, env i of group g seeded `seed + g * n + i` in either layout
    (sampler.env_pool). `first_only`: only the first group where each group is its own envpool (a worker
    builds the others later, with make_group); one shared envpool makes every group's envs at once anyway.
    gymnasium groups step in the worker's own thread, so there is no pool to share and each group is its own."""
    if shares_one_envpool(sampler, spec):
        n = sampler.num_envs_per_worker // sampler.num_splits
        pool = SharedEnvpool(env_cfg, spec, sampler.num_splits, n, seed)
        return [PooledGroup(pool, g, n) for g in range(sampler.num_splits)]
    return [make_group(env_cfg, spec, sampler, seed, g) for g in range(1 if first_only else sampler.num_splits)]
