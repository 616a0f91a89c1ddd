"""Tanh for the MLP encoders, computed by numpy where torch's CPU kernel is slow.

torch 2.13's CPU tanh is not vectorised: 88-96 µs for a 528x64 float32 tensor, whatever
ATEN_CPU_CAPABILITY says, against 12-18 µs for numpy's SIMD tanh (same box, 1 thread; the
outputs differ by at most 6e-8). On the CartPole preset's learner it was 27% of the CPU (four tanh
of 528x64 per optimizer step, torch profiler). Its backward, `aten::tanh_backward`, is fast and is
kept.

Below `MIN_NUMEL_*` elements torch's call is cheaper than the round trip through numpy (and, with
gradients, through a Python autograd.Function's backward). Crossovers measured inside a 2x64 tanh
MLP, 1 thread: acting (no gradients) breaks even at 16 rows of 64, 1.5x faster at 128 rows;
training (forward + backward) breaks even at ~192 rows, 4% faster at 264, 15% at 528, 22% at 1,056.
Anything but a CPU float32/float64 tensor (bf16 under autocast, a GPU tensor) goes to torch.tanh.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

MIN_NUMEL_NO_GRAD = 1024
MIN_NUMEL_GRAD = 16384


def _numpy_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.tanh(x.detach().numpy()))


class _NumpyTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = _numpy_tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)  # grad * (1 - y^2)


def tanh(x: torch.Tensor) -> torch.Tensor:
    """torch.tanh(x), by numpy where that is faster (see the module docstring)."""
    if not (x.is_cpu and x.dtype in (torch.float32, torch.float64)):
        return torch.tanh(x)
    if x.requires_grad:
        return _NumpyTanh.apply(x) if x.numel() >= MIN_NUMEL_GRAD else torch.tanh(x)
    return _numpy_tanh(x) if x.numel() >= MIN_NUMEL_NO_GRAD else torch.tanh(x)


class Tanh(nn.Module):
    """nn.Tanh's drop-in (no parameters, so state_dict names are unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tanh(x)
