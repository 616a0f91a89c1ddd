"""fastrl.models.linear: the weight-left product is the same layer, forward and backward, and it is
taken exactly where `weight_left_pays` says."""

import pytest
import torch
from torch import nn

from fastrl.models.linear import WeightLeftLinear, weight_left_pays


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
