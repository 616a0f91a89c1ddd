"""Several discrete choices acted as one categorical over their combinations (env.joint_actions), where the
env's action_mask marks combinations, not options: Jumanji's Minesweeper masks the [10, 10] cells of a row
and a column, so a row and a column drawn one by one cannot be masked, and a policy that picks an opened cell
ends its game. The policy side is a plain masked categorical (tests/test_action_mask.py); what is new is the
spec that picks it and the step from a combination's index to the env's choices (fastrl.envs.actions),
which fastrl_ext's rollout loop repeats (tests/test_native_steps.py, tests/test_serial.py)."""

import gymnasium as gym
import numpy as np
import pytest

from fastrl.config import load_config
from fastrl.config.loader import config_from_dict, config_to_dict
from fastrl.config.schema import EnvConfig
from fastrl.envs import resolve_env
from fastrl.envs.actions import EnvActions
from fastrl.envs.flatten import DictFlattener
from fastrl.envs.spec import _spec_from_spaces
from helpers import ROOT, SMALL_DISCRETE, TINY_CHEETAH


def spec_with_mask(act_space, mask_shape, joint_actions=True):
    obs = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(mask_shape),
                           "board": gym.spaces.Box(-1, 8, (2, 2), np.int32)})
    return _spec_from_spaces("Joint-v0", "gymnasium", obs, act_space, 1, joint_actions)


def test_a_mask_over_every_combination_makes_one_categorical_over_them():
    spec = spec_with_mask(gym.spaces.Box(0, 9, (2,), np.int32), (10, 10))  # Minesweeper's row and column
    assert (spec.num_actions, spec.action_joint, spec.action_nvec, spec.action_cell) == (100, (10, 10), (), ())
    assert spec.action_mask == (0, 100) and spec.action_mask_columns == slice(0, 100)
    assert spec.action_mask_note() == ("action_mask applied to one categorical over the 100 combinations of "
                                       "2 choices [10, 10] (env.joint_actions)")
    three = spec_with_mask(gym.spaces.MultiDiscrete([2, 3, 4], start=[1, 0, -1]), (2, 3, 4))
    assert (three.num_actions, three.action_joint, three.action_low) == (24, (2, 3, 4), (1, 0, -1))


def test_choices_stay_drawn_one_by_one_where_the_mask_is_not_one_per_combination_or_joint_actions_is_false():
    minesweeper = gym.spaces.Box(0, 9, (2,), np.int32)
    drawn_apart = spec_with_mask(minesweeper, (10, 10), joint_actions=False)
    assert (drawn_apart.num_actions, drawn_apart.action_nvec, drawn_apart.action_joint) == (20, (10, 10), ())
    # as many entries, but laid out [columns, rows]: entry i would not be combination i
    assert spec_with_mask(gym.spaces.Box(0, np.array([3, 9]), (2,), np.int32), (10, 4)).action_joint == ()
    # Connector's one row per choice ([choices, options]) is as large as their sum, and masks each draw
    per_choice = spec_with_mask(gym.spaces.Box(0, 4, (3,), np.int32), (3, 5))
    assert (per_choice.action_joint, per_choice.action_nvec, per_choice.action_mask) == ((), (5, 5, 5), (0, 15))
    # two binary choices: a [2, 2] mask could be either, and one row per choice is what it meant before
    assert spec_with_mask(gym.spaces.MultiBinary(2), (2, 2)).action_joint == ()
    assert _spec_from_spaces("NoMask-v0", "gymnasium", gym.spaces.Box(0.0, 1.0, (3,)),
                             gym.spaces.MultiDiscrete([3, 4]), 1).action_joint == ()


@pytest.mark.parametrize("nvec, start", [((10, 10), (0, 0)), ((2, 3, 4), (1, 0, -1)), ((4, 10), (0, 0))],
                         ids=["minesweeper", "three_choices_with_starts", "tetris"])
def test_the_masks_entry_i_and_the_action_i_name_the_same_combination(nvec, start):
    """The mask reaches the policy flattened as DictFlattener lays it out; entry i forbids or allows logit i, so
    action i must reach the env as the choices at entry i of the env's mask."""
    spec = spec_with_mask(gym.spaces.MultiDiscrete(list(nvec), start=list(start)), nvec)
    num_envs = 6
    masks = np.random.default_rng(0).random((num_envs, *nvec)) < 0.3
    flat = DictFlattener(spec.obs_dict, num_envs)({"action_mask": masks, "board": np.zeros((num_envs, 2, 2))})
    allowed = flat[:, spec.action_mask_columns] > 0.5
    to_env = EnvActions(spec)
    for i in range(spec.num_actions):
        env_actions = to_env(np.full(num_envs, i, dtype=np.int32))
        assert env_actions.shape == (num_envs, len(nvec)) and env_actions.dtype == np.int32
        choices = tuple((env_actions - np.asarray(start)).T)  # each choice's 0-based option, per env
        assert np.array_equal(masks[(np.arange(num_envs), *choices)], allowed[:, i])


def test_env_actions_offset_clip_or_pass_through():
    to_env = EnvActions(SMALL_DISCRETE)
    actions = np.array([0, 2, 1], dtype=np.int32)
    assert to_env.identity and to_env(actions) is actions  # CartPole's: no copy per step
    started = EnvActions(_spec_from_spaces("S-v0", "gymnasium", gym.spaces.Box(0.0, 1.0, (3,)),
                                           gym.spaces.Discrete(3, start=2), 1))
    assert started(actions).tolist() == [2, 4, 3]
    bounded = EnvActions(TINY_CHEETAH)
    assert bounded(np.array([[-3.0, 0.5], [0.25, 7.0]], np.float32)).tolist() == [[-1.0, 0.5], [0.25, 1.0]]


def test_jumanjis_minesweeper_tetris_and_binpack_act_over_their_masks_cells():
    for env_id, nvec in (("Minesweeper-v0", (10, 10)), ("Tetris-v0", (4, 10)), ("BinPack-v2", (40, 20))):
        spec = resolve_env(EnvConfig(id=env_id))
        assert spec.action_joint == nvec and spec.num_actions == int(np.prod(nvec)), env_id
        assert spec.action_mask[1] == spec.num_actions, env_id


def test_a_run_saved_before_joint_actions_keeps_its_one_categorical_per_choice():
    """Its checkpoints hold a head of 20 logits for Minesweeper, which the new default's 100 would not fit."""
    saved = config_to_dict(load_config(ROOT / "configs/cartpole.yaml"))
    assert saved["env"]["joint_actions"] is True
    del saved["env"]["joint_actions"]  # what config.json held before the key
    assert config_from_dict(saved).env.joint_actions is False
    saved["env"]["joint_actions"] = True
    assert config_from_dict(saved).env.joint_actions is True
