"""An acting forward of a Nature CNN network with its weights pre-packed for oneDNN.

On the CPU, torch's eager conv and linear calls hand oneDNN a plain weight tensor every time, and
oneDNN reorders it into the blocked layout its kernels read, then runs ReLU as a separate op. An
inference worker runs the same weights for many calls, so this packs each conv and the 512-unit
layer's weight once per weights version (`repack`), and calls oneDNN's pointwise-fused kernels
(`torch.ops.mkldnn._convolution_pointwise` / `_linear_pointwise`, the ones torch's own CPU freezing
pass emits) with ReLU fused in. The arithmetic is the same kernels': in bf16 the outputs equal the
eager network's bit for bit; in fp32 they differ by the summation order (~1e-6 relative).

Those ops are not public API, so `packed_forward` checks them against the eager network on a
random batch when it builds one and returns None (the caller keeps the eager network) where they
are missing or disagree. Inference only: the learner's weights change every optimizer step.

`direct_forward` is the same forward on the layers' own weights, nothing packed: the eager network's
own calls (each conv with its ReLU in one oneDNN call, fastrl.models.conv_relu; the hidden layer's
weight-left product, fastrl.models.linear) without its module calls, autocast's dispatch and the
first conv's weight cut into tiles again at every call. Its outputs are the eager network's bit for
bit (checked when it is built), and a Pong forward at batch 16 costs ~0.90x the CPU (1 thread, AMX
Xeon, `python bench/packed_microbench.py`). What it holds is only the tiled first-conv weight, re-cut
after each load (`repack`), so the inference workers act through it whatever `system.packed_inference`
says (fastrl.workers.acting).
"""

from __future__ import annotations

import torch
from torch import nn

from fastrl.models.actor_critic import ActorCritic, NatureCNN
from fastrl.models.conv_relu import conv_relu
from fastrl.models.frames import frames_to_input
from fastrl.models.linear import linear
from fastrl.models.space_to_depth import conv_weight_and_stride

_OPS = ("_reorder_convolution_weight", "_reorder_linear_weight", "_convolution_pointwise", "_linear_pointwise")


def _ops_present() -> bool:
    return torch.backends.mkldnn.is_available() and all(hasattr(torch.ops.mkldnn, op) for op in _OPS)


class _PackedEncoder:
    """One NatureCNN's convs and hidden layer, each as (module, packed weight); `pack` False: the convs' weights
    as their calls take them (the first conv's cut into tiles), the hidden layer's its own."""

    def __init__(self, encoder: NatureCNN, batch_hint: int, pack: bool = True):
        self.convs = [m for m in encoder.convs if isinstance(m, nn.Conv2d)]
        self.fc = encoder.fc[0]
        self.batch_hint, self.pack = batch_hint, pack
        self.conv_weights: list = []
        self.fc_weight = None

    def repack(self) -> None:
        mk = torch.ops.mkldnn
        with torch.inference_mode():
            # a space-to-depth first conv runs its weight cut into tiles, at stride 1
            called = [conv_weight_and_stride(c, c.weight) for c in self.convs]
            self.strides = [list(stride) for _, stride in called]
            if not self.pack:
                self.conv_weights = [weight for weight, _ in called]
                return
            self.conv_weights = [
                mk._reorder_convolution_weight(weight.contiguous(memory_format=torch.channels_last), list(c.padding),
                                               stride, list(c.dilation), c.groups)
                for c, (weight, _), stride in zip(self.convs, called, self.strides)]
            self.fc_weight = mk._reorder_linear_weight(self.fc.weight, self.batch_hint)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        mk = torch.ops.mkldnn
        if not self.pack:  # the eager network's own calls (NatureCNN._conv_stack's, then its fc's)
            for conv, weight, stride in zip(self.convs, self.conv_weights, self.strides):
                x = conv_relu(x, weight, conv.bias, stride, conv.padding, conv.dilation, conv.groups)
            return torch.relu(linear(x.flatten(1), self.fc.weight, self.fc.bias))
        for conv, weight, stride in zip(self.convs, self.conv_weights, self.strides):
            x = mk._convolution_pointwise(x, weight, conv.bias, list(conv.padding), stride,
                                          list(conv.dilation), conv.groups, "relu", [], "")
        return mk._linear_pointwise(x.flatten(1), self.fc_weight, self.fc.bias, "relu", [], "")


class PackedForward:
    """`model`'s (params, values) forward with packed weights (`pack` False: the layers' own, direct_forward's).
    Call `repack()` whenever new values have been loaded into the model's tensors: until then the packed
    layers (unpacked: the tiled first conv) keep the old weights; the rest is read from the model's tensors
    every call."""

    def __init__(self, model: ActorCritic, batch_hint: int, pack: bool = True):
        self.model = model
        self.actor = _PackedEncoder(model.actor_encoder, batch_hint, pack)
        self.critic = None if model.critic_encoder is None else _PackedEncoder(model.critic_encoder, batch_hint, pack)
        self.input_dtype = model.actor_encoder.input_dtype
        self.repack()

    def repack(self) -> None:
        self.actor.repack()
        if self.critic is not None:
            self.critic.repack()

    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.model
        enc = m.actor_encoder
        x = frames_to_input(enc.as_nchw(obs), self.input_dtype, True, enc.input_scale, enc.input_block)
        h = self.actor(x)
        h_v = h if self.critic is None else self.critic(x)
        params, values = m.heads(h, h_v)  # the eager network's own heads
        return params.float(), values.float()


def packed_forward(model: ActorCritic, obs_shape: tuple, batch_hint: int) -> PackedForward | None:
    """A PackedForward for an eval-mode, channels-last Nature CNN network on the CPU whose layers hold
    the weights it computes with (ActorCritic.for_inference), or None where it does not apply: an MLP,
    observation normalisation, another device, mixed layer dtypes, a torch without the ops, or ops
    that disagree with the eager network on a random batch of uint8 frames of `obs_shape` (or an action
    mask, which only the eager forward applies).
    `batch_hint`: the batch the hidden layer's packing is tuned for (any batch runs)."""
    return _checked_forward(model, obs_shape, batch_hint, pack=True)


def direct_forward(model: ActorCritic, obs_shape: tuple) -> PackedForward | None:
    """The same network's forward on its layers' own weights (the module docstring), where packed_forward
    would apply and its outputs equal the eager network's bit for bit; else None."""
    return _checked_forward(model, obs_shape, 0, pack=False)


def _checked_forward(model: ActorCritic, obs_shape: tuple, batch_hint: int, pack: bool) -> PackedForward | None:
    encoders = [e for e in (model.actor_encoder, model.critic_encoder) if e is not None]
    if (not all(isinstance(e, NatureCNN) for e in encoders) or model.normalizer is not None
            or model.action_mask is not None or (pack and not _ops_present())):
        return None
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    dtypes = {m.weight.dtype for m in layers}
    if any(m.weight.device.type != "cpu" for m in layers) or len(dtypes) != 1 or model.training:
        return None
    if next(iter(dtypes)) != encoders[0].input_dtype:
        return None  # fp32 layers under autocast: the eager network casts them every call
    if not all(c.weight.is_contiguous(memory_format=torch.channels_last) for e in encoders for c in e.convs
               if isinstance(c, nn.Conv2d)):
        return None
    try:
        forward = PackedForward(model, batch_hint, pack)
        obs = torch.randint(0, 256, (3, *obs_shape), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            want, got = model(obs), forward(obs)
    except RuntimeError:
        return None
    for w, g in zip(want, got):
        if w.shape != g.shape or not (torch.allclose(w, g, rtol=1e-3, atol=1e-4) if pack else torch.equal(w, g)):
            return None
    return forward
