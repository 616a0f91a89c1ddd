"""The APPO loss against an element-by-element reference of design.md §3's formulas.

Every test runs on both implementations: the C++ loss (fastrl_ext._appo_loss, which writes its own
gradient) and the torch reference (whose gradient is autograd's). The native one's gradients are
also checked against autograd through the reference, across the clip range's edges and ties.
"""

import math

import pytest
import torch

import fastrl.algo.appo_loss as loss_module


@pytest.fixture(params=["native", "torch"])
def appo_loss(request, monkeypatch):
    """The loss under test; the native one may not quietly fall back to torch."""
    if request.param == "torch":
        return lambda *args, **kw: loss_module.appo_loss(*args, **kw, native=False)

    def torch_forbidden(*args, **kw):
        raise AssertionError("the native APPO loss fell back to torch")
    monkeypatch.setattr(loss_module, "appo_loss_torch", torch_forbidden)
    return loss_module.appo_loss


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
def test_loss_matches_reference(appo_loss, vclip, norm):
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


def test_invalid_samples_have_no_effect(appo_loss):
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


def test_gradient_raises_probability_of_positive_advantage_actions(appo_loss):
    logits = torch.zeros(2, requires_grad=True)
    log_p = torch.log_softmax(logits, -1)
    actions_lp = log_p[[0, 1]]
    adv = torch.tensor([1.0, -1.0])
    out = appo_loss(actions_lp, actions_lp.detach(), torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2),
                    adv, torch.ones(2, dtype=torch.bool), 0.2, 0.0, 0.0, normalize_adv=False)
    out.loss.backward()
    assert logits.grad[0] < 0 < logits.grad[1]  # descending the loss raises action 0's logit



def _random_inputs(shape, dtype, seed, ties=False):
    gen = torch.Generator().manual_seed(seed)

    def t(scale=1.0):
        return torch.randn(shape, generator=gen, dtype=dtype) * scale
    new_lp, ent, v = t(), t().abs(), t()
    old_lp = new_lp.detach() + t(0.3)
    old_v = v + t(0.5)
    if ties:
        # ratios exactly at 1 +- clip (the closed ends of clamp), and value moves exactly at +-value_clip
        flat_new, flat_old = new_lp.view(-1), old_lp.view(-1)
        flat_old[:8] = flat_new[:8] - math.log(1.2)
        flat_old[8:16] = flat_new[8:16] - math.log(0.8)
        flat_old_v = old_v.view(-1)
        flat_old_v[16:24] = v.view(-1)[16:24] - 0.2
    valid = torch.rand(shape, generator=gen) > 0.2
    return [new_lp.requires_grad_(), old_lp, ent.requires_grad_(), v.requires_grad_(), old_v, t(), t(2.0), valid]


def _loss_and_grads(args, native, **kw):
    for x in (args[0], args[2], args[3]):
        x.grad = None
    out = loss_module.appo_loss(*args, 0.2, 0.5, 0.01, native=native, **kw)
    (out.loss * 3.0).backward()  # an upstream gradient other than 1
    return out, [args[i].grad.clone() for i in (0, 2, 3)]


# Ties only in float64: a float32 ratio built to sit on 1 +- clip lands 1 ulp either side of it
# depending on the exp implementation (torch's vectorised one vs libm's), and so does its gradient.
@pytest.mark.parametrize("dtype,ties", [(torch.float64, False), (torch.float32, False), (torch.float64, True)])
@pytest.mark.parametrize("shape", [(257,), (32, 9)])
@pytest.mark.parametrize("value_clip", [None, 0.2])
@pytest.mark.parametrize("normalize_adv", [True, False])
def test_native_loss_and_gradient_match_the_torch_reference(dtype, shape, value_clip, normalize_adv, ties):
    """What the C++ pass returns and the gradient it writes equal autograd through the torch
    version: time-major [T, B] minibatches as well as flat ones, float32 as well as float64, and
    samples sitting exactly on the ends of both clip ranges (where clamp's closed interval and the
    even split of min/max on a tie decide the gradient)."""
    args = _random_inputs(shape, dtype, seed=hash((shape, ties)) % 1000, ties=ties)
    kw = dict(value_clip=value_clip, normalize_adv=normalize_adv)
    want, want_grads = _loss_and_grads(args, native=False, **kw)
    got, got_grads = _loss_and_grads(args, native=True, **kw)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    for name, a, b in zip(want._fields, want, got):
        assert float(b.detach()) == pytest.approx(float(a.detach()), rel=tol["rtol"], abs=tol["atol"]), name
    for name, a, b in zip(("new_log_probs", "entropy", "new_values"), want_grads, got_grads):
        assert b.shape == a.shape and b.dtype == dtype
        torch.testing.assert_close(b, a, **tol, msg=name)


def test_native_loss_matches_the_reference_formulas_at_float32():
    gen = torch.Generator().manual_seed(7)
    n = 300
    args = [torch.randn(n, generator=gen) for _ in range(7)]
    args[1] = args[0] + 0.3 * torch.randn(n, generator=gen)
    args[2] = args[2].abs()
    valid = torch.rand(n, generator=gen) > 0.3
    out = loss_module.appo_loss(*args, valid, 0.1, 0.5, 0.01, 0.2, True, native=True)
    want = reference_loss(*args, valid, 0.1, 0.5, 0.01, 0.2, True)
    assert float(out.loss) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_native_loss_ignores_non_finite_invalid_samples_and_propagates_valid_ones():
    args = _random_inputs((64,), torch.float64, seed=5)
    valid = args[7]
    poisoned = [a.detach().clone() for a in args[:7]]
    for a in poisoned:
        a[~valid] = float("nan")
    base = loss_module.appo_loss(*[a.detach() for a in args[:7]], valid, 0.2, 0.5, 0.01, native=True)
    assert float(loss_module.appo_loss(*poisoned, valid, 0.2, 0.5, 0.01, native=True).loss) == pytest.approx(
        float(base.loss))
    poisoned[0][valid.nonzero()[0]] = float("nan")  # a non-finite valid sample must not be hidden
    assert math.isnan(float(loss_module.appo_loss(*poisoned, valid, 0.2, 0.5, 0.01, native=True).loss))


def test_inputs_the_native_loss_cannot_take_go_to_torch():
    """A data tensor that wants a gradient (the C++ pass gives none) or mixed dtypes: the torch
    version, so no gradient is silently dropped."""
    calls = []
    real = loss_module.appo_loss_torch

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)
    args = _random_inputs((16,), torch.float32, seed=2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loss_module, "appo_loss_torch", spy)
        loss_module.appo_loss(*args, 0.2, 0.5, 0.01)
        assert calls == []
        wants_grad = list(args)
        wants_grad[6] = args[6].clone().requires_grad_()  # advantages
        loss_module.appo_loss(*wants_grad, 0.2, 0.5, 0.01)
        mixed = list(args)
        mixed[5] = args[5].double()
        loss_module.appo_loss(*mixed, 0.2, 0.5, 0.01)
    assert len(calls) == 2


def test_native_loss_rejects_mismatched_sizes_instead_of_broadcasting():
    args = _random_inputs((16,), torch.float32, seed=3)
    args[5] = args[5][:1]  # torch would broadcast one value target over the minibatch
    with pytest.raises(ValueError, match="value_targets has 1 elements"):
        loss_module.appo_loss(*args, 0.2, 0.5, 0.01, native=True)
