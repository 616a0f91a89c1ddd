"""Microbenchmark of the rollout worker's per-step writes: fastrl_ext._record against the numpy reference.

    python bench/record_microbench.py [--rounds 5] [--seconds 1] [--json record_micro.json]

One call records one env step of a group of envs into its slot, from envpool-like raw outputs:
the reference builds the Step (fastrl.envs.vector.step_from_raw) and writes it
(fastrl.workers.recording.PythonRecorder.write); the native path is one NativeRecorder.write_raw.
At the presets' shapes: CartPole (32 envs, 4 float32), HalfCheetah (32 envs, 17 float64 cast to
float32, reward scaling), Pong (16 envs, 4x84x84 uint8 frames, Atari's score fields), each with
~5% of envs ending an episode per step. Alternated --rounds times for --seconds each; medians.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np

from fastrl.algo.reward_scaling import ReturnScaler
from fastrl.bench.measure import alternated_us_per_call, microbench_args, write_json
from fastrl.envs.vector import step_from_raw
from fastrl.workers.recording import NativeRecorder, PythonRecorder

SLOTS, T = 4, 32
SHAPES = {  # label: (envs, obs shape, envpool's obs dtype, the slots' dtype, atari, reward scaling)
    "CartPole (32 x 4 float32)": (32, (4,), np.float32, np.float32, False, False),
    "HalfCheetah (32 x 17 float64, scaled)": (32, (17,), np.float64, np.float32, False, True),
    "Pong (16 x 4x84x84 uint8)": (16, (4, 84, 84), np.uint8, np.uint8, True, False),
}


def recorder_call(shape: tuple, native: bool) -> Callable[[], None]:
    n, obs_shape, src, dst, atari, scale = shape
    rng = np.random.default_rng(0)

    def arr(shape, dtype):  # written once, so page faults are not timed
        return SimpleNamespace(array=np.full(shape, 0, dtype=dtype))
    bufs = SimpleNamespace(obs=arr((SLOTS, T + 1, n, *obs_shape), dst), rewards=arr((SLOTS, T, n), np.float32),
                           terminated=arr((SLOTS, T, n), bool), truncated=arr((SLOTS, T, n), bool),
                           valid=arr((SLOTS, T, n), bool))
    scaler = ReturnScaler((1, n), 0.99) if scale else None
    rec = (NativeRecorder if native else PythonRecorder)(bufs, 1, n, scaler, lambda k: None)
    obs = (rng.integers(0, 256, (n, *obs_shape)) if src == np.uint8 else rng.normal(size=(n, *obs_shape))).astype(src)
    done = rng.random(n) < 0.05
    raw = (obs, rng.normal(size=n).astype(np.float32), done, np.zeros(n, bool), np.arange(n, dtype=np.int32),
           np.ones(n, np.float32) if atari else None, done.astype(np.int32) if atari else None)
    cells = [(s, t) for s in range(SLOTS) for t in range(T)]
    i = 0

    def call():
        nonlocal i
        slot, t = cells[i]
        i = (i + 1) % len(cells)
        if native:
            rec.write_raw(0, raw, slot, t)
        else:
            rec.write(0, step_from_raw(*raw), slot, t)
        rec.take_finished()
    return call


def main() -> None:
    args = microbench_args(__doc__.splitlines()[0])
    results: dict[str, dict] = {}
    for label, shape in SHAPES.items():
        calls = {"numpy": recorder_call(shape, False), "native": recorder_call(shape, True)}
        results[label] = alternated_us_per_call(calls, args.rounds, args.seconds) | {"envs": shape[0]}
    print(f"{'preset shape':<40}{'numpy us':>10}{'native us':>11}{'speed-up':>10}{'native ns/env':>15}")
    for label, r in results.items():
        print(f"{label:<40}{r['numpy']:>10.1f}{r['native']:>11.2f}{r['numpy'] / r['native']:>9.1f}x"
              f"{r['native'] * 1e3 / r['envs']:>15.0f}")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
