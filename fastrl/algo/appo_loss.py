"""The APPO loss: PPO's clipped surrogate on V-trace advantages, a value loss and an entropy bonus.

Pure function of tensors; every mean is over valid samples only (envpool reset steps and
samples too stale to train on are invalid).

`appo_loss` computes the loss and its gradient in fastrl_ext's C++ loop (fastrl_ext/src/appo_loss.cpp)
when the inputs are CPU tensors of one float dtype and `native` (algo.native_loss), else
`appo_loss_torch`, the reference here. Why: the torch version is ~45 small ops forward and ~30
backward, and on the MLP presets the learner is bound by the number of ops it dispatches, not by
their arithmetic.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from fastrl.algo.native import cpu_floats_of_one_dtype
from fastrl_ext import _appo_loss as _native


class LossOutput(NamedTuple):
    """0-dim tensors (`loss` carries the graph), or Python floats from the native gradient chain
    (fastrl.algo.native_gradient), which has no graph to carry: read them with float()."""
    loss: torch.Tensor | float
    policy_loss: torch.Tensor | float
    value_loss: torch.Tensor | float
    entropy: torch.Tensor | float
    approx_kl: torch.Tensor | float
    clip_fraction: torch.Tensor | float


class _ValidMean:
    """Means over the valid samples, with the mask converted and counted once per loss: the loss
    takes seven such means, and the MLP presets' learner is bound by the number of torch ops it
    dispatches (~5 µs each on the 2-core box), not by arithmetic."""

    def __init__(self, valid: torch.Tensor, dtype: torch.dtype):
        self.weights = valid.reshape(-1).to(dtype)
        self.count = self.weights.sum().clamp(min=1.0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.weights if x.dtype == self.weights.dtype else self.weights.to(x.dtype)
        return torch.dot(x.reshape(-1), weights) / self.count


def normalize_advantages(adv: torch.Tensor, mean_of: _ValidMean, eps: float = 1e-8) -> torch.Tensor:
    mean = mean_of(adv)
    centred = adv - mean
    var = mean_of(centred * centred)
    return centred / (var.sqrt() + eps)


def normalized_advantages(adv: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Advantages normalised over the valid samples, as the loss does with normalize_adv: for a
    minibatch the learner cuts into pieces (fastrl.algo.shards) before each piece's loss."""
    return normalize_advantages(adv, _ValidMean(valid.bool(), adv.dtype))


def appo_loss_torch(new_log_probs: torch.Tensor, old_log_probs: torch.Tensor, entropy: torch.Tensor,
                    new_values: torch.Tensor, old_values: torch.Tensor, value_targets: torch.Tensor,
                    advantages: torch.Tensor, valid: torch.Tensor, clip_ratio: float, value_coef: float,
                    entropy_coef: float, value_clip: Optional[float] = None,
                    normalize_adv: bool = True) -> LossOutput:
    """The reference: autograd through plain torch ops (and the path for GPU tensors)."""
    valid_mean = _ValidMean(valid.bool(), new_log_probs.dtype)
    adv = normalize_advantages(advantages, valid_mean) if normalize_adv else advantages
    log_ratio = new_log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio) * adv)
    policy_loss = -valid_mean(surrogate)

    value_err = (new_values - value_targets) ** 2
    if value_clip is not None:
        clipped = old_values + torch.clamp(new_values - old_values, -value_clip, value_clip)
        value_err = torch.maximum(value_err, (clipped - value_targets) ** 2)
    value_loss = valid_mean(value_err)

    mean_entropy = valid_mean(entropy)
    loss = policy_loss + value_coef * value_loss - entropy_coef * mean_entropy
    with torch.no_grad():
        approx_kl = valid_mean((ratio - 1.0) - log_ratio)
        clip_fraction = valid_mean(((ratio - 1.0).abs() > clip_ratio).to(ratio.dtype))
    return LossOutput(loss, policy_loss.detach(), value_loss.detach(), mean_entropy.detach(), approx_kl, clip_fraction)


def appo_loss(new_log_probs: torch.Tensor, old_log_probs: torch.Tensor, entropy: torch.Tensor,
              new_values: torch.Tensor, old_values: torch.Tensor, value_targets: torch.Tensor,
              advantages: torch.Tensor, valid: torch.Tensor, clip_ratio: float, value_coef: float,
              entropy_coef: float, value_clip: Optional[float] = None,
              normalize_adv: bool = True, native: bool = True) -> LossOutput:
    """The loss over the valid samples; differentiable in new_log_probs, entropy and new_values.
    On the native path the five statistics are float64 views of one buffer (the reference's are
    float32 tensors); the learner reads them with float()."""
    args = (new_log_probs, old_log_probs, entropy, new_values, old_values, value_targets, advantages, valid)
    # gradients come back for new_log_probs, entropy and new_values only, so a data tensor that wants
    # one goes to torch; element counts are the C++ side's check (an error where torch would broadcast)
    if (native and _native is not None and cpu_floats_of_one_dtype(*args[:7]) and valid.is_cpu
            and not any(x.requires_grad for x in (old_log_probs, old_values, value_targets, advantages))):
        stats = torch.empty(6, dtype=torch.float64)
        coefs = native_coefs(clip_ratio, value_coef, entropy_coef, value_clip, normalize_adv)
        loss = _NativeLoss.apply(new_log_probs, entropy, new_values, args, coefs, stats)
        _, policy_loss, value_loss, mean_entropy, approx_kl, clip_fraction = stats.unbind()
        return LossOutput(loss, policy_loss, value_loss, mean_entropy, approx_kl, clip_fraction)
    return appo_loss_torch(*args, clip_ratio, value_coef, entropy_coef, value_clip, normalize_adv)


def native_coefs(clip_ratio: float, value_coef: float, entropy_coef: float, value_clip: Optional[float],
                 normalize_adv: bool) -> tuple:
    """The loss's coefficients as fastrl_ext._appo_loss.appo_loss takes them, after its ten arrays."""
    return (float(clip_ratio), float(value_coef), float(entropy_coef),
            None if value_clip is None else float(value_clip), bool(normalize_adv))


class _NativeLoss(torch.autograd.Function):
    """The C++ pass writes the gradient with the loss, so backward only scales it by d(out)/d(loss)."""

    @staticmethod
    def forward(ctx, new_log_probs, entropy, new_values, args, coefs, stats):
        floats = [x.detach().contiguous() for x in args[:7]]
        valid = args[7].to(torch.bool).contiguous()
        grads = torch.empty((3, new_log_probs.numel()), dtype=new_log_probs.dtype)
        _native.appo_loss(*(x.numpy() for x in floats), valid.numpy(), grads.numpy(), stats.numpy(), *coefs)
        ctx.grads = grads
        ctx.shapes = (new_log_probs.shape, entropy.shape, new_values.shape)
        return stats[0].to(new_log_probs.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        grads = ctx.grads * grad_loss
        return (*(g.view(shape) for g, shape in zip(grads, ctx.shapes)), None, None, None)
