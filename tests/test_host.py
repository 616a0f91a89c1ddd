"""fastrl.host: the cores' accounting the learner keeps over its waits for data. The spans here are
long enough (0.8 s) for the kernel's 10 ms ticks, and the machine is shared with nothing but this
test, so an idle span reads mostly idle and a span with every core spinning reads mostly busy."""

import multiprocessing as mp
import time

import pytest

from fastrl.host import CoresDuringWaits, idle_share, usable_cpus


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
