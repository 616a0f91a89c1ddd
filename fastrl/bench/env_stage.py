"""The env stage of `fastrl bench`: the preset's rollout workers as processes stepping their envs
(same splits, envs and threads) with random actions, double-buffered like the real rollout loop,
taking envpool's outputs as they come (the rollout workers' native recorder does the rest).

This module imports no torch, as the rollout workers whose envs it times do not: each round's
spawned env processes import only it, fastrl's config and envs (~0.3 s), where importing the
other stages' module cost each of them ~2 s of torch before its envs were made.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Callable

import numpy as np

from fastrl.bench.measure import ComponentResult, StageProgress, TreeSampler, spread, window_rates
from fastrl.config.checks import envs_per_split
from fastrl.config.schema import Config
from fastrl.envs import EnvSpec, make_groups
from fastrl.envs.actions import EnvActions
from fastrl.envs.vector import shares_one_envpool
from fastrl.workers.process import name_process_and_die_with_parent, terminal_signals_ignored_from_birth

ACTION_POOL = 16  # random action batches cycled through, so the stage does not time the RNG


def random_actions(spec: EnvSpec, num_envs: int, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random actions for num_envs envs, as the env takes them."""
    if spec.discrete:
        choices = spec.action_nvec or spec.num_actions
        actions = rng.integers(0, choices, size=(num_envs, *spec.action_cell), dtype=np.int32)
        return EnvActions(spec)(actions)
    low, high = np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32)
    return rng.uniform(low, high, size=(num_envs, spec.num_actions)).astype(np.float32)


def env_worker(cfg: Config, spec: EnvSpec, index: int, counters) -> None:
    """One rollout worker's envs with random actions; counters[index] = env steps, counters[-1] = stop."""
    name_process_and_die_with_parent(f"fastrl-bench-env-{index}")
    if os.getppid() == 1:  # the bench died before we got here
        return
    n_envs = envs_per_split(cfg)
    seed = cfg.run.seed * 1_000_003 + index * cfg.sampler.num_envs_per_worker
    envs = make_groups(cfg.env, spec, cfg.sampler, seed)  # the rollout workers' layout (sampler.env_pool)
    rng = np.random.default_rng(seed)
    pool = [random_actions(spec, n_envs, rng) for _ in range(ACTION_POOL)]
    for env in envs:
        env.reset()
        env.send(pool[0])
    # envpool's outputs as they come, as the rollout workers' native recorder takes them: the stage
    # times the envs, not the Step a Python caller would build around them
    recvs = [getattr(env, "recv_raw", env.recv) for env in envs]
    k = i = 0
    while counters[-1] == 0:
        recvs[k]()
        counters[index] += n_envs
        i = (i + 1) % ACTION_POOL
        envs[k].send(pool[i])  # this group steps while the loop collects the next one
        k = (k + 1) % len(envs)
    for env in envs:
        env.close()


def _sample_counter(read: Callable[[], float], seconds: float, warmup_s: float, progress: StageProgress,
                    label: str, on_start: Callable[[], None], on_stop: Callable[[], None],
                    ready: Callable[[], bool] = lambda: True) -> tuple[list, float, float]:
    """Poll a cumulative counter: wait until `ready`, warm up, then record points for `seconds`."""
    while not ready():
        time.sleep(0.05)
    time.sleep(warmup_s)
    on_start()
    t0 = time.monotonic()
    points = [(0.0, read())]
    while True:
        time.sleep(0.25)
        now = time.monotonic() - t0
        points.append((now, read()))
        rate = (points[-1][1] - points[0][1]) / max(now, 1e-9)
        progress(min(1.0, now / seconds), f"{label} {rate:,.0f}/s")
        if now >= seconds:
            break
    on_stop()
    return points, points[-1][1] - points[0][1], points[-1][0]


def bench_env(cfg: Config, spec: EnvSpec, seconds: float, progress: StageProgress) -> ComponentResult:
    ctx = mp.get_context("spawn")
    workers = cfg.sampler.num_rollout_workers
    counters = ctx.RawArray("q", workers + 1)
    procs = [ctx.Process(target=env_worker, args=(cfg, spec, i, counters), daemon=True, name=f"bench-env-{i}")
             for i in range(workers)]
    for p in procs:
        with terminal_signals_ignored_from_birth():
            p.start()
    sampler = TreeSampler()
    for i, p in enumerate(procs):
        sampler.add(f"env-{i}", p.pid)
    try:
        def ready() -> bool:
            if any(p.exitcode is not None for p in procs):
                raise RuntimeError("an env benchmark process died; see its output above")
            return all(counters[i] > 0 for i in range(workers))

        points, count, wall = _sample_counter(lambda: float(sum(counters[:workers])), seconds, min(2.0, seconds / 4),
                                              progress, "env steps", sampler.start, sampler.stop, ready)
    finally:
        counters[workers] = 1
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    cpu_s = sampler.cpu_seconds()
    threads_per_worker = 1 if shares_one_envpool(cfg.sampler, spec) else cfg.sampler.num_splits * cfg.sampler.env_threads
    return ComponentResult(spread(window_rates(points, max(1.0, seconds / 10))), count / max(cpu_s, 1e-9),
                           cpu_s / wall, wall, {"envs": workers * cfg.sampler.num_envs_per_worker,
                                          "env_threads_total": workers * threads_per_worker})
