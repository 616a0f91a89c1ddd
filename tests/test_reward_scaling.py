"""ReturnScaler against a per-env, per-step reference written from the definition."""

import numpy as np

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
