"""How `fastrl bench` turns counters into figures: rates over repeated windows (median and
spread, never a single number), and per-process CPU and memory of a process tree.

Memory is reported as PSS (proportional set size) as well as RSS: the trajectory slots are
mapped by every process, and summed RSS would count them once per process.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class Spread:
    """A rate measured over several windows."""
    median: float
    min: float
    max: float
    windows: int

    def as_dict(self) -> dict:
        return {"median": round(self.median, 1), "min": round(self.min, 1), "max": round(self.max, 1),
                "windows": self.windows}

    def text(self, unit: str = "") -> str:
        if self.windows == 0:
            return "n/a"
        return f"{self.median:,.0f}{unit} ({self.min:,.0f}-{self.max:,.0f}, {self.windows} windows)"


def window_rates(points: list[tuple[float, float]], window_s: float) -> list[float]:
    """Rates of a cumulative counter over consecutive windows of about `window_s` seconds.

    `points` are (time_s, count) samples in time order. A window closes at the first sample at
    least `window_s` after it opened, so irregular sampling never yields a zero-length window.
    """
    rates = []
    if not points:
        return rates
    t0, c0 = points[0]
    for t, c in points[1:]:
        if t - t0 >= window_s:
            rates.append((c - c0) / (t - t0))
            t0, c0 = t, c
    return rates


def spread(values: list[float]) -> Spread:
    if not values:
        return Spread(0.0, 0.0, 0.0, 0)
    return Spread(statistics.median(values), min(values), max(values), len(values))


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

    def cpu_seconds(self) -> float:
        return sum(self.cpu_end[n] - self.cpu_start[n] for n in self.cpu_end if n in self.cpu_start)

    def usage(self) -> list[ProcessUsage]:
        span = max(self.t_end - self.t_start, 1e-9)
        out = []
        for name in self.procs:
            if name in self.cpu_start and name in self.cpu_end:
                cpu = 100.0 * (self.cpu_end[name] - self.cpu_start[name]) / span
                out.append(ProcessUsage(name, cpu, self.peak_rss.get(name, 0), self.peak_pss.get(name, 0)))
        return out


def available_cores() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity, unlike os.cpu_count)."""
    try:
        return len(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error):
        return psutil.cpu_count() or 1
