"""Atari frames shrunk and stacked by envpool (OpenCV's INTER_AREA inside its env thread) against envpool's
raw frames through fastrl_ext (fastrl.envs.atari_frames.FrameStacks), per env step.

    python bench/atari_frames_microbench.py [--rounds 5] [--seconds 3] [--env Pong-v5] [--envs 16] [--json F]

Two figures, each alternated between the two paths round by round:
- one envpool group of `--envs` envs (the preset's env kwargs) stepped with random actions through the rollout
  workers' calls (fastrl.envs.vector.EnvpoolSplit) on one core (this process pinned there, its env thread
  with it): env steps per second and the process's CPU µs per env step, envpool's thread included;
- fastrl_ext's push alone: µs per frame for 16 frames at a time, each ISA variant this CPU has (a fresh
  interpreter each, FASTRL_ACTING_ISA capping the pick).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from fastrl.bench.measure import write_json
from fastrl.config.loader import load_config
from fastrl.envs import resolve_env
from fastrl.envs.vector import EnvpoolSplit

PUSH_ALONE = """
import time, numpy as np
from fastrl_ext import _atari_frames as af
src = np.random.default_rng(0).integers(0, 256, (16, 1, 210, 160), dtype=np.uint8)
stacks, full = np.zeros((16, 4, 84, 84), np.uint8), np.zeros(16, bool)
for _ in range(50): af.push_frames(src, stacks, full)
runs = []
for _ in range({rounds}):
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < {seconds}:
        af.push_frames(src, stacks, full); n += 1
    runs.append((time.perf_counter() - t) / n / 16 * 1e6)
print(af.ISA, sorted(runs)[len(runs) // 2])
"""


def make_group(config: str, env_id: str, num_envs: int, choice: str) -> EnvpoolSplit:
    """One envpool group as a rollout worker builds and steps it (direct calls), frames by `choice`."""
    cfg = load_config(config, [f"env.id={env_id}", f"env.atari_frames={choice}"])
    group = EnvpoolSplit(cfg.env, resolve_env(cfg.env), num_envs, 1, seed=1)
    assert (group._frames is not None) == (choice == "fastrl")
    group.reset()
    return group


def stepped(group: EnvpoolSplit, actions: np.ndarray, seconds: float) -> tuple[float, float]:
    """(env steps per second, the process's CPU µs per env step) over `seconds` of stepping."""
    steps, k, cpu0, wall0 = 0, 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds:
        group.send(actions[k % len(actions)])
        group.recv_raw()
        steps += group.num_envs
        k += 1
    return steps / (time.perf_counter() - wall0), (time.process_time() - cpu0) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/atari_pong.yaml", help="the preset whose env kwargs to take")
    parser.add_argument("--env", default="Pong-v5")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # envpool's thread inherits it
    groups = {choice: make_group(args.config, args.env, args.envs, choice) for choice in ("envpool", "fastrl")}
    actions = np.random.default_rng(0).integers(0, groups["envpool"]._env.action_space.n, (16, args.envs), np.int32)
    runs = {name: [] for name in groups}
    for group in groups.values():
        stepped(group, actions, 1.0)  # warm-up
    for r in range(args.rounds):
        for name in (list(groups) if r % 2 == 0 else list(groups)[::-1]):
            runs[name].append(stepped(groups[name], actions, args.seconds))
    results = {"env": args.env, "envs": args.envs, "rounds": args.rounds}
    print(f"{args.env}, {args.envs} envs in one envpool group on one core, {args.rounds} rounds of {args.seconds:g} s "
          f"alternated (medians):")
    for name, values in runs.items():
        rate = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        results[name] = {"env_steps_per_s": rate, "cpu_us_per_env_step": cpu}
        print(f"  {name:8s} frames: {rate:8,.0f} env steps/s   {cpu:6.1f} CPU µs per env step")
    ratios = [f[0] / e[0] for e, f in zip(runs["envpool"], runs["fastrl"])]
    results["rate_ratio_per_round"] = ratios
    print(f"  fastrl / envpool env steps/s per round: {' '.join(f'{x:.3f}' for x in ratios)}")
    print("fastrl_ext's push alone, 16 frames a call, µs per frame:")
    for isa in ("avx512", "avx2", "default"):
        out = subprocess.run([sys.executable, "-c", PUSH_ALONE.format(rounds=args.rounds, seconds=0.5)],
                             env=dict(os.environ, FASTRL_ACTING_ISA=isa), capture_output=True, text=True, timeout=120)
        picked, us = out.stdout.split()
        if picked != isa:  # this CPU lacks the variant
            continue
        results[f"push_us_per_frame_{isa}"] = float(us)
        print(f"  {isa:8s} {float(us):6.2f}")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
