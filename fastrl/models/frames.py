"""Image frames to the Nature CNN's input: the conv's dtype, scaled to [0, 1], in its memory order.

torch takes three passes (cast, relayout, scale), and its relayout to channels-last is slow: on the
AVX-512 EPYC, per 84x84x4 frame at batches of 16-528, 58-87 µs to bf16 channels-last (the learner's
input in bf16, and now the inference workers') and 29-105 µs to float32 channels-last (the learner's
on an AVX2 host); the learner pays it three times per env step trained. fastrl_ext's `_frames` does it
in one pass: 7-16 and 3-11 µs (`bench/frames_microbench.py`). It computes the product torch does
(the frame cast to float32 times float32(1/255), then one rounding to bf16), which `_native_agrees`
checks for all 256 byte values the first time it would be used; torch's passes, below, are the
reference and what runs for anything else (another dtype, a non-contiguous or non-CPU tensor, an
unbuilt fastrl_ext, or a scale other than uint8's 1/255: EnvSpec.image_scale).

`block` > 1 gives a space-to-depth first conv (fastrl.models.space_to_depth) its input: the frames cut
into block x block tiles, each tile's pixels as channels, torch's `pixel_unshuffle`, channels-last.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastrl_ext import _frames as _native  # None when fastrl_ext is not built

_agrees: bool | None = None  # whether the native pass matches torch's, checked once


UINT8_SCALE = 1.0 / 255.0


def frames_to_input_torch(obs: torch.Tensor, dtype: torch.dtype, channels_last: bool,
                          scale: float = UINT8_SCALE, block: int = 1) -> torch.Tensor:
    """The reference: cast, relayout, then scale in place (on a copy: never the caller's tensor)."""
    if block > 1:
        x = F.pixel_unshuffle(obs.to(dtype), block).contiguous(memory_format=torch.channels_last)
        return (x.clone() if x.data_ptr() == obs.data_ptr() else x).mul_(scale)
    if channels_last and dtype == torch.bfloat16:
        # two steps beat one: torch's fused uint8 -> bf16 channels-last copy took 3.4 ms for 64 frames,
        # against 0.2 ms for the plain cast plus 0.7 ms for the bf16 relayout
        x = obs.to(dtype).contiguous(memory_format=torch.channels_last)
    else:
        x = obs.to(dtype=dtype, memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    if x.data_ptr() == obs.data_ptr():
        x = x.clone()
    return x.mul_(scale)


def _native_into(obs: torch.Tensor, dtype: torch.dtype, channels_last: bool, block: int = 1) -> torch.Tensor:
    n, c, h, w = obs.shape
    x = torch.empty((n, c * block * block, h // block, w // block), dtype=dtype,
                    memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    view = x.permute(0, 2, 3, 1) if channels_last else x  # the memory's own order: C-contiguous
    if dtype == torch.bfloat16:
        view = view.view(torch.int16)  # numpy has no bf16; the kernel writes its bits
    _native.frames_to_input(obs.numpy(), view.numpy(), channels_last, block)
    return x


def _native_agrees() -> bool:
    global _agrees
    if _agrees is None:
        every_byte = torch.arange(256, dtype=torch.uint8).reshape(1, 4, 8, 8)
        _agrees = all(torch.equal(_native_into(every_byte, dtype, cl, block),
                                  frames_to_input_torch(every_byte, dtype, cl, block=block))
                      for dtype in (torch.bfloat16, torch.float32) for cl, block in ((True, 1), (False, 1), (True, 2)))
    return _agrees


def frames_to_input(obs: torch.Tensor, dtype: torch.dtype, channels_last: bool,
                    scale: float = UINT8_SCALE, block: int = 1) -> torch.Tensor:
    """obs [N, C, H, W] times `scale` (uint8 frames: 1/255) as `dtype`, channels-last in memory if asked;
    a new tensor. `block` > 1 (channels-last only; it must divide H and W): [N, C*block*block, H/block,
    W/block], `F.pixel_unshuffle`'s tiles."""
    if block > 1 and not channels_last:
        raise ValueError("frames_to_input: blocks come channels-last only")
    if (_native is not None and obs.dtype == torch.uint8 and scale == UINT8_SCALE and obs.dim() == 4 and obs.is_cpu
            and obs.is_contiguous() and dtype in (torch.bfloat16, torch.float32) and _native_agrees()):
        return _native_into(obs, dtype, channels_last, block)
    return frames_to_input_torch(obs, dtype, channels_last, scale, block)
