"""The numpy acting forward against ActorCritic: same outputs from the same published weights."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

from fastrl.buffers import ShmAllocator, SharedWeights
from fastrl.config import load_config
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic
from fastrl.models.numpy_policy import NumpyPolicy, acting_backend, unsupported_reason
from helpers import ROOT

DISCRETE = EnvSpec("Discrete-v0", "envpool", (4,), np.dtype(np.float32), True, 3)
CONTINUOUS = EnvSpec("Continuous-v0", "envpool", (17,), np.dtype(np.float32), False, 6, (-1.0,) * 6, (1.0,) * 6)
IMAGE = EnvSpec("Image-v0", "envpool", (4, 84, 84), np.dtype(np.uint8), True, 6)


def _config(*overrides: str):
    return load_config(None, list(overrides))


def _model_and_policy(spec: EnvSpec, *overrides: str, seed: int = 0):
    """An ActorCritic with every parameter and statistic randomised (heads included, so the
    outputs are far from their near-zero initialisation), and a NumpyPolicy that read it the way a
    rollout worker does: published through SharedWeights, copied out with try_read_array."""
    cfg = _config(*overrides)
    torch.manual_seed(seed)
    model = ActorCritic(spec, cfg.model).eval()
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name == "normalizer.var":
                t.copy_(torch.rand_like(t) * 4 + 0.1)
            elif name == "normalizer.count":
                t.fill_(1000.0)
            else:
                t.copy_(torch.randn_like(t) * (0.5 if name.endswith("weight") else 0.3))
    alloc = ShmAllocator()
    try:
        weights = SharedWeights.allocate(alloc, model)
        weights.publish(model, version=3)
        staging = np.empty(weights.data.shape[0], dtype=np.float32)
        assert weights.try_read_array(staging) == 3
        policy = NumpyPolicy(weights.layout, spec, cfg.model.activation)
        policy.load(staging)
    finally:
        alloc.unlink_all()
    return model, policy


VARIANTS = [
    (DISCRETE, ["model.activation=tanh", "model.shared_encoder=false"]),
    (DISCRETE, ["model.activation=relu", "model.shared_encoder=true", "model.hidden_sizes=[32, 16, 8]"]),
    (CONTINUOUS, ["model.activation=tanh", "model.shared_encoder=false", "model.normalize_obs=true"]),
    (CONTINUOUS, ["model.activation=relu", "model.shared_encoder=true", "model.init_log_std=-0.5"]),
]


@pytest.mark.parametrize("spec, overrides", VARIANTS, ids=["cat-tanh-separate", "cat-relu-shared-3layers",
                                                          "gauss-tanh-normalized", "gauss-relu-shared"])
def test_forward_and_log_probs_match_actor_critic(spec, overrides):
    model, policy = _model_and_policy(spec, *overrides)
    obs = (np.random.default_rng(1).standard_normal((37, *spec.obs_shape)) * 3).astype(np.float32)
    with torch.no_grad():
        params_ref, values_ref = model(torch.from_numpy(obs))
    params, values = policy.forward(obs)
    assert params.dtype == np.float32 and values.shape == (37,)
    np.testing.assert_allclose(params, params_ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values, values_ref.numpy(), rtol=1e-4, atol=1e-5)
    assert np.abs(values).max() > 0.1  # not a trivially zero comparison

    actions, log_probs = policy.sample(params, np.random.default_rng(2))
    with torch.no_grad():
        log_probs_ref = model.log_prob(params_ref, torch.as_tensor(actions))
    np.testing.assert_allclose(log_probs, log_probs_ref.numpy(), rtol=1e-4, atol=1e-5)


def test_categorical_samples_follow_the_softmax():
    model, policy = _model_and_policy(DISCRETE, "model.activation=tanh")
    params = np.array([[2.0, 0.5, -1.0]], dtype=np.float32).repeat(40_000, axis=0)
    actions, log_probs = policy.sample(params, np.random.default_rng(3))
    probs = np.exp(params[0] - params[0].max())
    probs /= probs.sum()
    freq = np.bincount(actions, minlength=3) / len(actions)
    np.testing.assert_allclose(freq, probs, atol=0.01)  # 5 sigma of a 40k-sample frequency is ~0.012
    np.testing.assert_allclose(log_probs, np.log(probs)[actions], rtol=1e-5)


def test_gaussian_samples_have_the_policys_mean_and_std():
    model, policy = _model_and_policy(CONTINUOUS, "model.init_log_std=-0.5")
    mean = np.linspace(-1, 1, 6, dtype=np.float32)[None].repeat(40_000, axis=0)
    actions, _ = policy.sample(mean, np.random.default_rng(4))
    std = model.log_std.detach().exp().numpy()
    np.testing.assert_allclose(actions.mean(0), mean[0], atol=5 * std.max() / np.sqrt(40_000))
    np.testing.assert_allclose(actions.std(0), std, rtol=0.02)


def test_which_models_act_in_numpy():
    cfg = _config("sampler.num_inference_workers=0")
    assert unsupported_reason(cfg, DISCRETE) is None and acting_backend(cfg, DISCRETE) == "numpy"
    assert "nature_cnn" in unsupported_reason(cfg, IMAGE) and acting_backend(cfg, IMAGE) == "torch"
    bf16 = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, precision="bf16"))
    assert "bf16" in unsupported_reason(bf16, DISCRETE) and acting_backend(bf16, DISCRETE) == "torch"
    forced = _config("sampler.acting_backend=torch")
    assert acting_backend(forced, DISCRETE) == "torch"


def test_an_impossible_numpy_backend_is_a_config_error():
    out = subprocess.run([sys.executable, "-m", "fastrl", "train", "--config", "configs/atari_pong.yaml",
                          "--set", "sampler.num_inference_workers=0", "--set", "sampler.acting_backend=numpy"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "sampler.acting_backend=numpy: model.encoder resolves to nature_cnn" in out.stdout + out.stderr


def test_importing_the_numpy_policy_does_not_import_torch():
    code = "import sys, fastrl.models.numpy_policy, fastrl.workers.acting; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr
