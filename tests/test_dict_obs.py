"""Dict observations (DeepMind Control, MiniGrid, Jumanji, user envs) flattened into one float32 vector
by each split (fastrl.envs.flatten). Before, every such env was refused as "not a Box"."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from fastrl.config.schema import EnvConfig, SamplerConfig
from fastrl.envs import EnvError, resolve_env
from fastrl.envs.envpool_loader import load_envpool
from fastrl.envs.flatten import DictFlattener, dict_layout
from fastrl.envs.spec import _spec_from_spaces
from fastrl.envs.vector import EnvpoolSplit, GymnasiumSplit, make_groups


def test_a_dict_of_boxes_discretes_and_binaries_is_laid_out_in_its_own_order():
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),
                             "direction": gym.spaces.Discrete(4),
                             "mask": gym.spaces.MultiBinary(5)})
    # gymnasium sorts a plain dict's keys; the layout follows the space, so envs and specs agree
    assert dict_layout(space) == (("direction", 1), ("image", 147), ("mask", 5))
    assert dict_layout(gym.spaces.Box(0, 1, (3,))) is None


def test_a_nested_dict_is_laid_out_by_dotted_names_as_envpool_names_its_outputs():
    space = gym.spaces.Dict({"agent": gym.spaces.Dict({"row": gym.spaces.Discrete(10), "col": gym.spaces.Discrete(10)}),
                             "walls": gym.spaces.MultiBinary((3, 3))})
    layout = dict_layout(space)
    assert layout == (("agent.col", 1), ("agent.row", 1), ("walls", 9))
    obs = {"walls": np.ones((2, 3, 3), np.int8), "agent": {"row": np.array([1, 2]), "col": np.array([3, 4])}}
    np.testing.assert_array_equal(DictFlattener(layout, 2)(obs), [[3, 1] + [1] * 9, [4, 2] + [1] * 9])


@pytest.mark.parametrize("entry", [gym.spaces.Text(8), gym.spaces.Tuple([gym.spaces.Discrete(2)])])
def test_a_dict_entry_that_cannot_be_flattened_is_named(entry):
    with pytest.raises(ValueError, match="its entry 'inner.odd' is"):
        dict_layout(gym.spaces.Dict({"fine": gym.spaces.Discrete(3), "inner": gym.spaces.Dict({"odd": entry})}))


def test_the_flattener_puts_each_entry_in_its_columns_as_float32():
    flatten = DictFlattener((("a", 2), ("b", 1), ("c", 4)), num_envs=3)
    obs = {"c": np.arange(12, dtype=np.float64).reshape(3, 2, 2), "a": -np.ones((3, 2), np.int32),
           "b": np.array([7, 8, 9])}
    out = flatten(obs)
    assert out.dtype == np.float32 and out.shape == (3, 7)
    np.testing.assert_array_equal(out[:, :2], -1)
    np.testing.assert_array_equal(out[:, 2], [7, 8, 9])
    np.testing.assert_array_equal(out[:, 3:], np.arange(12).reshape(3, 4))


def _concatenated(want):
    return np.concatenate([want["position"], want["velocity"]], axis=1).astype(np.float32)


def _one_hot(size):
    return lambda want: np.eye(size, dtype=np.float32)[want]


@pytest.mark.parametrize("env_id, shape, expected", [("CheetahRun-v1", (17,), _concatenated),
                                                     ("FrozenLake-v1", (16,), _one_hot(16)),
                                                     ("Taxi-v3", (500,), _one_hot(500))])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "public_api"])
def test_envpool_dicts_and_discretes_step_as_envpools_own_observations_made_one_vector(direct, env_id, shape,
                                                                                       expected):
    """Through EnvpoolSplit against envpool's own outputs, same seed, same actions: DeepMind Control's dict
    concatenated; FrozenLake's and Taxi's state index one-hot (tests/test_discrete_obs.py)."""
    env_cfg = EnvConfig(id=env_id)
    spec = resolve_env(env_cfg)
    assert spec.obs_shape == shape and spec.obs_dtype == np.float32
    split = EnvpoolSplit(env_cfg, spec, 3, 1, seed=4, direct=direct)
    assert split.direct == direct
    raw = load_envpool(spec.env_id).make(spec.env_id, env_type="gymnasium", num_envs=3, batch_size=3,
                                         num_threads=1, seed=4)
    ids = np.arange(3, dtype=np.int32)
    raw.async_reset()
    step = split.reset()
    rng = np.random.default_rng(0)
    observed = set()
    for t in range(60):
        want = raw.recv()[0]
        assert step.obs.dtype == np.float32 and step.obs.shape == (3, *shape)
        np.testing.assert_array_equal(step.obs, expected(want), err_msg=f"step {t}")
        observed.add(step.obs.tobytes())
        if spec.discrete:
            actions = rng.integers(0, spec.num_actions, 3).astype(np.int32)
        else:
            actions = rng.uniform(-1, 1, (3, spec.num_actions)).astype(np.float32)
        split.send(actions)
        raw.send(actions.astype(np.float64) if not spec.discrete else actions, ids)
        step = split.recv()
    assert len(observed) > 4  # the observations moved: one stuck on the first would have failed above
    raw.recv()
    split.close()
    raw.close()


def test_a_nested_envpool_dict_flattens_alike_through_both_calls():
    """Jumanji's Maze: nested Dicts (agent_position.row, ...) whose outputs envpool names with dots."""
    env_cfg = EnvConfig(id="Maze-v0")
    spec = resolve_env(env_cfg)
    assert spec.obs_dict[:2] == (("agent_position.row", 1), ("agent_position.col", 1)) and spec.obs_shape == (109,)
    direct, public = (EnvpoolSplit(env_cfg, spec, 2, 1, seed=6, direct=d) for d in (True, False))
    assert direct.direct and not public.direct
    step_d, step_p = direct.reset(), public.reset()
    rng = np.random.default_rng(2)
    for t in range(30):
        np.testing.assert_array_equal(step_d.obs, step_p.obs, err_msg=f"step {t}")
        actions = rng.integers(0, spec.num_actions, 2).astype(np.int32)
        direct.send(actions)
        public.send(actions)
        step_d, step_p = direct.recv(), public.recv()
    direct.close()
    public.close()


@pytest.mark.parametrize("env_cfg, size", [(EnvConfig(id="MiniGrid-Empty-5x5-v0", kwargs={"max_episode_steps": 12}),
                                             1 + 147 + 96),
                                            (EnvConfig(id="FrozenLake-v1"), 16)], ids=["dict", "discrete"])
def test_groups_of_one_shared_envpool_flatten_as_one_pool_per_group(env_cfg, size):
    """MiniGrid's Dict (direction, image, mission), and FrozenLake's Discrete cell stored one-hot
    (tests/test_discrete_obs.py): the pooled groups' direct calls, whose env ids are made local, against
    one envpool per group."""
    spec = resolve_env(env_cfg)
    assert spec.discrete and spec.obs_shape == (size,)
    sampler = SamplerConfig(num_envs_per_worker=4, num_splits=2, env_pool="per_worker")
    pooled = make_groups(env_cfg, spec, sampler, seed=9)
    assert all(g.direct for g in pooled)
    separate = make_groups(env_cfg, spec, dataclasses.replace(sampler, env_pool="per_group"), seed=9)
    steps_p, steps_s = [g.reset().obs.copy() for g in pooled], [g.reset().obs.copy() for g in separate]
    for g in range(2):
        np.testing.assert_array_equal(steps_p[g], steps_s[g])
    rng = np.random.default_rng(1)
    for g in range(2):
        actions = rng.integers(0, spec.num_actions, 2).astype(np.int32)
        pooled[g].send(actions)
        separate[g].send(actions)
    ends = 0
    for t in range(40):
        g = t % 2
        step_p, step_s = pooled[g].recv(), separate[g].recv()
        np.testing.assert_array_equal(step_p.obs, step_s.obs, err_msg=f"step {t}, group {g}")
        ends += int(step_p.truncated.sum() + step_p.terminated.sum())
        actions = rng.integers(0, spec.num_actions, 2).astype(np.int32)
        pooled[g].send(actions)
        separate[g].send(actions)
    assert ends > 0
    for env in pooled + separate:
        env.recv()
        env.close()


def test_a_gymnasium_dict_env_is_flattened_too():
    env_cfg = EnvConfig(id="custom_env:FastrlTestDictChain-v0")
    spec = resolve_env(env_cfg)
    assert spec.backend == "gymnasium" and spec.obs_shape == (9,)
    split = GymnasiumSplit(env_cfg, spec, 2, 1, seed=0)
    first = split.reset().obs
    np.testing.assert_array_equal(first, [[1, 0, 0, 0, 0, 0, 0, 0, 0]] * 2)
    split.send(np.array([1, 1]))
    np.testing.assert_array_equal(split.recv().obs, [[0, 1, 0, 0, 0, 0, 0, 0, 1]] * 2)
    split.close()


def test_what_cannot_be_flattened_is_refused_before_anything_starts():
    with pytest.raises(EnvError, match="cannot be used: its entry"):
        _spec_from_spaces("Odd-v0", "gymnasium", gym.spaces.Dict({"t": gym.spaces.Tuple([gym.spaces.Discrete(2)])}),
                          gym.spaces.Discrete(2), 1)
    with pytest.raises(EnvError, match="is not a Box, a Discrete or a Dict of them"):
        _spec_from_spaces("Odd-v0", "gymnasium", gym.spaces.Tuple([gym.spaces.Discrete(2)]), gym.spaces.Discrete(2), 1)
