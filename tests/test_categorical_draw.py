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
from fastrl.config.schema import ModelConfig
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic
from fastrl.models.numpy_policy import NumpyPolicy
from helpers import PONG as IMAGE
from helpers import TWO_CHOICES

fastrl_ext = pytest.importorskip("fastrl_ext")
pytestmark = pytest.mark.skipif(fastrl_ext._acting is None, reason="fastrl_ext not built")


def _draw(logits: np.ndarray, uniforms: np.ndarray, action_dtype=np.int32, choices=None):
    actions = np.full(uniforms.shape, -1, dtype=action_dtype)
    log_probs = np.full(logits.shape[0], np.nan, dtype=np.float32)
    if choices is None:
        fastrl_ext._acting.sample_categorical(logits, uniforms, actions, log_probs)
    else:
        fastrl_ext._acting.sample_categorical(logits, uniforms, actions, log_probs, np.asarray(choices, np.int64))
    return actions, log_probs


def _numpy_reference(actions) -> NumpyPolicy:
    """A NumpyPolicy over `actions` (a number: one categorical; a tuple: several choices' options), for its
    sample."""
    nvec = actions if isinstance(actions, tuple) else ()
    spec = EnvSpec("Draw-v0", "envpool", (3,), np.dtype(np.float32), True, sum(nvec) or actions, (0,) * len(nvec),
                   action_nvec=nvec)
    return NumpyPolicy.from_module(ActorCritic(spec, ModelConfig(hidden_sizes=[4], native_mlp=False)), spec, "tanh")


# past 64 options the draw counts beyond the sums it keeps on the stack in a second pass
@pytest.mark.parametrize("num_actions", [1, 2, 6, 18, 64, 65, 100, (3, 4), (64, 2, 5), (100, 3)])
@pytest.mark.parametrize("action_dtype", [np.int32, np.int64])
def test_the_draw_matches_the_numpy_reference(num_actions, action_dtype):
    """The same uniforms pick the same actions as NumpyPolicy.sample, with its log-probabilities: one
    categorical, or several choices each over its slice of the row."""
    reference = _numpy_reference(num_actions)
    choices = num_actions if isinstance(num_actions, tuple) else None
    width = sum(choices) if choices else num_actions
    for seed in range(3):
        logits = (np.random.default_rng(100 + seed).standard_normal((257, width)) * 3).astype(np.float32)
        want_actions, want_log_probs = reference.sample(logits, np.random.default_rng(seed))
        uniforms = np.random.default_rng(seed).random((257, len(choices)) if choices else 257, dtype=np.float32)
        got_actions, got_log_probs = _draw(logits, uniforms, action_dtype, choices)
        np.testing.assert_array_equal(got_actions, want_actions)
        np.testing.assert_allclose(got_log_probs, want_log_probs, rtol=1e-5, atol=1e-6)
        if width > 2:
            assert np.unique(got_actions).size > 2  # not trivially equal


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
    with pytest.raises(ValueError, match="at least 1 action"):
        draw(ok_logits, np.zeros((4, 3), np.float32), np.zeros((4, 3), np.int32), log_probs,
             np.array([3, 0, 0], np.int64))
    with pytest.raises(ValueError, match="must hold B items"):
        draw(ok_logits, np.zeros(3, np.float32), actions, log_probs)
    with pytest.raises(TypeError, match="4 or 5 arguments"):
        draw(ok_logits, ok_u, actions)
    # several choices: their options must add up to the row, and each row takes a uniform and an action per choice
    two_u, two_actions = np.zeros((4, 2), np.float32), np.zeros((4, 2), np.int32)
    draw(ok_logits, two_u, two_actions, log_probs, np.array([1, 2], np.int64))
    with pytest.raises(ValueError, match="do not add up"):
        draw(ok_logits, two_u, two_actions, log_probs, np.array([2, 2], np.int64))
    with pytest.raises(TypeError, match="choices must be int64"):
        draw(ok_logits, two_u, two_actions, log_probs, np.array([1, 2], np.int32))
    with pytest.raises(ValueError, match="B items per choice"):
        draw(ok_logits, ok_u, two_actions, log_probs, np.array([1, 2], np.int64))
    with pytest.raises(ValueError, match="B items per choice"):
        draw(ok_logits, two_u, actions, log_probs, np.array([1, 2], np.int64))


@pytest.mark.parametrize("preset, spec, native_acting", [
    ("configs/atari_pong.yaml", IMAGE, True), ("configs/atari_pong.yaml", IMAGE, False),
    ("configs/cartpole.yaml", TWO_CHOICES, True)], ids=["one", "one_native_acting_off", "two_choices"])
def test_an_inference_forward_draws_into_the_cells_it_is_given(preset, spec, native_acting):
    """TorchForward.act_into, as an inference worker calls it for two rollout groups: values equal
    the forward's, each log-prob is the policy's own (ActorCritic.log_prob) at the drawn actions, and the
    rows land in their own group's cells: one categorical (the Pong CNN's), or two choices of 3 and 4
    options, [rows, 2] actions drawn with a uniform per choice. With system.native_acting=false it declines
    (the caller then draws through torch)."""
    from fastrl.workers.acting import TorchForward

    cfg = load_config(preset, [f"system.native_acting={str(native_acting).lower()}"])
    alloc = ShmAllocator()
    try:
        torch.manual_seed(0)
        learner_net = ActorCritic(spec, cfg.model)
        with torch.no_grad():
            learner_net.policy_head.weight.mul_(100.0)  # logits far from uniform, so the draws differ by row
        weights = SharedWeights.allocate(alloc, learner_net)
        weights.publish(learner_net, version=1)
        forward = TorchForward(SimpleNamespace(cfg=cfg, spec=spec, weights=weights), seed=0)
        assert forward.read(weights) == 1
        rng = np.random.default_rng(0)
        obs = (rng.integers(0, 256, (16, *spec.obs_shape), dtype=np.uint8) if spec.is_image
               else rng.standard_normal((16, *spec.obs_shape)).astype(np.float32))
        action_cell = spec.action_cell
        cells = (np.full((2, 8, *action_cell), -1, np.int32), np.full((2, 8), np.nan, np.float32),
                 np.full((2, 8), np.nan, np.float32))
        targets = [(cells[0][g], cells[1][g], cells[2][g]) for g in range(2)]
        if not native_acting:
            assert not forward.act_into(obs, targets) and np.all(cells[0] == -1)
            return
        seen = set()
        for _ in range(4):
            assert forward.act_into(obs, targets)
            actions = cells[0].reshape(16, *action_cell)
            with torch.inference_mode():
                logits, values = forward._net()(torch.from_numpy(obs))
                want = forward.model.log_prob(logits, torch.from_numpy(actions))
            assert ((actions >= 0) & (actions < np.asarray(spec.action_nvec or spec.num_actions))).all()
            seen.update(actions.reshape(16, -1)[:, -1].tolist())
            np.testing.assert_array_equal(cells[2].reshape(-1), values.numpy())
            np.testing.assert_allclose(cells[1].reshape(-1), want.numpy(), rtol=1e-5, atol=1e-5)
        assert len(seen) > 1
    finally:
        alloc.unlink_all()
