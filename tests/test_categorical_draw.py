"""fastrl_ext._acting.sample_categorical, the inference worker's action draw after its torch forward:
held to the numpy reference (NumpyPolicy.sample), to the softmax's frequencies, and wired into
TorchForward.act_into so that the draws land in the slot cells they are given."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fastrl.buffers import ShmAllocator, SharedWeights
from fastrl.config import load_config
from fastrl.models import ActorCritic
from fastrl.models.numpy_policy import NumpyPolicy
from helpers import PONG as IMAGE

fastrl_ext = pytest.importorskip("fastrl_ext")
pytestmark = pytest.mark.skipif(fastrl_ext._acting is None, reason="fastrl_ext not built")


def _draw(logits: np.ndarray, uniforms: np.ndarray, action_dtype=np.int32):
    actions = np.full(logits.shape[0], -1, dtype=action_dtype)
    log_probs = np.full(logits.shape[0], np.nan, dtype=np.float32)
    fastrl_ext._acting.sample_categorical(logits, uniforms, actions, log_probs)
    return actions, log_probs


@pytest.mark.parametrize("num_actions", [1, 2, 6, 18, 64])
@pytest.mark.parametrize("action_dtype", [np.int32, np.int64])
def test_the_draw_matches_the_numpy_reference(num_actions, action_dtype):
    """The same uniforms pick the same actions as NumpyPolicy.sample, with its log-probabilities."""
    reference = SimpleNamespace(discrete=True)  # all NumpyPolicy.sample reads of its policy for a categorical
    for seed in range(3):
        logits = (np.random.default_rng(100 + seed).standard_normal((257, num_actions)) * 3).astype(np.float32)
        want_actions, want_log_probs = NumpyPolicy.sample(reference, logits, np.random.default_rng(seed))
        got_actions, got_log_probs = _draw(logits, np.random.default_rng(seed).random(257, dtype=np.float32),
                                           action_dtype)
        np.testing.assert_array_equal(got_actions, want_actions)
        np.testing.assert_allclose(got_log_probs, want_log_probs, rtol=1e-5, atol=1e-6)
        if num_actions > 2:
            assert len(set(got_actions.tolist())) > 2  # not trivially equal


def test_the_draw_follows_the_softmax():
    """400,000 draws from one row of logits: each action's frequency within 5 standard errors of its
    probability, and each log-probability exactly log_softmax's."""
    logits = np.array([1.5, -0.5, 0.0, 2.0, -3.0, 0.7], dtype=np.float32)
    n = 400_000
    rows = np.broadcast_to(logits, (n, logits.size)).copy()
    actions, log_probs = _draw(rows, np.random.default_rng(7).random(n, dtype=np.float32))
    p = torch.softmax(torch.from_numpy(logits).double(), -1).numpy()
    freq = np.bincount(actions, minlength=logits.size) / n
    assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n)), (freq, p)
    log_softmax = torch.log_softmax(torch.from_numpy(logits), -1).numpy()
    np.testing.assert_allclose(log_probs, log_softmax[actions], rtol=1e-6, atol=1e-6)


def test_the_draw_never_picks_an_impossible_action_and_stays_finite():
    """A -inf logit is never drawn, whatever u, at both ends of [0, 1); huge logits do not overflow."""
    u = np.array([0.0, 1e-7, 0.5, np.nextafter(np.float32(1), np.float32(0))], dtype=np.float32)
    masked = np.tile(np.array([-np.inf, 0.0, -np.inf, 1.0, -np.inf], dtype=np.float32), (u.size, 1))
    actions, log_probs = _draw(masked, u)
    assert set(actions.tolist()) <= {1, 3} and np.all(np.isfinite(log_probs))
    assert actions[0] == 1 and actions[-1] == 3
    huge = np.tile(np.array([1e4, 1e4 - 1.0, -1e4], dtype=np.float32), (u.size, 1))
    actions, log_probs = _draw(huge, u)
    assert set(actions.tolist()) <= {0, 1} and np.all(np.isfinite(log_probs)) and np.all(log_probs <= 0)


def test_the_draw_refuses_what_it_cannot_take():
    ok_logits, ok_u = np.zeros((4, 3), np.float32), np.zeros(4, np.float32)
    actions, log_probs = np.zeros(4, np.int32), np.zeros(4, np.float32)
    draw = fastrl_ext._acting.sample_categorical
    with pytest.raises(TypeError, match="logits must be float32"):
        draw(ok_logits.astype(np.float64), ok_u, actions, log_probs)
    with pytest.raises(TypeError, match="actions must be int32 or int64"):
        draw(ok_logits, ok_u, actions.astype(np.int16), log_probs)
    with pytest.raises(TypeError, match="writable"):
        read_only = np.zeros(4, np.float32)
        read_only.flags.writeable = False
        draw(ok_logits, ok_u, actions, read_only)
    with pytest.raises(ValueError, match=r"\[B, A\]"):
        draw(ok_logits.reshape(-1), np.zeros(12, np.float32), np.zeros(12, np.int32), np.zeros(12, np.float32))
    with pytest.raises(ValueError, match="1 to 64 actions"):
        draw(np.zeros((4, 65), np.float32), ok_u, actions, log_probs)
    with pytest.raises(ValueError, match="must hold B items"):
        draw(ok_logits, np.zeros(3, np.float32), actions, log_probs)
    with pytest.raises(TypeError, match="4 arguments"):
        draw(ok_logits, ok_u, actions)


@pytest.mark.parametrize("native_acting", [True, False])
def test_an_inference_forward_draws_into_the_cells_it_is_given(native_acting):
    """TorchForward.act_into, as an inference worker calls it for two rollout groups: values equal
    the forward's, each log-prob is log_softmax of the forward's logits at the drawn action, and the
    rows land in their own group's cells. With system.native_acting=false it declines (the caller
    then draws through torch)."""
    from fastrl.workers.acting import TorchForward

    cfg = load_config("configs/atari_pong.yaml", [f"system.native_acting={str(native_acting).lower()}"])
    alloc = ShmAllocator()
    try:
        torch.manual_seed(0)
        learner_net = ActorCritic(IMAGE, cfg.model)
        with torch.no_grad():
            learner_net.policy_head.weight.mul_(100.0)  # logits far from uniform, so the draws differ by row
        weights = SharedWeights.allocate(alloc, learner_net)
        weights.publish(learner_net, version=1)
        forward = TorchForward(SimpleNamespace(cfg=cfg, spec=IMAGE, weights=weights), seed=0)
        assert forward.read(weights) == 1
        obs = np.random.default_rng(0).integers(0, 256, (16, *IMAGE.obs_shape), dtype=np.uint8)
        cells = np.full((2, 8), -1, np.int32), np.full((2, 8), np.nan, np.float32), np.full((2, 8), np.nan, np.float32)
        targets = [(cells[0][g], cells[1][g], cells[2][g]) for g in range(2)]
        if not native_acting:
            assert not forward.act_into(obs, targets) and np.all(cells[0] == -1)
            return
        seen = set()
        for _ in range(4):
            assert forward.act_into(obs, targets)
            with torch.inference_mode():
                logits, values = forward._net()(torch.from_numpy(obs))
            actions = cells[0].reshape(-1)
            seen.update(actions.tolist())
            np.testing.assert_array_equal(cells[2].reshape(-1), values.numpy())
            want = torch.log_softmax(logits, -1).numpy()[np.arange(16), actions]
            np.testing.assert_allclose(cells[1].reshape(-1), want, rtol=1e-5, atol=1e-5)
        assert len(seen) > 1
    finally:
        alloc.unlink_all()
