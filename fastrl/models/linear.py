"""A linear layer that puts its weight on the left of the product where that spares a weight copy.

`F.linear(x, W)` is `x @ W.T`: oneDNN's bf16 matmul takes the transposed weight as its right-hand
operand and repacks it (the Nature CNN's 512 x 3136 weight, 3.2 MB) on every call. `(W @ x.T).T` is
the same product with the weight as the left-hand operand, read in place, and only the small
`x.T` repacked. It pays where oneDNN's kernel takes the batch as a whole number of 16-column blocks:
one thread, bf16, caches flushed before each call (AVX-512 EPYC, `python bench/linear_microbench.py`),
the layer's CPU time against `F.linear` at 16 / 32 / 48 / 64 rows 0.68 / 0.81 / 0.86 / 0.92x, but at
17, 20 or 33 rows 1.07-1.16x and in fp32 1.0-1.7x. So the weight goes left only in bf16 at those
batches (on the CPU; the GPU's matmuls were not measured). The Pong inference worker's batches are
splits of 16, its learner's minibatches 64 rows (32-row pieces with system.learner_split=rows).

`bf16_linear_in_fp32` is the other way round for the narrow products after the hidden layer (the policy
and value heads): autocast's bf16 linear computed as an fp32 product, where oneDNN's bf16 call costs more to
set up than the product itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ROW_BLOCK = 16
MAX_WEIGHT_LEFT_ROWS = 64


def weight_left_pays(rows: int, dtype: torch.dtype) -> bool:
    """Whether `(W @ x.T).T` beats `x @ W.T` for a batch of `rows` computed in `dtype`."""
    return dtype == torch.bfloat16 and 0 < rows <= MAX_WEIGHT_LEFT_ROWS and rows % ROW_BLOCK == 0


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, as `(weight @ x.T + bias).T` (a transposed view) where
    `weight_left_pays` for the dtype the product runs in."""
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else weight.dtype
    if x.device.type != "cpu" or x.dim() != 2 or not weight_left_pays(x.shape[0], dtype):
        return F.linear(x, weight, bias)
    if bias is None:
        return torch.mm(weight, x.t()).t()
    return torch.addmm(bias.unsqueeze(1), weight, x.t()).t()


class WeightLeftLinear(nn.Linear):
    """nn.Linear (same parameters, state dict and initialisation) whose product is `linear`'s, so
    oneDNN does not repack the weight per call where that pays. Autograd differentiates the addmm as
    usual."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def bf16_linear_in_fp32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight, bias)` as CPU autocast runs it in bf16 -- the inputs rounded to bf16, the
    products summed in fp32, the output rounded to bf16 -- but computed as an fp32 product of the rounded
    values, for the narrow heads after the hidden layer. oneDNN's bf16 kernels pay a fixed ~20-40 µs a
    call to set up (AMX Xeon, 1 thread), which for a 512 x 6 or 512 x 1 product is nearly all of it: Pong's
    two heads took 81 µs at batch 16 as bf16 calls, 14 µs as one fp32 product of both, and ~40-55 as
    ActorCritic.heads runs them, one each with its casts (scratch timings, stop 77). The outputs are
    autocast's but for the order of the fp32 sums. Autograd differentiates the casts and the fp32 addmm,
    so the gradients are rounded where autocast's bf16 products would round them. Call it with autocast off."""
    def rounded(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.bfloat16).float()

    return torch.addmm(rounded(bias), rounded(x), rounded(weight).t()).to(torch.bfloat16)
