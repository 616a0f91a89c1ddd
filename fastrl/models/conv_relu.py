"""A conv layer and the ReLU after it as one oneDNN call on the CPU.

torch's eager conv writes its output, then ReLU reads it and writes another: for Pong's first conv
at batch 64 (819,200 bf16 values) the ReLU alone took 166 µs of a 911 µs conv-and-ReLU, and 264 µs
over the CNN's three (1 thread, AMX Xeon). oneDNN applies the ReLU to each output as its kernel
stores it (a post-op), through `torch.ops.mkldnn._convolution_pointwise`, the op torch's own CPU
inductor emits for a conv followed by ReLU. The conv is the same primitive on the same weights, so
the outputs are the unfused ones bit for bit (tests/test_conv_relu.py; checked here on first use).

Where it runs: a Nature CNN's forward without autograd (inference workers, evaluation), and the
learner's split backward (fastrl.algo.split_backward), whose conv layers keep the ReLU's output for
its backward. Under an autocast to another dtype, with autograd, off the CPU, or where the op is
missing or disagrees, it is the plain conv and ReLU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastrl.models.space_to_depth import conv_weight_and_stride

_checked: bool | None = None  # whether the fused op exists and agreed with the plain pair


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


def relu_follows(layers: nn.Sequential, i: int) -> bool:
    """Whether layers[i] is a conv that a ReLU follows: the pair one call can run."""
    return isinstance(layers[i], nn.Conv2d) and i + 1 < len(layers) and type(layers[i + 1]) is nn.ReLU


def conv_layer_relu(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """relu(conv(x)) for a conv module (a space-to-depth one on its tiles), through `conv_relu`."""
    weight, stride = conv_weight_and_stride(conv, conv.weight)
    return conv_relu(x, weight, conv.bias, stride, conv.padding, conv.dilation, conv.groups)
