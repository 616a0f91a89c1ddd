"""A bf16 conv's weight and bias gradients for the learner's backward, on AMX tiles where the CPU has them.

torch's CPU backward of a conv (`convolution_backward`, oneDNN) took 1.2-1.3 ms for the weight gradient of
Pong's second conv at a minibatch of 64 on the AMX Xeon, and 0.8-0.9 for the third's: more than twice the
time oneDNN's forward takes for the same products. `fastrl_ext._conv_grad.weight_grad` runs each as one tiled
product over the output positions (the gradient transposed on the left, the input's patches in the
position pairs a bf16 tile product wants on the right), built a block of 128 positions at a time in L1:
0.50 and 0.30 ms (`python bench/conv_grad_microbench.py`; bench/README, stop 78). The sums are float32 in
another order than oneDNN's, rounded once to bf16, so a gradient may differ from torch's in its last bf16
place (tests/test_conv_weight_grad.py holds both to a float64 reference). The input gradient stays torch's.

Where it does not apply (no AMX, fp32, padding, dilation, groups, channel counts that are not multiples of
32, tensors not channels-last in memory) the gradients are `convolution_backward`'s, as before.
"""

from __future__ import annotations

import torch

from fastrl_ext import _conv_grad as _native

_available: bool | None = None


def available() -> bool:
    """Whether this CPU and kernel give fastrl_ext's conv gradient its AMX tiles (checked once)."""
    global _available
    if _available is None:
        _available = _native is not None and bool(_native.available())
    return _available


def _nhwc(t: torch.Tensor) -> torch.Tensor | None:
    """t [N, C, H, W] as the [N, H, W, C] view of its memory, if that is one dense channels-last block."""
    view = t.permute(0, 2, 3, 1)
    return view if view.is_contiguous() else None


def native_applies(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation,
                   groups: int) -> bool:
    """Whether `weight_and_bias_grad` runs fastrl_ext's kernel for this conv."""
    if not available() or groups != 1 or any(padding) or any(d != 1 for d in dilation) or stride[0] != stride[1]:
        return False
    if any(t.dtype != torch.bfloat16 or t.device.type != "cpu" or t.dim() != 4 for t in (grad, x, weight)):
        return False
    if x.shape[1] % 32 or weight.shape[0] % 32:
        return False
    return _nhwc(x) is not None and _nhwc(grad) is not None


def weight_and_bias_grad(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias_grad: bool, stride,
                         padding, dilation, groups: int, native: bool = True):
    """The gradients of a conv's weight and (if `bias_grad`) bias, given its output's gradient `grad` and its
    input `x`: fastrl_ext's kernel where `native` and `native_applies`, else torch's `convolution_backward`.
    The weight's gradient comes channels-last in memory, as its oneDNN counterpart does."""
    if not (native and native_applies(grad, x, weight, stride, padding, dilation, groups)):
        _, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad, x, weight, [weight.shape[0]] if bias_grad else None, list(stride), list(padding), list(dilation),
            False, [0, 0], groups, [False, True, bias_grad])
        return grad_w, grad_b
    oc, c, kh, kw = weight.shape
    grad_w = torch.empty(oc, kh, kw, c, dtype=weight.dtype)
    grad_b = torch.empty(oc, dtype=weight.dtype) if bias_grad else None
    _native.weight_grad(_nhwc(x).view(torch.int16).numpy(), _nhwc(grad).view(torch.int16).numpy(),
                        grad_w.view(torch.int16).numpy(),
                        None if grad_b is None else grad_b.view(torch.int16).numpy(), int(stride[0]))
    return grad_w.permute(0, 3, 1, 2), grad_b
