"""Running mean/std observation normalisation whose statistics travel with the weights.

The statistics are module buffers, so the learner's updates reach the inference workers in the
same seqlocked publication as the weights, and they are saved in every checkpoint.
"""

from __future__ import annotations

import torch
from torch import nn

# defined beside the numpy acting forward, which must normalise exactly as this module does
from fastrl.models.numpy_policy import NORMALIZER_CLIP, NORMALIZER_EPS


class ObsNormalizer(nn.Module):
    def __init__(self, shape: tuple, clip: float = NORMALIZER_CLIP, eps: float = NORMALIZER_EPS):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.full((1,), 1e-4))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.clamp((obs - self.mean) / torch.sqrt(self.var + self.eps), -self.clip, self.clip)

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Merge a batch's moments (parallel variance formula of Chan et al.)."""
        batch = batch.reshape(-1, *self.mean.shape).float()
        n = float(batch.shape[0])
        b_mean, b_var = batch.mean(0), batch.var(0, unbiased=False)
        total = self.count + n
        delta = b_mean - self.mean
        self.mean += delta * n / total
        self.var.copy_((self.var * self.count + b_var * n + delta ** 2 * self.count * n / total) / total)
        self.count.copy_(total)
