"""fastrl.models.activations.tanh against torch.tanh: values and gradients, on both sides of
the sizes where it switches to numpy, and the cases it must leave to torch."""

import numpy as np
import pytest
import torch

from fastrl.models.activations import MIN_NUMEL_GRAD, MIN_NUMEL_NO_GRAD, Tanh, _NumpyTanh, tanh

SIZES = [(1, 7), (16, 64), (MIN_NUMEL_NO_GRAD // 64, 64), (MIN_NUMEL_GRAD // 64, 64), (528, 64), (33, 16, 64)]


@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_match_torch(shape, dtype):
    x = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(0)) * 4
    y = tanh(x)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, torch.tanh(x), atol=1e-6 if dtype == torch.float32 else 1e-12, rtol=0)


@pytest.mark.parametrize("shape", SIZES)
def test_gradients_match_torch(shape):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(*shape, generator=gen) * 3).requires_grad_()
    upstream = torch.randn(*shape, generator=gen)
    (tanh(x) * upstream).sum().backward()
    ours = x.grad.clone()
    x.grad = None
    (torch.tanh(x) * upstream).sum().backward()
    torch.testing.assert_close(ours, x.grad, atol=1e-6, rtol=1e-5)


def test_numpy_function_passes_gradcheck():
    # the Function itself, at a size the numerical Jacobian can afford (tanh() calls it only above MIN_NUMEL_GRAD)
    x = torch.randn(3, 17, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 2
    assert torch.autograd.gradcheck(_NumpyTanh.apply, (x.requires_grad_(),))


def test_large_inputs_take_the_numpy_path(monkeypatch):
    calls = []
    real = np.tanh
    monkeypatch.setattr(np, "tanh", lambda a: calls.append(a.shape) or real(a))
    tanh(torch.randn(MIN_NUMEL_NO_GRAD))
    tanh(torch.randn(MIN_NUMEL_GRAD, requires_grad=True))
    tanh(torch.randn(MIN_NUMEL_NO_GRAD - 1))          # small: torch
    tanh(torch.randn(MIN_NUMEL_GRAD - 1, requires_grad=True))
    tanh(torch.randn(MIN_NUMEL_GRAD).to(torch.bfloat16))  # not a float32/float64 CPU tensor: torch
    assert calls == [(MIN_NUMEL_NO_GRAD,), (MIN_NUMEL_GRAD,)]


def test_under_inference_mode_and_bf16_autocast():
    x = torch.randn(528, 64)
    with torch.inference_mode():
        torch.testing.assert_close(tanh(x), torch.tanh(x), atol=1e-6, rtol=0)
    linear = torch.nn.Linear(64, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = linear(x)
        assert h.dtype == torch.bfloat16
        torch.testing.assert_close(Tanh()(h), torch.tanh(h))


def test_module_has_no_state():
    assert Tanh().state_dict() == {}
