"""The learner's second thread inside one minibatch's backward (system.learner_split=weight_grads).

A layer's backward is two products: the gradient with respect to its input, which the layer below
waits for, and the gradient with respect to its weight, which nothing waits for until the optimizer
step. Here the Nature CNN's conv and hidden layers hand their weight gradient to a second thread and
go on with the input gradient at once, so the two threads split the backward by layer work, each
product at the whole minibatch's rows. Row shards (fastrl.algo.shards) split it by samples instead,
and each half pays a CNN call's fixed cost (~4.5 CPU-ms) again. The first conv layer has no input
gradient to compute (its input is the frames), so its weight gradient runs in place.

The products are the ones autograd would run, on the same tensors, so the gradients are autograd's
bit for bit (tests/test_split_backward.py). Only the bf16 working copy's layers are wrapped
(fastrl.algo.bf16_copy), and `gradients` replaces its `torch.autograd.grad`.

Autograd runs only the nodes on a path to a requested input, and a wrapped layer's weight is not one
(the thread computes its gradient): every wrapped layer also takes `anchor`, a scalar whose gradient
is 0, and asking for the anchor's gradient runs them all.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fastrl.algo.shards import ran_here
from fastrl.models.actor_critic import NatureCNN
from fastrl.models.conv_relu import conv_layer_relu, conv_relu, relu_backward, relu_follows
from fastrl.models.conv_weight_grad import weight_and_bias_grad
from fastrl.models.linear import linear
from fastrl.models.space_to_depth import conv_weight_and_stride, parameter_grad


class WeightGradThread:
    """Weight gradients computed on a second thread (`submit`: one job to it, returning a Future)
    while the backward goes on; `gradients` collects them with autograd's."""

    def __init__(self, submit: Callable[[Callable], Future]):
        self._submit = submit
        self._pending: dict[int, tuple] = {}  # id(parameter) -> (future of its job's grads, index in them)
        self.anchor = torch.zeros((), requires_grad=True)

    def later(self, weight: nn.Parameter, bias: nn.Parameter | None, job: Callable[[], tuple]) -> None:
        """`job()` -> (weight's gradient, bias's gradient) runs on the thread."""
        self._record(weight, bias, self._submit(job))

    def now(self, weight: nn.Parameter, bias: nn.Parameter | None, job: Callable[[], tuple]) -> None:
        """`job()` runs in the calling thread (the first layer's, which has nothing else to do)."""
        self._record(weight, bias, ran_here(job))

    def _record(self, weight, bias, future: Future) -> None:
        self._pending[id(weight)] = (future, 0)
        if bias is not None:
            self._pending[id(bias)] = (future, 1)

    def gradients(self, loss: torch.Tensor, params: list) -> tuple:
        """d loss / d params, as `torch.autograd.grad(loss, params, allow_unused=True)` returns them.
        Every job has finished when this returns or raises."""
        try:
            grads = torch.autograd.grad(loss, [*params, self.anchor], allow_unused=True)[:-1]
        finally:
            pending, self._pending = self._pending, {}
            errors = [future.exception() for future, _ in pending.values()]  # waits for each
        for error in errors:
            if error is not None:
                raise error
        out = []
        for p, g in zip(params, grads):
            entry = pending.get(id(p))
            out.append(g if entry is None else entry[0].result()[entry[1]])
        return tuple(out)


class _ConvWeightGradLater(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anchor, weight, bias, conv: nn.Conv2d, thread: WeightGradThread, relu: bool,
                native_weight_grad: bool):
        weight, stride = conv_weight_and_stride(conv, weight)  # a space-to-depth conv's: cut into tiles
        ctx.conv, ctx.thread, ctx.stride, ctx.relu, ctx.native = conv, thread, stride, relu, native_weight_grad
        if not relu:
            ctx.save_for_backward(x, weight)
            return F.conv2d(x, weight, bias, stride, conv.padding, conv.dilation, conv.groups)
        # the ReLU after the conv in the same call (fastrl.models.conv_relu); its backward needs only the output
        out = conv_relu(x, weight, bias, stride, conv.padding, conv.dilation, conv.groups)
        ctx.save_for_backward(x, weight, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, *relu_out = ctx.saved_tensors
        conv, thread = ctx.conv, ctx.thread
        if ctx.relu:  # what autograd's ReLU node runs (threshold_backward), on the same tensors
            grad_out = relu_backward(grad_out, relu_out[0])
        layout = (list(ctx.stride), list(conv.padding), list(conv.dilation), False, [0, 0], conv.groups)

        stride, native = ctx.stride, ctx.native

        def weight_grad():  # fastrl_ext's AMX kernel where it applies (model.native_conv_grad), else torch's
            grad_w, grad_b = weight_and_bias_grad(grad_out, x, weight, conv.bias is not None, stride, conv.padding,
                                                  conv.dilation, conv.groups, native=native)
            return parameter_grad(conv, grad_w), grad_b

        grad_x = None
        if ctx.needs_input_grad[0]:
            thread.later(conv.weight, conv.bias, weight_grad)
            grad_x = torch.ops.aten.convolution_backward(
                grad_out, x, weight, None, *layout, [True, False, False])[0]
        else:  # the first layer: nothing else to do here meanwhile
            thread.now(conv.weight, conv.bias, weight_grad)
        return grad_x, torch.zeros(()), None, None, None, None, None, None


class _LinearWeightGradLater(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, anchor, weight, bias, layer: nn.Linear, thread: WeightGradThread):
        ctx.save_for_backward(x, weight)
        ctx.layer, ctx.thread = layer, thread
        return linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        layer, thread = ctx.layer, ctx.thread
        has_bias = layer.bias is not None
        thread.later(layer.weight, layer.bias,
                     lambda: (grad_out.t() @ x, grad_out.sum(0) if has_bias else None))
        grad_x = grad_out @ weight if ctx.needs_input_grad[0] else None
        return grad_x, torch.zeros(()), None, None, None, None


class WeightGradLater(nn.Module):
    """Wraps a conv or linear layer (keeping its parameters, in place in the module order) so that
    its backward hands the weight gradient to `thread`. Outside autograd it is the layer. A backward
    through it must come from `thread.gradients`: a plain `loss.backward()` would leave the weights'
    gradients with the thread and never in `.grad`. `relu` (a conv only): the wrapper also applies the
    ReLU that followed the layer, in the conv's own call (fastrl.models.conv_relu)."""

    def __init__(self, layer: nn.Module, thread: WeightGradThread, relu: bool = False, native_conv_grad: bool = True):
        super().__init__()
        self.native_conv_grad = native_conv_grad  # a conv's weight gradient by fastrl.models.conv_weight_grad
        self.layer = layer
        self._fn = _ConvWeightGradLater if isinstance(layer, nn.Conv2d) else _LinearWeightGradLater
        if relu and self._fn is not _ConvWeightGradLater:
            raise ValueError("only a conv layer takes its ReLU in")
        self.relu = relu
        self._thread = thread

    @property
    def weight(self) -> nn.Parameter:
        return self.layer.weight

    @property
    def bias(self) -> nn.Parameter | None:
        return self.layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        if not torch.is_grad_enabled():
            return conv_layer_relu(layer, x) if self.relu else layer(x)
        bias = None if layer.bias is None else layer.bias.detach()
        if self._fn is _ConvWeightGradLater:
            return self._fn.apply(x, self._thread.anchor, layer.weight.detach(), bias, layer, self._thread, self.relu,
                                  self.native_conv_grad)
        return self._fn.apply(x, self._thread.anchor, layer.weight.detach(), bias, layer, self._thread)


def wrap_cnn_layers(model: nn.Module, thread: WeightGradThread) -> int:
    """Every Nature CNN in `model` gets its conv and hidden layers wrapped; returns how many. A conv followed
    by a ReLU takes the ReLU in (the ReLU's place becomes an identity): one call instead of two, one pass
    over the conv's output fewer (264 µs of a Pong minibatch's forward at batch 64, AMX Xeon)."""
    wrapped = 0
    for encoder in [m for m in model.modules() if isinstance(m, NatureCNN)]:
        for seq in (encoder.convs, encoder.fc):
            for i, layer in enumerate(seq):
                if isinstance(layer, (nn.Conv2d, nn.Linear)):
                    relu = relu_follows(seq, i)
                    seq[i] = WeightGradLater(layer, thread, relu, encoder.native_conv_grad)
                    if relu:
                        seq[i + 1] = nn.Identity()
                    wrapped += 1
    return wrapped
