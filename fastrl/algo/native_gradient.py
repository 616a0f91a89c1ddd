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
weights on one thread, a categorical (one choice or several, an observed action mask included) or a Gaussian
head; anything else keeps autograd.
"""

from __future__ import annotations

import numpy as np
import torch

from fastrl.algo.appo_loss import LossOutput, native_coefs
from fastrl.algo.flat_params import FlatParams
from fastrl.algo.vtrace import vtrace
from fastrl.config.schema import AlgoConfig
from fastrl.models import ActorCritic
from fastrl.models.native_mlp import NativeNets, split_views
from fastrl.models.numpy_policy import MASKED_LOGIT, forbidden_actions
from fastrl_ext import _appo_loss, _mlp, _optim, _policy_head, _vtrace

# Buffers for up to this many distinct minibatch shapes are kept (a batch's minibatches
# share one; the bench's synthetic batch and a run's may differ).
MAX_CACHED_SHAPES = 4


class NativeGradient:
    """The loss and gradient of a trajectory or sample minibatch for one ActorCritic and its FlatParams."""

    def __init__(self, model: ActorCritic, cfg: AlgoConfig, flat: FlatParams):
        self.model, self.cfg, self.flat = model, cfg, flat
        self.nets: NativeNets = model.native_nets
        self.coefs = native_coefs(cfg.clip_ratio, cfg.value_coef, cfg.entropy_coef, cfg.value_clip,
                                  cfg.normalize_advantages)
        self._grad_arrays: tuple[np.ndarray, list[tuple]] | None = None
        self._scratch: dict[tuple[int, int], _Scratch] = {}
        # several choices' numbers of options, as _policy_head takes them; None for one categorical or a Gaussian
        self.choices = None if model.action_nvec is None else np.asarray(model.action_nvec, dtype=np.int64)

    @staticmethod
    def supported(model: ActorCritic, cfg: AlgoConfig, flat: FlatParams | None) -> bool:
        """Whether this trainer's minibatches can take the native chain (see the module's docstring)."""
        return (cfg.native_gradient and cfg.native_loss and cfg.native_vtrace and flat is not None
                and _policy_head is not None and _mlp is not None and _appo_loss is not None and _vtrace is not None
                and _optim is not None
                and model.native_nets is not None and not model.bf16
                and len(model.native_nets.acts) == 2
                and cfg.minibatches_per_weights == 1)

    def ready(self) -> bool:
        """Whether it can run now: the model still on its native layers (a benchmark may switch them off),
        the gradients still the flat buffer's views, the weights float32 on the CPU."""
        return self.model.native_nets is self.nets and self.flat.attached() and self.nets.param_arrays() is not None

    def _grads(self) -> tuple[np.ndarray, list[tuple]]:
        """The flat gradient, and per net its parameters' gradients (where the C++ backward writes them), as
        numpy views: all of the flat gradient's memory, which it keeps while attached (`ready`), so made once."""
        if self._grad_arrays is None:
            self._grad_arrays = (self.flat.grad.numpy(),
                                 [tuple(p.grad.numpy() for p in params) for params in self.nets.params])
        return self._grad_arrays

    def _scratch_for(self, rows: int, n: int) -> "_Scratch":
        """Buffers for a minibatch of `rows` inputs of which the loss reads `n`, made once per shape: one
        minibatch's are read only until the next one's."""
        if (rows, n) not in self._scratch:
            if len(self._scratch) >= MAX_CACHED_SHAPES:
                self._scratch.clear()
            self._scratch[rows, n] = _Scratch(self.nets.widths, rows, n)
        return self._scratch[rows, n]

    def _inputs(self, obs: torch.Tensor, rows: int, scratch: "_Scratch") -> np.ndarray:
        """The networks' input rows, as ActorCritic.forward makes them: the observation normaliser's formula
        in one fastrl_ext call, bit for bit (its five torch ops cost ~11 µs on HalfCheetah's 264 rows, the
        same formula in numpy ~18), with the normaliser's std computed as its forward does."""
        x = _array(obs.float(), (rows, -1))
        normalizer = self.model.normalizer
        if normalizer is None:
            return x
        # in numpy, as torch.sqrt(var + eps) rounds it (float32 add and sqrt, each correctly rounded)
        std = np.sqrt(_array(normalizer.var, (-1,)) + np.float32(normalizer.eps))
        _mlp.normalize(x, _array(normalizer.mean, (-1,)), std, float(normalizer.clip), scratch.inputs)
        return scratch.inputs

    @torch.no_grad()
    def trajectory_minibatch(self, mb: dict) -> tuple[LossOutput, float]:
        """Whole trajectories [T(+1), b]: V-trace with the current values, as APPOTrainer's autograd path.
        Returns the loss's output and the gradient's sum of squares (the clip's norm squared)."""
        T1, b = mb["obs"].shape[:2]
        return self._minibatch(mb, T1 * b, (T1 - 1) * b, traj_shape=(T1, b))

    @torch.no_grad()
    def sample_minibatch(self, mb: dict) -> tuple[LossOutput, float]:
        """Single samples [b] with the batch's V-trace targets; returns as trajectory_minibatch."""
        rows = mb["obs"].shape[0]
        return self._minibatch(mb, rows, rows, traj_shape=None)

    def _minibatch(self, mb: dict, rows: int, n: int, traj_shape: tuple | None) -> tuple[LossOutput, float]:
        """Forward over `rows` inputs, the loss over the first `n` (the steps taken; with trajectories the
        last time step's rows only give the bootstrap value), the gradient into the parameters' .grad."""
        scratch = self._scratch_for(rows, n)
        x = self._inputs(mb["obs"], rows, scratch)
        (actor_act, critic_act), (actor, critic) = self.nets.acts, self.nets.param_arrays()
        actor_hs, critic_hs = scratch.activations
        _mlp.forward(x, actor, actor_hs, actor_act)
        _mlp.forward(x, critic, critic_hs, critic_act)
        policy_params, values = actor_hs[-1][:n], critic_hs[-1].reshape(rows)
        log_std = None if self.model.discrete else self.model.log_std.detach().numpy()
        actions = _array(mb["actions"], (n, -1) if log_std is not None or self.choices is not None else (n,))
        lp, ent = scratch.lp, scratch.ent
        forbidden = None
        if self.model.action_mask is not None:
            forbidden = forbidden_actions(_array(mb["obs"], (rows, -1))[:n], self.model.action_mask)
            policy_params[forbidden] = MASKED_LOGIT
        _policy_head.forward(policy_params, actions, log_std, lp, ent, self.choices)

        old_lp = _array(mb["log_probs"], (n,))
        if traj_shape is None:
            value_targets, advantages = _array(mb["vs"], (n,)), _array(mb["pg_advantages"], (n,))
        else:
            value_targets, advantages = self._vtrace(lp, old_lp, values, mb, traj_shape, scratch)
        valid = _array(mb["train_mask"] if mb["train_mask"].dtype == torch.bool else mb["train_mask"].bool(), (n,))
        _appo_loss.appo_loss(lp, old_lp, ent, values[:n], _array(mb["values"], (n,)), value_targets, advantages,
                             valid, scratch.loss_grads, scratch.stats, *self.coefs)
        g_lp, g_ent, g_v = scratch.loss_grads

        flat_grad, (actor_grads, critic_grads) = self._grads()
        log_std_grad = None
        if log_std is not None:
            log_std_grad = self.model.log_std.grad.numpy()
        _policy_head.backward(policy_params, actions, log_std, g_lp, g_ent, scratch.g_params[:n], log_std_grad,
                              self.choices)
        if forbidden is not None:
            # as masked_fill's backward: a forbidden logit is a constant, whatever the head's gradient there (an
            # action drawn where its row allowed nothing, or a batch's action the mask now forbids)
            scratch.g_params[:n][forbidden] = 0.0
        scratch.g_values[:n, 0] = g_v  # the rows past n (bootstrap values) keep the zeros they were made with
        _mlp.backward(scratch.g_params, x, actor, actor_hs, actor_grads, actor_act, None)
        _mlp.backward(scratch.g_values, x, critic, critic_hs, critic_grads, critic_act, None)
        # summed in float64 (no overflow to a false inf) without a float64 copy of the gradient (~20 µs)
        grad_sum_sq = _optim.sum_squares(flat_grad)
        # the statistics as Python floats: the trainer reads them as floats, and 0-dim tensors cost ~1 µs each
        return LossOutput(*scratch.stats.tolist()), grad_sum_sq

    def _vtrace(self, lp: np.ndarray, old_lp: np.ndarray, values: np.ndarray, mb: dict, traj_shape: tuple,
                scratch: "_Scratch") -> tuple[np.ndarray, np.ndarray]:
        """V-trace's (value targets, advantages) [n] for trajectories [T, b]: fastrl_ext._vtrace straight on
        the arrays (the torch-facing wrapper's checks and conversions cost ~25 µs a call), or through
        fastrl.algo.vtrace where the batch's dtypes are not the ones the call takes."""
        T1, b = traj_shape
        cfg = self.cfg
        rewards, terminated, truncated = mb["rewards"], mb["terminated"], mb["truncated"]
        if rewards.dtype != torch.float32 or terminated.dtype != torch.bool or truncated.dtype != torch.bool:
            targets = vtrace(torch.from_numpy(lp - old_lp).view(T1 - 1, b), rewards,
                             torch.from_numpy(values).view(T1, b), terminated, truncated, cfg.gamma, cfg.rho_bar,
                             cfg.c_bar, cfg.vtrace_lambda)
            return _array(targets.vs.float(), (-1,)), _array(targets.pg_advantages.float(), (-1,))
        np.subtract(lp, old_lp, out=scratch.log_ratios)
        shape = (T1 - 1, b)
        _vtrace.vtrace(scratch.log_ratios.reshape(shape), _array(rewards, shape), values.reshape(T1, b),
                       _array(terminated, shape), _array(truncated, shape), scratch.vs.reshape(shape),
                       scratch.advantages.reshape(shape), float(cfg.gamma), float(cfg.rho_bar), float(cfg.c_bar),
                       float(cfg.vtrace_lambda))
        return scratch.vs, scratch.advantages


def _array(t: torch.Tensor, shape: tuple) -> np.ndarray:
    """A C-contiguous numpy view of `t` in `shape` (a copy only where `t` is not contiguous). Reshaped in
    numpy: torch's detach, reshape and contiguous cost ~1 µs each, and a step takes ~10 of these."""
    a = (t.detach() if t.requires_grad else t).numpy().reshape(shape)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class _Scratch:
    """One minibatch shape's buffers: `rows` inputs, the loss over the first `n`."""

    def __init__(self, widths: list[list[int]], rows: int, n: int):
        self.inputs = np.empty((rows, widths[0][0]), np.float32)  # the normalised observations
        self.activations = []  # per net, each layer's output [rows, width]
        for net_widths in widths:
            buffer = np.empty(rows * sum(net_widths[1:]), np.float32)
            self.activations.append(tuple(split_views(buffer, [(rows, w) for w in net_widths[1:]])))
        actor_width = widths[0][-1]
        # the loss's gradient w.r.t. the nets' outputs; zeros past row n (a trajectory's bootstrap step), which
        # the loss does not read, stay zero
        out_grads = np.zeros(rows * (actor_width + 1), np.float32)
        self.g_params, self.g_values = split_views(out_grads, [(rows, actor_width), (rows, 1)])
        self.lp, self.ent, self.log_ratios, self.vs, self.advantages = np.empty((5, n), np.float32)
        self.loss_grads = np.empty((3, n), np.float32)  # w.r.t. log-probs, entropies, values
        self.stats = np.empty(6, np.float64)  # loss, policy loss, value loss, entropy, approx KL, clip fraction
