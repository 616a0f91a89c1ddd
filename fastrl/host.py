"""The cores this process may run on, and what the kernel counted them doing (/proc/stat).

Shared by `fastrl bench`, which says where the cores' time went over a stage, and the learner,
which counts how much of the cores' time idled while it waited for data: on a machine whose
cores every process shares, a learner's wait is waste only where the cores idle through it.
"""

from __future__ import annotations

import psutil


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its children inherit them)."""
    try:
        return list(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error):
        return list(range(psutil.cpu_count() or 1))


def available_cores() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity, unlike os.cpu_count)."""
    return len(usable_cpus())


def core_times(cpus: list[int]) -> dict[str, float]:
    """Seconds since boot that `cpus` spent busy (any process, interrupts), idle (or waiting on
    I/O) and stolen by the hypervisor, from the kernel's per-CPU counters (10 ms ticks)."""
    per_cpu = psutil.cpu_times(percpu=True)
    out = {"busy_s": 0.0, "idle_s": 0.0, "stolen_s": 0.0}
    for i in cpus:
        if i >= len(per_cpu):
            continue
        t = per_cpu[i]
        out["busy_s"] += t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        out["idle_s"] += t.idle + getattr(t, "iowait", 0.0)
        out["stolen_s"] += getattr(t, "steal", 0.0)
    return out


class CoresDuringWaits:
    """The cores' time, and of it the idle time, summed over spans marked by `begin` and `end` (a
    process's waits). Each mark reads /proc/stat (~50 µs), so it suits waits, not every step."""

    def __init__(self, cpus: list[int] | None = None):
        self.cpus = usable_cpus() if cpus is None else cpus
        self.core_s = self.idle_core_s = 0.0
        self._at: dict[str, float] | None = None

    def begin(self) -> None:
        if self._at is None:
            self._at = core_times(self.cpus)

    def end(self) -> None:
        if self._at is None:
            return
        now = core_times(self.cpus)
        self.core_s += sum(now[k] - self._at[k] for k in now)
        self.idle_core_s += now["idle_s"] - self._at["idle_s"]
        self._at = None


def idle_share(idle_core_s: float, core_s: float) -> float | None:
    """`idle_core_s` over `core_s`; None for spans of under a few of the kernel's 10 ms ticks, too short
    for its counters to tell."""
    return idle_core_s / core_s if core_s >= 0.05 else None
