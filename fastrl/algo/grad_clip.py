"""Gradient clipping by global norm, in three foreach kernels.

Same result as `torch.nn.utils.clip_grad_norm_` (the 2-norm of every gradient together, scaled
down to `max_norm` when above it, 1e-6 added to the norm before dividing), which goes through
grouping by device and dtype and a generic p-norm path on every call: ~200 µs for the 12 small
tensors of the 64x64 MLP presets on the 2-core box, against ~110 µs here. The learner calls it
once per optimizer step, and those presets take a step every ~4 ms.
"""

from __future__ import annotations

import torch


def clip_scale(total: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The factor that brings a global norm `total` down to `max_norm` (1 when it is already below)."""
    # clamped instead of branched on, so the norm is never read back to Python here
    return torch.clamp(max_norm / (total + 1e-6), max=1.0)


def clip_scale_of(total: float, max_norm: float) -> float:
    """clip_scale on a norm already read back as a Python float (a native sum of squares' square
    root), in float64: three tensor ops would cost ~20 µs of the MLP presets' ~500 µs step."""
    return min(max_norm / (total + 1e-6), 1.0)


def clip_grad_norm(params, max_norm: float, flat_grad: torch.Tensor | None = None) -> torch.Tensor:
    """Scale the gradients of `params` in place so their global 2-norm is at most `max_norm`;
    return the norm before clipping (a 0-dim tensor; inf or nan when a gradient is). `flat_grad`:
    one tensor of which every gradient is a view (fastrl.algo.flat_params), clipped in two kernels."""
    if flat_grad is not None:
        total = torch.linalg.vector_norm(flat_grad)
        flat_grad.mul_(clip_scale(total, max_norm))
        return total
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, clip_scale(total, max_norm))
    return total
