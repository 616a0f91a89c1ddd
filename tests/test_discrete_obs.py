"""A bare Discrete observation (FrozenLake's cell, Taxi's and CliffWalking's state index) stored one-hot by
each split (fastrl.envs.flatten.OneHot). Before, every such env was refused as "neither a Box nor a Dict".
envpool's FrozenLake and Taxi against envpool's own integers, and FrozenLake in groups of one shared envpool,
are in tests/test_dict_obs.py beside the Dicts that take the same path."""

import gymnasium as gym
import numpy as np
import pytest

from fastrl.config.schema import EnvConfig
from fastrl.envs import resolve_env
from fastrl.envs.flatten import OneHot
from fastrl.envs.spec import _spec_from_spaces
from fastrl.envs.vector import GymnasiumSplit


def test_a_discrete_observation_is_specified_as_its_one_hot():
    spec = _spec_from_spaces("Taxi-v3", "gymnasium", gym.spaces.Discrete(500), gym.spaces.Discrete(6), 1)
    assert spec.obs_shape == (500,) and spec.obs_dtype == np.float32 and spec.obs_one_hot == (500, 0)
    assert not spec.is_image and not spec.obs_dict
    counted_from_3 = _spec_from_spaces("Odd-v0", "gymnasium", gym.spaces.Discrete(5, start=3), gym.spaces.Discrete(2), 1)
    assert counted_from_3.obs_one_hot == (5, 3) and counted_from_3.obs_shape == (5,)
    box = _spec_from_spaces("Box-v0", "gymnasium", gym.spaces.Box(0, 1, (5,)), gym.spaces.Discrete(2), 1)
    assert box.obs_one_hot == ()


def test_one_hot_lights_each_rows_value_less_start_and_clears_the_last_call():
    one_hot = OneHot(5, 3, num_envs=3)
    first = one_hot(np.array([3, 7, 5])).copy()
    np.testing.assert_array_equal(first, np.eye(5, dtype=np.float32)[[0, 4, 2]])
    second = one_hot(np.array([[4], [4], [3]], dtype=np.int32))  # any integer dtype and shape of one per env
    assert second.dtype == np.float32
    np.testing.assert_array_equal(second, np.eye(5, dtype=np.float32)[[1, 1, 0]])


@pytest.mark.parametrize("values", [[2, 3, 4], [3, 8, 4]], ids=["below_start", "past_the_end"])
def test_a_value_outside_the_space_is_refused_not_wrapped(values):
    with pytest.raises(ValueError, match="outside 3..7"):
        OneHot(5, 3, num_envs=3)(np.array(values))


def test_a_gymnasium_discrete_observation_counted_from_its_start_is_one_hot():
    env_cfg = EnvConfig(id="custom_env:FastrlTestIndex-v0")
    spec = resolve_env(env_cfg)
    assert spec.backend == "gymnasium" and spec.obs_one_hot == (12, 3)
    split = GymnasiumSplit(env_cfg, spec, 3, 1, seed=0)
    step = split.reset()
    for _ in range(5):
        states = [int(np.flatnonzero(row)[0]) + 3 for row in step.obs]
        assert (step.obs.sum(axis=1) == 1).all()
        np.testing.assert_array_equal(states, [env.unwrapped.state for env in split._env.envs])
        split.send(np.zeros(3, dtype=np.int64))
        step = split.recv()
    split.close()
