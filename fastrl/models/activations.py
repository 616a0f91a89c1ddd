"""Tanh for the MLP encoders, computed by fastrl_ext (or numpy) where torch's CPU kernel is slow.

torch 2.13's CPU tanh is not vectorised: ~90 µs for a 512x64 float32 tensor on either EPYC, whatever
ATEN_CPU_CAPABILITY says. numpy's SIMD tanh is 13 µs on the AVX-512 one but needs AVX-512: 127 µs
on the AVX2 one. fastrl_ext's (`_activations`: tanh_row.h's loop, also the acting kernel's, AVX-512
or AVX2 picked at import, absolute error < 2e-7) is 15 µs on the AVX-512 EPYC and 43 on the AVX2
one; its gradient 4 µs against torch's `tanh_backward` 7 (AVX-512), 7 against 24 (AVX2). Learner
CPU per CartPole batch, native against numpy: a tie on the AVX-512 EPYC, ~10% less on the AVX2 one
(`bench/activations_microbench.py --learner configs/cartpole.yaml`). Before any of this, tanh was
27% of the CartPole learner's CPU on the AVX-512 box (torch profiler).

So a float32 CPU tensor goes to fastrl_ext (numpy when it is not built), a float64 one to numpy,
anything else (bf16 under autocast, a GPU tensor) to torch.tanh. Below `MIN_NUMEL_*` elements
torch's call is cheaper than the round trip (and, with gradients, than a Python autograd.Function's
forward and backward, ~50 µs together). Crossovers inside a 2x64 tanh MLP, 1 thread, AVX2 EPYC:
acting (no gradients) breaks even at 32 rows of 64, 1.4x faster at 128 rows; training (forward +
backward) is 1.4x faster at 528 rows and slower at 128.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fastrl_ext import _activations as _native

MIN_NUMEL_NO_GRAD = 2048
MIN_NUMEL_GRAD = 16384


def _numpy_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.tanh(x.detach().numpy()))


def _native_tanh(x: torch.Tensor) -> torch.Tensor:
    x = x.detach().contiguous()
    y = torch.empty_like(x)
    _native.tanh(x.numpy(), y.numpy())
    return y


class _Tanh(torch.autograd.Function):
    """tanh with its gradient: both by fastrl_ext when `native`, else numpy's forward and torch's backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, native: bool) -> torch.Tensor:
        y = _native_tanh(x) if native else _numpy_tanh(x)
        ctx.save_for_backward(y)
        ctx.native = native
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        (y,) = ctx.saved_tensors
        if not (ctx.native and grad.dtype == torch.float32):
            return torch.ops.aten.tanh_backward(grad, y), None  # grad * (1 - y^2)
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        _native.tanh_backward(grad.numpy(), y.numpy(), out.numpy())
        return out, None


def tanh(x: torch.Tensor) -> torch.Tensor:
    """torch.tanh(x), by fastrl_ext or numpy where that is faster (see the module docstring)."""
    if not (x.is_cpu and x.dtype in (torch.float32, torch.float64)):
        return torch.tanh(x)
    native = _native is not None and x.dtype == torch.float32
    if x.requires_grad:
        if x.numel() < MIN_NUMEL_GRAD:
            return torch.tanh(x)
        return _Tanh.apply(x, native)
    if x.numel() < MIN_NUMEL_NO_GRAD:
        return torch.tanh(x)
    return _native_tanh(x) if native else _numpy_tanh(x)


class Tanh(nn.Module):
    """nn.Tanh's drop-in (no parameters, so state_dict names are unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tanh(x)
