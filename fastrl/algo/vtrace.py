"""V-trace off-policy targets (Espeholt et al., 2018, IMPALA §4.1), with episode boundaries.

Inputs are time-major [T, B]; `values` has T+1 rows, the last being the learner's value of the
bootstrap observation stored at step T. Two kinds of episode end:
- terminated (d_t): the future is worth zero, so gamma * (1 - d_t) cuts both the TD target and
  the trace;
- truncated (time limit): the TD target still bootstraps from V(x_{t+1}) (the final
  observation), but the trace is cut, because step t+1 belongs to the next episode (it is
  envpool's reset step).

`vtrace` runs fastrl_ext's C++ loop (fastrl_ext/src/vtrace.cpp, the same operations in the same
order) when every input is a CPU tensor of float32 or float64 and `native` (algo.native_vtrace), else
`vtrace_torch`, the reference here. Why: the recursion below is a Python loop of small torch ops,
~0.6-1.2 ms per call at the MLP presets' minibatch sizes on a 2-core EPYC, re-run for every minibatch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fastrl.algo.native import cpu_floats_of_one_dtype
from fastrl_ext import _vtrace as _native


class VTraceReturns(NamedTuple):
    vs: torch.Tensor             # [T, B] value targets v_t
    pg_advantages: torch.Tensor  # [T, B] rho_t (r_t + gamma v_{t+1} - V(x_t))


@torch.no_grad()
def vtrace(log_ratios: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor, terminated: torch.Tensor,
           truncated: torch.Tensor, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0, native: bool = True) -> VTraceReturns:
    """log_ratios = log pi(a_t|x_t) - log mu(a_t|x_t); values = V(x_0..x_T) under the learner's network."""
    if (native and _native is not None and cpu_floats_of_one_dtype(log_ratios, rewards, values)
            and terminated.is_cpu and truncated.is_cpu):
        flags = terminated.to(torch.bool).contiguous(), truncated.to(torch.bool).contiguous()
        inputs = [x.contiguous() for x in (log_ratios, rewards, values)]
        vs, adv = torch.empty_like(inputs[1]), torch.empty_like(inputs[1])
        _native.vtrace(*(x.detach().numpy() for x in (*inputs, *flags, vs, adv)), float(gamma), float(rho_bar),
                       float(c_bar), float(lam))
        return VTraceReturns(vs, adv)
    return vtrace_torch(log_ratios, rewards, values, terminated, truncated, gamma, rho_bar, c_bar, lam)


@torch.no_grad()
def vtrace_torch(log_ratios: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor, terminated: torch.Tensor,
           truncated: torch.Tensor, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0) -> VTraceReturns:
    """log_ratios = log pi(a_t|x_t) - log mu(a_t|x_t); values = V(x_0..x_T) under the learner's network."""
    ratios = torch.exp(log_ratios)
    rhos = torch.clamp(ratios, max=rho_bar)
    cs = lam * torch.clamp(ratios, max=c_bar)
    not_terminated = 1.0 - terminated.to(rewards.dtype)
    not_done = not_terminated * (1.0 - truncated.to(rewards.dtype))
    v_t, v_next = values[:-1], values[1:]

    deltas = rhos * (rewards + gamma * not_terminated * v_next - v_t)
    discounted_cs = gamma * not_done * cs
    vs_minus_v = torch.empty_like(deltas)
    acc = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounted_cs[t] * acc
        vs_minus_v[t] = acc
    vs = v_t + vs_minus_v

    # v_{t+1} for the advantage: the next target inside an episode, V(x_{t+1}) across an end
    vs_next = torch.cat([vs[1:], values[-1:]], dim=0)
    vs_next = torch.where(not_done.bool(), vs_next, v_next)
    pg_advantages = rhos * (rewards + gamma * not_terminated * vs_next - v_t)
    return VTraceReturns(vs, pg_advantages)
