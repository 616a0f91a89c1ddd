"""One minibatch's APPO loss and its gradient in fastrl_ext calls, without torch's autograd (algo.native_gradient).

Why: once the MLP presets' layers, V-trace and the loss ran natively, HalfCheetah's optimizer step still
took ~1,290 µs, of which the layers' arithmetic is ~500 (bench/profile_learner.py). The rest was ~60 small
torch ops and their autograd nodes (the log-prob and entropy, slicing, the engine's bookkeeping, one
AccumulateGrad per parameter), each a few µs. Here the chain is written out: the actor and critic forward
(fastrl_ext._mlp), the policy's log-prob and entropy (_policy_head), V-trace (_vtrace), the loss with its
gradient w.r.t. log-prob, entropy and value (_appo_loss), then back through the head and each network
straight into the parameters' `.grad` (views of the flat gradient, fastrl.algo.flat_params).

The same math as the autograd path, to float rounding (tests/test_native_gradient.py holds the loss and every
gradient to it). Taken only where that path would run the same layers natively: an fp32 MLP actor and critic
with model.native_mlp's layers, algo.native_loss and native_vtrace, a flat gradient, one minibatch per
weights on one thread; anything else keeps autograd.
"""

from __future__ import annotations

import torch

from fastrl.algo.appo_loss import LossOutput
from fastrl.algo.vtrace import vtrace
from fastrl.config.schema import AlgoConfig
from fastrl.models import ActorCritic
from fastrl.models.native_mlp import NativeNets, _split
from fastrl_ext import _appo_loss, _mlp, _policy_head

# Buffers for up to this many distinct minibatch shapes are kept (a batch's minibatches
# share one; the bench's synthetic batch and a run's may differ).
MAX_CACHED_SHAPES = 4


class NativeGradient:
    """The loss and gradient of a trajectory or sample minibatch for one ActorCritic and its FlatParams."""

    def __init__(self, model: ActorCritic, cfg: AlgoConfig, flat):
        self.model, self.cfg, self.flat = model, cfg, flat
        self.nets: NativeNets = model.native_nets
        self.coefs = (float(cfg.clip_ratio), float(cfg.value_coef), float(cfg.entropy_coef),
                      None if cfg.value_clip is None else float(cfg.value_clip), bool(cfg.normalize_advantages))
        self._grad_key: tuple | None = None
        self._grad_arrays: list[tuple] = []
        self._buffers: dict[int, tuple] = {}

    @staticmethod
    def supported(model: ActorCritic, cfg: AlgoConfig, flat) -> bool:
        """Whether this trainer's minibatches can take the native chain (see the module's docstring)."""
        return (cfg.native_gradient and cfg.native_loss and cfg.native_vtrace and flat is not None
                and _policy_head is not None and _mlp is not None and _appo_loss is not None
                and model.native_nets is not None and not model.bf16 and len(model.native_nets.acts) == 2
                and cfg.minibatches_per_weights == 1)

    def ready(self) -> bool:
        """Whether it can run now: the model still on its native layers (a benchmark may switch them off),
        the gradients still the flat buffer's views, the weights float32 on the CPU."""
        return (self.model.native_nets is self.nets and self.flat.attached() and self.nets.param_arrays() is not None
                and self._grads() is not None)

    def _grads(self) -> list[tuple] | None:
        """Per net, its parameters' gradients as numpy views, where the C++ backward writes them."""
        grads = [p.grad for p in self.nets.all_params]
        if any(g is None for g in grads):
            return None
        key = tuple(g.data_ptr() for g in grads)
        if key != self._grad_key:
            self._grad_arrays = [tuple(p.grad.numpy() for p in params) for params in self.nets.params]
            self._grad_key = key
        return self._grad_arrays

    def _buffers_for(self, rows: int, n: int) -> tuple:
        """For `rows` inputs of which the loss reads `n`: both nets' activations, the gradients w.r.t. their
        outputs, the head's log-probs and entropies [2, n], the loss's gradients [3, n]. Made once per shape:
        one minibatch's are read only until the next one's."""
        if (rows, n) not in self._buffers:
            if len(self._buffers) >= MAX_CACHED_SHAPES:
                self._buffers.clear()
            activations = []
            for widths in self.nets.widths:
                buffer = torch.empty(rows * sum(widths[1:]))
                activations.append(tuple(_split(buffer.numpy(), [(rows, w) for w in widths[1:]])))
            actor_width = self.nets.widths[0][-1]
            # zeros: past row n (a trajectory's bootstrap step) they stay zero, the loss not reading those outputs
            out_grads = torch.zeros(rows * (actor_width + 1))
            g_params, g_values = _split(out_grads.numpy(), [(rows, actor_width), (rows, 1)])
            self._buffers[rows, n] = (activations, g_params, g_values, torch.empty(2, n).numpy(),
                                      torch.empty(3, n).numpy())
        return self._buffers[rows, n]

    def _inputs(self, obs: torch.Tensor, rows: int) -> torch.Tensor:
        """The networks' input rows, as ActorCritic.forward makes them."""
        x = obs.reshape(rows, -1).float()
        if self.model.normalizer is not None:
            x = self.model.normalizer(x)
        return x.contiguous()

    @torch.no_grad()
    def trajectory_minibatch(self, mb: dict) -> LossOutput:
        """Whole trajectories [T(+1), b]: V-trace with the current values, as APPOTrainer's autograd path."""
        T1, b = mb["obs"].shape[:2]
        return self._minibatch(mb, T1 * b, (T1 - 1) * b, traj_shape=(T1, b))

    @torch.no_grad()
    def sample_minibatch(self, mb: dict) -> LossOutput:
        """Single samples [b] with the batch's V-trace targets."""
        rows = mb["obs"].shape[0]
        return self._minibatch(mb, rows, rows, traj_shape=None)

    def _minibatch(self, mb: dict, rows: int, n: int, traj_shape: tuple | None) -> LossOutput:
        """Forward over `rows` inputs, the loss over the first `n` (the steps taken; with trajectories the
        last time step's rows only give the bootstrap value), the gradient into the parameters' .grad."""
        x = self._inputs(mb["obs"], rows).numpy()
        params, grads = self.nets.param_arrays(), self._grads()
        (actor_hs, critic_hs), g_params, g_values, (lp, ent), loss_grads = self._buffers_for(rows, n)
        (actor_act, critic_act), (actor, critic) = self.nets.acts, params
        _mlp.forward(x, actor, actor_hs, actor_act)
        _mlp.forward(x, critic, critic_hs, critic_act)
        policy_params, values = actor_hs[-1][:n], critic_hs[-1].reshape(rows)
        log_std = None if self.model.discrete else self.model.log_std.detach().numpy()
        actions = mb["actions"].reshape(n, -1) if log_std is not None else mb["actions"].reshape(n)
        actions = actions.contiguous().numpy()
        _policy_head.forward(policy_params, actions, log_std, lp, ent)

        old_lp = mb["log_probs"].reshape(n).contiguous()
        if traj_shape is None:
            value_targets, advantages = mb["vs"], mb["pg_advantages"]
        else:
            T1, b = traj_shape
            targets = vtrace(torch.from_numpy(lp).view(T1 - 1, b) - old_lp.view(T1 - 1, b), mb["rewards"],
                             torch.from_numpy(values).view(T1, b), mb["terminated"], mb["truncated"],
                             self.cfg.gamma, self.cfg.rho_bar, self.cfg.c_bar, self.cfg.vtrace_lambda)
            value_targets, advantages = targets.vs, targets.pg_advantages
        stats = torch.empty(6, dtype=torch.float64)
        floats = (old_lp, mb["values"], value_targets, advantages)
        old_lp, old_values, value_targets, advantages = (t.reshape(n).contiguous().numpy() for t in floats)
        valid = mb["train_mask"].reshape(n).to(torch.bool).contiguous().numpy()
        _appo_loss.appo_loss(lp, old_lp, ent, values[:n], old_values, value_targets, advantages, valid,
                             loss_grads, stats.numpy(), *self.coefs)
        g_lp, g_ent, g_v = loss_grads

        (actor_grads, critic_grads), log_std_grad = grads, None
        if log_std is not None:
            log_std_grad = self.model.log_std.grad.numpy()
        _policy_head.backward(policy_params, actions, log_std, g_lp, g_ent, g_params[:n], log_std_grad)
        g_values[:n, 0] = g_v  # the rows past n (bootstrap values) keep the zeros they were made with
        _mlp.backward(g_params, x, actor, actor_hs, actor_grads, actor_act, None)
        _mlp.backward(g_values, x, critic, critic_hs, critic_grads, critic_act, None)
        return LossOutput(*stats.float().unbind())
