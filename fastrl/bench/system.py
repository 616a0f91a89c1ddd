"""The two whole-system stages of `fastrl bench`: the real runner, workers and learner, measured
through the runner's tick callback.

- sample: the learner frees every batch untrained (`system.learner_discards_batches`), so the
          figure is what rollout + inference can deliver.
- train:  full training, exactly as `fastrl train` runs the preset. Its rate counts the env steps
          the learner has trained on (batches x batch size), not those sampled: in the first minute
          the samplers also fill every free trajectory slot, which a 20 s window after the first
          sample counted as speed (Pong read 522 where the steady run went at ~410).

After the learner's first batch (trained, or freed untrained in the sample stage) and a warm-up,
counters are recorded for `seconds`: env steps (rates per
window), each process's wait time (busy / idle fractions), inference batch sizes, the policy-lag
histogram, and CPU and memory of every process.
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from fastrl.bench.measure import TreeSampler, overall_rate, spread, window_rates
from fastrl.buffers import SharedControl
from fastrl.config.schema import Config
from fastrl.envs import EnvSpec
from fastrl.host import idle_share
from fastrl.runner.runner import Runner
from fastrl.runner.stats import RunStats, hist_quantile
from fastrl.config.checks import envs_per_split
from fastrl.workers.process import heartbeat_index

MEMORY_EVERY_S = 2.0


class BenchInterrupted(Exception):
    """The user pressed Ctrl-C (or sent SIGTERM) during a system stage: `signum` says which."""

    def __init__(self, reason: str, signum: int):
        super().__init__(reason)
        self.signum = signum


class SystemProbe:
    """Tick callback: waits for the first sample and a warm-up, then measures for `seconds`."""

    def __init__(self, cfg: Config, seconds: float, warmup_s: float, progress, label: str,
                 prune: Callable[[float, float], bool] | None = None):
        """`prune(elapsed_s, env_steps_per_s)` may end the measurement early (fastrl tune's losers)."""
        self.cfg, self.seconds, self.warmup_s, self.progress, self.label = cfg, seconds, warmup_s, progress, label
        self.prune = prune
        self.pruned = False
        self.t_launch = time.monotonic()
        self.first_sample_s: float | None = None
        self.first_train_s: float | None = None  # the learner's first batch (freed untrained in the sample stage)
        self.t0: float | None = None
        self.points: list[tuple[float, float]] = []
        self.sampler = TreeSampler()
        self.last_memory = 0.0
        self.done = False

    def _snapshot(self, runner: Runner, stats: RunStats, control: SharedControl) -> dict:
        return {"t": time.monotonic(), "env_steps": stats.env_steps, "wait_s": control.wait_s.array.copy(),
                "pinned_s": None if runner.placement is None else runner.placement.pinned_s,
                "inference": control.inference_counts.array.copy(), "lag_hist": stats.lag_hist.copy(),
                "dropped": stats.dropped_for_lag,
                "minibatches": np.array([stats.learner.get("minibatches", 0), stats.learner.get("parallel_minibatches", 0)]),
                "wait_cores": np.array([stats.learner.get("wait_core_s", 0.0), stats.learner.get("wait_idle_core_s", 0.0)])}

    def _count(self, stats: RunStats) -> float:
        """Env steps done: sampled for the sample stage, trained on for the train stage."""
        if self.cfg.system.learner_discards_batches:
            return float(stats.env_steps)
        return float(stats.learner.get("train_steps", 0) * self.cfg.algo.batch_size)

    def __call__(self, runner: Runner, stats: RunStats, control: SharedControl) -> None:
        now = time.monotonic()
        if self.done:
            return
        if self.first_train_s is None and stats.first_train_after_command_s is not None:
            self.first_train_s = now - self.t_launch
        if self.first_sample_s is None:
            if stats.env_steps > stats.start_env_steps:
                self.first_sample_s = now - self.t_launch
            else:
                self.progress(0.0, f"{self.label}: starting processes ({now - self.t_launch:.0f} s)")
            return
        if self.t0 is None:
            # from the learner's first batch: it is spawned at the first sample and takes seconds to
            # start, and a window opened before it has warmed up measures its start, not its pace
            if self.first_train_s is None or now - self.t_launch - self.first_train_s < self.warmup_s:
                self.progress(0.0, f"{self.label}: warming up")
                return
            self.t0 = now
            self.start = self._snapshot(runner, stats, control)
            # every process the run has when the window opens: the learner is spawned at the first sample
            for name, p in runner.procs.items():
                self.sampler.add(name, p.pid)
            self.sampler.start()
        elapsed = now - self.t0
        self.points.append((elapsed, self._count(stats)))
        if now - self.last_memory >= MEMORY_EVERY_S:
            self.sampler.sample_memory()
            self.last_memory = now
        rate = (self.points[-1][1] - self.points[0][1]) / max(elapsed, 1e-9)
        self.progress(min(1.0, elapsed / self.seconds), f"env steps {rate:,.0f}/s")
        if self.prune is not None and elapsed >= self.seconds / 2 and self.prune(elapsed, rate):
            self.pruned = True
        if elapsed >= self.seconds or self.pruned:
            self.end = self._snapshot(runner, stats, control)
            self.sampler.stop()
            self.sampler.sample_memory()
            self.done = True
            runner.stop_reason = "benchmark window complete"

    def result(self, frames_per_env_step: int) -> dict:
        cfg = self.cfg
        span = self.end["t"] - self.start["t"]
        wait_frac = (self.end["wait_s"] - self.start["wait_s"]) / span
        n_roll, n_inf = cfg.sampler.num_rollout_workers, cfg.sampler.num_inference_workers
        rollout_idle = float(np.mean([wait_frac[heartbeat_index(cfg, "rollout", i)] for i in range(n_roll)]))
        # no inference process (n_inf == 0): the rollout workers act, one split at a time
        inference_busy = float(np.mean([1 - wait_frac[heartbeat_index(cfg, "inference", i)]
                                        for i in range(n_inf)])) if n_inf else 0.0
        learner_wait = float(wait_frac[heartbeat_index(cfg, "learner", 0)])
        inf = self.end["inference"] - self.start["inference"]
        minibatches, parallel = self.end["minibatches"] - self.start["minibatches"]
        wait_core_s, wait_idle_core_s = self.end["wait_cores"] - self.start["wait_cores"]
        wait_idle = idle_share(float(wait_idle_core_s), float(wait_core_s))
        lag_hist = self.end["lag_hist"].copy()
        lag_hist[:self.start["lag_hist"].size] -= self.start["lag_hist"]
        window_s = max(1.0, self.seconds / 10)
        rates = window_rates(self.points, window_s)
        overall = overall_rate(self.points)
        usage = self.sampler.usage()
        shares = self.sampler.core_shares()
        return {
            "env_steps_per_s": spread(rates, overall).as_dict(),
            "frames_per_s": spread([r * frames_per_env_step for r in rates],
                                   None if overall is None else overall * frames_per_env_step).as_dict(),
            "learner_busy_fraction": round(min(1.0, max(0.0, 1 - learner_wait)), 4),
            "learner_wait_fraction": round(min(1.0, max(0.0, learner_wait)), 4),
            # of the cores' time while the learner waited, the share that idled (the rest ran the samplers)
            "learner_wait_cores_idle_fraction": None if wait_idle is None else round(wait_idle, 4),
            # with learner_shards > 1: the share of its minibatches the learner ran on all its threads
            "learner_parallel_fraction": round(float(parallel / minibatches), 4) if minibatches else None,
            "rollout_idle_fraction": round(min(1.0, max(0.0, rollout_idle)), 4),
            "inference_busy_fraction": round(min(1.0, max(0.0, inference_busy)), 4),
            "inference_mean_batch": round(float(inf[:, 1].sum() / max(inf[:, 0].sum(), 1)), 1) if n_inf
            else float(envs_per_split(cfg)),
            "policy_lag": {"p50": hist_quantile(lag_hist, 0.5), "p95": hist_quantile(lag_hist, 0.95),
                           "max": int(np.flatnonzero(lag_hist).max()) if lag_hist.any() else None},
            "samples_dropped_for_lag": int(self.end["dropped"] - self.start["dropped"]),
            "processes": [u.as_dict() for u in usage],
            "cpu_percent_total": round(sum(u.cpu_percent for u in usage), 1),
            "core_shares": shares and {k: round(v, 4) for k, v in shares.items()},
            "peak_total_rss_mib": round(self.sampler.peak_total_rss_bytes / 2**20, 1),
            "peak_total_pss_mib": round(self.sampler.peak_total_pss_bytes / 2**20, 1),
            "time_to_first_sample_s": round(self.first_sample_s, 2),
            "time_to_first_batch_s": None if self.first_train_s is None else round(self.first_train_s, 2),
            # system.rollout_pinning: the share of the window the rollout workers were pinned (None: never set)
            "rollout_pinned_fraction": None if self.start["pinned_s"] is None
            else round(min(1.0, (self.end["pinned_s"] - self.start["pinned_s"]) / span), 4),
            "measured_s": round(span, 1), "pruned": self.pruned,
        }


def bench_system(cfg: Config, spec: EnvSpec, seconds: float, progress, discard: bool,
                 prune: Callable[[float, float], bool] | None = None) -> dict:
    """Run the real system for warm-up + `seconds` and measure it; `discard` = the sample stage."""
    cfg = copy.deepcopy(cfg)
    cfg.system.learner_discards_batches = discard
    warmup_s = min(10.0, max(1.0, seconds / 4))
    cfg.run.train_for_env_steps = 1 << 62
    cfg.run.stop_at_mean_return = None
    # a safety net only: the probe stops the run once it has measured
    cfg.run.train_for_seconds = cfg.system.startup_timeout_s + warmup_s + seconds + 30
    cfg.run.report_interval_s = 1e9
    cfg.run.save_every_s = 1e9
    probe = SystemProbe(cfg, seconds, warmup_s, progress, "sample" if discard else "train", prune)
    with tempfile.TemporaryDirectory(prefix="fastrl-bench-") as tmp:
        run_dir = Path(tmp)
        (run_dir / "checkpoints").mkdir()
        runner = Runner(cfg, spec, run_dir, echo=False, on_tick=probe)
        code = runner.run()
        if runner.stop_signal is not None:
            raise BenchInterrupted(runner.stop_reason, runner.stop_signal)
        if code != 0 or not probe.done:
            log_tail = "\n".join((run_dir / "train.log").read_text().splitlines()[-30:])
            raise RuntimeError(f"the {'sample' if discard else 'train'} stage failed: "
                               f"{runner.failure or runner.stop_reason}\n{log_tail}")
    return {**probe.result(spec.frames_per_env_step), "learner_trains": not discard}
