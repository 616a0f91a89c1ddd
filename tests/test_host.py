"""fastrl.host: how many cores a process can use (affinity and cgroup quota, read from fake cgroup
trees here), and the cores' accounting the learner keeps over its waits for data. The spans there
are long enough (0.8 s) for the kernel's 10 ms ticks, and the machine is shared with nothing but
this test, so an idle span reads mostly idle and a span with every core spinning reads mostly busy."""

import multiprocessing as mp
import time

import pytest

from fastrl import host
from fastrl.host import CoresDuringWaits, available_cores, cgroup_cpu_quota, idle_share, usable_cpus


def _spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def _wait(meter: CoresDuringWaits, seconds: float) -> float:
    started = time.monotonic()
    meter.begin()
    time.sleep(seconds)
    meter.end()
    return time.monotonic() - started


def test_a_wait_the_cores_sleep_through_reads_idle_and_one_they_spend_busy_does_not():
    cpus = usable_cpus()
    idle_meter, busy_meter = CoresDuringWaits(cpus), CoresDuringWaits(cpus)
    assert idle_share(idle_meter.idle_core_s, idle_meter.core_s) is None  # nothing measured yet
    span_s = _wait(idle_meter, 0.8)
    # every core's time is counted once: busy + idle + stolen over the span is the span times the cores
    assert idle_meter.core_s == pytest.approx(span_s * len(cpus), abs=0.05 * len(cpus) + 0.05)
    assert idle_share(idle_meter.idle_core_s, idle_meter.core_s) > 0.6

    ctx = mp.get_context("spawn")
    spinners = [ctx.Process(target=_spin, args=(3.0,)) for _ in cpus]
    for p in spinners:
        p.start()
    try:
        time.sleep(1.0)  # the spawned interpreters are up and spinning
        _wait(busy_meter, 0.8)
    finally:
        for p in spinners:
            p.join(10)
    assert idle_share(busy_meter.idle_core_s, busy_meter.core_s) < 0.3


def test_spans_accumulate_and_an_end_without_a_begin_counts_nothing():
    meter = CoresDuringWaits()
    meter.end()
    assert meter.core_s == 0.0
    _wait(meter, 0.2)
    first = meter.core_s
    meter.begin()
    meter.begin()  # a second begin inside a span keeps the span's start
    time.sleep(0.2)
    meter.end()
    assert meter.core_s > first > 0
    assert idle_share(0.01, 0.02) is None and idle_share(0.5, 1.0) == 0.5


def _cgroup_v2(tmp_path, own: str, limits: dict[str, str]):
    """A fake /proc/self/cgroup naming `own` in the unified hierarchy, and cpu.max files as `limits` says."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc_cgroup").write_text(f"0::{own}\n")
    root = tmp_path / "cgroup"
    for directory, content in limits.items():
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / "cpu.max").write_text(content)
    return tmp_path / "proc_cgroup", root


def test_cgroup_v2_quota_is_the_tightest_over_the_cgroup_and_its_ancestors(tmp_path):
    own = "/user.slice/run.scope"
    assert cgroup_cpu_quota(*_cgroup_v2(tmp_path / "a", own, {"": "max 100000", "user.slice/run.scope": "150000 100000"})) == 1.5
    # the limit set on a parent binds its children, whose own cpu.max says max
    assert cgroup_cpu_quota(*_cgroup_v2(tmp_path / "b", own, {"user.slice": "50000 100000", "user.slice/run.scope": "max 100000"})) == 0.5
    assert cgroup_cpu_quota(*_cgroup_v2(tmp_path / "c", own, {"user.slice": "300000 100000", "user.slice/run.scope": "200000 100000"})) == 2.0
    assert cgroup_cpu_quota(*_cgroup_v2(tmp_path / "d", own, {"": "max 100000", "user.slice/run.scope": "max 100000"})) is None
    # a container's namespace shows its own cgroup as "/": the mount's root holds its limit
    assert cgroup_cpu_quota(*_cgroup_v2(tmp_path / "e", "/", {"": "400000 100000"})) == 4.0
    assert cgroup_cpu_quota(*_cgroup_v2(tmp_path / "f", own, {"": "garbage"})) is None  # unreadable: no limit


def test_cgroup_v1_quota_and_missing_files(tmp_path):
    proc = tmp_path / "proc_cgroup"
    proc.write_text("4:memory:/job\n3:cpu,cpuacct:/job\n1:name=systemd:/\n")
    job = tmp_path / "cgroup" / "cpu" / "job"
    job.mkdir(parents=True)
    (job / "cpu.cfs_period_us").write_text("100000\n")
    (job / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(proc, tmp_path / "cgroup") is None  # -1: no limit
    (job / "cpu.cfs_quota_us").write_text("250000\n")
    assert cgroup_cpu_quota(proc, tmp_path / "cgroup") == 2.5
    assert cgroup_cpu_quota(tmp_path / "absent", tmp_path / "cgroup") is None  # no /proc (not Linux)
    assert cgroup_cpu_quota(proc, tmp_path / "no_mount") is None


def test_available_cores_is_the_affinity_capped_by_the_quota_rounded_up(monkeypatch):
    monkeypatch.setattr(host, "usable_cpus", lambda: [0, 1, 2, 3])
    for quota, cores in ((None, 4), (1.5, 2), (0.5, 1), (2.0, 2), (16.0, 4)):
        monkeypatch.setattr(host, "cgroup_cpu_quota", lambda q=quota: q)
        assert available_cores() == cores


def test_core_times_from_one_pread_agree_with_psutil(monkeypatch):
    """The kept-open /proc/stat read counts what psutil.cpu_times(percpu=True) counts: each figure lies
    between psutil's readings just before and just after it (the counters only grow), give or take a
    tick; where a CPU is missing from /proc/stat it falls back to psutil."""
    cpus = usable_cpus()
    for _ in range(3):
        with monkeypatch.context() as m:
            m.setattr(host, "_per_cpu_ticks", lambda cpus: None)
            before = host.core_times(cpus)
        fast = host.core_times(cpus)
        with monkeypatch.context() as m:
            m.setattr(host, "_per_cpu_ticks", lambda cpus: None)
            after = host.core_times(cpus)
        assert fast["busy_s"] + fast["idle_s"] > 0
        for key in fast:
            assert before[key] - 0.011 <= fast[key] <= after[key] + 0.011, (key, before, fast, after)
    assert host._per_cpu_ticks([10**6]) is None  # no such CPU: core_times takes psutil's path
    assert host.core_times([10**6]) == {"busy_s": 0.0, "idle_s": 0.0, "stolen_s": 0.0}
