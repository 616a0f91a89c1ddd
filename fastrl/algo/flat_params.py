"""One flat tensor behind a model's trained parameters, and one behind their gradients.

The MLP presets' networks have ~12 parameter tensors, and every optimizer step ran its clip (norms,
a stack, a norm, a scale) and Adam's fused update over that list: 112 + 90 µs of a 1,845 µs step on
HalfCheetah (`bench/profile_learner.py`), mostly per-tensor dispatch. With each parameter and each
gradient a view of one flat tensor, the clip is one norm and one scale and Adam one fused call over
one tensor. Autograd accumulates into a parameter's existing `.grad` in place (first-order backward),
so the views stay the gradients as long as nobody sets `.grad` to None: `zero_grad` here zeroes the
flat tensor instead, and `check` makes a detached view an error rather than a silently unclipped,
unapplied gradient (the clip falls back to the parameters' own gradients then).

Only for parameters that can be plain views of one tensor: one dtype and device, contiguous (a
channels-last conv weight's memory order is not its logical one; the Atari CNN keeps its list).
A deep copy of the parameters does not keep them views (torch clones a Parameter's data), so a
copied trainer has to be built anew; its Adam refuses to step rather than apply a stale gradient.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

_GRAD = operator.attrgetter("grad")


def memory_flat(t: torch.Tensor) -> torch.Tensor | None:
    """A 1-D view of one dense tensor's memory in its own order (a channels-last conv weight's too),
    for kernels that work element by element on several tensors laid out alike; None if strided."""
    if t.is_contiguous():
        return t.view(-1)
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1).reshape(-1)  # contiguous after the permute: a view, not a copy
    return None


def memory_flat_array(t: torch.Tensor) -> np.ndarray | None:
    """memory_flat as the numpy array fastrl_ext's kernels take (a bf16 tensor's as int16: numpy has no
    bf16, and the kernels read and write its bits); None if strided or not on the CPU."""
    flat = memory_flat(t.detach()) if t.device.type == "cpu" else None
    if flat is None:
        return None
    return (flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat).numpy()


class FlatParams:
    def __init__(self, params: list[torch.nn.Parameter]):
        if not self.supported(params):
            raise ValueError("FlatParams needs contiguous parameters of one floating dtype on one device")
        self.params = list(params)
        first = self.params[0]
        total = sum(p.numel() for p in self.params)
        self.data = torch.empty(total, dtype=first.dtype, device=first.device)
        self.grad = torch.zeros_like(self.data)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                self.data[offset:offset + n].copy_(p.reshape(-1))
                p.data = self.data[offset:offset + n].view_as(p)
                p.grad = self.grad[offset:offset + n].view_as(p)
                offset += n
        self.grad_views = [p.grad for p in self.params]

    @staticmethod
    def supported(params: list[torch.nn.Parameter]) -> bool:
        params = list(params)
        if not params or not params[0].dtype.is_floating_point:
            return False
        dtype, device = params[0].dtype, params[0].device
        return all(p.dtype == dtype and p.device == device and p.is_contiguous() for p in params)

    def zero_grad(self) -> None:
        self.grad.zero_()

    def attached(self) -> bool:
        """Whether every parameter's gradient is still the view set here. Autograd keeps it so; setting
        `.grad` to None (torch.optim's zero_grad) or a backward with create_graph does not. Checked every
        step, so by identity (torch hands out one Python object per tensor)."""
        return all(map(operator.is_, map(_GRAD, self.params), self.grad_views))  # ~2 µs faster than a generator

    def check(self) -> None:
        """Raise unless attached: an update over the flat gradient would apply stale or zero values."""
        if not self.attached():
            raise RuntimeError("a parameter's gradient was detached from the flat gradient buffer")
