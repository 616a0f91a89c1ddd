"""An fp32 MLP actor and critic forward and backward through fastrl_ext (model.native_mlp).

The MLP presets' learner is bound by dispatch, not arithmetic: HalfCheetah's optimizer step on 256
samples spent 356 µs in the network's forward and 544 in the backward (bench/profile_learner.py),
where its ~8M multiply-adds take ~250 µs at torch's own matmul rate. Per layer torch runs a matmul,
a bias, a tanh (fastrl.models.activations' Python autograd Function, ~50 µs with its backward) and
their backward nodes. Here the actor and the critic (encoder and head each) are one autograd node
whose forward and backward are one C++ call per network (fastrl_ext/src/mlp.cpp), with the layers'
arrays made once and their outputs and gradients in one buffer per network. torch's layers are the
reference (tests/test_native_mlp.py holds outputs and gradients to them at float rounding).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from fastrl.models.activations import Tanh
from fastrl_ext import _mlp as _native

ACTIVATIONS = {"tanh": 0, "relu": 1}


def pays() -> bool:
    """Whether the networks should take these layers by default: where the extension is built with
    vectors wider than SSE2's. Its AVX-512 and AVX2 variants run the presets' actor and critic forward +
    backward in ~0.67x torch's time, the plain x86-64 one in ~1.2x (torch brings its own AVX2 kernels;
    bench/mlp_microbench.py with FASTRL_ACTING_ISA=default)."""
    return _native is not None and _native.ISA != "default"


def mlp_layers(encoder: nn.Module, head: nn.Linear) -> tuple[int, list[nn.Linear]] | None:
    """(activation code, the Linear layers in order) when `encoder` is an MLP encoder of
    fastrl.models.actor_critic (Linear, activation, Linear, activation, ...) and `head` follows it;
    None for anything else (a CNN, a shared encoder's trunk)."""
    if not isinstance(encoder, nn.Sequential) or len(encoder) % 2 or type(head) is not nn.Linear:
        return None
    linears, act = [], None
    for linear, activation in zip(encoder[0::2], encoder[1::2]):
        kind = "relu" if isinstance(activation, nn.ReLU) else "tanh" if isinstance(activation, Tanh) else None
        if type(linear) is not nn.Linear or kind is None or act not in (None, ACTIVATIONS[kind]):
            return None
        act = ACTIVATIONS[kind]
        linears.append(linear)
    return (ACTIVATIONS["tanh"] if act is None else act), [*linears, head]


class NativeNets:
    """MLPs (each: an activation code and its Linear layers) that run on one input through one autograd node.

    The parameters' numpy views are made once and again only when a parameter's memory moves
    (fastrl.algo.flat_params re-seats them, `.to()` may): making them per call cost ~3 µs each."""

    def __init__(self, nets: list[tuple[int, list[nn.Linear]]]):
        self.acts = [act for act, _ in nets]
        self.params = [[p for layer in layers for p in (layer.weight, layer.bias)] for _, layers in nets]
        # the same Parameter objects whatever memory they are re-seated in, so listed once
        self.all_params = [p for params in self.params for p in params]
        self.widths = [[layers[0].in_features, *(layer.out_features for layer in layers)] for _, layers in nets]
        self._key: tuple | None = None
        self._arrays: list[tuple] = []

    def _arrays_for(self, x: torch.Tensor) -> list[tuple] | None:
        """The parameters' arrays where fastrl_ext can run the nets on `x`: float32 [rows, features] on
        the CPU, outside bf16 autocast, with float32 contiguous CPU parameters; else None."""
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or torch.is_autocast_enabled("cpu"):
            return None
        return self.param_arrays()

    def param_arrays(self) -> list[tuple] | None:
        """Per net, its (W_1, b_1, ...) as numpy views; None where a parameter is not float32, contiguous, on the CPU."""
        key = tuple(map(torch.Tensor.data_ptr, self.all_params))  # every step: ~2 µs faster than a generator
        if key != self._key:
            if not all(p.dtype == torch.float32 and p.device.type == "cpu" and p.is_contiguous() for p in self.all_params):
                return None
            self._arrays = [tuple(p.detach().numpy() for p in params) for params in self.params]
            self._key = key
        return self._arrays

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """Each net's output on `x` ([rows, its last width]), all through one autograd node; None where
        the nets cannot run on `x` natively (another dtype or device, bf16 autocast: torch's layers then)."""
        arrays = self._arrays_for(x)
        return None if arrays is None else _Nets.apply(x.contiguous(), self, arrays, *self.all_params)


def split_views(buffer: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Consecutive C-contiguous views of `buffer` with these shapes."""
    views, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        views.append(buffer[at:at + n].reshape(shape))
        at += n
    return views


class _Nets(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, nets: NativeNets, param_arrays: list[tuple],
                *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`param_arrays`: `params` as `nets.param_arrays()` gives them (numpy views of the same memory);
        `params` are passed too so that autograd knows them."""
        rows = x.shape[0]
        x_array = x.detach().numpy()
        outputs, activations = [], []
        for act, arrays, widths in zip(nets.acts, param_arrays, nets.widths):
            buffer = torch.empty(rows * sum(widths[1:]))
            hs = split_views(buffer.numpy(), [(rows, w) for w in widths[1:]])
            _native.forward(x_array, arrays, tuple(hs), act)
            activations.append(tuple(hs))
            outputs.append(torch.from_numpy(hs[-1]))  # shares the buffer
        ctx.acts, ctx.param_arrays, ctx.x_array, ctx.activations = nets.acts, param_arrays, x_array, activations
        ctx.set_materialize_grads(False)  # an output that did not reach the loss: None, its net skipped
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *output_grads: torch.Tensor | None) -> tuple:
        grad_x = torch.zeros(ctx.x_array.shape) if ctx.needs_input_grad[0] else None
        param_grads: list[torch.Tensor | None] = []
        for k, (act, arrays, grad) in enumerate(zip(ctx.acts, ctx.param_arrays, output_grads)):
            if grad is None:  # this net's output did not reach the loss
                param_grads += [None] * len(arrays)
                continue
            buffer = torch.empty(sum(a.size for a in arrays))
            grads = split_views(buffer.numpy(), [a.shape for a in arrays])
            net_grad_x = None if grad_x is None else np.empty_like(ctx.x_array)
            _native.backward(grad.float().contiguous().numpy(), ctx.x_array, arrays, ctx.activations[k],
                             tuple(grads), act, net_grad_x)
            if grad_x is not None:
                grad_x += torch.from_numpy(net_grad_x)
            param_grads += [torch.from_numpy(g) for g in grads]
        return (grad_x, None, None, *param_grads)
