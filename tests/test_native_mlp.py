"""model.native_mlp: an fp32 MLP actor and critic through fastrl_ext._mlp against torch's own layers
(the same network with native_mlp off, same weights): outputs and every parameter's gradient on
random inputs and losses, at row counts on both sides of the kernel's 8-row and 16-column blocks,
for tanh and ReLU, Gaussian and categorical heads; an optimizer step of the APPO learner; the
cases it must leave to torch; the raw kernel's argument checks; every compiled variant; and its
observation normalisation against the normaliser's forward, bit for bit."""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from fastrl.algo.appo import APPOTrainer
from fastrl.algo.flat_params import FlatParams
from fastrl.bench.components import synthetic_batch
from fastrl.config import load_config
from fastrl.config.schema import ModelConfig
from fastrl.envs import resolve_env
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic
from fastrl.models import native_mlp
from helpers import HALFCHEETAH as CHEETAH  # an MLP at HalfCheetah's shape

ROOT = Path(__file__).resolve().parents[1]
needs_native = pytest.mark.skipif(native_mlp._native is None, reason="fastrl_ext not built")

CARTPOLE = EnvSpec("Tiny-cartpole", "envpool", (4,), np.dtype(np.float32), True, 2)


def _pair(spec: EnvSpec, **model_kwargs) -> tuple[ActorCritic, ActorCritic]:
    """(native, torch) networks with the same weights."""
    torch.manual_seed(0)
    native = ActorCritic(spec, ModelConfig(native_mlp=True, **model_kwargs))
    reference = ActorCritic(spec, ModelConfig(native_mlp=False, **model_kwargs))
    reference.load_state_dict(native.state_dict())
    # on the plain x86-64 variant the networks keep torch's layers by default (native_mlp.pays); its kernel
    # is tested all the same
    assert native.native_nets is not None or (not native_mlp.pays() and native.use_native_layers())
    assert reference.native_nets is None
    with torch.no_grad():  # biases away from their zero init, so that a wrong bias gradient shows
        for a, b in zip(native.parameters(), reference.parameters()):
            a.add_(torch.randn_like(a) * 0.1)
            b.copy_(a)
    return native, reference


def _loss(params: torch.Tensor, values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (params * weights[:, : params.shape[1]]).sum() + (values ** 2 * weights[:, -1]).sum()


@needs_native
@pytest.mark.parametrize("rows", [1, 7, 8, 17, 255, 260, 528])
@pytest.mark.parametrize("spec,hidden,activation", [
    (CHEETAH, [64, 64], "tanh"), (CARTPOLE, [64, 64], "tanh"), (CHEETAH, [33], "relu"),
    (CARTPOLE, [17, 50, 5], "relu"), (CHEETAH, [], "tanh")])
def test_outputs_and_gradients_match_torch(rows, spec, hidden, activation):
    native, reference = _pair(spec, hidden_sizes=hidden, activation=activation, normalize_obs=True)
    torch.manual_seed(rows)
    obs = torch.randn(rows, *spec.obs_shape) * 2
    weights = torch.randn(rows, spec.num_actions + 1)
    outs = [net(obs) for net in (native, reference)]
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    for net, (params, values) in zip((native, reference), outs):
        _loss(params, values, weights).backward()
    for (name, a), b in zip(native.named_parameters(), reference.parameters()):
        if b.grad is None:  # log_std: no path from these outputs, in either
            assert a.grad is None, name
            continue
        scale = b.grad.abs().max().item() + 1e-6
        torch.testing.assert_close(a.grad / scale, b.grad / scale, atol=3e-5, rtol=0, msg=name)


@needs_native
def test_one_output_in_the_loss_leaves_the_other_nets_parameters_without_gradient():
    native, reference = _pair(CHEETAH)
    obs = torch.randn(40, 17)
    for net in (native, reference):
        net(obs)[1].sum().backward()  # the value only
    for (name, a), b in zip(native.named_parameters(), reference.parameters()):
        assert (a.grad is None) == (b.grad is None), name
        if b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5)
    assert native.policy_head.weight.grad is None and native.value_head.weight.grad is not None


@needs_native
def test_input_gradient_when_the_observation_requires_it():
    native, reference = _pair(CARTPOLE, hidden_sizes=[64, 64])
    obs = torch.randn(37, 4)
    grads = []
    for net in (native, reference):
        x = obs.clone().requires_grad_()
        _loss(*net(x), torch.ones(37, 3)).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)


@needs_native
def test_parameters_reseated_into_flat_memory_are_read_where_they_now_live():
    """fastrl.algo.flat_params moves the parameters into one buffer after the network is built (and
    after the native path cached its views); an optimizer step then writes them in place."""
    native, reference = _pair(CHEETAH)
    obs = torch.randn(16, 17)
    native(obs)  # caches views of the parameters' first memory
    flat = FlatParams(list(native.parameters()))
    assert flat is not None
    with torch.no_grad():
        for p in native.parameters():
            p.mul_(1.5)
        for p in reference.parameters():
            p.mul_(1.5)
    torch.testing.assert_close(native(obs), reference(obs), atol=2e-5, rtol=1e-5)
    native.load_state_dict(reference.state_dict())
    torch.testing.assert_close(native(obs), reference(obs), atol=2e-5, rtol=1e-5)


@needs_native
def test_an_appo_optimizer_step_lands_on_the_same_weights():
    """The learner's whole pass (V-trace values, minibatches, loss, clip, Adam) with native layers
    against torch's, from the same weights on the same batch: a wrong gradient moves the weights."""
    results = []
    for native in (True, False):
        cfg = load_config(str(ROOT / "configs/mujoco_halfcheetah.yaml"),
                          [f"model.native_mlp={str(native).lower()}", "algo.num_minibatches=2"])
        spec = resolve_env(cfg.env)
        torch.manual_seed(0)
        model = ActorCritic(spec, cfg.model)
        assert (model.native_nets is not None) == native
        initial = copy.deepcopy(model.state_dict())
        trainer = APPOTrainer(model, cfg.algo, cfg.sampler.max_policy_lag)
        torch.manual_seed(1)
        batch = synthetic_batch(cfg, spec)
        batch["log_probs"] = torch.randn(batch["log_probs"].shape) * 0.1 - 3.0  # off-policy: ratios != 1
        stats = trainer.train(batch)
        results.append((stats, copy.deepcopy(model.state_dict())))
    (s_native, w_native), (s_torch, w_torch) = results
    for key in ("policy_loss", "value_loss", "approx_kl", "grad_norm"):
        assert abs(s_native[key] - s_torch[key]) <= 1e-4 * max(1.0, abs(s_torch[key])), key
    for name in w_torch:
        torch.testing.assert_close(w_native[name], w_torch[name], atol=2e-5, rtol=1e-4, msg=name)
    # the step did move every layer's weights (from the same start), so the comparison above means something
    for name, value in w_torch.items():
        if name.endswith("weight"):
            assert (value - initial[name]).abs().max().item() > 1e-4, name


@needs_native
def test_left_to_torch_where_the_kernel_does_not_apply():
    for net in (ActorCritic(CHEETAH, ModelConfig(shared_encoder=True)), ActorCritic(CHEETAH, ModelConfig(precision="bf16")),
                ActorCritic(EnvSpec("Tiny-frames", "envpool", (4, 36, 36), np.dtype(np.uint8), True, 3),
                            ModelConfig(encoder="nature_cnn", hidden_sizes=[64]))):
        assert net.native_nets is None and not net.use_native_layers()
    assert native_mlp.pays() == (native_mlp._native.ISA != "default")
    native, reference = _pair(CHEETAH)
    obs = torch.randn(9, 17, dtype=torch.float64)  # cast by the network, then native
    torch.testing.assert_close(native(obs), reference(obs), atol=2e-5, rtol=1e-5)
    assert native.native_nets(torch.randn(9, 17, dtype=torch.float64)) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert native.native_nets(torch.randn(9, 17)) is None
    native.double()  # float64 parameters: torch's layers
    assert native.native_nets(torch.randn(9, 17)) is None
    with torch.inference_mode():
        native.float()
        torch.testing.assert_close(native(obs), reference(obs), atol=2e-5, rtol=1e-5)


@needs_native
def test_the_kernel_rejects_what_it_cannot_read():
    k = native_mlp._native
    x, w, b, h = (np.zeros(s, np.float32) for s in ((4, 3), (5, 3), (5,), (4, 5)))
    k.forward(x, (w, b), (h,), 0)
    with pytest.raises(ValueError, match="2 params for 2 layers"):
        k.forward(x, (w, b), (h, h), 0)
    with pytest.raises(ValueError, match="a weight has"):
        k.forward(x, (np.zeros((5, 4), np.float32), b), (h,), 0)
    with pytest.raises(ValueError, match="an activation has"):
        k.forward(x, (w, b), (np.zeros((3, 5), np.float32),), 0)
    with pytest.raises(TypeError, match="float32"):
        k.forward(x.astype(np.float64), (w, b), (h,), 0)
    with pytest.raises(ValueError, match="act must be"):
        k.forward(x, (w, b), (h,), 2)
    with pytest.raises(TypeError, match="writable"):
        h.setflags(write=False)
        k.forward(x, (w, b), (h,), 0)
    h = np.zeros((4, 5), np.float32)
    with pytest.raises(ValueError, match="grads must be a tuple of 2"):
        k.backward(h, x, (w, b), (h,), (w,), 0, None)
    with pytest.raises(ValueError, match="a bias gradient has"):
        k.backward(h, x, (w, b), (h,), (np.zeros_like(w), np.zeros(4, np.float32)), 0, None)
    with pytest.raises(ValueError, match="gx has"):
        k.backward(h, x, (w, b), (h,), (np.zeros_like(w), np.zeros_like(b)), 0, np.zeros((4, 4), np.float32))


@needs_native
@pytest.mark.parametrize("rows,features", [(1, 17), (264, 17), (37, 4)])
def test_normalize_is_the_normalisers_forward_bit_for_bit(rows, features):
    """The native gradient chain's input rows: fastrl.models.normalizer's forward, the same float32 ops."""
    from fastrl.models.normalizer import ObsNormalizer

    gen = torch.Generator().manual_seed(rows)
    norm = ObsNormalizer((features,))
    norm.update(torch.randn(500, features, generator=gen) * 3 + 1)
    x = torch.randn(rows, features, generator=gen) * 40  # some rows far enough out to be clipped
    x[0, 0] = float("nan")
    expected = norm(x)
    std = torch.sqrt(norm.var + norm.eps)
    out = np.full((rows, features), 7.0, np.float32)
    native_mlp._native.normalize(x.numpy(), norm.mean.numpy(), std.numpy(), float(norm.clip), out)
    assert (out == expected.numpy()).sum() == rows * features - 1 and np.isnan(out[0, 0])
    assert (np.abs(out[1:]) == norm.clip).any() or rows == 1
    with pytest.raises(ValueError, match="mean has"):
        native_mlp._native.normalize(x.numpy(), np.zeros(features + 1, np.float32), std.numpy(), 5.0, out)
    with pytest.raises(ValueError, match="out has"):
        native_mlp._native.normalize(x.numpy(), norm.mean.numpy(), std.numpy(), 5.0, out[:, :1].copy())
    with pytest.raises(TypeError, match="float32"):
        native_mlp._native.normalize(x.double().numpy(), norm.mean.numpy(), std.numpy(), 5.0, out)
