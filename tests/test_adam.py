"""fastrl.algo.adam against Adam as the paper writes it and against torch.optim.Adam."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from fastrl.algo.adam import Adam
from helpers import ROOT

SHAPES = [(7, 5), (5,), (3, 2, 4)]


def _params(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in SHAPES]


def _grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(s, generator=g) * (10.0 ** (step % 3 - 1)) for s in SHAPES]


def _paper_adam(theta: list[torch.Tensor], grads_per_step, lrs, b1=0.9, b2=0.999, eps=1e-6):
    """Algorithm 1 of Kingma & Ba (2015), one float64 scalar at a time."""
    theta = [t.detach().double().clone() for t in theta]
    m = [torch.zeros_like(t) for t in theta]
    v = [torch.zeros_like(t) for t in theta]
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        for k, g in enumerate(grads):
            g = g.double()
            flat_theta, flat_m, flat_v, flat_g = theta[k].view(-1), m[k].view(-1), v[k].view(-1), g.reshape(-1)
            for j in range(flat_theta.numel()):
                flat_m[j] = b1 * flat_m[j] + (1 - b1) * flat_g[j]
                flat_v[j] = b2 * flat_v[j] + (1 - b2) * flat_g[j] ** 2
                m_hat = flat_m[j] / (1 - b1 ** t)
                v_hat = flat_v[j] / (1 - b2 ** t)
                flat_theta[j] -= lr * m_hat / (math.sqrt(v_hat) + eps)
    return theta


def _run(opt, params, steps, lrs):
    for t in range(steps):
        opt.param_groups[0]["lr"] = lrs[t]
        opt.zero_grad(set_to_none=True)
        for p, g in zip(params, _grads(t)):
            p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("kernel", ["native", "fused", "per-tensor"])
def test_matches_the_paper_and_torch_optim(kernel):
    steps, lrs = 6, [1e-2, 1e-2, 5e-3, 5e-3, 1e-3, 0.0]
    ours = _params(0)
    opt = Adam(ours, lr=lrs[0], eps=1e-6, native=kernel == "native")
    if kernel == "per-tensor":
        opt.fused = False
    elif kernel == "fused" and not opt.fused:
        pytest.skip("this torch has no fused CPU Adam kernel")
    if kernel == "native":  # fastrl_ext._optim, a call per tensor
        opt._torch_step = lambda grad_mul: pytest.fail("the native step fell back to torch")
    _run(opt, ours, steps, lrs)

    paper = _paper_adam(_params(0), [_grads(t) for t in range(steps)], lrs)
    theirs = _params(0)
    _run(torch.optim.Adam(theirs, lr=lrs[0], eps=1e-6, foreach=False), theirs, steps, lrs)
    start = _params(0)
    for a, b, c, p0 in zip(ours, paper, theirs, start):
        assert torch.allclose(a.double(), b, atol=1e-6, rtol=1e-5)
        assert torch.allclose(a, c, atol=1e-7, rtol=1e-6)
        assert (a - p0).abs().max() > 1e-3  # it did move


def test_state_dict_round_trips_with_torch_optim_both_ways():
    lrs = [1e-2] * 8
    # ours for 4 steps -> torch.optim for 4, against ours for all 8
    whole = _params(1)
    _run(Adam(whole, lr=1e-2), whole, 8, lrs)

    first = _params(1)
    ours = Adam(first, lr=1e-2)
    _run(ours, first, 4, lrs)
    torch_opt = torch.optim.Adam(first, lr=1e-2)
    torch_opt.load_state_dict(ours.state_dict())

    def run_from(opt, params, start):
        for t in range(start, 8):
            opt.zero_grad(set_to_none=True)
            for p, g in zip(params, _grads(t)):
                p.grad = g.clone()
            opt.step()

    run_from(torch_opt, first, 4)
    for a, b in zip(first, whole):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-6)

    # and back: torch.optim's state into ours
    second = _params(1)
    torch_opt = torch.optim.Adam(second, lr=1e-2)
    _run(torch_opt, second, 4, lrs)
    ours = Adam(second, lr=1e-2)
    ours.load_state_dict(torch_opt.state_dict())
    run_from(ours, second, 4)
    for a, b in zip(second, whole):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-6)


def test_a_state_for_another_model_is_refused():
    opt = Adam(_params(0), lr=1e-3)
    other = [torch.randn(7, 6).requires_grad_(), torch.randn(5).requires_grad_(), torch.randn(3, 2, 4).requires_grad_()]
    other_opt = Adam(other, lr=1e-3)
    for p in other:
        p.grad = torch.ones_like(p)
    other_opt.step()
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(other_opt.state_dict())
    with pytest.raises(ValueError, match="parameters"):
        Adam(other[:2], lr=1e-3).load_state_dict(other_opt.state_dict())


def test_training_never_imports_torch_dynamo():
    """The reason this module exists: torch.optim imports torch._dynamo (~1.7 CPU-s) on first use."""
    code = (
        "import json, sys\n"
        "sys.path.insert(0, 'tests')  # as pytest's rootdir import does: test modules import helpers\n"
        "from test_appo_trainer import _trainer_and_batch\n"
        "trainer, batch, cfg = _trainer_and_batch(['algo.num_epochs=2', 'algo.num_minibatches=2'])\n"
        "stats = trainer.train(batch)\n"
        "print(json.dumps({'dynamo': 'torch._dynamo' in sys.modules, 'version': trainer.policy_version}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["version"] == 4 and not got["dynamo"]
