"""The APPO loss: PPO's clipped surrogate on V-trace advantages, a value loss and an entropy bonus.

Pure function of tensors; every mean is over valid samples only (envpool reset steps and
samples too stale to train on are invalid).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class LossOutput(NamedTuple):
    loss: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clip_fraction: torch.Tensor


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def normalize_advantages(adv: torch.Tensor, valid: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    mean = masked_mean(adv, valid)
    var = masked_mean((adv - mean) ** 2, valid)
    return (adv - mean) / (var.sqrt() + eps)


def appo_loss(new_log_probs: torch.Tensor, old_log_probs: torch.Tensor, entropy: torch.Tensor,
              new_values: torch.Tensor, old_values: torch.Tensor, value_targets: torch.Tensor,
              advantages: torch.Tensor, valid: torch.Tensor, clip_ratio: float, value_coef: float,
              entropy_coef: float, value_clip: Optional[float] = None,
              normalize_adv: bool = True) -> LossOutput:
    valid = valid.bool()
    adv = normalize_advantages(advantages, valid) if normalize_adv else advantages
    log_ratio = new_log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio) * adv)
    policy_loss = -masked_mean(surrogate, valid)

    value_err = (new_values - value_targets) ** 2
    if value_clip is not None:
        clipped = old_values + torch.clamp(new_values - old_values, -value_clip, value_clip)
        value_err = torch.maximum(value_err, (clipped - value_targets) ** 2)
    value_loss = masked_mean(value_err, valid)

    mean_entropy = masked_mean(entropy, valid)
    loss = policy_loss + value_coef * value_loss - entropy_coef * mean_entropy
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, valid)
        clip_fraction = masked_mean(((ratio - 1.0).abs() > clip_ratio).float(), valid)
    return LossOutput(loss, policy_loss.detach(), value_loss.detach(), mean_entropy.detach(), approx_kl, clip_fraction)
