"""Microbenchmark of the learner's native pieces against their torch references, 1 thread.

    python bench/learner_microbench.py [--rounds 5] [--seconds 1] [--json learner_micro.json]

- V-trace (fastrl_ext._vtrace vs fastrl.algo.vtrace.vtrace_torch), microseconds per call;
- the APPO loss, forward and backward (fastrl_ext._appo_loss vs fastrl.algo.appo_loss.appo_loss_torch
  under autograd), microseconds per call of `appo_loss(...).loss.backward()`.

At the shapes the presets call them with (float32, as the learner does): HalfCheetah's minibatches of
4 trajectories of 64 steps (40 per batch), CartPole's 16 trajectories of 32 (8 per batch), Pong's
V-trace over the whole batch of 32 x 32 (once per batch) and its loss over minibatches of 64 single
samples (32 per batch). Native and torch are measured alternately, --rounds times for --seconds each;
the table gives medians.
"""

from __future__ import annotations

from typing import Callable

import torch

from fastrl.algo.appo_loss import appo_loss
from fastrl.algo.vtrace import vtrace
from fastrl.bench.measure import alternated_us_per_call, microbench_args, write_json

VTRACE_SHAPES = {"HalfCheetah minibatch": (64, 4), "CartPole minibatch": (32, 16), "Pong batch": (32, 32)}
LOSS_SHAPES = {"HalfCheetah minibatch": (64, 4), "CartPole minibatch": (32, 16), "Pong minibatch": (64,)}


def vtrace_call(shape: tuple, native: bool) -> Callable[[], None]:
    T, B = shape
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(T, B, generator=gen)
    args = (torch.randn(T, B, generator=gen) * 0.1, torch.randn(T, B, generator=gen),
            torch.randn(T + 1, B, generator=gen), u < 0.01, (u >= 0.01) & (u < 0.02))
    return lambda: vtrace(*args, 0.99, 1.0, 1.0, 0.95, native=native)


def loss_call(shape: tuple, native: bool) -> Callable[[], None]:
    gen = torch.Generator().manual_seed(0)

    def t(scale=1.0):
        return torch.randn(shape, generator=gen) * scale
    new_lp, entropy, new_v = t().requires_grad_(), t().abs().requires_grad_(), t().requires_grad_()
    data = (new_lp.detach() + t(0.2), t(), t(), t())  # old log-probs, old values, value targets, advantages
    valid = torch.rand(shape, generator=gen) > 0.05

    def call():
        new_lp.grad = entropy.grad = new_v.grad = None
        appo_loss(new_lp, data[0], entropy, new_v, data[1], data[2], data[3], valid, 0.2, 0.5, 0.01,
                  native=native).loss.backward()
    return call


def main() -> None:
    args = microbench_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)
    results: dict[str, dict] = {}
    for piece, shapes, make in (("vtrace", VTRACE_SHAPES, vtrace_call), ("appo_loss", LOSS_SHAPES, loss_call)):
        for label, shape in shapes.items():
            calls = {"torch": make(shape, False), "native": make(shape, True)}
            results[f"{piece}: {label}"] = alternated_us_per_call(calls, args.rounds, args.seconds) | {
                "shape": list(shape)}
    print(f"{'piece: shape':<36}{'shape':>10}{'torch us':>12}{'native us':>12}{'speed-up':>10}")
    for label, r in results.items():
        print(f"{label:<36}{str(r['shape']):>10}{r['torch']:>12.1f}{r['native']:>12.1f}"
              f"{r['torch'] / r['native']:>9.1f}x")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
