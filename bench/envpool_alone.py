"""envpool alone, no fastrl: wall rate and CPU microseconds per env step at given batch shapes.

    python bench/envpool_alone.py --env HalfCheetah-v5 --shape 16x1 --shape 32x1 --shape 64x2
    python bench/envpool_alone.py --env Pong-v5 --shape 16x1 --rounds 4 \
        --kwarg episodic_life=true --variant use_inter_area_resize=false

A shape is ENVSxTHREADS (sync mode: batch = envs). CPU time is the whole process's (caller plus
envpool's C++ threads), so `cpu_us_per_step` is what one env step costs the machine: 2 cores
cannot step more than 2e6 / cpu_us_per_step env steps per second, with nothing else running.
`--kwarg` passes envpool.make a keyword (a YAML value, as `--set` reads one); `--variant` adds a
second configuration, the first plus that keyword, and each round times both in turn, so that
drift hits both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from fastrl.config.loader import parse_override


def measure(env_id: str, num_envs: int, threads: int, seconds: float, kwargs: dict | None = None) -> dict:
    import envpool

    env = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs, num_threads=threads,
                       seed=0, **(kwargs or {}))
    ids = np.arange(num_envs, dtype=np.int32)
    space = env.action_space
    rng = np.random.default_rng(0)
    env.async_reset()
    env.recv()
    steps, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds:
        if hasattr(space, "n"):
            actions = rng.integers(0, space.n, num_envs)
        else:
            actions = rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(np.float32)
        env.send(actions, ids)
        env.recv()
        steps += num_envs
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    env.close()
    return {"env": env_id, "envs": num_envs, "threads": threads, "kwargs": kwargs or {},
            "env_steps_per_s": steps / wall, "cpu_cores": cpu / wall, "cpu_us_per_step": cpu / steps * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--shape", action="append", default=[], help="ENVSxTHREADS, repeatable (default 16x1)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--kwarg", action="append", default=[], help="KEY=VALUE for envpool.make, repeatable")
    parser.add_argument("--variant", action="append", default=[],
                        help="KEY=VALUE: also measure the configuration with these keywords added, alternately")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    base = dict(parse_override(pair) for pair in args.kwarg)
    configs = [base] + ([{**base, **dict(parse_override(pair) for pair in args.variant)}] if args.variant else [])
    rows = []
    for shape in args.shape or ["16x1"]:
        envs, threads = (int(x) for x in shape.lower().split("x"))
        costs = [[] for _ in configs]
        for _ in range(args.rounds):
            for i, kwargs in enumerate(configs):
                row = measure(args.env, envs, threads, args.seconds, kwargs)
                rows.append(row)
                costs[i].append(row["cpu_us_per_step"])
                print(f"{args.env} {envs:>4} envs x {threads} thread(s){' (variant)' if i else ''}: "
                      f"{row['env_steps_per_s']:>10,.0f} env steps/s, {row['cpu_cores']:.2f} cores, "
                      f"{row['cpu_us_per_step']:.1f} CPU us per env step")
        if len(configs) == 2:
            ratios = [after / before for before, after in zip(*costs)]
            print(f"{shape}: CPU us per env step, variant / base, per round "
                  f"{' '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
