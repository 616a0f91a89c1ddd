"""A conv and its ReLU in one oneDNN call (fastrl.models.conv_relu): the same outputs as the plain conv and
ReLU, bit for bit, in every dtype, memory order and shape the Nature CNN runs (the space-to-depth first
conv's tiles included); used by the CNN's forward without autograd and by the learner's split backward,
never under autocast or with autograd through it."""

import pytest
import torch
import torch.nn.functional as F

import fastrl.models.conv_relu as conv_relu_module
from fastrl.algo.split_backward import WeightGradThread, wrap_cnn_layers
from fastrl.algo.shards import ran_here
from fastrl.config.schema import ModelConfig
from fastrl.models import seeded_model
from fastrl.models.conv_relu import conv_relu, fuses, relu_backward
from fastrl.models.space_to_depth import SpaceToDepthConv2d, conv_weight_and_stride
from helpers import TINY_FRAMES

pytestmark = pytest.mark.skipif(not conv_relu_module._fused_agrees(),
                                reason="torch's oneDNN fused conv op is missing or disagrees here")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("shape,out_channels,kernel,stride,padding", [
    ((5, 4, 84, 84), 32, 8, 4, 0),   # Pong's first conv
    ((5, 32, 20, 20), 64, 4, 2, 0),  # its second
    ((3, 64, 9, 9), 64, 3, 1, 1),    # a padded one
])
def test_the_fused_call_is_the_conv_and_relu_bit_for_bit(dtype, channels_last, shape, out_channels, kernel, stride,
                                                         padding):
    gen = torch.Generator().manual_seed(sum(shape) + kernel)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(shape, generator=gen).to(dtype).contiguous(memory_format=memory_format)
    w = (torch.randn(out_channels, shape[1], kernel, kernel, generator=gen) * 0.1).to(dtype).contiguous(
        memory_format=memory_format)
    b = torch.randn(out_channels, generator=gen).to(dtype)
    assert fuses(x, w)
    with torch.no_grad():
        fused = conv_relu(x, w, b, (stride, stride), (padding, padding), (1, 1), 1)
        plain = F.relu(F.conv2d(x, w, b, stride, padding))
    assert torch.equal(fused, plain) and fused.dtype == dtype
    assert (fused == 0).any() and (fused > 0).any()  # the ReLU cut some and kept some
    assert fused.is_contiguous(memory_format=memory_format)


def test_the_space_to_depth_tiles_fuse_too():
    conv = SpaceToDepthConv2d(4, 32, 8, 4).to(torch.bfloat16).to(memory_format=torch.channels_last)
    tiled = torch.rand(3, 64, 21, 21).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    weight, stride = conv_weight_and_stride(conv, conv.weight)
    with torch.no_grad():
        assert torch.equal(conv_relu(tiled, weight, conv.bias, stride, conv.padding, conv.dilation, 1),
                           F.relu(conv(tiled)))


def test_it_is_never_fused_where_autocast_would_cast_or_dtypes_differ():
    x, w = torch.rand(1, 4, 9, 9), torch.rand(8, 4, 3, 3)
    assert fuses(x, w)
    assert not fuses(x, w.to(torch.bfloat16))  # mixed dtypes: the plain conv's rules
    assert not fuses(x, w, torch.zeros(8, dtype=torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fuses(x, w)  # autocast casts inside F.conv2d; the fused op would run fp32
        # a bf16 network under its own autocast: nothing to cast, so the fused op runs what F.conv2d would
        assert fuses(x.to(torch.bfloat16), w.to(torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16))


def test_the_first_check_agrees_inside_a_bf16_networks_autocast(monkeypatch):
    """Where a run first asks: inside the bf16 network's own autocast (an inference worker's first forward, the
    learner's first minibatch), which must not turn the check's float32 case into a bf16 conv."""
    monkeypatch.setattr(conv_relu_module, "_checked", None)
    x, w = torch.rand(1, 4, 9, 9, dtype=torch.bfloat16), torch.rand(8, 4, 3, 3, dtype=torch.bfloat16)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert fuses(x, w)
    assert conv_relu_module._checked is True


def test_a_fresh_bf16_network_fuses_from_its_first_forward(monkeypatch):
    model = seeded_model(TINY_FRAMES, ModelConfig(encoder="nature_cnn", precision="bf16"), seed=2).for_inference()
    monkeypatch.setattr(conv_relu_module, "_checked", None)  # as in a new process
    calls = []
    original = torch.ops.mkldnn._convolution_pointwise
    monkeypatch.setattr(conv_relu_module, "_fused_op", lambda *args: calls.append(1) or original(*args))
    with torch.inference_mode():
        model(torch.zeros((2, *TINY_FRAMES.obs_shape), dtype=torch.uint8))
    assert len(calls) == 6  # the fused op ran for each encoder's three convs


def _counting(monkeypatch):
    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        return conv_relu(*args)
    monkeypatch.setattr(conv_relu_module, "conv_relu", counted)  # what conv_layer_relu calls
    return calls


@pytest.mark.parametrize("precision,first_conv", [("bf16", "space_to_depth"), ("bf16", "strided"), ("fp32", "strided")])
def test_the_cnn_fuses_without_autograd_and_gives_the_unfused_outputs(monkeypatch, precision, first_conv):
    model = seeded_model(TINY_FRAMES, ModelConfig(encoder="nature_cnn", precision=precision, first_conv=first_conv),
                         seed=2).for_inference()
    obs = torch.randint(0, 256, (6, *TINY_FRAMES.obs_shape), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(1))
    calls = _counting(monkeypatch)
    with torch.inference_mode():
        fused = model(obs)
    encoders = [e for e in (model.actor_encoder, model.critic_encoder) if e is not None]
    assert len(encoders) == 2 and len(calls) == 3 * len(encoders)  # each encoder's three convs, with their ReLUs
    monkeypatch.setattr(conv_relu_module, "_checked", False)  # as where the op is missing
    calls.clear()
    with torch.inference_mode():
        plain = model(obs)
    assert calls == []
    for a, b in zip(fused, plain):
        assert torch.equal(a, b)


@pytest.mark.parametrize("precision,first_conv", [("bf16", "space_to_depth"), ("bf16", "strided"), ("fp32", "strided")])
def test_with_autograd_the_cnn_fuses_and_gives_the_unfused_outputs_and_gradients(monkeypatch, precision, first_conv):
    """The learner's plain backward (learner_split rows): each conv and its ReLU one fused call forward, the
    ReLU's gradient by fastrl_ext, and the outputs and every parameter's gradient autograd's own for the
    unfused layers, bit for bit. (The conv weight gradients by torch: model.native_conv_grad's AMX kernel sums in
    another order, tests/test_conv_weight_grad.py.)"""
    model = seeded_model(TINY_FRAMES, ModelConfig(encoder="nature_cnn", precision=precision, first_conv=first_conv,
                                                  native_conv_grad=False), seed=2)
    model.hold_layer_weights_in_bf16()  # as the learner's bf16 working copy holds them
    model.use_channels_last()
    gen = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (6, *TINY_FRAMES.obs_shape), dtype=torch.uint8, generator=gen)
    weights = torch.randn(6, TINY_FRAMES.num_actions, generator=gen)
    fused_calls = []
    real_op = conv_relu_module._fused_op
    monkeypatch.setattr(conv_relu_module, "_fused_op", lambda *args: fused_calls.append(1) or real_op(*args))
    native = _NativeCalls(conv_relu_module._native)
    monkeypatch.setattr(conv_relu_module, "_native", native)

    def outputs_and_gradients():
        params, values = model(obs)
        loss = (params * weights).sum() + values.square().sum()
        return (params, values, *torch.autograd.grad(loss, list(model.parameters())))

    fused = outputs_and_gradients()
    assert len(fused_calls) == 6 and native.calls == 6  # two encoders' three convs, forward and backward
    monkeypatch.setattr(conv_relu_module, "_checked", False)  # as where the op is missing: the plain layers
    fused_calls.clear()
    plain = outputs_and_gradients()
    assert fused_calls == []
    for a, b in zip(fused, plain):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_the_learners_wrapped_convs_take_their_relu_in_with_and_without_autograd():
    model = seeded_model(TINY_FRAMES, ModelConfig(encoder="nature_cnn", precision="bf16"), seed=4)
    model.hold_layer_weights_in_bf16()
    model.to(memory_format=torch.channels_last)
    reference = seeded_model(TINY_FRAMES, ModelConfig(encoder="nature_cnn", precision="bf16"), seed=4)
    reference.hold_layer_weights_in_bf16()
    reference.to(memory_format=torch.channels_last)
    assert wrap_cnn_layers(model, WeightGradThread(ran_here)) == 8  # actor and critic: 3 convs and a hidden layer
    for encoder in (model.actor_encoder, model.critic_encoder):
        assert [type(m).__name__ for m in encoder.convs] == ["WeightGradLater", "Identity"] * 3 + ["Flatten"]
        assert all(m.relu for m in encoder.convs[:6:2])
        assert not encoder.fc[0].relu and type(encoder.fc[1]) is torch.nn.ReLU
    obs = torch.randint(0, 256, (4, *TINY_FRAMES.obs_shape), dtype=torch.uint8)
    with torch.no_grad():
        for a, b in zip(model(obs), reference(obs)):
            assert torch.equal(a, b)
    # with autograd: the outputs here, the gradients in tests/test_split_backward.py, both autograd's bit for bit
    for a, b in zip(model(obs), reference(obs)):
        assert torch.equal(a, b) and a.requires_grad


class _NativeCalls:
    """fastrl_ext's relu_backward, counting its calls."""

    def __init__(self, real):
        self.real, self.calls = real, 0

    def relu_backward(self, grad, y, out):
        self.calls += 1
        self.real.relu_backward(grad, y, out)


CL, NCHW = torch.channels_last, torch.contiguous_format


@pytest.mark.skipif(conv_relu_module._native is None, reason="fastrl_ext not built")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("y_layout,grad_layout,hw", [
    (CL, CL, (7, 5)), (NCHW, NCHW, (7, 5)),
    (CL, NCHW, (7, 5)),  # the third conv's: its gradient comes back through the flatten, in NCHW order
    (NCHW, CL, (7, 5)),
    (CL, NCHW, (1, 1)),  # 1x1 images: both orders at once
])
def test_the_relus_gradient_is_threshold_backwards_bit_for_bit_through_fastrl_ext(monkeypatch, dtype, y_layout,
                                                                                  grad_layout, hw):
    native = _NativeCalls(conv_relu_module._native)
    monkeypatch.setattr(conv_relu_module, "_native", native)
    gen = torch.Generator().manual_seed(5)
    y = F.relu(torch.randn(3, 16, *hw, generator=gen)).to(dtype).contiguous(memory_format=y_layout)
    y[0, :5, 0, 0] = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), 1e-30])
    grad = torch.randn(3, 16, *hw, generator=gen).to(dtype).contiguous(memory_format=grad_layout)
    before = grad.clone()
    ours = relu_backward(grad, y)
    assert native.calls == 1
    expected = torch.ops.aten.threshold_backward(grad, y, 0)
    assert torch.equal(ours, expected) and ours.stride() == expected.stride()  # torch's result takes y's layout
    assert torch.equal(grad, before)  # not written


@pytest.mark.parametrize("case", ["not dense", "float16", "shapes differ", "switched off"])
def test_the_relus_gradient_falls_back_to_torch_where_the_kernel_cannot_read_it(monkeypatch, case):
    native = _NativeCalls(conv_relu_module._native)
    monkeypatch.setattr(conv_relu_module, "_native", native)
    gen = torch.Generator().manual_seed(6)
    y = F.relu(torch.randn(2, 8, 6, 6, generator=gen)).bfloat16().contiguous(memory_format=torch.channels_last)
    grad = torch.randn(2, 8, 6, 6, generator=gen).bfloat16().contiguous(memory_format=torch.channels_last)
    if case == "not dense":
        y, grad = y[:, :, ::2], grad[:, :, ::2]
    elif case == "float16":
        y, grad = y.half(), grad.half()
    elif case == "shapes differ":  # threshold_backward broadcasts
        y = y[:1]
    else:
        monkeypatch.setattr(conv_relu_module, "native_relu_backward", False)
    assert torch.equal(relu_backward(grad, y), torch.ops.aten.threshold_backward(grad, y, 0))
    assert native.calls == 0
