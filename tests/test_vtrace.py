"""V-trace against a slow reference written straight from the IMPALA paper's sum form,
on random inputs with terminations, truncations and envpool reset steps. Every test runs both
implementations: fastrl_ext's C++ loop and the torch reference."""

import math

import pytest
import torch

import fastrl.algo.vtrace as vtrace_module
from fastrl.algo.vtrace import vtrace_torch


@pytest.fixture(params=["native", "torch"])
def vtrace(request, monkeypatch):
    """The V-trace under test; the native one may not quietly fall back to torch."""
    if request.param == "torch":
        return lambda *args, **kw: vtrace_module.vtrace(*args, **kw, native=False)

    def torch_forbidden(*args, **kw):
        raise AssertionError("the native V-trace fell back to torch")
    monkeypatch.setattr(vtrace_module, "vtrace_torch", torch_forbidden)
    return vtrace_module.vtrace


def random_episode_flags(T, B, gen, p_end=0.15):
    """terminated/truncated flags, never both; the step after an end is a reset step as envpool makes it."""
    u = torch.rand(T, B, generator=gen)
    terminated = u < p_end / 2
    truncated = (u >= p_end / 2) & (u < p_end)
    return terminated, truncated


def reference_vtrace(log_ratios, rewards, values, terminated, truncated, gamma, rho_bar, c_bar, lam):
    """v_s = V(x_s) + sum_{t>=s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t, the sum ending at the
    first episode end; delta_t = rho_t (r_t + gamma (1 - term_t) V(x_{t+1}) - V(x_t))."""
    T, B = rewards.shape
    vs = torch.zeros(T, B, dtype=torch.float64)
    adv = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        ratio = [math.exp(float(log_ratios[t, b])) for t in range(T)]
        rho = [min(rho_bar, r) for r in ratio]
        c = [lam * min(c_bar, r) for r in ratio]
        V = [float(values[t, b]) for t in range(T + 1)]
        term = [bool(terminated[t, b]) for t in range(T)]
        done = [bool(terminated[t, b]) or bool(truncated[t, b]) for t in range(T)]
        delta = [rho[t] * (float(rewards[t, b]) + gamma * (0.0 if term[t] else V[t + 1]) - V[t]) for t in range(T)]
        for s in range(T):
            total, weight = 0.0, 1.0
            for t in range(s, T):
                total += weight * delta[t]
                if done[t]:
                    break
                weight *= gamma * c[t]
            vs[s, b] = V[s] + total
        for s in range(T):
            if done[s]:
                next_v = V[s + 1]
            else:
                next_v = float(vs[s + 1, b]) if s + 1 < T else V[T]
            adv[s, b] = rho[s] * (float(rewards[s, b]) + gamma * (0.0 if term[s] else next_v) - V[s])
    return vs, adv


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rho_bar,c_bar,lam", [(1.0, 1.0, 1.0), (2.0, 0.5, 0.9), (0.8, 1.2, 0.95)])
def test_vtrace_matches_paper_reference(seed, rho_bar, c_bar, lam, vtrace):
    gen = torch.Generator().manual_seed(seed)
    T, B, gamma = 20, 6, 0.97
    log_ratios = torch.randn(T, B, generator=gen, dtype=torch.float64) * 0.7
    rewards = torch.randn(T, B, generator=gen, dtype=torch.float64)
    values = torch.randn(T + 1, B, generator=gen, dtype=torch.float64)
    terminated, truncated = random_episode_flags(T, B, gen)
    assert terminated.any() and truncated.any()
    got = vtrace(log_ratios, rewards, values, terminated, truncated, gamma, rho_bar, c_bar, lam)
    want_vs, want_adv = reference_vtrace(log_ratios, rewards, values, terminated, truncated, gamma, rho_bar, c_bar, lam)
    torch.testing.assert_close(got.vs, want_vs, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got.pg_advantages, want_adv, rtol=1e-9, atol=1e-9)


def n_step_returns(rewards, values, terminated, truncated, gamma):
    """On-policy lambda=1 targets: discounted rewards to the episode end or the rollout end, then bootstrap."""
    T, B = rewards.shape
    out = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        for s in range(T):
            ret, disc = 0.0, 1.0
            for t in range(s, T):
                ret += disc * float(rewards[t, b])
                disc *= gamma
                if terminated[t, b]:
                    break
                if truncated[t, b] or t == T - 1:
                    ret += disc * float(values[t + 1, b])
                    break
            out[s, b] = ret
    return out


def gae(rewards, values, terminated, truncated, gamma, lam):
    T, _ = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(T)):
        not_term = (~terminated[t]).double()
        not_done = (~(terminated[t] | truncated[t])).double()
        delta = rewards[t] + gamma * not_term * values[t + 1] - values[t]
        last = delta + gamma * lam * not_done * last
        adv[t] = last
    return adv


def test_on_policy_targets_are_n_step_returns(vtrace):
    gen = torch.Generator().manual_seed(7)
    T, B, gamma = 16, 5, 0.9
    rewards = torch.randn(T, B, generator=gen, dtype=torch.float64)
    values = torch.randn(T + 1, B, generator=gen, dtype=torch.float64)
    terminated, truncated = random_episode_flags(T, B, gen, p_end=0.2)
    got = vtrace(torch.zeros(T, B, dtype=torch.float64), rewards, values, terminated, truncated, gamma)
    torch.testing.assert_close(got.vs, n_step_returns(rewards, values, terminated, truncated, gamma))


def test_on_policy_lambda_advantage_is_gae(vtrace):
    gen = torch.Generator().manual_seed(8)
    T, B, gamma, lam = 16, 5, 0.99, 0.9
    rewards = torch.randn(T, B, generator=gen, dtype=torch.float64)
    values = torch.randn(T + 1, B, generator=gen, dtype=torch.float64)
    terminated, truncated = random_episode_flags(T, B, gen, p_end=0.2)
    got = vtrace(torch.zeros(T, B, dtype=torch.float64), rewards, values, terminated, truncated, gamma, lam=lam)
    torch.testing.assert_close(got.vs - values[:-1], gae(rewards, values, terminated, truncated, gamma, lam))


def test_truncation_bootstraps_but_termination_does_not(vtrace):
    rewards = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    values = torch.tensor([[0.0], [10.0], [0.0]], dtype=torch.float64)
    zeros = torch.zeros(2, 1, dtype=torch.float64)
    no = torch.zeros(2, 1, dtype=torch.bool)
    end = torch.tensor([[True], [False]])
    truncated = vtrace(zeros, rewards, values, no, end, gamma=0.5)
    terminated = vtrace(zeros, rewards, values, end, no, gamma=0.5)
    assert float(truncated.vs[0, 0]) == pytest.approx(1.0 + 0.5 * 10.0)  # final obs worth 10
    assert float(terminated.vs[0, 0]) == pytest.approx(1.0)


def test_reset_step_does_not_leak_into_previous_episode(vtrace):
    """A huge reward on the reset step (action ignored) must not change the previous step's target."""
    T = 3
    values = torch.zeros(T + 1, 1, dtype=torch.float64)
    terminated = torch.tensor([[True], [False], [False]])
    truncated = torch.zeros(T, 1, dtype=torch.bool)
    base = torch.tensor([[1.0], [0.0], [0.0]], dtype=torch.float64)
    spiked = base.clone()
    spiked[1, 0] = 1000.0
    a = vtrace(torch.zeros(T, 1, dtype=torch.float64), base, values, terminated, truncated, 0.99)
    b = vtrace(torch.zeros(T, 1, dtype=torch.float64), spiked, values, terminated, truncated, 0.99)
    assert float(a.vs[0, 0]) == float(b.vs[0, 0]) == 1.0


def random_inputs(T, B, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    log_ratios = (torch.randn(T, B, generator=gen) * 0.7).to(dtype)
    rewards = torch.randn(T, B, generator=gen).to(dtype)
    values = torch.randn(T + 1, B, generator=gen).to(dtype)
    terminated, truncated = random_episode_flags(T, B, gen)
    return log_ratios, rewards, values, terminated, truncated


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_native_matches_torch_on_learner_sized_batches(dtype, tol):
    """The shapes the presets train on ([64, 4] HalfCheetah minibatches, [32, 32] CartPole), in the
    learner's float32; and inputs that are views (columns of a batch), as minibatches can be."""
    for T, B in [(64, 4), (32, 32), (1, 7)]:
        args = random_inputs(T, B, dtype, seed=T * B)
        want = vtrace_torch(*args, 0.99, 1.0, 1.0, 0.95)
        got = vtrace_module.vtrace(*args, 0.99, 1.0, 1.0, 0.95)
        torch.testing.assert_close(got.vs, want.vs, rtol=tol, atol=tol)
        torch.testing.assert_close(got.pg_advantages, want.pg_advantages, rtol=tol, atol=tol)
    wide = random_inputs(16, 12, dtype, seed=5)
    cols = [x[:, ::3] for x in wide]  # non-contiguous views
    want = vtrace_torch(*(x.contiguous() for x in cols), 0.9, 2.0, 0.5, 1.0)
    got = vtrace_module.vtrace(*cols, 0.9, 2.0, 0.5, 1.0)
    torch.testing.assert_close(got.vs, want.vs, rtol=tol, atol=tol)
    torch.testing.assert_close(got.pg_advantages, want.pg_advantages, rtol=tol, atol=tol)


def test_a_nan_ratio_stays_nan_in_both(vtrace):
    """A non-finite log-ratio must reach the loss (which then skips the step), not be clamped away."""
    log_ratios, rewards, values, terminated, truncated = random_inputs(8, 3, torch.float32, seed=1)
    terminated[:], truncated[:] = False, False
    log_ratios[5, 1] = float("nan")
    out = vtrace(log_ratios, rewards, values, terminated, truncated, 0.99)
    assert torch.isnan(out.vs[:6, 1]).all() and torch.isfinite(out.vs[6:, 1]).all()
    assert torch.isfinite(out.vs[:, [0, 2]]).all()


def test_native_refuses_what_it_cannot_read():
    native = vtrace_module._native
    log_ratios, rewards, values, terminated, truncated = (x.numpy() for x in random_inputs(4, 2, torch.float32, 0))
    vs, adv = rewards.copy(), rewards.copy()
    with pytest.raises(ValueError, match="values must be"):
        native.vtrace(log_ratios, rewards, values[:-1], terminated, truncated, vs, adv, 0.9, 1.0, 1.0, 1.0)
    with pytest.raises(TypeError, match="terminated must be bool"):
        native.vtrace(log_ratios, rewards, values, terminated.astype("f4"), truncated, vs, adv, 0.9, 1.0, 1.0, 1.0)
    with pytest.raises(TypeError, match="share one dtype"):
        native.vtrace(log_ratios, rewards.astype("f8"), values, terminated, truncated, vs, adv, 0.9, 1.0, 1.0, 1.0)
    vs.flags.writeable = False
    with pytest.raises(TypeError, match="vs_out must be a C-contiguous writable"):
        native.vtrace(log_ratios, rewards, values, terminated, truncated, vs, adv, 0.9, 1.0, 1.0, 1.0)


def reference_lambda_returns(rewards, values, terminated, truncated, gamma, lam):
    """GAE (Schulman et al., 2016, eq. 16) in its sum form: A_t = sum_{l>=0} (gamma lam)^l delta_{t+l}, the sum
    ending at the first episode end, and the value target A_t + V(x_t); delta_t = r_t + gamma (1 - term_t)
    V(x_{t+1}) - V(x_t), where a truncated step bootstraps from its final observation's value."""
    T, B = rewards.shape
    returns = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        V = [float(values[t, b]) for t in range(T + 1)]
        delta = [float(rewards[t, b]) + gamma * (0.0 if terminated[t, b] else V[t + 1]) - V[t] for t in range(T)]
        for s in range(T):
            advantage, weight = 0.0, 1.0
            for t in range(s, T):
                advantage += weight * delta[t]
                if terminated[t, b] or truncated[t, b]:
                    break
                weight *= gamma * lam
            returns[s, b] = V[s] + advantage
    return returns


@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_with_importance_weights_of_1_is_gae(seed, vtrace):
    """algo.vtrace_values=behaviour runs V-trace with log-ratios of 0 and rho_bar = c_bar = 1 on the acting
    policy's values: its value targets must then be GAE's lambda-returns."""
    gen = torch.Generator().manual_seed(seed)
    T, B, gamma, lam = 24, 5, 0.99, 0.95
    rewards = torch.randn(T, B, generator=gen, dtype=torch.float64)
    values = torch.randn(T + 1, B, generator=gen, dtype=torch.float64)
    terminated, truncated = random_episode_flags(T, B, gen)
    assert terminated.any() and truncated.any()
    got = vtrace(torch.zeros(T, B, dtype=torch.float64), rewards, values, terminated, truncated, gamma, 1.0, 1.0, lam)
    torch.testing.assert_close(got.vs, reference_lambda_returns(rewards, values, terminated, truncated, gamma, lam),
                               rtol=1e-9, atol=1e-9)
