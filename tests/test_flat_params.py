"""fastrl.algo.flat_params: parameters and gradients as views of two flat tensors, and the Adam step,
the clip and the trainer over them against the same code over the parameters' own tensors."""

from __future__ import annotations

import copy

import pytest
import torch

from fastrl.algo.adam import Adam
from fastrl.algo.flat_params import FlatParams
from fastrl.algo.grad_clip import clip_grad_norm
from fastrl_ext import _optim
from test_appo_trainer import _trainer_and_batch

SHAPES = [(64, 17), (64,), (64, 64), (64,), (6, 64), (6,), (6,)]


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def _backward(params, step: int) -> None:
    """A loss whose gradient reaches every parameter, different at each step."""
    g = torch.Generator().manual_seed(100 + step)
    loss = sum((p * torch.randn(p.shape, generator=g)).sum() * (3.0 ** (step % 3)) for p in params)
    loss.backward()


def test_parameters_become_views_and_gradients_accumulate_in_the_flat_buffer():
    params = _params(0)
    before = [p.detach().clone() for p in params]
    flat = FlatParams(params)
    for p, b in zip(params, before):
        assert torch.equal(p, b) and p.is_leaf and p.requires_grad
    flat.data.add_(1.0)  # the parameters are the flat tensor
    assert all(torch.equal(p, b + 1.0) for p, b in zip(params, before))
    _backward(params, 0)
    assert flat.attached() and float(flat.grad.abs().sum()) > 0
    assert torch.equal(flat.grad, torch.cat([p.grad.reshape(-1) for p in params]))
    flat.zero_grad()
    assert all(float(p.grad.abs().sum()) == 0 for p in params)
    params[3].grad = None  # what torch.optim's zero_grad does
    assert not flat.attached()
    with pytest.raises(RuntimeError, match="detached"):
        flat.check()


def test_only_plain_views_are_flattened():
    assert FlatParams.supported(_params(0))
    conv = torch.nn.Parameter(torch.randn(8, 4, 3, 3).to(memory_format=torch.channels_last))
    assert not FlatParams.supported([conv]) and not FlatParams.supported([])
    assert not FlatParams.supported([torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3).double())])
    with pytest.raises(ValueError):
        FlatParams([conv])


@pytest.mark.parametrize("route", ["native", "fused kernel", "per-tensor"])
@pytest.mark.parametrize("clip_scale", [None, 0.37, torch.tensor(0.37)], ids=["no clip", "float", "tensor"])
def test_flat_adam_takes_the_same_steps_as_per_tensor_adam(route, clip_scale):
    """The flat update (fastrl_ext._optim's one pass, or torch's kernels over the flat tensors) against the
    per-parameter one; with a clip's scale (a float, as the trainer passes it, or a 0-dim tensor), against
    a list whose gradients were scaled beforehand."""
    flat_params, list_params = _params(0), _params(0)
    flat = FlatParams(flat_params)
    flat_opt = Adam(flat_params, lr=1e-2, flat=flat, native=route == "native")
    list_opt = Adam(list_params, lr=1e-2)
    if route == "native" and _optim is None:
        pytest.skip("fastrl_ext not built")
    if route == "per-tensor":
        flat_opt.fused = list_opt.fused = False
    elif not flat_opt.fused:
        pytest.skip("this torch has no fused CPU Adam kernel")
    for step in range(5):
        for opt, params in ((flat_opt, flat_params), (list_opt, list_params)):
            opt.zero_grad()
            _backward(params, step)
        if clip_scale is None:
            flat_opt.step()
        else:
            flat_opt.step(clip_scale)
            for p in list_params:
                p.grad.mul_(float(clip_scale))
        list_opt.step()
    for a, b, p0 in zip(flat_params, list_params, _params(0)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        assert float((a - p0).detach().abs().max()) > 1e-3
    # checkpoints keep torch.optim's per-parameter layout, whichever way the state was held
    state = flat_opt.state_dict()
    assert [float(s["step"]) for s in state["state"].values()] == [5.0] * len(SHAPES)
    if clip_scale is not None:
        return
    restored = Adam(_params(1), lr=1e-2)
    restored.load_state_dict(state)
    for a, b in zip(restored.exp_avg_sqs, list_opt.exp_avg_sqs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)
    back_params = _params(2)
    back = Adam(back_params, lr=1e-2, flat=FlatParams(back_params))
    back.load_state_dict(list_opt.state_dict())
    torch.testing.assert_close(back.flat_exp_avg, torch.cat([m.reshape(-1) for m in list_opt.exp_avgs]))
    assert float(back.flat_step) == 5.0
    back.zero_grad()
    _backward(back_params, 5)
    back.step()  # the native step counts on from the loaded count (its numpy view of the step tensor)
    assert float(back.flat_step) == 6.0


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0])
def test_clipping_the_flat_gradient_matches_clipping_the_list(scale):
    flat_params, list_params = _params(0), _params(0)
    flat = FlatParams(flat_params)
    for params in (flat_params, list_params):
        _backward(params, 1)
        for p in params:
            p.grad.mul_(scale)
    norm_flat = clip_grad_norm(flat_params, 0.5, flat.grad)
    norm_list = clip_grad_norm(list_params, 0.5)
    assert float(norm_flat) == pytest.approx(float(norm_list), rel=1e-6)
    for a, b in zip(flat_params, list_params):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-9)


def test_the_trainer_trains_the_same_with_and_without_the_flat_buffer():
    trainer, batch, _ = _trainer_and_batch(["algo.num_epochs=2", "algo.num_minibatches=2"])
    assert trainer.flat is not None and trainer.optimizer.flat is trainer.flat
    plain = copy.deepcopy(trainer)
    plain.flat = None
    plain.optimizer = Adam(plain.trained_params, lr=trainer.cfg.lr, eps=trainer.cfg.adam_eps)
    for t in (trainer, plain):
        torch.manual_seed(0)
        stats = t.train(copy.deepcopy(batch))
        assert stats["sgd_steps"] == 4
    for (name, a), b in zip(trainer.model.state_dict().items(), plain.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert trainer.flat.attached()
