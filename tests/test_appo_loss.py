"""The APPO loss against an element-by-element reference of design.md §3's formulas."""

import math

import pytest
import torch

from fastrl.algo.appo_loss import appo_loss


def reference_loss(new_lp, old_lp, ent, v, old_v, vs, adv, valid, clip, vc, ec, vclip, norm):
    idx = [i for i in range(len(valid)) if valid[i]]
    n = len(idx)
    a = [float(adv[i]) for i in idx]
    if norm:
        mean = sum(a) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in a) / n)
        a = [(x - mean) / (std + 1e-8) for x in a]
    pol = val = e = 0.0
    for k, i in enumerate(idx):
        r = math.exp(float(new_lp[i]) - float(old_lp[i]))
        pol += -min(r * a[k], max(1 - clip, min(1 + clip, r) ) * a[k])
        err = (float(v[i]) - float(vs[i])) ** 2
        if vclip is not None:
            clipped = float(old_v[i]) + max(-vclip, min(vclip, float(v[i]) - float(old_v[i])))
            err = max(err, (clipped - float(vs[i])) ** 2)
        val += err
        e += float(ent[i])
    return pol / n + vc * val / n - ec * e / n


@pytest.mark.parametrize("vclip", [None, 0.2])
@pytest.mark.parametrize("norm", [True, False])
def test_loss_matches_reference(vclip, norm):
    gen = torch.Generator().manual_seed(3)
    n = 200
    t = lambda scale=1.0: torch.randn(n, generator=gen, dtype=torch.float64) * scale  # noqa: E731
    new_lp, old_lp, ent, v, old_v, vs, adv = t(), t(), t().abs(), t(), t(), t(), t(2.0)
    old_lp = new_lp + t(0.3)  # ratios around 1, many inside and outside the clip range
    valid = torch.rand(n, generator=gen) > 0.2
    out = appo_loss(new_lp, old_lp, ent, v, old_v, vs, adv, valid, 0.1, 0.5, 0.01, vclip, norm)
    want = reference_loss(new_lp, old_lp, ent, v, old_v, vs, adv, valid, 0.1, 0.5, 0.01, vclip, norm)
    assert float(out.loss) == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert 0.0 < float(out.clip_fraction) < 1.0


def test_invalid_samples_have_no_effect():
    gen = torch.Generator().manual_seed(4)
    n = 50
    args = [torch.randn(n, generator=gen, dtype=torch.float64) for _ in range(7)]
    valid = torch.ones(n, dtype=torch.bool)
    valid[::3] = False
    base = appo_loss(*args, valid, 0.1, 0.5, 0.01)
    poisoned = [a.clone() for a in args]
    for a in poisoned:
        a[~valid] = 1e6
    assert float(appo_loss(*poisoned, valid, 0.1, 0.5, 0.01).loss) == pytest.approx(float(base.loss))


def test_gradient_raises_probability_of_positive_advantage_actions():
    logits = torch.zeros(2, requires_grad=True)
    log_p = torch.log_softmax(logits, -1)
    actions_lp = log_p[[0, 1]]
    adv = torch.tensor([1.0, -1.0])
    out = appo_loss(actions_lp, actions_lp.detach(), torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2),
                    adv, torch.ones(2, dtype=torch.bool), 0.2, 0.0, 0.0, normalize_adv=False)
    out.loss.backward()
    assert logits.grad[0] < 0 < logits.grad[1]  # descending the loss raises action 0's logit

