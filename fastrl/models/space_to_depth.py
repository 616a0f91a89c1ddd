"""The Nature CNN's first conv as a space-to-depth conv: the same products, in a shape AMX runs fast.

The first conv reads 4 channels (the frame stack) with an 8x8 kernel at stride 4. Cut the frames into
4x4 tiles and make each tile's 4 channels x 16 pixels one 64-channel pixel (`F.pixel_unshuffle`), cut
the kernel the same way, and it becomes a 2x2 kernel at stride 1 over 64 channels: every output is the
same sum of the same products, added in another order. oneDNN's bf16 kernels on an AMX Xeon fill their
tiles with input channels, and 4 channels leave most of each tile empty: at batch 64, 1 thread, the
weight gradient takes 1.02 ms instead of 2.07 and the forward 0.60 instead of 0.70 (in fp32 a tie;
bench/space_to_depth_microbench.py, bench/README stop 71).

The parameter keeps its [out, C, 8, 8] shape, so checkpoints, the optimizer and the published weights
see the plain conv: the forward cuts it (~14 µs) and autograd's pixel_unshuffle backward (a
pixel_shuffle) hands its gradient back in that shape. The frames arrive already cut:
fastrl.models.frames with block=stride, in the one pass from uint8 that makes the plain conv's input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def tiles(chw: tuple, kernel: int, stride: int) -> bool:
    """Whether a conv of this kernel and stride over [C, H, W] images can run on stride x stride tiles:
    the stride divides the kernel, the height and the width."""
    _, h, w = chw
    return stride > 1 and kernel % stride == 0 and h % stride == 0 and w % stride == 0


class SpaceToDepthConv2d(nn.Conv2d):
    """An unpadded conv whose stride divides its kernel, run on input cut into stride x stride tiles
    ([N, C*s*s, H/s, W/s], channels-last): `conv(tiled)` equals the plain conv on the untiled input."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        if stride < 2 or kernel_size % stride != 0:
            raise ValueError(f"a space-to-depth conv needs a stride of 2+ that divides the kernel "
                             f"(got kernel {kernel_size}, stride {stride})")
        super().__init__(in_channels, out_channels, kernel_size, stride=stride)
        self.block = stride

    def forward(self, tiled: torch.Tensor) -> torch.Tensor:
        weight, stride = conv_weight_and_stride(self, self.weight)
        return F.conv2d(tiled, weight, self.bias, stride)


def conv_weight_and_stride(conv: nn.Conv2d, weight: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """The weight and stride that `F.conv2d` runs `conv` with, for its parameter's value `weight`
    (another dtype's copy, say): the weight cut into tiles and stride 1 for a space-to-depth conv."""
    if isinstance(conv, SpaceToDepthConv2d):
        return F.pixel_unshuffle(weight, conv.block), (1, 1)
    return weight, tuple(conv.stride)


def parameter_grad(conv: nn.Conv2d, grad: torch.Tensor) -> torch.Tensor:
    """The gradient of the weight `conv_weight_and_stride` returned, in the parameter's shape."""
    return F.pixel_shuffle(grad, conv.block) if isinstance(conv, SpaceToDepthConv2d) else grad
