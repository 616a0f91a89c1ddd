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
"""

from __future__ import annotations

import torch
from torch import nn

from fastrl.models.actor_critic import ActorCritic, NatureCNN
from fastrl.models.frames import frames_to_input
from fastrl.models.space_to_depth import conv_weight_and_stride

_OPS = ("_reorder_convolution_weight", "_reorder_linear_weight", "_convolution_pointwise", "_linear_pointwise")


def _ops_present() -> bool:
    return torch.backends.mkldnn.is_available() and all(hasattr(torch.ops.mkldnn, op) for op in _OPS)


class _PackedEncoder:
    """One NatureCNN's convs and hidden layer, each as (module, packed weight)."""

    def __init__(self, encoder: NatureCNN, batch_hint: int):
        self.convs = [m for m in encoder.convs if isinstance(m, nn.Conv2d)]
        self.fc = encoder.fc[0]
        self.batch_hint = batch_hint
        self.conv_weights: list = []
        self.fc_weight = None

    def repack(self) -> None:
        mk = torch.ops.mkldnn
        with torch.inference_mode():
            # a space-to-depth first conv runs its weight cut into tiles, at stride 1
            called = [conv_weight_and_stride(c, c.weight) for c in self.convs]
            self.strides = [list(stride) for _, stride in called]
            self.conv_weights = [
                mk._reorder_convolution_weight(weight.contiguous(memory_format=torch.channels_last), list(c.padding),
                                               stride, list(c.dilation), c.groups)
                for c, (weight, _), stride in zip(self.convs, called, self.strides)]
            self.fc_weight = mk._reorder_linear_weight(self.fc.weight, self.batch_hint)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        mk = torch.ops.mkldnn
        for conv, weight, stride in zip(self.convs, self.conv_weights, self.strides):
            x = mk._convolution_pointwise(x, weight, conv.bias, list(conv.padding), stride,
                                          list(conv.dilation), conv.groups, "relu", [], "")
        return mk._linear_pointwise(x.flatten(1), self.fc_weight, self.fc.bias, "relu", [], "")


class PackedForward:
    """`model`'s (params, values) forward with packed weights. Call `repack()` whenever new values
    have been loaded into the model's tensors: until then the packed layers keep the old weights
    (the biases and the two heads are read from the model's tensors every call)."""

    def __init__(self, model: ActorCritic, batch_hint: int):
        self.model = model
        self.actor = _PackedEncoder(model.actor_encoder, batch_hint)
        self.critic = None if model.critic_encoder is None else _PackedEncoder(model.critic_encoder, batch_hint)
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
        # the heads' weights share the layers' dtype (bf16 in a bf16 network), as under autocast
        return m.policy_head(h).float(), m.value_head(h_v).squeeze(-1).float()


def packed_forward(model: ActorCritic, obs_shape: tuple, batch_hint: int) -> PackedForward | None:
    """A PackedForward for an eval-mode, channels-last Nature CNN network on the CPU whose layers hold
    the weights it computes with (ActorCritic.for_inference), or None where it does not apply: an MLP,
    observation normalisation, another device, mixed layer dtypes, a torch without the ops, or ops
    that disagree with the eager network on a random batch of uint8 frames of `obs_shape`.
    `batch_hint`: the batch the hidden layer's packing is tuned for (any batch runs)."""
    encoders = [e for e in (model.actor_encoder, model.critic_encoder) if e is not None]
    if not all(isinstance(e, NatureCNN) for e in encoders) or model.normalizer is not None or not _ops_present():
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
        packed = PackedForward(model, batch_hint)
        obs = torch.randint(0, 256, (3, *obs_shape), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            want, got = model(obs), packed(obs)
    except RuntimeError:
        return None
    for w, g in zip(want, got):
        if w.shape != g.shape or not torch.allclose(w, g, rtol=1e-3, atol=1e-4):
            return None
    return packed
