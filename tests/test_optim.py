"""fastrl_ext._optim against its references: the bf16 gradient pieces summed into a float32 .grad
must be torch's cast-copy and adds to the bit, for any piece count and length (the vector loop's tail
included), and the sum of squares must be that .grad's (and sum_squares a float32 buffer's, in
float64), with or without the sum written; the Adam step must land where the paper's update (in
float64) and torch's fused kernel land, to float32 rounding, and round the new weights into the bf16
copy as torch does, and on the pieces where it lands on their written sum, to the bit; every compiled
variant too."""

import math

import numpy as np
import pytest
import torch

from fastrl.algo.bf16_copy import _native_sum
from fastrl.algo.flat_params import memory_flat
from fastrl_ext import _optim


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
    sum_sq = _optim.sum_pieces(dst.numpy(), [p.view(torch.int16).numpy() for p in pieces])
    expected = _torch_sum(pieces)
    assert torch.equal(dst, expected)
    assert sum_sq == pytest.approx(float(expected.double().square().sum()), rel=1e-13)


@pytest.mark.parametrize("count", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 4099])
def test_sum_squares_of_pieces_without_dst_is_the_written_sums(count, n):
    """dst None: the same float64 sum of squares to the bit, nothing written (what the learner's clip
    takes before Adam steps on the pieces)."""
    bits = [p.view(torch.int16).numpy() for p in _pieces(count, n, seed=count * 100 + n)]
    assert _optim.sum_pieces(None, bits) == _optim.sum_pieces(np.empty(n, np.float32), bits)


def test_a_nan_or_inf_makes_the_sum_of_squares_non_finite():
    for bad in (float("nan"), float("inf")):
        pieces = _pieces(2, 100)
        pieces[1][37] = bad
        dst = torch.empty(100)
        assert not math.isfinite(_optim.sum_pieces(dst.numpy(), [p.view(torch.int16).numpy() for p in pieces]))
        assert not math.isfinite(_optim.sum_pieces(None, [p.view(torch.int16).numpy() for p in pieces]))


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1000, 9093])
def test_sum_squares_is_the_float64_sum(n):
    """The native gradient chain's clip norm: float32 values squared and summed in float64."""
    gen = torch.Generator().manual_seed(n)
    a = (torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 4)).numpy()
    assert _optim.sum_squares(a) == pytest.approx(float(np.square(a.astype(np.float64)).sum()), rel=1e-13)
    if n:
        big = np.full(n, 3e30, np.float32)  # squares past float32's range: float64 holds them
        assert _optim.sum_squares(big) == pytest.approx(n * 9e60, rel=1e-6)
        for bad in (float("nan"), float("inf")):
            a[n // 2] = bad
            assert not math.isfinite(_optim.sum_squares(a))
    with pytest.raises(TypeError, match="float32"):
        _optim.sum_squares(np.zeros(4, np.float64))
    with pytest.raises(TypeError, match="contiguous"):
        _optim.sum_squares(np.zeros((4, 4), np.float32)[:, 1])


def test_sum_refuses_what_it_cannot_fill():
    dst = np.empty(8, np.float32)
    bits = np.zeros(8, np.int16)
    with pytest.raises(TypeError, match="float32"):
        _optim.sum_pieces(np.empty(8, np.float64), [bits])
    with pytest.raises(TypeError, match="element count"):
        _optim.sum_pieces(dst, [np.zeros(7, np.int16)])
    with pytest.raises(TypeError, match="bf16 as int16"):
        _optim.sum_pieces(dst, [np.zeros(8, np.float32)])
    with pytest.raises(ValueError, match="1 to 8 pieces"):
        _optim.sum_pieces(dst, [])
    with pytest.raises(ValueError, match="1 to 8 pieces"):
        _optim.sum_pieces(dst, [bits] * 9)
    with pytest.raises(TypeError, match="element count"):
        _optim.sum_pieces(None, [bits, np.zeros(7, np.int16)])
    with pytest.raises(TypeError, match="writable"):
        dst.flags.writeable = False
        _optim.sum_pieces(dst, [bits])


def _adam_paper(p, g, m, v, lr, b1, b2, eps, t):
    """Kingma & Ba, Algorithm 1, in float64."""
    p, g, m, v = (x.double() for x in (p, g, m, v))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
    # torch (and _optim) add eps to sqrt(v_hat) the same way: sqrt(v) / sqrt(1 - b2^t) + eps
    return p - lr * m_hat / (v_hat.sqrt() + eps), m, v


@pytest.mark.parametrize("n", [1, 17, 4099])
@pytest.mark.parametrize("step,grad_mul", [(1, 1.0), (7, 0.37)])
def test_adam_step_matches_the_paper_and_torchs_fused_kernel(n, step, grad_mul):
    gen = torch.Generator().manual_seed(n + step)
    p = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen) * 1e-2
    m = torch.randn(n, generator=gen) * 1e-3
    v = torch.rand(n, generator=gen) * 1e-4
    lr, b1, b2, eps = 2.5e-4, 0.9, 0.999, 1e-6
    want_p, want_m, want_v = _adam_paper(p, g * grad_mul, m, v, lr, b1, b2, eps, step)
    fused = [t.clone() for t in (p, g, m, v)]
    torch._fused_adam_([fused[0]], [fused[1]], [fused[2]], [fused[3]], [], [torch.tensor(float(step))], amsgrad=False,
                       lr=lr, beta1=b1, beta2=b2, weight_decay=0.0, eps=eps, maximize=False,
                       grad_scale=torch.tensor(1 / grad_mul) if grad_mul != 1.0 else None, found_inf=None)
    ours_p, ours_g, ours_m, ours_v = (t.clone() for t in (p, g, m, v))
    copy = torch.empty(n, dtype=torch.bfloat16)
    _optim.adam_step(ours_p.numpy(), ours_g.numpy(), ours_m.numpy(), ours_v.numpy(), copy.view(torch.int16).numpy(),
                     lr, b1, b2, eps, float(step), grad_mul)
    assert torch.equal(ours_g, g)  # the gradient is read, not scaled in place
    g_scale = float((g * grad_mul).abs().max())
    for ours, want, theirs, old, term in ((ours_p, want_p, fused[0], p, 0.0), (ours_m, want_m, fused[2], m, g_scale),
                                          (ours_v, want_v, fused[3], v, g_scale ** 2)):
        # float32 rounding on the scale of the terms summed, as torch's own kernel errs (both ~3-8e-8)
        scale = max(float(want.abs().max()), float(old.abs().max()), term)
        assert float((ours.double() - want).abs().max()) <= 1.5e-7 * scale
        assert float((ours.double() - theirs.double()).abs().max()) <= 2e-7 * scale
    assert not torch.equal(ours_p, p)  # it did move
    assert torch.equal(copy, ours_p.to(torch.bfloat16))


@pytest.mark.parametrize("count", [1, 2, 3, 8])
@pytest.mark.parametrize("n", [1, 17, 4099])
@pytest.mark.parametrize("with_copy", [True, False])
def test_adam_step_on_pieces_is_the_step_on_their_written_sum_bit_for_bit(count, n, with_copy):
    pieces = _pieces(count, n, seed=count + n)
    bits = [p.view(torch.int16).numpy() for p in pieces]
    gen = torch.Generator().manual_seed(n)
    start = (torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 1e-3, torch.rand(n, generator=gen) * 1e-4)
    results = []
    for grad in ("written", "pieces"):
        p, m, v = (t.clone() for t in start)
        copy = torch.empty(n, dtype=torch.bfloat16) if with_copy else None
        g = _torch_sum(pieces).numpy() if grad == "written" else tuple(bits)
        _optim.adam_step(p.numpy(), g, m.numpy(), v.numpy(), None if copy is None else copy.view(torch.int16).numpy(),
                         2.5e-4, 0.9, 0.999, 1e-6, 7.0, 0.37)
        results.append((p, m, v, copy))
    for a, b in zip(*results):
        assert (a is None and b is None) or torch.equal(a, b)
    assert not torch.equal(results[1][0], start[0])  # it did move
    assert all(torch.equal(p, q) for p, q in zip(pieces, _pieces(count, n, seed=count + n)))  # read, not written


def test_adam_step_rounds_specials_into_the_copy_as_torch_does():
    p = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.0e38, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8])
    zeros = torch.zeros_like(p)
    copy = torch.empty(p.shape, dtype=torch.bfloat16)
    _optim.adam_step(p.numpy(), zeros.numpy(), zeros.clone().numpy(), zeros.clone().numpy(),
                     copy.view(torch.int16).numpy(), 1e-3, 0.9, 0.999, 1e-8, 1.0, 1.0)
    assert torch.equal(copy[1:], p[1:].to(torch.bfloat16)) and torch.isnan(copy[0])


def test_adam_step_refuses_what_it_cannot_fill():
    f = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="float32"):
        _optim.adam_step(f, f.astype(np.float64), f.copy(), f.copy(), None, 1e-3, 0.9, 0.999, 1e-8, 1.0, 1.0)
    with pytest.raises(TypeError, match="copy must be bf16"):
        _optim.adam_step(f, f.copy(), f.copy(), f.copy(), np.zeros(3, np.int16), 1e-3, 0.9, 0.999, 1e-8, 1.0, 1.0)
    with pytest.raises(ValueError, match="at least 1"):
        _optim.adam_step(f, f.copy(), f.copy(), f.copy(), None, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1.0)
    with pytest.raises(TypeError, match="11 arguments"):
        _optim.adam_step(f, f, f, f)
    bits = np.zeros(4, np.int16)
    with pytest.raises(TypeError, match="element count"):
        _optim.adam_step(f, [bits, np.zeros(3, np.int16)], f.copy(), f.copy(), None, 1e-3, 0.9, 0.999, 1e-8, 1.0, 1.0)
    with pytest.raises(TypeError, match="bf16 as int16"):
        _optim.adam_step(f, (f.copy(),), f.copy(), f.copy(), None, 1e-3, 0.9, 0.999, 1e-8, 1.0, 1.0)
    with pytest.raises(ValueError, match="1 to 8"):
        _optim.adam_step(f, [], f.copy(), f.copy(), None, 1e-3, 0.9, 0.999, 1e-8, 1.0, 1.0)


def test_memory_order_views_cover_channels_last_weights():
    conv = torch.randn(32, 4, 8, 8).to(memory_format=torch.channels_last)
    flat = memory_flat(conv)
    assert flat.data_ptr() == conv.data_ptr() and flat.numel() == conv.numel()
    assert torch.equal(flat, conv.permute(0, 2, 3, 1).reshape(-1))
    assert memory_flat(torch.randn(4, 6)[:, ::2]) is None  # strided: not one block


def test_native_sum_falls_back_on_layouts_and_dtypes_it_does_not_take():
    dst = torch.empty(32, 4, 8, 8).to(memory_format=torch.channels_last)
    cl = [p.view(32, 8, 8, 4).permute(0, 3, 1, 2) for p in _pieces(2, dst.numel())]  # channels-last bf16
    assert _native_sum([dst], [cl]) is not None
    assert torch.equal(dst, _torch_sum(cl))
    nchw = [p.contiguous() for p in cl]  # another memory order than dst's
    assert _native_sum([dst], [nchw]) is None
    assert _native_sum([torch.empty(10)], [[torch.randn(10)]]) is None  # an fp32 piece (a Gaussian's log-std)
