"""sampler.env_pool=per_worker: a rollout worker's groups as async batches of one envpool (fastrl.envs.vector's
SharedEnvpool and PooledGroup) step exactly as one envpool per group seeded alike, and a group that collects
another's envs is refused rather than recorded."""

import dataclasses

import numpy as np
import pytest

from fastrl.config import load_config
from fastrl.config.checks import check_config
from fastrl.config.schema import EnvConfig, SamplerConfig
from fastrl.envs.spec import resolve_env
from fastrl.envs.vector import EnvpoolSplit, PooledGroup, make_groups

FIELDS = ("obs", "reward", "terminated", "truncated", "score", "game_over")


def _actions(spec, rng, n):
    if spec.discrete:
        return rng.integers(0, spec.num_actions, n).astype(np.int32)
    return rng.uniform(-1, 1, (n, spec.num_actions)).astype(np.float32)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "public_api"])
@pytest.mark.parametrize("env_id, groups, per_group, steps, kwargs", [
    ("CartPole-v1", 2, 8, 200, {"max_episode_steps": 20}),    # truncations, terminations, reset steps
    ("CartPole-v1", 3, 4, 120, {"max_episode_steps": 15}),    # three groups take turns
    ("HalfCheetah-v5", 2, 4, 80, {"max_episode_steps": 30}),  # float actions
    ("Pong-v5", 2, 2, 120, {"max_episode_steps": 40}),        # Atari's score and game-over fields
])
def test_groups_of_one_pool_step_exactly_as_one_pool_per_group(env_id, groups, per_group, steps, kwargs, direct):
    """The rollout loop's order: every group sends, then in turn each collects its step and sends the next."""
    env_cfg = EnvConfig(id=env_id, kwargs=kwargs)
    spec = resolve_env(env_cfg)
    sampler = SamplerConfig(num_envs_per_worker=groups * per_group, num_splits=groups, env_pool="per_worker")
    pooled = make_groups(env_cfg, spec, sampler, seed=21)
    if not direct:  # the same pool's groups through envpool's public send/recv
        pool = pooled[0].pool
        pooled = [PooledGroup(pool, g, per_group, direct=False) for g in range(groups)]
    assert all(isinstance(g, PooledGroup) and g.direct == direct for g in pooled)
    separate = make_groups(env_cfg, spec, dataclasses.replace(sampler, env_pool="per_group"), seed=21)
    assert all(isinstance(g, EnvpoolSplit) for g in separate)

    rng = np.random.default_rng(5)
    ends = 0
    for g, (first_p, first_s) in enumerate(zip([e.reset() for e in pooled], [e.reset() for e in separate])):
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(first_p, field), getattr(first_s, field), err_msg=f"reset {g}")
    for g in range(groups):
        actions = _actions(spec, rng, per_group)
        pooled[g].send(actions)
        separate[g].send(actions)
    for t in range(steps):
        g = t % groups
        step_p, step_s = pooled[g].recv(), separate[g].recv()
        for field in FIELDS:
            got, want = getattr(step_p, field), getattr(step_s, field)
            assert got.dtype == want.dtype and got.shape == want.shape, (t, field)
            np.testing.assert_array_equal(got, want, err_msg=f"step {t}, group {g}, {field}")
        ends += int(step_p.truncated.sum() + step_p.terminated.sum())
        actions = _actions(spec, rng, per_group)
        pooled[g].send(actions)
        separate[g].send(actions)
    assert ends > 0
    for g in range(groups):  # the sends still outstanding, so that close does not race a stepping thread
        pooled[g].recv()
        separate[g].recv()
    for env in pooled + separate:
        env.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "public_api"])
def test_a_group_collecting_another_groups_envs_is_refused(direct):
    env_cfg = EnvConfig(id="CartPole-v1")
    spec = resolve_env(env_cfg)
    sampler = SamplerConfig(num_envs_per_worker=8, num_splits=2, env_pool="per_worker")
    groups = make_groups(env_cfg, spec, sampler, seed=3)
    if not direct:
        groups = [PooledGroup(groups[0].pool, g, 4, direct=False) for g in range(2)]
    groups[0].reset()
    groups[1].reset()
    groups[0].send(np.zeros(4, np.int32))
    groups[1].send(np.zeros(4, np.int32))
    with pytest.raises(RuntimeError, match="group 1 of a shared envpool collected envs 0..3, not its own 4..7"):
        groups[1].recv()  # group 0 sent first, so its envs come back first
    with pytest.raises(RuntimeError, match="group 0 of a shared envpool collected envs 4..7, not its own 0..3"):
        groups[0].recv_raw()
    for g in groups:
        g.close()


def test_native_callers_get_the_groups_own_env_ids():
    """fastrl_ext._rollout calls raw_calls' recv itself: the ids there are the group's, made 0..n-1."""
    env_cfg = EnvConfig(id="CartPole-v1")
    spec = resolve_env(env_cfg)
    groups = make_groups(env_cfg, spec, SamplerConfig(num_envs_per_worker=6, num_splits=2, env_pool="per_worker"),
                         seed=3)
    for g in groups:
        g.reset()
    for g in groups:
        g.send(np.ones(3, np.int32))
    for g in groups:
        _send, _args, recv, _actions_array, positions = g.raw_calls()
        np.testing.assert_array_equal(recv()[positions[4]], [0, 1, 2])
    for g in groups:
        g.close()


def test_gymnasium_groups_are_their_own_even_per_worker():
    env_cfg = EnvConfig(id="CartPole-v1", backend="gymnasium")
    spec = resolve_env(env_cfg)
    groups = make_groups(env_cfg, spec, SamplerConfig(num_envs_per_worker=4, num_splits=2, env_pool="per_worker"),
                         seed=0)
    assert len(groups) == 2 and not any(isinstance(g, PooledGroup) for g in groups)


def test_first_only_builds_one_group_per_group_pool_but_every_group_of_a_shared_one():
    env_cfg = EnvConfig(id="CartPole-v1")
    spec = resolve_env(env_cfg)
    sampler = SamplerConfig(num_envs_per_worker=4, num_splits=2)
    assert len(make_groups(env_cfg, spec, sampler, seed=0, first_only=True)) == 1
    shared = make_groups(env_cfg, spec, dataclasses.replace(sampler, env_pool="per_worker"), seed=0, first_only=True)
    assert len(shared) == 2


def test_a_shared_pool_with_more_than_one_thread_is_refused():
    cfg = load_config(None, ["sampler.env_pool=per_worker", "sampler.env_threads=2"])
    assert any("sampler.env_pool=per_worker steps a worker's groups in one envpool on one thread" in p
               for p in check_config(cfg))
    assert not check_config(load_config(None, ["sampler.env_pool=per_worker"]))
