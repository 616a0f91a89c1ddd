"""A bf16 conv's weight and bias gradients on AMX tiles (fastrl_ext._conv_grad through
fastrl.models.conv_weight_grad): held to a float64 reference written as the sum it is (every output position's
gradient times the input under the kernel there), exactly where float32 sums are exact, within float32's
rounding of the sum elsewhere; torch's convolution_backward wherever the kernel does not apply; and the
learner's backward through it."""

import pytest
import torch

import fastrl.models.conv_weight_grad as cwg
from fastrl.config.schema import ModelConfig
from fastrl.models import seeded_model
from fastrl.models.conv_weight_grad import native_applies, weight_and_bias_grad
from fastrl_ext import _conv_grad
from helpers import PONG, TINY_FRAMES

amx = pytest.mark.skipif(not cwg.available(), reason="fastrl_ext's conv gradient needs a CPU with amx_bf16")


def reference(x: torch.Tensor, grad: torch.Tensor, kernel: int, stride: int):
    """dW[o, c, i, j] = sum over images n and output positions (y, x) of grad[n, o, y, x] * x[n, c, y*s+i, x*s+j]
    and db[o] = the sum of grad[n, o, :, :], in float64, straight from the definition."""
    x64, g64 = x.double(), grad.double()
    out_h, out_w = grad.shape[2], grad.shape[3]
    dw = torch.zeros(grad.shape[1], x.shape[1], kernel, kernel, dtype=torch.float64)
    for i in range(kernel):
        for j in range(kernel):
            window = x64[:, :, i:i + stride * (out_h - 1) + 1:stride, j:j + stride * (out_w - 1) + 1:stride]
            dw[:, :, i, j] = torch.einsum("nohw,nchw->oc", g64, window)
    return dw, g64.sum((0, 2, 3))


def magnitude(x: torch.Tensor, grad: torch.Tensor, kernel: int, stride: int) -> torch.Tensor:
    """The sum of the products' magnitudes behind each weight gradient: what float32 rounding scales with."""
    return reference(x.abs(), grad.abs(), kernel, stride)[0]


def case(batch, channels, side, out_channels, kernel, stride, seed, integers=False):
    gen = torch.Generator().manual_seed(seed)
    out_side = (side - kernel) // stride + 1
    if integers:  # small integers: every float32 partial sum is exact, so only the final rounding remains
        x = torch.randint(-3, 4, (batch, channels, side, side), generator=gen).float()
        grad = torch.randint(-3, 4, (batch, out_channels, out_side, out_side), generator=gen).float()
    else:
        x = torch.randn(batch, channels, side, side, generator=gen)
        grad = torch.randn(batch, out_channels, out_side, out_side, generator=gen)
    x = x.bfloat16().contiguous(memory_format=torch.channels_last)
    grad = grad.bfloat16().contiguous(memory_format=torch.channels_last)
    weight = torch.zeros(out_channels, channels, kernel, kernel, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    return x, grad, weight


# (batch, in channels, side, out channels, kernel, stride): Pong's three convs at batches that leave the positions
# short of a tile's 32, one block of 256 and several, and other strides, kernels and channel counts
SHAPES = [
    (64, 64, 21, 32, 2, 1),   # Pong's first conv on 4x4 tiles: 25,600 positions
    (64, 32, 20, 64, 4, 2),   # its second
    (64, 64, 9, 64, 3, 1),    # its third
    (1, 64, 9, 64, 3, 1),     # 49 positions
    (3, 32, 7, 96, 3, 2),     # 27 positions, fewer than a tile's 32; 96 output channels
    (5, 96, 12, 32, 5, 1),    # 3 x 32 input channels, 5x5 kernel
    (2, 32, 16, 64, 4, 4),    # stride equal to the kernel
    (7, 32, 10, 32, 1, 1),    # 1x1
    (9, 32, 13, 64, 3, 3),    # 9 x 16 positions, a block and a partial one
]


@amx
@pytest.mark.parametrize("shape", SHAPES)
def test_small_integer_sums_are_the_exact_sums_rounded_once_to_bf16(shape):
    batch, c, side, oc, kernel, stride = shape
    x, grad, weight = case(*shape, seed=sum(shape), integers=True)
    grad_w, grad_b = weight_and_bias_grad(grad, x, weight, True, (stride, stride), (0, 0), (1, 1), 1)
    exact_w, exact_b = reference(x, grad, kernel, stride)
    assert grad_w.dtype == grad_b.dtype == torch.bfloat16 and grad_w.shape == weight.shape and grad_b.shape == (oc,)
    assert torch.equal(grad_w, exact_w.to(torch.bfloat16)) and torch.equal(grad_b, exact_b.to(torch.bfloat16))
    assert grad_w.is_contiguous(memory_format=torch.channels_last)


@amx
@pytest.mark.parametrize("shape", SHAPES)
def test_random_sums_are_within_float32_rounding_of_the_reference(shape):
    batch, c, side, oc, kernel, stride = shape
    x, grad, weight = case(*shape, seed=7 * sum(shape))
    grad_w, grad_b = weight_and_bias_grad(grad, x, weight, True, (stride, stride), (0, 0), (1, 1), 1)
    exact_w, exact_b = reference(x, grad, kernel, stride)
    positions = grad.shape[0] * grad.shape[2] * grad.shape[3]
    # the final rounding to bf16 (half a place, 2^-9 of the value) plus float32's rounding of a sum of this length
    w_bound = exact_w.abs() * 2.0 ** -8 + magnitude(x, grad, kernel, stride) * positions * 2.0 ** -24
    assert ((grad_w.double() - exact_w).abs() <= w_bound).all()
    b_bound = exact_b.abs() * 2.0 ** -8 + grad.double().abs().sum((0, 2, 3)) * positions * 2.0 ** -24
    assert ((grad_b.double() - exact_b).abs() <= b_bound).all()
    # and as close as oneDNN's own: most values equal to the bit
    _, torch_w, _ = torch.ops.aten.convolution_backward(grad, x, weight, [oc], [stride, stride], [0, 0], [1, 1],
                                                         False, [0, 0], 1, [False, True, True])
    assert (grad_w == torch_w).float().mean() > 0.95


@amx
def test_nans_and_infinities_come_through_and_the_bias_is_optional():
    x, grad, weight = case(2, 32, 9, 32, 3, 1, seed=3)
    grad[0, 5, 2, 2] = float("nan")
    grad[1, 7, 0, 0] = float("inf")
    x[1, :, 0, 0] = 1.0
    grad_w, grad_b = weight_and_bias_grad(grad, x, weight, True, (1, 1), (0, 0), (1, 1), 1)
    assert grad_w[5].isnan().all() and grad_b[5].isnan() and grad_b[7] == float("inf")
    assert torch.isfinite(grad_w[[o for o in range(32) if o not in (5, 7)]]).all()
    no_bias_w, no_bias = weight_and_bias_grad(grad, x, weight, False, (1, 1), (0, 0), (1, 1), 1)
    assert no_bias is None and torch.equal(no_bias_w.nan_to_num(), grad_w.nan_to_num())


@amx
def test_the_kernel_refuses_what_it_cannot_compute():
    def arrays(n=2, h=9, c=32, oh=7, oc=32, k=3, bias=True):
        x = torch.zeros(n, h, h, c, dtype=torch.int16).numpy()
        g = torch.zeros(n, oh, oh, oc, dtype=torch.int16).numpy()
        w = torch.zeros(oc, k, k, c, dtype=torch.int16).numpy()
        return x, g, w, torch.zeros(oc, dtype=torch.int16).numpy() if bias else None

    _conv_grad.weight_grad(*arrays(), 1)
    with pytest.raises(ValueError, match="shapes"):
        _conv_grad.weight_grad(*arrays(oh=6), 1)
    with pytest.raises(ValueError, match="shapes"):
        _conv_grad.weight_grad(*arrays(), 2)
    with pytest.raises(ValueError, match="multiples of 32"):
        _conv_grad.weight_grad(*arrays(c=16), 1)
    with pytest.raises(ValueError, match="multiples of 32"):
        _conv_grad.weight_grad(*arrays(oc=48), 1)
    x, g, w, b = arrays()
    with pytest.raises(TypeError, match="bf16"):
        _conv_grad.weight_grad(x.astype("float32"), g, w, b, 1)
    with pytest.raises(TypeError, match="C-contiguous"):
        _conv_grad.weight_grad(x[:, ::2], g, w, b, 1)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        _conv_grad.weight_grad(x, g, w, b)


def test_where_the_kernel_does_not_apply_the_gradients_are_torchs_bit_for_bit():
    x, grad, weight = case(3, 32, 9, 32, 3, 1, seed=5)
    cases = [  # (x, grad, weight, padding, stride): each outside what the kernel computes
        (x.float(), grad.float(), weight.float(), (0, 0), (1, 1)),                     # float32
        (x.contiguous(), grad.contiguous(), weight, (0, 0), (1, 1)),                   # not channels-last
        (x, torch.zeros(3, 32, 9, 9, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last), weight,
         (1, 1), (1, 1)),                                                              # padded
        (x[:, :16], grad, weight[:, :16], (0, 0), (1, 1)),                              # 16 input channels
    ]
    for xs, gs, ws, padding, stride in cases:
        assert not native_applies(gs, xs, ws, stride, padding, (1, 1), 1)
        grad_w, grad_b = weight_and_bias_grad(gs, xs, ws, True, stride, padding, (1, 1), 1)
        _, torch_w, torch_b = torch.ops.aten.convolution_backward(gs, xs, ws, [ws.shape[0]], list(stride), list(padding),
                                                                   [1, 1], False, [0, 0], 1, [False, True, True])
        assert torch.equal(grad_w, torch_w) and torch.equal(grad_b, torch_b)
    # and `native=False` is torch's where the kernel would apply
    off_w, off_b = weight_and_bias_grad(grad, x, weight, True, (1, 1), (0, 0), (1, 1), 1, native=False)
    _, torch_w, torch_b = torch.ops.aten.convolution_backward(grad, x, weight, [32], [1, 1], [0, 0], [1, 1], False,
                                                               [0, 0], 1, [False, True, True])
    assert torch.equal(off_w, torch_w) and torch.equal(off_b, torch_b)


class _Counting:
    """fastrl_ext._conv_grad with its weight_grad calls counted; `negate`: its weight gradients negated, to see
    them come out of the backward."""

    def __init__(self, real, negate: bool = False):
        self.real, self.calls, self.negate = real, 0, negate

    def available(self):
        return self.real.available()

    def weight_grad(self, x, grad, grad_weight, grad_bias, stride):
        self.calls += 1
        self.real.weight_grad(x, grad, grad_weight, grad_bias, stride)
        if self.negate:
            grad_weight ^= -32768  # the sign bit of each bf16


@amx
@pytest.mark.parametrize("shared_encoder", [True, False])
def test_the_learners_cnn_takes_its_conv_weight_gradients_from_the_kernel(monkeypatch, shared_encoder):
    """A bf16 Pong network's backward (the learner's plain path): each of its convs' weight and bias gradients by
    the kernel when model.native_conv_grad is on, each within float32 rounding of torch's; every other gradient,
    and the outputs, equal to torch's path bit for bit (the input gradients are torch's in both). With the
    kernel's weight gradients negated, the weights' gradients come out negated: they are the kernel's."""
    gen = torch.Generator().manual_seed(4)
    obs = torch.randint(0, 256, (8, *PONG.obs_shape), dtype=torch.uint8, generator=gen)
    weights = torch.randn(8, PONG.num_actions, generator=gen)
    results, counts = {}, {}
    for native, negate in ((False, False), (True, False), (True, True)):
        counting = _Counting(cwg._native if not isinstance(cwg._native, _Counting) else cwg._native.real, negate)
        monkeypatch.setattr(cwg, "_native", counting)
        model = seeded_model(PONG, ModelConfig(encoder="nature_cnn", precision="bf16", shared_encoder=shared_encoder,
                                               native_conv_grad=native), seed=3)
        model.hold_layer_weights_in_bf16()
        model.use_channels_last()
        params, values = model(obs)
        loss = (params * weights).sum() + values.square().sum()
        names = [name for name, _ in model.named_parameters()]
        results[native, negate] = (params, values,
                                   dict(zip(names, torch.autograd.grad(loss, list(model.parameters())))))
        counts[native, negate] = counting.calls
    encoders = 1 if shared_encoder else 2
    assert counts == {(False, False): 0, (True, False): 3 * encoders, (True, True): 3 * encoders}
    (p0, v0, g0), (p1, v1, g1), (_, _, negated) = results.values()
    assert torch.equal(p0, p1) and torch.equal(v0, v1)
    conv_grads = [name for name in g0 if ".convs." in name]
    assert len(conv_grads) == 6 * encoders  # three convs' weights and biases
    for name, torch_grad in g0.items():
        if name in conv_grads:
            scale = torch_grad.double().abs().max()
            assert scale > 0 and (g1[name].double() - torch_grad.double()).abs().max() <= scale * 2.0 ** -6, name
        else:
            assert torch.equal(g1[name], torch_grad), name
    for name in conv_grads:
        if name.endswith("weight"):
            assert torch.equal(negated[name], -g1[name]), name


def test_a_network_built_with_native_conv_grad_off_never_calls_the_kernel(monkeypatch):
    counting = _Counting(cwg._native)
    monkeypatch.setattr(cwg, "_native", counting)
    model = seeded_model(TINY_FRAMES, ModelConfig(encoder="nature_cnn", precision="bf16", native_conv_grad=False),
                         seed=1)
    model.hold_layer_weights_in_bf16()
    model.use_channels_last()
    params, values = model(torch.randint(0, 256, (4, *TINY_FRAMES.obs_shape), dtype=torch.uint8))
    (params.sum() + values.sum()).backward()
    assert counting.calls == 0
