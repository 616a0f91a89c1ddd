"""fastrl.models.linear: the weight-left product is the same layer, forward and backward, and it is
taken exactly where `weight_left_pays` says."""

import pytest
import torch
from torch import nn

from fastrl.models.linear import WeightLeftLinear, bf16_linear_in_fp32, weight_left_pays


def layer_and_twin(dtype: torch.dtype, in_dim: int = 96, out_dim: int = 40):
    torch.manual_seed(0)
    layer = WeightLeftLinear(in_dim, out_dim).to(dtype)
    twin = nn.Linear(in_dim, out_dim).to(dtype)
    twin.load_state_dict(layer.state_dict())
    return layer, twin


def test_the_rule_takes_whole_blocks_of_16_rows_in_bf16_only():
    assert [r for r in range(0, 129) if weight_left_pays(r, torch.bfloat16)] == [16, 32, 48, 64]
    assert not any(weight_left_pays(r, torch.float32) for r in (16, 32, 64))


@pytest.mark.parametrize("rows", [16, 32, 64])
def test_bf16_weight_left_matches_f_linear_forward_and_backward(rows):
    layer, twin = layer_and_twin(torch.bfloat16)
    x = torch.randn(rows, 96).bfloat16()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = layer(x1), twin(x2)
    assert not y1.is_contiguous() and y1.t().is_contiguous(), "the weight-left product was not taken"
    assert y1.dtype == y2.dtype == torch.bfloat16
    torch.testing.assert_close(y1, y2, rtol=1.6e-2, atol=1e-2)
    g = torch.randn(rows, 40).bfloat16()
    (y1 * g).sum().backward()
    (y2 * g).sum().backward()
    for a, b in ((x1.grad, x2.grad), (layer.weight.grad, twin.weight.grad), (layer.bias.grad, twin.bias.grad)):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_under_autocast_fp32_weights_get_fp32_gradients_from_the_weight_left_product():
    layer, twin = layer_and_twin(torch.float32)
    x = torch.randn(32, 96)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y1, y2 = layer(x), twin(x)
    assert not y1.is_contiguous() and y1.dtype == y2.dtype == torch.bfloat16
    torch.testing.assert_close(y1, y2, rtol=1.6e-2, atol=1e-2)
    y1.float().square().sum().backward()
    y2.float().square().sum().backward()
    assert layer.weight.grad.dtype == torch.float32
    torch.testing.assert_close(layer.weight.grad, twin.weight.grad, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(layer.bias.grad, twin.bias.grad, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dtype,rows", [(torch.float32, 32), (torch.bfloat16, 17), (torch.bfloat16, 128)])
def test_elsewhere_it_is_f_linear_bit_for_bit(dtype, rows):
    layer, twin = layer_and_twin(dtype)
    x = torch.randn(rows, 96).to(dtype)
    y = layer(x)
    assert y.is_contiguous()
    assert torch.equal(y, twin(x))


def test_a_weight_left_layer_loads_an_nn_linear_state_dict_and_back():
    layer, twin = layer_and_twin(torch.float32)
    assert layer.state_dict().keys() == twin.state_dict().keys()
    other = nn.Linear(96, 40)
    other.load_state_dict(layer.state_dict())
    assert torch.equal(other.weight, layer.weight)


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of the last place of bf16 at the larger of the two magnitudes."""
    a, b = a.float(), b.float()
    scale = torch.maximum(a.abs(), b.abs()).clamp_min(torch.finfo(torch.bfloat16).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(scale)) - 7)
    return (a - b).abs() / ulp


@pytest.mark.parametrize("rows,weights_dtype", [(1, torch.bfloat16), (16, torch.bfloat16), (64, torch.bfloat16),
                                                (32, torch.float32)])
def test_bf16_linear_in_fp32_is_autocasts_bf16_linear_forward_and_backward(rows, weights_dtype):
    """The heads' fp32 product of bf16 values, rounded to bf16, against autocast's own bf16 call: the same
    outputs and gradients but for the order of the fp32 sums (at most one bf16 place, and rarely), each
    gradient in its leaf's dtype."""
    torch.manual_seed(rows)
    w = (torch.randn(7, 512) * 0.05).to(weights_dtype).requires_grad_()
    b = (torch.randn(7) * 0.1).to(weights_dtype).requires_grad_()
    x = torch.randn(rows, 512).bfloat16().requires_grad_()
    g = torch.randn(rows, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.nn.functional.linear(x, w, b)
    want_grads = torch.autograd.grad((want.float() * g).sum(), (x, w, b))
    got = bf16_linear_in_fp32(x, w, b)
    got_grads = torch.autograd.grad((got.float() * g).sum(), (x, w, b))
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    for a, e in ((got, want), *zip(got_grads, want_grads)):
        assert a.dtype == e.dtype
        ulps = bf16_ulps(a, e)
        assert ulps.max() <= 1.0 and (ulps > 0).float().mean() < 0.02


def test_bf16_linear_in_fp32_rounds_an_fp32_input_as_autocast_does():
    """An fp32 value that bf16 cannot hold is rounded before the product, not multiplied in full."""
    x = torch.tensor([[1.0 + 2.0 ** -10]])  # rounds to 1.0 in bf16; unrounded, x - 1 would be 2^-10
    w, b = torch.ones(1, 1), -torch.ones(1)
    assert bf16_linear_in_fp32(x, w, b).item() == 0.0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.functional.linear(x, w, b).item() == 0.0
