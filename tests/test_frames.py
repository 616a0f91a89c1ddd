"""uint8 frames to the CNN's input (fastrl.models.frames): fastrl_ext's one pass must give torch's three
passes (cast, relayout, scale) to the bit, for every byte value, both dtypes and both memory orders,
and the Nature CNN must see the same input either way."""

import numpy as np
import pytest
import torch

from fastrl.config.schema import ModelConfig
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic
from fastrl.models import frames as frames_module
from fastrl.models.frames import frames_to_input, frames_to_input_torch
from fastrl_ext import _frames

DTYPES = [torch.bfloat16, torch.float32]


def _frames_of(shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("shape", [(2, 4, 16, 16), (3, 4, 84, 84), (2, 4, 5, 7), (2, 3, 7, 5), (1, 1, 9, 11)],
                         ids=["every-byte", "pong", "4-channels-odd", "3-channels", "1-channel"])
def test_native_pass_matches_torch(dtype, channels_last, shape):
    obs = torch.arange(256, dtype=torch.uint8).repeat(2 * 4 * 16 * 16 // 256).reshape(shape) \
        if shape == (2, 4, 16, 16) else _frames_of(shape)
    expected = frames_to_input_torch(obs, dtype, channels_last)
    got = frames_module._native_into(obs, dtype, channels_last)  # the kernel itself, not a fallback
    assert got.dtype == dtype and got.shape == obs.shape
    if shape[1] > 1:  # one channel: both orders are the same memory, and torch's strides for it vary
        assert got.stride() == expected.stride()
    assert got.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert torch.equal(got, expected)
    assert float(got.float().max()) <= 1.0 and float(got.float().min()) >= 0.0
    assert obs.dtype == torch.uint8  # the caller's frames are untouched
    assert frames_module._native_agrees()  # so frames_to_input takes the kernel


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape,block", [((3, 4, 84, 84), 4), ((2, 4, 8, 12), 4), ((2, 3, 12, 8), 2), ((1, 2, 9, 6), 3),
                                         ((2, 1, 8, 8), 4)],
                         ids=["pong", "4-channels-small", "3-channels", "odd-block", "1-channel"])
def test_native_blocks_are_torchs_pixel_unshuffle(dtype, shape, block):
    obs = _frames_of(shape, seed=2)
    n, c, h, w = shape
    # the reference written out: tile (i, j) of channel ch holds pixel (dy, dx) at channel (ch*b + dy)*b + dx
    tiled = obs.reshape(n, c, h // block, block, w // block, block).permute(0, 1, 3, 5, 2, 4)
    want = (tiled.reshape(n, c * block * block, h // block, w // block).to(torch.float32) * (1 / 255)).to(dtype)
    got = frames_module._native_into(obs, dtype, True, block)
    assert got.shape == want.shape and got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, frames_to_input_torch(obs, dtype, True, block=block))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_blocks_come_channels_last_only():
    obs = _frames_of((2, 4, 8, 8))
    with pytest.raises(ValueError, match="channels-last"):
        frames_to_input(obs, torch.float32, False, block=2)
    with pytest.raises(ValueError, match="block must be 1, or more with channels_last"):
        _frames.frames_to_input(obs.numpy(), np.empty((2, 4, 4, 16), np.float32), False, 2)
    with pytest.raises(ValueError, match="must divide"):
        _frames.frames_to_input(obs.numpy(), np.empty((2, 2, 2, 36), np.float32), True, 3)
    with pytest.raises(ValueError, match=r"\[2, 4, 4, 16\]"):
        _frames.frames_to_input(obs.numpy(), np.empty((2, 8, 8, 4), np.float32), True, 2)


def test_what_the_native_pass_does_not_take_goes_through_torch(monkeypatch):
    calls = []
    monkeypatch.setattr(frames_module, "_native_into", lambda *a: calls.append(a) or frames_to_input_torch(*a))
    strided = _frames_of((2, 4, 20, 20))[:, :, ::2]  # not contiguous
    as_float = _frames_of((2, 4, 8, 8)).float()
    for obs, dtype in ((strided, torch.bfloat16), (as_float, torch.float32), (_frames_of((2, 4, 8, 8)), torch.float16)):
        out = frames_to_input(obs, dtype, True)
        assert torch.equal(out, frames_to_input_torch(obs, dtype, True))
    assert calls == []
    frames_to_input(_frames_of((2, 4, 8, 8)), torch.bfloat16, True)
    assert len(calls) == 1


def test_kernel_refuses_what_it_cannot_fill():
    obs = _frames_of((2, 4, 8, 8)).numpy()
    with pytest.raises(TypeError, match="uint8"):
        _frames.frames_to_input(obs.astype(np.float32), np.empty((2, 8, 8, 4), np.float32), True)
    with pytest.raises(TypeError, match="float32, or bf16"):
        _frames.frames_to_input(obs, np.empty((2, 8, 8, 4), np.float64), True)
    with pytest.raises(ValueError, match=r"\[2, 8, 8, 4\]"):
        _frames.frames_to_input(obs, np.empty((2, 4, 8, 8), np.float32), True)
    with pytest.raises(TypeError, match="writable"):
        out = np.empty((2, 4, 8, 8), np.float32)
        out.flags.writeable = False
        _frames.frames_to_input(obs, out, False)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "nchw"])
def test_nature_cnn_outputs_are_the_torch_input_paths(monkeypatch, precision, channels_last):
    spec = EnvSpec("Tiny-frames", "envpool", (4, 36, 36), np.dtype(np.uint8), True, 3)
    torch.manual_seed(0)
    model = ActorCritic(spec, ModelConfig(encoder="nature_cnn", hidden_sizes=[64], activation="relu",
                                          precision=precision))
    if channels_last:
        model.to(memory_format=torch.channels_last)
    obs = _frames_of((5, 4, 36, 36))
    with torch.no_grad():
        native = model(obs)
        monkeypatch.setattr(frames_module, "_native", None)
        reference = model(obs)
    for a, b in zip(native, reference):
        assert torch.equal(a, b)
