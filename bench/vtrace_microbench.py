"""Microbenchmark of V-trace: fastrl_ext's C++ loop against the torch reference, 1 thread.

    python bench/vtrace_microbench.py [--rounds 5] [--seconds 1] [--json vtrace.json]

At the [T, B] shapes the presets call it with (float32, as the learner does): HalfCheetah's
minibatches of 4 trajectories of 64 steps (40 calls per batch), CartPole's 16 trajectories of 32
(8 calls), and Pong's whole batch of 32 trajectories of 32 (once per batch). The two are measured
alternately, --rounds times for --seconds each; the table gives medians of microseconds per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from fastrl.algo.vtrace import vtrace

SHAPES = {"HalfCheetah minibatch": (64, 4), "CartPole minibatch": (32, 16), "Pong batch": (32, 32)}


def inputs(T: int, B: int) -> tuple:
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(T, B, generator=gen)
    return (torch.randn(T, B, generator=gen) * 0.1, torch.randn(T, B, generator=gen),
            torch.randn(T + 1, B, generator=gen), u < 0.01, (u >= 0.01) & (u < 0.02))


def us_per_call(args: tuple, native: bool, seconds: float) -> float:
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(50):
            vtrace(*args, 0.99, 1.0, 1.0, 0.95, native=native)
        n += 50
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for label, (T, B) in SHAPES.items():
        data = inputs(T, B)
        runs: dict[str, list] = {"torch": [], "native": []}
        for _ in range(args.rounds):
            for impl in runs:
                runs[impl].append(us_per_call(data, impl == "native", args.seconds))
        results[label] = {impl: statistics.median(v) for impl, v in runs.items()} | {"T": T, "B": B}
    print(f"{'shape':<24}{'[T, B]':>10}{'torch us':>12}{'native us':>12}{'speed-up':>10}")
    for label, r in results.items():
        print(f"{label:<24}{str([r['T'], r['B']]):>10}{r['torch']:>12.1f}{r['native']:>12.1f}"
              f"{r['torch'] / r['native']:>9.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
