"""The cores this process may run on, and what the kernel counted them doing (/proc/stat).

Shared by `fastrl bench`, which says where the cores' time went over a stage, and the learner,
which counts how much of the cores' time idled while it waited for data: on a machine whose
cores every process shares, a learner's wait is waste only where the cores idle through it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import psutil


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its children inherit them)."""
    try:
        return list(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error):
        return list(range(psutil.cpu_count() or 1))


def _cgroup_paths(proc_cgroup: Path) -> dict[str, str]:
    """This process's cgroup per hierarchy: "" for cgroup v2's unified one, else each v1 controller."""
    paths: dict[str, str] = {}
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in (parts[1].split(",") if parts[1] else [""]):
                paths[controller] = parts[2]
    return paths


def _quota_in(directory: Path) -> float | None:
    """The CPU quota one cgroup directory sets, in cores; None where it sets none or cannot be read."""
    try:
        if (directory / "cpu.max").exists():  # v2: "<quota_us|max> <period_us>"
            quota, period = (directory / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota_us = int((directory / "cpu.cfs_quota_us").read_text())  # v1: -1 for no limit
        period_us = int((directory / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def cgroup_cpu_quota(proc_cgroup: Path = Path("/proc/self/cgroup"),
                     cgroup_root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU time per second that this process's cgroups allow (`docker --cpus`, a systemd CPUQuota,
    a Kubernetes CPU limit), in cores; None where none is set. A quota leaves every core in the
    affinity mask but throttles the whole group once it has used its share of a period, so a
    machine of 16 cores under `--cpus=2` should be planned for as 2. The tightest limit over the
    cgroup and its ancestors applies; inside a container whose cgroup namespace makes its own
    cgroup "/", the mount's root is that cgroup."""
    paths = _cgroup_paths(proc_cgroup)
    if "" in paths:
        tree = [(cgroup_root, paths[""])]
    else:
        tree = [(cgroup_root / "cpu", paths["cpu"])] if "cpu" in paths else []
    limits = []
    for mount, own in tree:
        directory = mount / own.strip("/")
        while True:
            quota = _quota_in(directory)
            if quota is not None:
                limits.append(quota)
            if directory == mount or mount not in directory.parents:
                break
            directory = directory.parent
    return min(limits) if limits else None


def available_cores() -> int:
    """Cores this process can use: its affinity mask (taskset, a cpuset), capped by its cgroups' CPU
    quota rounded up, where either is set. os.cpu_count() sees neither."""
    cores = len(usable_cpus())
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota - 1e-9))) if quota is not None else cores


_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_proc_stat_fd: int | None = None
# the per-CPU lines come first in /proc/stat, before the interrupt counts that can run to megabytes
_PROC_STAT_HEAD_BYTES = 1 << 16


def _per_cpu_ticks(cpus: list[int]) -> dict[int, list[int]] | None:
    """/proc/stat's counters (user nice system idle iowait irq softirq steal ...) for `cpus`, read with
    one pread of a descriptor kept open: core_times ~13 µs where psutil.cpu_times(percpu=True) alone takes
    ~22, which the learner pays at each of its waits. None where /proc/stat cannot be read or lacks a CPU."""
    global _proc_stat_fd
    try:
        if _proc_stat_fd is None:
            _proc_stat_fd = os.open("/proc/stat", os.O_RDONLY)  # not inherited by children (O_CLOEXEC)
        head = os.pread(_proc_stat_fd, _PROC_STAT_HEAD_BYTES, 0)
    except OSError:
        return None
    wanted, found = set(cpus), {}
    for line in head.split(b"\n")[1:]:  # the first line is all CPUs together
        if not line.startswith(b"cpu"):
            break
        name, *fields = line.split()
        cpu = int(name[3:])
        if cpu in wanted and len(fields) >= 8:  # up to steal: every kernel since 2.6.11
            found[cpu] = [int(f) for f in fields]
    return found if len(found) == len(wanted) else None


def core_times(cpus: list[int]) -> dict[str, float]:
    """Seconds since boot that `cpus` spent busy (any process, interrupts), idle (or waiting on
    I/O) and stolen by the hypervisor, from the kernel's per-CPU counters (10 ms ticks)."""
    out = {"busy_s": 0.0, "idle_s": 0.0, "stolen_s": 0.0}
    ticks = _per_cpu_ticks(cpus)
    if ticks is not None:
        for t in ticks.values():
            out["busy_s"] += (t[0] + t[1] + t[2] + t[5] + t[6]) / _TICKS_PER_S
            out["idle_s"] += (t[3] + t[4]) / _TICKS_PER_S
            out["stolen_s"] += t[7] / _TICKS_PER_S
        return out
    per_cpu = psutil.cpu_times(percpu=True)  # elsewhere (no /proc/stat): psutil's own way
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
    process's waits). Each mark reads /proc/stat (~13 µs, see _per_cpu_ticks), so it suits waits, not every step."""

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
