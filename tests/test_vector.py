"""EnvpoolSplit's direct calls into envpool's C++ send/recv against envpool's public API."""

from types import SimpleNamespace

import numpy as np
import pytest

from fastrl.config.schema import EnvConfig
from fastrl.envs.flatten import DictFlattener
from fastrl.envs.spec import resolve_env
from fastrl.envs.vector import EnvpoolSplit, _DirectCalls

FIELDS = ("obs", "reward", "terminated", "truncated", "score", "game_over")


@pytest.mark.parametrize("env_id, num_envs, steps, kwargs", [
    ("CartPole-v1", 16, 300, {"max_episode_steps": 20}),     # truncations and terminations
    ("HalfCheetah-v5", 8, 120, {"max_episode_steps": 30}),   # float32 actions cast to envpool's float64
    ("Pong-v5", 2, 150, {"max_episode_steps": 40}),          # Atari's unclipped score and game-over keys
    ("LunarLanderContinuous-v2", 4, 200, {}),               # Box2D declares its action shape with no -1 axis
    ("BipedalWalker-v3", 4, 200, {"max_episode_steps": 50}),
])
def test_direct_calls_step_exactly_like_the_public_api(env_id, num_envs, steps, kwargs):
    env_cfg = EnvConfig(id=env_id, kwargs=kwargs)
    spec = resolve_env(env_cfg)
    direct = EnvpoolSplit(env_cfg, spec, num_envs, 1, seed=11, direct=True)
    public = EnvpoolSplit(env_cfg, spec, num_envs, 1, seed=11, direct=False)
    assert direct.direct and not public.direct
    rng = np.random.default_rng(3)
    ends = 0
    step_d, step_p = direct.reset(), public.reset()
    for t in range(steps):
        for field in FIELDS:
            got, want = getattr(step_d, field), getattr(step_p, field)
            assert got.dtype == want.dtype and got.shape == want.shape, (t, field)
            np.testing.assert_array_equal(got, want, err_msg=f"step {t}, {field}")
        ends += int(step_d.truncated.sum() + step_d.terminated.sum())
        if spec.discrete:
            actions = rng.integers(0, spec.num_actions, num_envs).astype(np.int64)
        else:
            actions = rng.uniform(-1, 1, (num_envs, spec.num_actions)).astype(np.float32)
        direct.send(actions)
        public.send(actions)
        step_d, step_p = direct.recv(), public.recv()
    assert ends > 0  # the comparison crossed episode ends and envpool's reset steps
    direct.close()
    public.close()


def test_an_unexpected_envpool_layout_falls_back_to_the_public_api():
    layout = dict(_action_keys=["env_id", "players.env_id", "action"],
                  _state_keys=["info:env_id", "obs", "reward", "done", "trunc"],
                  _send=print, _recv=print,
                  _spec=SimpleNamespace(_action_spec=[(np.int32, [], ()), (np.int32, [-1], ()), (np.int32, [-1], ())]),
                  config={"max_num_players": 1})
    assert _DirectCalls.supported(SimpleNamespace(**layout))
    assert not _DirectCalls.supported(SimpleNamespace(**{**layout, "_action_keys": ["env_id", "action"]}))
    assert not _DirectCalls.supported(SimpleNamespace(**{**layout, "config": {"max_num_players": 2}}))
    assert not _DirectCalls.supported(SimpleNamespace(**{**layout, "_state_keys": ["obs", "reward"]}))
    assert not _DirectCalls.supported(SimpleNamespace(**{**layout, "_recv": None}))
    no_send = {k: v for k, v in layout.items() if k != "_send"}
    assert not _DirectCalls.supported(SimpleNamespace(**no_send))
    flatten = DictFlattener((("a", 2), ("b", 1)), num_envs=4)  # a Dict observation: one output per key
    assert not _DirectCalls.supported(SimpleNamespace(**layout), flatten)
    dict_keys = ["info:env_id", "obs:a", "reward", "done", "trunc", "obs:b"]
    assert _DirectCalls.supported(SimpleNamespace(**{**layout, "_state_keys": dict_keys}), flatten)
    assert not _DirectCalls.supported(SimpleNamespace(**{**layout, "_state_keys": dict_keys[:-1]}), flatten)
