"""What fastrl_ext's learner pieces (V-trace, the APPO loss) take: CPU tensors of one float dtype,
float32 or float64, which they read in place through numpy views. Anything else (a GPU batch,
mixed dtypes) goes to the piece's torch reference."""

from __future__ import annotations

import torch


def cpu_floats_of_one_dtype(*tensors: torch.Tensor) -> bool:
    dtype = tensors[0].dtype
    return dtype in (torch.float32, torch.float64) and all(t.is_cpu and t.dtype == dtype for t in tensors)
