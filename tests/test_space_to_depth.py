"""model.first_conv=space_to_depth (fastrl.models.space_to_depth): the first conv on 4x4 tiles of the frames
computes the strided conv's outputs and weight gradients, from the same parameters, in either precision;
a checkpoint moves between the two; images that do not tile keep the strided conv."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fastrl.config.schema import ModelConfig
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic
from fastrl.models.space_to_depth import SpaceToDepthConv2d, tiles
from helpers import PONG

CNN = {"encoder": "nature_cnn", "hidden_sizes": [64], "activation": "relu"}


def _obs(spec, n, seed=1):
    return torch.randint(0, 256, (n, *spec.obs_shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _pair(spec, precision, seed=0):
    nets = []
    for first_conv in ("strided", "space_to_depth"):
        torch.manual_seed(seed)
        nets.append(ActorCritic(spec, ModelConfig(**CNN, precision=precision, first_conv=first_conv)))
    return nets


def test_the_conv_on_tiles_is_the_strided_conv():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 84, 84, dtype=torch.float64)
    conv = SpaceToDepthConv2d(4, 32, 8, 4).double()
    tiled = F.pixel_unshuffle(x, 4).contiguous(memory_format=torch.channels_last)
    out = conv(tiled)
    want = F.conv2d(x, conv.weight, conv.bias, 4)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    grad_out = torch.randn_like(want)
    got_grad, = torch.autograd.grad(out, conv.weight, grad_out)
    want_grad, = torch.autograd.grad(want, conv.weight, grad_out)
    assert got_grad.shape == conv.weight.shape == (32, 4, 8, 8)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="divides the kernel"):
        SpaceToDepthConv2d(4, 32, 8, 3)


@pytest.mark.parametrize("precision,tol", [("fp32", 1e-5), ("bf16", 0.03)])
def test_a_network_on_tiles_computes_the_strided_networks_outputs_and_gradients(precision, tol):
    strided, tiled = _pair(PONG, precision)
    assert isinstance(tiled.actor_encoder.convs[0], SpaceToDepthConv2d) and tiled.actor_encoder.input_block == 4
    assert type(strided.actor_encoder.convs[0]) is torch.nn.Conv2d
    # the same parameters, drawn from the same seed in the same order, under the same names
    assert list(strided.state_dict()) == list(tiled.state_dict())
    for a, b in zip(strided.state_dict().values(), tiled.state_dict().values()):
        assert torch.equal(a, b)
    obs = _obs(PONG, 6)
    grads = []
    for net in (strided, tiled):
        logits, values = net(obs)
        loss = logits.logsumexp(-1).sum() + values.square().sum()
        grads.append((logits.detach(), values.detach(), torch.autograd.grad(loss, list(net.parameters()))))
    (lp, vp, gp), (lt, vt, gt) = grads
    torch.testing.assert_close(lt, lp, rtol=tol, atol=tol)
    torch.testing.assert_close(vt, vp, rtol=tol, atol=tol)
    for a, b in zip(gt, gp):
        assert a.shape == b.shape
        scale = float(b.abs().max()) + 1e-12
        assert float((a - b).abs().max()) <= tol * scale * 3


def test_a_checkpoint_loads_into_either_first_conv():
    strided, tiled = _pair(PONG, "fp32", seed=0)
    trained = ActorCritic(PONG, ModelConfig(**CNN, precision="fp32", first_conv="space_to_depth"))
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.1 * torch.randn_like(p))
    strided.load_state_dict(trained.state_dict())
    tiled.load_state_dict(trained.state_dict())
    obs = _obs(PONG, 4)
    with torch.no_grad():
        torch.testing.assert_close(tiled(obs)[0], strided(obs)[0], rtol=1e-5, atol=1e-5)


def test_images_that_do_not_tile_keep_the_strided_conv():
    assert tiles((4, 84, 84), 8, 4) and not tiles((4, 86, 84), 8, 4) and not tiles((4, 84, 84), 8, 1)
    odd = EnvSpec("Odd-frames", "envpool", (4, 38, 40), np.dtype(np.uint8), True, 3)
    net = ActorCritic(odd, ModelConfig(**CNN, precision="fp32", first_conv="space_to_depth"))
    assert type(net.actor_encoder.convs[0]) is torch.nn.Conv2d and net.actor_encoder.input_block == 1
    logits, _ = net(_obs(odd, 2))
    assert logits.shape == (2, 3)


def test_gymnasium_ordered_frames_tile_too():
    """[N, H, W, C] observations reach the tiles through torch's path (a permuted view)."""
    hwc = EnvSpec("Hwc-frames", "gymnasium", (36, 36, 3), np.dtype(np.uint8), True, 3, obs_channels_last=True)
    strided, tiled = _pair(hwc, "fp32")
    assert tiled.actor_encoder.input_block == 4
    obs = _obs(hwc, 3)
    with torch.no_grad():
        torch.testing.assert_close(tiled(obs)[0], strided(obs)[0], rtol=1e-5, atol=1e-5)
