"""fastrl.models.activations.tanh against torch.tanh: values and gradients, on both sides of
the sizes where it switches to fastrl_ext (float32) or numpy (float64), every compiled variant of
fastrl_ext's kernel, and the cases it must leave to torch. And fastrl_ext's ReLU gradient
(`_activations.relu_backward`, fastrl.models.conv_relu's) against torch's threshold_backward."""

import numpy as np
import pytest
import torch

import fastrl.models.activations as activations
from fastrl.models.activations import MIN_NUMEL_GRAD, MIN_NUMEL_NO_GRAD, Tanh, _Tanh, tanh
from fastrl.workers.process import flush_denormals

needs_native = pytest.mark.skipif(activations._native is None, reason="fastrl_ext not built")

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
    assert torch.autograd.gradcheck(_Tanh.apply, (x.requires_grad_(), False))


class _Recording:
    """Stands in for fastrl_ext._activations and notes which kernel ran on what."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def tanh(self, x, out):
        self.calls.append(("tanh", x.shape))
        return self.real.tanh(x, out)

    def tanh_backward(self, grad, y, out):
        self.calls.append(("tanh_backward", grad.shape))
        return self.real.tanh_backward(grad, y, out)


def test_large_inputs_take_the_native_path_in_float32_and_numpy_in_float64(monkeypatch):
    numpy_calls = []
    real = np.tanh
    monkeypatch.setattr(np, "tanh", lambda a: numpy_calls.append((a.dtype, a.shape)) or real(a))
    if activations._native is not None:
        native = _Recording(activations._native)
        monkeypatch.setattr(activations, "_native", native)
        tanh(torch.randn(MIN_NUMEL_NO_GRAD))
        x = torch.randn(MIN_NUMEL_GRAD, requires_grad=True)
        tanh(x).sum().backward()
        tanh(torch.randn(MIN_NUMEL_NO_GRAD - 1))          # small: torch
        tanh(torch.randn(MIN_NUMEL_GRAD - 1, requires_grad=True))
        tanh(torch.randn(MIN_NUMEL_GRAD).to(torch.bfloat16))  # not a float32/float64 CPU tensor: torch
        assert native.calls == [("tanh", (MIN_NUMEL_NO_GRAD,)), ("tanh", (MIN_NUMEL_GRAD,)),
                                ("tanh_backward", (MIN_NUMEL_GRAD,))]
        assert numpy_calls == []
    tanh(torch.randn(MIN_NUMEL_NO_GRAD, dtype=torch.float64))
    tanh(torch.randn(MIN_NUMEL_GRAD, dtype=torch.float64, requires_grad=True))
    monkeypatch.setattr(activations, "_native", None)  # fastrl_ext not built: float32 goes to numpy
    tanh(torch.randn(MIN_NUMEL_NO_GRAD))
    assert numpy_calls == [(np.float64, (MIN_NUMEL_NO_GRAD,)), (np.float64, (MIN_NUMEL_GRAD,)),
                           (np.float32, (MIN_NUMEL_NO_GRAD,))]


@needs_native
def test_native_function_matches_torch_on_strided_and_in_place_inputs():
    base = torch.randn(40, 130, generator=torch.Generator().manual_seed(3)) * 5
    x = base[:, ::2].requires_grad_()  # not contiguous
    upstream = torch.randn(40, 65).t().contiguous().t()  # nor is the gradient coming back
    (_Tanh.apply(x, True) * upstream).sum().backward()
    ours = x.grad.clone()
    x.grad = None
    (torch.tanh(x) * upstream).sum().backward()
    torch.testing.assert_close(ours, x.grad, atol=1e-6, rtol=1e-5)
    buf = base.contiguous().numpy().copy()
    activations._native.tanh(buf, buf)  # out may be the input
    torch.testing.assert_close(torch.from_numpy(buf), torch.tanh(base), atol=1e-6, rtol=0)


@needs_native
def test_native_kernels_reject_what_they_cannot_read():
    native = activations._native
    with pytest.raises(TypeError, match="x must be float32"):
        native.tanh(np.zeros(4), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="out has 3 items, x has 4"):
        native.tanh(np.zeros(4, np.float32), np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="C-contiguous"):
        native.tanh_backward(np.zeros((4, 4), np.float32)[:, ::2], np.zeros(8, np.float32), np.zeros(8, np.float32))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        native.tanh_backward(np.zeros(4, np.float32), np.zeros(4, np.float32))


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


# every value class a ReLU's gradient must tell apart: zeros of both signs, normals, denormals (for bf16 and
# float32 alike), infinities and NaNs of both signs; threshold_backward passes the gradient where y > 0 or y is NaN
RELU_SPECIALS = [0.0, -0.0, 1.0, -1.0, 3e-39, -3e-39, 1e-44, -1e-44, float("inf"), -float("inf"),
                 float("nan"), -float("nan"), 1e38, -1e38]


@needs_native
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [1, 17, 63, 4099])  # the vector loops' tails
@pytest.mark.parametrize("flush", [False, True])
def test_relu_backward_kernel_bits_match_torch(dtype, n, flush):
    # under flush_denormals (DAZ, every learner's setting) torch's compare reads a denormal y as 0: no gradient
    gen = torch.Generator().manual_seed(n)
    specials = torch.tensor(RELU_SPECIALS)

    def values() -> torch.Tensor:
        return torch.where(torch.rand(n, generator=gen) < 0.5, torch.randn(n, generator=gen) * 10,
                           specials[torch.randint(len(RELU_SPECIALS), (n,), generator=gen)]).to(dtype)

    y, grad = values(), values()
    native_view = torch.int16 if dtype == torch.bfloat16 else torch.float32  # what the kernel reads
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32  # compared, so that -0.0, denormals and NaNs count
    was = flush_denormals(flush)
    try:
        expected = torch.ops.aten.threshold_backward(grad, y, 0)
        out = torch.empty_like(grad)
        activations._native.relu_backward(*(t.view(native_view).numpy() for t in (grad, y, out)))
        assert torch.equal(out.view(bits), expected.view(bits))
        activations._native.relu_backward(*(t.view(native_view).numpy() for t in (grad, y, grad)))
        assert torch.equal(grad.view(bits), expected.view(bits))  # out may be the gradient itself
    finally:
        flush_denormals(was)


@needs_native
def test_relu_backward_kernel_rejects_what_it_cannot_read():
    native, h, f = activations._native, np.int16, np.float32
    with pytest.raises(TypeError, match="y must be int16 .bf16 bits. or float32"):
        native.relu_backward(np.zeros(4, f), np.zeros(4), np.zeros(4, f))
    with pytest.raises(ValueError, match="out must have grad's dtype and element count"):
        native.relu_backward(np.zeros(4, h), np.zeros(4, h), np.zeros(4, f))
    with pytest.raises(ValueError, match="y must have grad's dtype and element count"):
        native.relu_backward(np.zeros(4, h), np.zeros(3, h), np.zeros(4, h))
    with pytest.raises(TypeError, match="y must be a C-contiguous buffer"):
        native.relu_backward(np.zeros(4, f), np.zeros(8, f)[::2], np.zeros(4, f))
    frozen = np.zeros(4, f)
    frozen.setflags(write=False)
    with pytest.raises(TypeError, match="out must be a C-contiguous writable buffer"):
        native.relu_backward(np.zeros(4, f), np.zeros(4, f), frozen)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        native.relu_backward(np.zeros(4, f), np.zeros(4, f))
