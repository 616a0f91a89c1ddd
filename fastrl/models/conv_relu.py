"""A conv layer and the ReLU after it as one oneDNN call on the CPU.

torch's eager conv writes its output, then ReLU reads it and writes another: for Pong's first conv
at batch 64 (819,200 bf16 values) the ReLU alone took 166 µs of a 911 µs conv-and-ReLU, and 264 µs
over the CNN's three (1 thread, AMX Xeon). oneDNN applies the ReLU to each output as its kernel
stores it (a post-op), through `torch.ops.mkldnn._convolution_pointwise`, the op torch's own CPU
inductor emits for a conv followed by ReLU. The conv is the same primitive on the same weights, so
the outputs are the unfused ones bit for bit (tests/test_conv_relu.py; checked here on first use).

Where it runs: a Nature CNN's forward without autograd (inference workers, evaluation), its forward with
autograd (the learner: `conv_layer_relu_trained`, whose backward takes the ReLU's gradient natively, then
the conv's: its weight and bias gradients by fastrl.models.conv_weight_grad), and the learner's split backward (fastrl.algo.split_backward), whose conv
layers keep the ReLU's output for its backward. Under an autocast to another dtype, off the CPU, or where
the op is missing or disagrees, it is the plain conv and ReLU.

That backward (`relu_backward`) runs in fastrl_ext (`_activations.relu_backward`): torch's
`threshold_backward` turns each bf16 value into a float to compare and select, and in the learner,
with the ReLU's output long out of cache, it took 1.3 ms of a Pong optimizer step's ~13.6 on the
main thread (AMX Xeon, cProfile). The kernel compares the values' bits as integers, the same answer
for every value, NaNs and signed zeros included. Batch 64, the output cold (`python
bench/relu_backward_microbench.py`): the first conv's 298 -> 249 µs, the third's 1,052 -> 176.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastrl.algo.flat_params import memory_flat_array
from fastrl.models.conv_weight_grad import native_applies, weight_and_bias_grad
from fastrl.models.space_to_depth import conv_weight_and_stride
from fastrl_ext import _activations as _native

_checked: bool | None = None  # whether the fused op exists and agreed with the plain pair
# the ReLU's gradient by fastrl_ext where it applies (False: torch's, for comparisons)
native_relu_backward = True


def _fused_agrees() -> bool:
    """Whether the fused op exists here and gives the plain conv and ReLU's outputs bit for bit, on a
    small channels-last bf16 case and a contiguous float32 one (checked once per process). The first
    call usually comes inside a bf16 network's forward: the check turns its autocast off, which would
    otherwise run the plain float32 conv in bf16 and fail it."""
    global _checked
    if _checked is None:
        _checked = False
        if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise"):
            gen = torch.Generator().manual_seed(0)
            try:
                with torch.no_grad(), torch.autocast("cpu", enabled=False):
                    for dtype, memory_format in ((torch.bfloat16, torch.channels_last),
                                                 (torch.float32, torch.contiguous_format)):
                        x = torch.randn(2, 8, 9, 9, generator=gen).to(dtype).contiguous(memory_format=memory_format)
                        w = torch.randn(16, 8, 3, 3, generator=gen).to(dtype).contiguous(memory_format=memory_format)
                        b = torch.randn(16, generator=gen).to(dtype)
                        fused = torch.ops.mkldnn._convolution_pointwise(x, w, b, [0, 0], [2, 2], [1, 1], 1, "relu",
                                                                        [], "")
                        if not torch.equal(fused, F.relu(F.conv2d(x, w, b, 2))):
                            return False
            except RuntimeError:
                return False
            _checked = True
    return _checked


def fuses(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether `conv_relu` on these runs the fused op (the grad mode is the caller's to check): CPU tensors of
    one dtype, and no autocast, or an autocast to that very dtype (a bf16 network's layers under its own
    autocast, which then casts nothing: the fused op, which autocast does not know, runs what it would)."""
    if x.device.type != "cpu" or x.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        return False
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") != weight.dtype:
        return False
    return _fused_agrees()


def conv_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride, padding, dilation,
              groups: int) -> torch.Tensor:
    """relu(conv2d(x, weight, bias, ...)), fused where `fuses` says so. No autograd through the fused op:
    callers run it under no_grad or inside an autograd.Function of their own."""
    if isinstance(padding, str) or not fuses(x, weight, bias):
        return F.relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups))
    return _fused_op(x, weight, bias, list(padding), list(stride), list(dilation), groups, "relu", [], "")


def _fused_op(*args) -> torch.Tensor:
    """The fused op itself (one name for tests to count its calls by)."""
    return torch.ops.mkldnn._convolution_pointwise(*args)


class _ConvReLUFunction(torch.autograd.Function):
    """relu(conv2d(...)) forward by `conv_relu` (the fused op), and backward the ReLU's gradient by
    `relu_backward`, then the conv's: the input's by `convolution_backward`, the weight's and bias's by
    fastrl.models.conv_weight_grad (AMX tiles where it applies and `native_weight_grad`, else the same
    `convolution_backward` call, which then also gives the input's: the calls autograd makes for the
    unfused pair, on the same tensors, so the gradients are its own bit for bit)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, native_weight_grad):
        out = conv_relu(x, weight, bias, stride, padding, dilation, groups)
        ctx.save_for_backward(x, weight, out)
        ctx.conv = (list(stride), list(padding), list(dilation), groups, bias is not None, native_weight_grad)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, out = ctx.saved_tensors
        stride, padding, dilation, groups, has_bias, native_weight_grad = ctx.conv
        grad = relu_backward(grad_out, out)
        need = ctx.needs_input_grad
        bias_grad = has_bias and need[2]
        if need[1] and native_weight_grad and native_applies(grad, x, weight, stride, padding, dilation, groups):
            grad_w, grad_b = weight_and_bias_grad(grad, x, weight, bias_grad, stride, padding, dilation, groups)
            grad_x = None
            if need[0]:
                grad_x = torch.ops.aten.convolution_backward(
                    grad, x, weight, None, stride, padding, dilation, False, [0, 0], groups, [True, False, False])[0]
        else:
            grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
                grad, x, weight, [weight.shape[0]] if has_bias else None, stride, padding, dilation, False, [0, 0],
                groups, [need[0], need[1], bias_grad])
        return grad_x, grad_w, grad_b, None, None, None, None, None


def conv_layer_relu_trained(conv: nn.Conv2d, x: torch.Tensor, native_weight_grad: bool = True) -> torch.Tensor:
    """relu(conv(x)) with autograd for a conv module where `fuses` holds: the fused op forward (no pass of its
    own for the ReLU), and its gradient by fastrl_ext's `relu_backward` (_ConvReLUFunction). The learner's
    plain backward (system.learner_split=rows) took ~1.7 ms a Pong optimizer step in torch's ReLU and its
    gradient (`clamp_min`, `threshold_backward`: the third conv's gradient arrives in another memory layout
    than its output's), of ~15 (AMX Xeon, torch.profiler, stop 77). `native_weight_grad`: the weight's and
    bias's gradients by fastrl_ext's AMX kernel where it applies (model.native_conv_grad)."""
    weight, stride = conv_weight_and_stride(conv, conv.weight)
    return _ConvReLUFunction.apply(x, weight, conv.bias, stride, conv.padding, conv.dilation, conv.groups,
                                   native_weight_grad)


def relu_follows(layers: nn.Sequential, i: int) -> bool:
    """Whether layers[i] is a conv that a ReLU follows: the pair one call can run."""
    return isinstance(layers[i], nn.Conv2d) and i + 1 < len(layers) and type(layers[i + 1]) is nn.ReLU


def conv_layer_relu(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """relu(conv(x)) for a conv module (a space-to-depth one on its tiles), through `conv_relu`."""
    weight, stride = conv_weight_and_stride(conv, conv.weight)
    return conv_relu(x, weight, conv.bias, stride, conv.padding, conv.dilation, conv.groups)


def relu_backward(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The gradient through a ReLU whose output was `out`: `torch.ops.aten.threshold_backward(grad, out, 0)`, bit for
    bit and in the same memory layout (`out`'s), by fastrl_ext where it applies (CPU bf16 or float32 tensors of one
    dtype and shape, `out` one dense block), else by torch. A new tensor: `grad` is not written.
    A gradient in another layout is copied into `out`'s first: the third conv's arrives in NCHW order from the
    flatten after it, where torch's own mixed-layout pass took ~1,050 µs (64x64x7x7 bf16) against ~175 for both."""
    applies = (native_relu_backward and _native is not None and grad.dtype in (torch.bfloat16, torch.float32)
               and out.dtype == grad.dtype and grad.shape == out.shape)
    out_array = memory_flat_array(out) if applies else None
    if out_array is None:
        return torch.ops.aten.threshold_backward(grad, out, 0)
    if grad.stride() != out.stride():
        grad = torch.empty_like(out).copy_(grad)
    result = torch.empty_like(out)  # out's strides, as torch's result has
    _native.relu_backward(memory_flat_array(grad), out_array, memory_flat_array(result))
    return result
