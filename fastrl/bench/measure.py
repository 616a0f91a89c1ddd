"""How `fastrl bench` turns counters into figures: rates over repeated windows (median and
spread, never a single number), per-process CPU and memory of a process tree, and the timing
loop of the microbenchmarks in bench/ (implementations alternated, medians).

Memory is reported as PSS (proportional set size) as well as RSS: the trajectory slots are
mapped by every process, and summed RSS would count them once per process.

The cores' own accounting (/proc/stat) is read over the same span, so that a sample or train
stage can say where the cores' time went besides the run: other processes, idle, or taken by
the hypervisor (steal). On a shared virtual machine steal comes and goes by the minute; a run's
rate is per wall second while the bound's per-core rates are per CPU second, so stolen time
lowers the efficiency without anything in fastrl costing more.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from fastrl.host import core_times, usable_cpus


@dataclass
class Spread:
    """A rate measured over several windows; `overall`, where set, over the whole measurement."""
    median: float
    min: float
    max: float
    windows: int
    overall: float | None = None

    def as_dict(self) -> dict:
        out = {"median": round(self.median, 1), "min": round(self.min, 1), "max": round(self.max, 1),
               "windows": self.windows}
        if self.overall is not None:
            out["overall"] = round(self.overall, 1)
        return out


def _change_points(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The samples at which a cumulative counter has just moved."""
    return [p for prev, p in zip(points, points[1:]) if p[1] != prev[1]]


def window_rates(points: list[tuple[float, float]], window_s: float) -> list[float]:
    """Rates of a cumulative counter over consecutive windows of about `window_s` seconds.

    `points` are (time_s, count) samples in time order. Windows open and close only at samples
    where the count has just changed: the train stage's counter jumps a whole batch at a time
    (1,024 env steps every ~2 s on Pong), and a window cut at an arbitrary moment would hold 0, 1
    or 2 of those jumps, which made 2 s windows read 0, 500 or 1,000 for a run going at 480. A
    steady counter changes at every sample, so there this is the plain windowing. A window
    closes at the first such sample at least `window_s` after it opened, so none has zero length.
    A measurement shorter than one window is one window, from its first change to its last:
    `fastrl bench --seconds 1` measured the env and infer stages for just under their 1 s window,
    and printed 0 env steps/s.
    """
    edges = _change_points(points)
    rates = []
    if not edges:
        return rates
    t0, c0 = edges[0]
    for t, c in edges[1:]:
        if t - t0 >= window_s:
            rates.append((c - c0) / (t - t0))
            t0, c0 = t, c
    whole = overall_rate(points) if not rates else None
    if whole is not None:
        rates.append(whole)
    return rates


def overall_rate(points: list[tuple[float, float]]) -> float | None:
    """A cumulative counter's rate from its first change to its last (None: fewer than two).

    The system stages' headline: their counters move in bursts (a batch's worth of slots freed at
    once, every few seconds), so any window shorter than the run holds a variable number of bursts.
    """
    edges = _change_points(points)
    if len(edges) < 2 or edges[-1][0] <= edges[0][0]:
        return None
    return (edges[-1][1] - edges[0][1]) / (edges[-1][0] - edges[0][0])


def headline_rate(rates: dict) -> float:
    """The one figure to quote from a Spread's dict: the whole-measurement rate where there is one."""
    return rates["overall"] if rates.get("overall") is not None else rates["median"]


def spread(values: list[float], overall: float | None = None) -> Spread:
    if not values:
        return Spread(0.0, 0.0, 0.0, 0, overall)
    return Spread(statistics.median(values), min(values), max(values), len(values), overall)


StageProgress = Callable[[float, str], None]  # a stage's progress: (fraction done, text)


@dataclass
class ComponentResult:
    """One isolated stage's figures (env, infer or learn), as `fastrl bench` reports them."""

    rate: Spread             # per second of wall time, all cores the stage used
    per_core: float          # per CPU second
    cpu_cores_used: float    # CPU seconds / wall seconds over the measurement
    measured_s: float
    detail: dict

    def as_dict(self, unit: str) -> dict:
        return {f"{unit}_per_s": self.rate.as_dict(), f"{unit}_per_core_s": round(self.per_core, 1),
                "cpu_cores_used": round(self.cpu_cores_used, 2), "measured_s": round(self.measured_s, 1),
                **self.detail}


@dataclass
class ProcessUsage:
    """CPU and memory of one process over a measurement."""
    name: str
    cpu_percent: float
    rss_bytes: int
    pss_bytes: int

    def as_dict(self) -> dict:
        return {"name": self.name, "cpu_percent": round(self.cpu_percent, 1),
                "rss_mib": round(self.rss_bytes / 2**20, 1), "pss_mib": round(self.pss_bytes / 2**20, 1)}


def core_shares(start: dict[str, float], end: dict[str, float], ours_cpu_s: float) -> dict[str, float] | None:
    """Where the cores' time went between two core_times snapshots, as fractions that add up to 1:
    `ours` (the CPU time of the processes measured), `other` (everything else that ran), `idle`
    and `stolen`. None over a span too short for the kernel's 10 ms ticks to tell."""
    spent = {k: end[k] - start[k] for k in ("busy_s", "idle_s", "stolen_s")}
    total = sum(spent.values())
    if total < 0.5:
        return None
    # our processes' CPU times and the cores' busy ticks are counted separately; never let their
    # rounding make `other` negative or `ours` exceed what the cores were busy
    ours = min(ours_cpu_s, spent["busy_s"])
    return {"ours": ours / total, "other": (spent["busy_s"] - ours) / total,
            "idle": spent["idle_s"] / total, "stolen": spent["stolen_s"] / total}


@dataclass
class TreeSampler:
    """Samples CPU time and memory of named processes; CPU % is over the span between `start` and `stop`."""
    procs: dict[str, psutil.Process] = field(default_factory=dict)
    cpu_start: dict[str, float] = field(default_factory=dict)
    cpu_end: dict[str, float] = field(default_factory=dict)
    peak_rss: dict[str, int] = field(default_factory=dict)
    peak_pss: dict[str, int] = field(default_factory=dict)
    peak_total_rss_bytes: int = 0
    peak_total_pss_bytes: int = 0
    t_start: float = 0.0
    t_end: float = 0.0
    cpus: list[int] = field(default_factory=usable_cpus)
    cores_start: dict[str, float] = field(default_factory=dict)
    cores_end: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, pid: int) -> None:
        try:
            self.procs[name] = psutil.Process(pid)
        except psutil.NoSuchProcess:
            pass

    @staticmethod
    def _cpu_s(p: psutil.Process) -> float | None:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.NoSuchProcess:
            return None

    def _cpu_snapshot(self) -> dict[str, float]:
        """CPU seconds so far of every process still alive."""
        cpu = {name: self._cpu_s(p) for name, p in self.procs.items()}
        return {name: c for name, c in cpu.items() if c is not None}

    def start(self) -> None:
        self.t_start = time.monotonic()
        self.cpu_start = self._cpu_snapshot()
        self.cores_start = core_times(self.cpus)

    def sample_memory(self) -> None:
        total_rss = total_pss = 0
        for name, p in self.procs.items():
            try:
                mem = p.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            pss = getattr(mem, "pss", mem.rss)
            self.peak_rss[name] = max(self.peak_rss.get(name, 0), mem.rss)
            self.peak_pss[name] = max(self.peak_pss.get(name, 0), pss)
            total_rss += mem.rss
            total_pss += pss
        self.peak_total_rss_bytes = max(self.peak_total_rss_bytes, total_rss)
        self.peak_total_pss_bytes = max(self.peak_total_pss_bytes, total_pss)

    def stop(self) -> None:
        self.t_end = time.monotonic()
        self.cpu_end = self._cpu_snapshot()
        self.cores_end = core_times(self.cpus)

    def cpu_seconds(self) -> float:
        return sum(self.cpu_end[n] - self.cpu_start[n] for n in self.cpu_end if n in self.cpu_start)

    def core_shares(self) -> dict[str, float] | None:
        """The cores' time over the span: these processes, other processes, idle, stolen."""
        if not self.cores_start or not self.cores_end:
            return None
        return core_shares(self.cores_start, self.cores_end, self.cpu_seconds())

    def usage(self) -> list[ProcessUsage]:
        span = max(self.t_end - self.t_start, 1e-9)
        out = []
        for name in self.procs:
            if name in self.cpu_start and name in self.cpu_end:
                cpu = 100.0 * (self.cpu_end[name] - self.cpu_start[name]) / span
                out.append(ProcessUsage(name, cpu, self.peak_rss.get(name, 0), self.peak_pss.get(name, 0)))
        return out


def fastrl_children(root: psutil.Process) -> dict[str, psutil.Process]:
    """A run's worker processes under `root`, by their title without "fastrl-" (rollout-0, inference-0,
    learner). The title, not the kernel's 15-character name, which reads "fastrl-rollout-" for every
    rollout worker."""
    found = {}
    for child in root.children(recursive=True):
        try:
            title = child.cmdline()[0]
        except (psutil.Error, IndexError):
            continue
        if title.startswith("fastrl-"):
            found[title[len("fastrl-"):]] = child
    return found


def us_per_call(call: Callable[[], None], seconds: float) -> float:
    """Wall microseconds per call of `call`, run in blocks of 50 for about `seconds`."""
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(50):
            call()
        n += 50
    return (time.perf_counter() - started) / n * 1e6


def microbench_args(description: str, default_seconds: float = 1.0) -> argparse.Namespace:
    """--rounds, --seconds and --json, as bench/'s alternated reference-against-native microbenchmarks take them."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=default_seconds)
    parser.add_argument("--json", help="also write the figures here")
    return parser.parse_args()


def write_json(path: str | None, results: dict) -> None:
    """A microbenchmark's figures to `path`, where one was given."""
    if path:
        Path(path).write_text(json.dumps(results, indent=2))


def alternated_us_per_call(calls: dict[str, Callable[[], None]], rounds: int, seconds: float) -> dict[str, float]:
    """Median µs per call of each implementation, timed in turn `rounds` times so that the host's
    drift hits them alike."""
    runs: dict[str, list] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            runs[name].append(us_per_call(call, seconds))
    return {name: statistics.median(v) for name, v in runs.items()}


def alternated_learner_cpu_ms(learners: dict[str, tuple], rounds: int, seconds: float,
                              clock: Callable[[], float] = time.thread_time) -> dict[str, list[float]]:
    """The learner's CPU ms per batch under each of `learners`, name -> (trainer, batch, switch): `switch`
    (None for a trainer of its own) puts the trainer on that name's implementation before each of its
    stretches. After a 1 s warm-up of each (allocator, first-call paths), `rounds` rounds of `seconds` each,
    the order reversed every other round so that the host's drift hits all alike. `clock`: this thread's
    CPU time by default (other processes' load counts less than in wall time); time.process_time for a
    learner that trains on several threads. The caller restores any state a switch changed."""
    names = list(learners)

    def cpu_ms_per_batch(name: str, budget_s: float) -> float:
        trainer, batch, switch = learners[name]
        if switch is not None:
            switch()
        batches, cpu0, started = 0, clock(), time.perf_counter()
        while time.perf_counter() - started < budget_s:
            batch["policy_version"].fill_(trainer.policy_version)
            trainer.train(batch)
            batches += 1
        return (clock() - cpu0) / batches * 1e3

    for name in names:
        cpu_ms_per_batch(name, 1.0)
    spent: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            spent[name].append(cpu_ms_per_batch(name, seconds))
    return spent


def switched_learner_ab(config: str, overrides: list[str], choose: Callable, rounds: int, seconds: float,
                        isa: str, as_configured: bool = False) -> None:
    """A microbenchmark's learner A/B: the preset's learner (1 thread, `overrides` applied) on `fastrl bench`'s
    synthetic batch, one attribute switched between two values in alternate rounds
    (alternated_learner_cpu_ms), and what it measured printed (fastrl.bench.report.learner_ab_lines).
    `choose(trainer)` returns (owner, attribute name, {label: value} for the before and the after value);
    the attribute is restored afterwards. `as_configured`: the preset's own threads, shards and split instead
    of 1 thread, timed by the process's CPU clock (every thread's)."""
    # imported here: the microbenchmarks alone need none of the learner's machinery
    from fastrl.bench.components import learner_on_synthetic_batch
    from fastrl.bench.report import learner_ab_lines, learner_setup
    from fastrl.config.hardware import resolve_auto
    from fastrl.config.loader import load_config
    from fastrl.envs.spec import resolve_env

    cfg = resolve_auto(load_config(config, [*([] if as_configured else ["system.learner_threads=1"]), *overrides]))
    trainer, batch = learner_on_synthetic_batch(cfg, resolve_env(cfg.env))
    owner, name, values = choose(trainer)
    original = getattr(owner, name)
    learners = {label: (trainer, batch, lambda value=value: setattr(owner, name, value))
                for label, value in values.items()}
    try:
        spent = alternated_learner_cpu_ms(learners, rounds, seconds,
                                          clock=time.process_time if as_configured else time.thread_time)
    finally:
        setattr(owner, name, original)
    before, after = values
    threads = learner_setup(cfg, trainer) if as_configured else "1 thread"
    print("\n".join(learner_ab_lines(config, isa, spent, before, after, threads)))


def microbench_main(description: str, microbench: Callable[[int, float], None],
                    learner_ab: Callable[[str, int, float], None]) -> None:
    """The command line of a microbenchmark with a learner A/B mode (bench/mlp_microbench.py,
    bench/activations_microbench.py): `[--rounds R] [--seconds S]` runs `microbench` (5 rounds of 1 s by
    default), `--learner CONFIG` runs `learner_ab` on that preset (8 rounds of 3 s); 1 torch thread."""
    import argparse

    import torch

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--learner", metavar="CONFIG", help="A/B the learner step of this preset instead")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--seconds", type=float)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.learner:
        learner_ab(args.learner, args.rounds or 8, args.seconds or 3.0)
    else:
        microbench(args.rounds or 5, args.seconds or 1.0)
