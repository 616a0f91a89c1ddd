"""The policy/value network: an encoder (MLP or Nature CNN) with a categorical or Gaussian head."""

from __future__ import annotations

import math

import torch
from torch import nn

from fastrl.config.checks import resolve_encoder
from fastrl.config.hardware import resolve_first_conv, resolve_precision
from fastrl.config.schema import ModelConfig
from fastrl.envs.spec import EnvSpec
from fastrl.models.activations import Tanh
from fastrl.models.conv_relu import conv_layer_relu, conv_layer_relu_trained, fuses, relu_follows
from fastrl.models.frames import UINT8_SCALE, frames_to_input
from fastrl.models import native_mlp
from fastrl.models.linear import WeightLeftLinear, bf16_linear_in_fp32
from fastrl.models.normalizer import ObsNormalizer
from fastrl.models.numpy_policy import MASKED_LOGIT
from fastrl.models.space_to_depth import SpaceToDepthConv2d, tiles

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _mlp(in_dim: int, hidden: list, activation: str) -> tuple[nn.Module, int]:
    act = Tanh if activation == "tanh" else nn.ReLU
    layers, d = [], in_dim
    for h in hidden:
        linear = nn.Linear(d, h)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear, act()]
        d = h
    return nn.Sequential(*layers), d


class NatureCNN(nn.Module):
    """Mnih et al. (2015): 3 conv layers and a 512-unit layer; frames scaled to [0, 1].

    `chw`: the image's (channels, height, width); `obs_channels_last`: the observations arrive
    [N, H, W, C] (gymnasium's order) rather than [N, C, H, W] (envpool Atari's); `input_scale`: what
    the frames are multiplied by (EnvSpec.image_scale: 1/255 for uint8)."""

    def __init__(self, chw: tuple, out_dim: int = 512, obs_channels_last: bool = False,
                 input_scale: float = UINT8_SCALE, space_to_depth: bool = False, native_conv_grad: bool = True):
        super().__init__()
        c, h, w = chw
        self.obs_channels_last, self.input_scale = obs_channels_last, input_scale
        self.native_conv_grad = native_conv_grad  # model.native_conv_grad: the learner's conv weight gradients
        # model.first_conv: the first conv on 4x4 tiles of the frames (fastrl.models.space_to_depth), where they tile
        self.input_block = 4 if space_to_depth and tiles(chw, 8, 4) else 1
        first = SpaceToDepthConv2d(c, 32, 8, 4) if self.input_block > 1 else nn.Conv2d(c, 32, 8, stride=4)
        self.convs = nn.Sequential(
            first, nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
        b = self.input_block
        with torch.no_grad():
            n = self.convs(torch.zeros(1, c * b * b, h // b, w // b)).shape[1]
        self.fc = nn.Sequential(WeightLeftLinear(n, out_dim), nn.ReLU())
        self.input_dtype = torch.float32  # bf16 under model.precision=bf16: the convs would cast to it anyway
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.orthogonal_(m.weight, math.sqrt(2))
                nn.init.zeros_(m.bias)

    def as_nchw(self, obs: torch.Tensor) -> torch.Tensor:
        """The observations as the convs index them, [N, C, H, W]: [N, H, W, C] ones become a view that
        is channels-last in memory, which is also the layout the CPU's convs run fastest in."""
        return obs.permute(0, 3, 1, 2) if self.obs_channels_last else obs

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # the frames become the dtype and memory order the first conv wants, scaled, in one pass
        channels_last = self.input_block > 1 or self.convs[0].weight.is_contiguous(memory_format=torch.channels_last)
        x = frames_to_input(self.as_nchw(obs), self.input_dtype, channels_last, self.input_scale, self.input_block)
        return self.fc(self._conv_stack(x))

    def _conv_stack(self, x: torch.Tensor) -> torch.Tensor:
        """self.convs on x, each conv and the ReLU after it as one oneDNN call where that applies
        (fastrl.models.conv_relu: the same outputs, one pass over each layer's output fewer; with autograd,
        the same gradients, the ReLU's taken natively)."""
        layers = self.convs
        if not fuses(x, layers[0].weight, layers[0].bias):
            return layers(x)
        trained = torch.is_grad_enabled()
        i = 0
        while i < len(layers):
            layer = layers[i]
            if relu_follows(layers, i):
                x = conv_layer_relu_trained(layer, x, self.native_conv_grad) if trained else conv_layer_relu(layer, x)
                i += 2
            else:
                x = layer(x)
                i += 1
        return x


class ActorCritic(nn.Module):
    def __init__(self, spec: EnvSpec, cfg: ModelConfig):
        super().__init__()
        self.discrete = spec.discrete
        # several discrete choices: one categorical per choice over its slice of the logits (EnvSpec.action_nvec)
        self.action_nvec = tuple(spec.action_nvec) or None
        # the observation's columns that say which actions are allowed (EnvSpec.action_mask), or None
        self.action_mask = spec.action_mask_columns
        encoder = resolve_encoder(cfg, spec)
        self.normalizer = ObsNormalizer(spec.obs_shape) if cfg.normalize_obs else None

        # "auto" is normally resolved with the config (fastrl.config.hardware); a model built
        # straight from a ModelConfig resolves it for the CPU
        precision = resolve_precision(cfg.precision, "cpu")
        space_to_depth = resolve_first_conv(cfg.first_conv, precision, "cpu") == "space_to_depth"

        def make_encoder():
            if encoder == "nature_cnn":
                width = cfg.hidden_sizes[0] if cfg.hidden_sizes else 512
                return NatureCNN(spec.image_chw, width, spec.obs_channels_last, spec.image_scale,
                                 space_to_depth, cfg.native_conv_grad), width
            return _mlp(int(math.prod(spec.obs_shape)), cfg.hidden_sizes, cfg.activation)

        self.actor_encoder, feat = make_encoder()
        self.critic_encoder = None if cfg.shared_encoder else make_encoder()[0]
        self.policy_head = nn.Linear(feat, spec.num_actions)
        nn.init.orthogonal_(self.policy_head.weight, 0.01)
        nn.init.zeros_(self.policy_head.bias)
        self.value_head = nn.Linear(feat, 1)
        nn.init.orthogonal_(self.value_head.weight, 1.0)
        nn.init.zeros_(self.value_head.bias)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((spec.num_actions,), float(cfg.init_log_std)))
        self._flatten = not spec.is_image
        self.bf16 = precision == "bf16"
        for encoder in (self.actor_encoder, self.critic_encoder):
            if isinstance(encoder, NatureCNN) and self.bf16:
                encoder.input_dtype = torch.bfloat16
        self.native_nets: native_mlp.NativeNets | None = None
        if cfg.native_mlp and native_mlp.pays():
            self.use_native_layers()

    def use_native_layers(self) -> bool:
        """Run an fp32 MLP actor and critic (encoder and head each) as one fastrl_ext call forward and one
        backward (model.native_mlp, fastrl.models.native_mlp); False, and torch's layers, for anything
        else (a CNN, a shared encoder, bf16) or where the extension is not built."""
        if self.critic_encoder is None or self.bf16 or native_mlp._native is None:
            return False
        actor = native_mlp.mlp_layers(self.actor_encoder, self.policy_head)
        critic = native_mlp.mlp_layers(self.critic_encoder, self.value_head)
        self.native_nets = native_mlp.NativeNets([actor, critic]) if actor and critic else None
        return self.native_nets is not None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (logits or Gaussian mean, value) for a batch of observations."""
        x = obs.reshape(obs.shape[0], -1).float() if self._flatten else obs
        if self.normalizer is not None:
            x = self.normalizer(x.float())
        outputs = self.native_nets(x) if self.native_nets is not None else None
        if outputs is not None:
            params, values = outputs
            return self._masked(params, obs), values.squeeze(-1)
        # bf16 halves the cost of the convs and matmuls on CPUs with AVX-512 bf16; the outputs
        # come back as fp32 so that log-probs, V-trace and the losses keep full precision.
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            h = self.actor_encoder(x)
            h_v = h if self.critic_encoder is None else self.critic_encoder(x)
            params, values = self.heads(h, h_v)
        return self._masked(params.float(), obs), values.float()

    def heads(self, h: torch.Tensor, h_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy head on the actor's features `h` and the value head on the critic's `h_v` (the same
        tensor with a shared encoder): (params, values), in bf16 where the network computes in bf16.
        A bf16 network on the CPU runs each head as an fp32 product of the bf16 values, rounded to bf16
        as autocast's is (fastrl.models.linear.bf16_linear_in_fp32): oneDNN's bf16 calls cost more to set
        up than these 512 x 6 and 512 x 1 products. Each head keeps its own product (and so its own
        rounding of the features' gradient), as autocast's two calls do."""
        if not (self.bf16 and h.device.type == "cpu"):
            return self.policy_head(h), self.value_head(h_v).squeeze(-1)
        p, v = self.policy_head, self.value_head
        with torch.autocast("cpu", enabled=False):
            return bf16_linear_in_fp32(h, p.weight, p.bias), bf16_linear_in_fp32(h_v, v.weight, v.bias).squeeze(-1)

    def _masked(self, logits: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The logits with the actions the observation's action mask forbids set to MASKED_LOGIT: their
        probability is exactly 0 in float32, and a finite value keeps 0 * log p at 0 in the entropy (-inf
        would make it NaN). Without a mask, the logits themselves."""
        if self.action_mask is None:
            return logits
        allowed = obs.reshape(obs.shape[0], -1)[:, self.action_mask] > 0.5
        return logits.masked_fill(~allowed, MASKED_LOGIT)

    def use_channels_last(self) -> ActorCritic:
        """A CNN's weights in channels-last memory, which oneDNN's convs run faster on the CPU (its
        input follows, fastrl.models.frames): training ~1.6x (the Pong CNN), a bf16 inference forward
        with its weights held in bf16 3-7% (batch 32-16, AVX-512 EPYC). The learner and the inference
        workers both use it, so both compute in the same layout. A no-op for an MLP."""
        if any(isinstance(m, NatureCNN) for m in self.modules()):
            self.to(memory_format=torch.channels_last)
        return self

    def for_inference(self) -> ActorCritic:
        """This network as an inference worker runs it: eval mode, channels-last, the conv and linear
        weights held in bf16 (a no-op in fp32). The worker takes these steps apart (it may publish the
        fp32 network first, fastrl.workers.acting); benchmarks call this, so they time what it runs."""
        self.eval().use_channels_last()
        self.hold_layer_weights_in_bf16()
        return self

    def state_all_in_layers(self) -> bool:
        """Whether every tensor of the state dict is a conv's or linear layer's (weights and biases), so that
        hold_layer_weights_in_bf16 leaves none in float32: no observation statistics, no Gaussian log-std."""
        return all(isinstance(self.get_submodule(name.rpartition(".")[0]), (nn.Linear, nn.Conv2d))
                   for name in self.state_dict())

    def hold_layer_weights_in_bf16(self) -> None:
        """Keep the conv and linear weights in bf16, the copies autocast would otherwise make from
        fp32 at every forward (40% of a batch-16 Pong forward in the profiler, mostly the 1.6M-weight
        layer's copy): an inference worker's network, and the learner's working copy
        (fastrl.algo.bf16_copy), which takes its gradients w.r.t. these bf16 weights.
        The values are the same bf16 roundings; loading fp32 weights into them rounds once per
        new version. The Gaussian log-std and the observation statistics stay fp32."""
        if not self.bf16:
            return
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                module.to(torch.bfloat16)

    # --- distribution helpers: plain formulas, cheaper than torch.distributions on the hot path.
    # Several discrete choices are independent categoricals, one per slice of the logits: their log-probs
    # and entropies add up.
    def _choices(self, params: torch.Tensor) -> list[torch.Tensor]:
        return [torch.log_softmax(p, dim=-1) for p in params.split(self.action_nvec, dim=-1)]

    def sample(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.action_nvec is not None:
            choices = self._choices(params)
            actions = torch.stack([torch.multinomial(log_p.reshape(-1, log_p.shape[-1]).exp(), 1).reshape(
                log_p.shape[:-1]) for log_p in choices], dim=-1)
            return actions, self._choices_log_prob(choices, actions)
        if self.discrete:
            log_p = torch.log_softmax(params, dim=-1)
            actions = torch.multinomial(log_p.exp(), 1).squeeze(-1)
            return actions, log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        std = self.log_std.exp()
        actions = params + std * torch.randn_like(params)
        return actions, self.log_prob(params, actions)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        """The most likely action (deterministic evaluation)."""
        if self.action_nvec is not None:
            return torch.stack([p.argmax(-1) for p in params.split(self.action_nvec, dim=-1)], dim=-1)
        return params.argmax(-1) if self.discrete else params

    @staticmethod
    def _choices_log_prob(choices: list[torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        actions = actions.long()
        return torch.stack([log_p.gather(-1, actions[..., i:i + 1]).squeeze(-1) for i, log_p in enumerate(choices)],
                           dim=-1).sum(-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        if self.action_nvec is not None:
            return self._choices_log_prob(self._choices(params), actions)
        if self.discrete:
            return torch.log_softmax(params, dim=-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        z = (actions - params) / self.log_std.exp()
        return (-0.5 * z ** 2 - self.log_std - LOG_SQRT_2PI).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        if self.action_nvec is not None:
            return torch.stack([-(log_p.exp() * log_p).sum(-1) for log_p in self._choices(params)], dim=-1).sum(-1)
        if self.discrete:
            log_p = torch.log_softmax(params, dim=-1)
            return -(log_p.exp() * log_p).sum(-1)
        return (self.log_std + 0.5 + LOG_SQRT_2PI).sum(-1).expand(params.shape[:-1])


def seeded_model(spec: EnvSpec, cfg: ModelConfig, seed: int) -> ActorCritic:
    """A run's starting network: the same weights for the same seed, whichever process builds it
    (the runner, or the first inference worker) and however many torch threads it runs: the
    orthogonal init's QR differs in the last bits between thread counts, so it runs on one. The
    caller's global torch RNG and thread count are left as they were."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return ActorCritic(spec, cfg)
    finally:
        torch.set_num_threads(threads)
