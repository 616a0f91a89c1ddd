"""fastrl's gradient clipping against torch.nn.utils.clip_grad_norm_, its reference."""

import math

import pytest
import torch

from fastrl.algo.grad_clip import clip_grad_norm


def _params(seed: int, scale: float) -> list:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in [(64, 4), (64,), (64, 64), (1,), (2, 64)]]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * scale
    return params


@pytest.mark.parametrize("scale", [1e-3, 0.05, 1.0, 30.0])  # total norms from below max_norm to far above
def test_clip_matches_torch(scale):
    ours, theirs = _params(1, scale), _params(1, scale)
    norm = clip_grad_norm(ours, 0.5)
    want = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    assert float(norm) == pytest.approx(float(want), rel=1e-6)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-9)
    after = math.sqrt(sum(float((p.grad ** 2).sum()) for p in ours))
    assert after <= 0.5 * (1 + 1e-5) and (float(norm) > 0.5 or after == pytest.approx(float(norm), rel=1e-6))


def test_parameters_without_gradients_are_skipped_and_non_finite_norms_are_reported():
    params = _params(2, 1.0)
    params[1].grad = None
    assert math.isfinite(float(clip_grad_norm(params, 0.5)))
    assert params[1].grad is None
    params[0].grad[0, 0] = float("inf")
    assert not math.isfinite(float(clip_grad_norm(params, 0.5)))  # the trainer skips such a step
    assert float(clip_grad_norm([torch.nn.Parameter(torch.zeros(3))], 0.5)) == 0.0
