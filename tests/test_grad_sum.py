"""fastrl_ext._grad_sum against torch, its reference: the bf16 gradient pieces summed into a float32
.grad must be torch's cast-copy and adds to the bit, for any piece count and length (the vector
loop's tail included), and the sum of squares must be that .grad's; every compiled variant too."""

import math

import numpy as np
import pytest
import torch

from fastrl.algo.bf16_copy import _memory_flat, _native_sum
from fastrl_ext import _grad_sum
from helpers import run_tests_under_isa


def _pieces(count, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # a wide range of magnitudes: sums that round, cancel and overflow nothing
    return [(torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 4)).to(torch.bfloat16)
            for _ in range(count)]


def _torch_sum(pieces):
    dst = torch.empty(pieces[0].shape)
    torch._foreach_copy_([dst], [pieces[0]])
    for p in pieces[1:]:
        torch._foreach_add_([dst], [p])
    return dst


@pytest.mark.parametrize("count", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 1000, 4099])
def test_sum_matches_torch(count, n):
    pieces = _pieces(count, n, seed=count * 1000 + n)
    dst = torch.full((n,), float("nan"))
    sum_sq = _grad_sum.sum_pieces(dst.numpy(), [p.view(torch.int16).numpy() for p in pieces])
    expected = _torch_sum(pieces)
    assert torch.equal(dst, expected)
    assert sum_sq == pytest.approx(float(expected.double().square().sum()), rel=1e-13)


def test_a_nan_or_inf_makes_the_sum_of_squares_non_finite():
    for bad in (float("nan"), float("inf")):
        pieces = _pieces(2, 100)
        pieces[1][37] = bad
        dst = torch.empty(100)
        assert not math.isfinite(_grad_sum.sum_pieces(dst.numpy(), [p.view(torch.int16).numpy() for p in pieces]))


def test_sum_refuses_what_it_cannot_fill():
    dst = np.empty(8, np.float32)
    bits = np.zeros(8, np.int16)
    with pytest.raises(TypeError, match="float32"):
        _grad_sum.sum_pieces(np.empty(8, np.float64), [bits])
    with pytest.raises(TypeError, match="element count"):
        _grad_sum.sum_pieces(dst, [np.zeros(7, np.int16)])
    with pytest.raises(TypeError, match="bf16 as int16"):
        _grad_sum.sum_pieces(dst, [np.zeros(8, np.float32)])
    with pytest.raises(ValueError, match="1 to 8 pieces"):
        _grad_sum.sum_pieces(dst, [])
    with pytest.raises(ValueError, match="1 to 8 pieces"):
        _grad_sum.sum_pieces(dst, [bits] * 9)
    with pytest.raises(TypeError, match="writable"):
        dst.flags.writeable = False
        _grad_sum.sum_pieces(dst, [bits])


def test_memory_order_views_cover_channels_last_weights():
    conv = torch.randn(32, 4, 8, 8).to(memory_format=torch.channels_last)
    flat = _memory_flat(conv)
    assert flat.data_ptr() == conv.data_ptr() and flat.numel() == conv.numel()
    assert torch.equal(flat, conv.permute(0, 2, 3, 1).reshape(-1))
    assert _memory_flat(torch.randn(4, 6)[:, ::2]) is None  # strided: not one block


def test_native_sum_falls_back_on_layouts_and_dtypes_it_does_not_take():
    dst = torch.empty(32, 4, 8, 8).to(memory_format=torch.channels_last)
    cl = [p.view(32, 8, 8, 4).permute(0, 3, 1, 2) for p in _pieces(2, dst.numel())]  # channels-last bf16
    assert _native_sum([dst], [cl]) is not None
    assert torch.equal(dst, _torch_sum(cl))
    nchw = [p.contiguous() for p in cl]  # another memory order than dst's
    assert _native_sum([dst], [nchw]) is None
    assert _native_sum([torch.empty(10)], [[torch.randn(10)]]) is None  # an fp32 piece (a Gaussian's log-std)


@pytest.mark.parametrize("isa", ["avx2", "default"])
def test_every_compiled_variant_matches_torch(isa):
    """This machine picks its widest variant; the others are checked in a subprocess that caps the pick."""
    run_tests_under_isa(__file__, "_grad_sum", isa, "sum_matches_torch or non_finite")
