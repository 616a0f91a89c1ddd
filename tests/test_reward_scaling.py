"""ReturnScaler against a per-env, per-step reference written from the definition."""

import numpy as np
import pytest

import fastrl_ext
from fastrl.algo.reward_scaling import ReturnScaler


def reference(rewards, valid, done, gamma, clip=10.0, eps=1e-8):
    """rewards/valid/done: [steps, splits, envs]. One scalar return per env; running moments merged
    one value at a time (with the same weak prior: mean 0, var 1, count 1e-4)."""
    steps, splits, envs = rewards.shape
    G = np.zeros((splits, envs))
    count, mean, m2 = 1e-4, 0.0, 1.0 * 1e-4
    out = np.zeros_like(rewards)
    for t in range(steps):
        for s in range(splits):  # the rollout worker records one split per step
            for e in range(envs):
                if valid[t, s, e]:
                    G[s, e] = gamma * G[s, e] + rewards[t, s, e]
                    count += 1
                    delta = G[s, e] - mean
                    mean += delta / count
                    m2 += delta * (G[s, e] - mean)
            var = m2 / count
            for e in range(envs):
                out[t, s, e] = min(clip, max(-clip, rewards[t, s, e] / np.sqrt(var + eps)))
                if done[t, s, e]:
                    G[s, e] = 0.0
    return out


def test_matches_the_per_step_reference_across_episode_ends():
    rng = np.random.default_rng(0)
    steps, splits, envs, gamma = 60, 2, 5, 0.97
    rewards = rng.normal(2.0, 3.0, (steps, splits, envs)).astype(np.float32)
    done = rng.random((steps, splits, envs)) < 0.08
    valid = np.ones_like(done)
    valid[1:] = ~done[:-1]  # envpool: the step after an episode end is a reset step, not a transition
    rewards[~valid] = 0.0
    scaler = ReturnScaler((splits, envs), gamma)
    got = np.stack([np.stack([scaler(s, rewards[t, s], valid[t, s], done[t, s]) for s in range(splits)])
                    for t in range(steps)])
    np.testing.assert_allclose(got, reference(rewards, valid, done, gamma), rtol=1e-5, atol=1e-6)


def test_scaled_returns_have_unit_scale_and_are_clipped():
    rng = np.random.default_rng(1)
    scaler = ReturnScaler((1, 16), 0.99, clip=5.0)
    valid, done = np.ones(16, bool), np.zeros(16, bool)
    for _ in range(2000):
        scaled = scaler(0, rng.normal(50.0, 1.0, 16), valid, done)
    assert np.sqrt(scaler.var) > 100  # returns of ~50/(1-0.99) spread over their ramp-up
    assert np.all(np.abs(scaled) <= 5.0) and 0 < scaled.mean() < 1
    assert np.all(scaler(0, np.full(16, 1e9), valid, done) == 5.0)


native_only = pytest.mark.skipif(fastrl_ext._record is None, reason=f"fastrl_ext not built: {fastrl_ext.BUILD_ERROR}")


@native_only
@pytest.mark.parametrize("envs", [1, 7, 8, 13, 32, 128, 129, 300])
def test_native_scaling_matches_the_reference_bit_for_bit(envs):
    """Every summation path of numpy's pairwise sum (under 8, blocks of 8 up to 128, halves above),
    with reset steps thinning G[valid] to any size, and rewards large enough to hit the clip."""
    rng = np.random.default_rng(envs)
    gamma, groups = 0.99, 2
    ref, nat = ReturnScaler((groups, envs), gamma, clip=3.0), ReturnScaler((groups, envs), gamma, clip=3.0)
    valid = np.ones((groups, envs), bool)
    clipped = 0
    for step in range(200):
        g = step % groups
        rewards = (rng.normal(1.0, 5.0, envs) * (100.0 if step % 37 == 0 else 1.0)).astype(np.float32)
        done = rng.random(envs) < 0.05
        rewards[~valid[g]] = 0.0
        expected = ref(g, rewards, valid[g], done)
        got = rewards.copy()
        fastrl_ext._record.scale_rewards(nat.returns[g], nat.moments, got, valid[g], done, gamma, 3.0, nat.eps)
        assert got.tobytes() == expected.tobytes(), f"step {step}"
        clipped += int((np.abs(expected) == 3.0).sum())
        assert nat.moments.tobytes() == ref.moments.tobytes() and nat.returns.tobytes() == ref.returns.tobytes()
        valid[g] = ~done  # envpool: the step after an episode end is a reset step
    assert clipped > 0 and ref.count > 80 * envs


@native_only
def test_native_scaling_refuses_bad_inputs_before_writing():
    scale = fastrl_ext._record.scale_rewards
    s = ReturnScaler((1, 4), 0.99)
    rewards, valid, done = np.ones(4, np.float32), np.ones(4, bool), np.zeros(4, bool)
    with pytest.raises(TypeError, match="float32"):
        scale(s.returns[0], s.moments, rewards.astype(np.float64), valid, done, 0.99, 10.0, 1e-8)
    with pytest.raises(ValueError, match="one item per env"):
        scale(s.returns[0], s.moments, rewards[:3], valid, done, 0.99, 10.0, 1e-8)
    with pytest.raises(ValueError, match="count, mean, var"):
        scale(s.returns[0], s.moments[:2], rewards, valid, done, 0.99, 10.0, 1e-8)
    with pytest.raises(TypeError, match="bool"):
        scale(s.returns[0], s.moments, rewards, valid.astype(np.uint8), done, 0.99, 10.0, 1e-8)
    assert s.moments.tolist() == [1e-4, 0.0, 1.0] and not s.returns.any() and (rewards == 1).all()
