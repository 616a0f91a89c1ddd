"""The lock-free rings that connect the processes: order, capacity, wake-ups across processes,
and the property they exist for: a process killed with SIGKILL at any moment cannot wedge them.

Every test runs on both implementations, the Python reference and fastrl_ext's C++ (`native`),
which share one memory layout; the mixed tests put one of each on the two ends of a ring."""

import multiprocessing as mp
import os
import pickle
import signal
import time

import numpy as np
import pytest

from fastrl.buffers import ShmAllocator
from fastrl.ipc import Doorbell, IntRing, MsgRing, put_report, wait_any


@pytest.fixture
def alloc():
    a = ShmAllocator()
    yield a
    a.unlink_all()


@pytest.fixture(params=[False, True], ids=["python", "native"])
def native(request):
    return request.param


def as_impl(obj, native: bool):
    """The same shared ring or bell, driven by the other implementation (what another process could do)."""
    clone = pickle.loads(pickle.dumps(obj))
    bell = clone if isinstance(clone, Doorbell) else clone.bell
    bell.native = native
    return clone


def test_int_ring_is_fifo_and_wraps(alloc, native):
    bell = Doorbell.allocate(alloc, "bell", native)
    ring = IntRing.allocate(alloc, "r", 4, 2, bell)
    seen = []
    for i in range(10):  # wraps around the 4 records twice
        ring.push((i, -i))
        ring.push((i + 100, 0))
        seen += ring.pop_all()
    assert seen == [x for i in range(10) for x in ((i, -i), (i + 100, 0))]
    assert ring.pop_all() == [] and len(ring) == 0


def test_int_ring_refuses_to_overwrite(alloc, native):
    ring = IntRing.allocate(alloc, "r", 3, 1, Doorbell.allocate(alloc, "bell", native))
    for i in range(3):
        ring.push(i)
    with pytest.raises(OverflowError):
        ring.push(3)
    assert ring.peek_all() == [(0,), (1,), (2,)] and ring.pop_all(max_records=2) == [(0,), (1,)]
    assert ring.pop_all() == [(2,)]


def test_msg_ring_round_trips_and_rejects_oversized(alloc, native):
    ring = MsgRing.allocate(alloc, "m", 2, 256, Doorbell.allocate(alloc, "bell", native))
    assert ring.try_push({"kind": "episodes", "scores": [1.5, 2.0]})
    assert not ring.try_push({"blob": "x" * 1000})
    assert ring.try_push({"kind": "x"}) and not ring.try_push({"kind": "full"})
    assert ring.pop_all() == [{"kind": "episodes", "scores": [1.5, 2.0]}, {"kind": "x"}]


def test_routine_reports_wait_for_the_runners_poll_and_the_rest_wake_it(alloc, native):
    """Learner batches and finished episodes arrive up to hundreds of times a second: they must not
    ring the runner's bell (each wake-up costs it CPU and preempts the sender); errors and anything
    else must, or a crash report or the first weights' layout would wait for the next poll."""
    bell = Doorbell.allocate(alloc, "bell", native)
    ring = MsgRing.allocate(alloc, "m", 8, 1024, bell)
    rung = bell.value
    put_report(ring, {"kind": "learner", "loss": 0.5})
    put_report(ring, {"kind": "episodes", "scores": [1.0], "lengths": [3]})
    assert bell.value == rung and len(ring) == 2  # queued, nobody woken
    put_report(ring, {"kind": "error", "process": "p", "traceback": "boom"})
    assert bell.value != rung
    rung = bell.value
    put_report(ring, {"kind": "weights_layout", "layout": []})
    assert bell.value != rung
    assert [m["kind"] for m in ring.pop_all()] == ["learner", "episodes", "error", "weights_layout"]


def _producer(ring, n, delay_s):
    time.sleep(delay_s)
    for i in range(n):
        while len(ring) >= ring.capacity:
            time.sleep(0.0001)
        ring.push(i)


def test_consumer_sleeps_until_a_producer_in_another_process_pushes(alloc, native):
    bell = Doorbell.allocate(alloc, "bell", native)
    ring = IntRing.allocate(alloc, "r", 64, 1, bell)
    p = mp.get_context("spawn").Process(target=_producer, args=(ring, 5000, 0.5))
    p.start()
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 5000 and time.monotonic() < deadline:
        wait_any(bell, [ring], 10.0)  # a long timeout: only the doorbell can end these waits in time
        got += [r[0] for r in ring.pop_all()]
    p.join(10)
    assert got == list(range(5000))


def _spin_producer(ring):
    i = 0
    while True:
        if len(ring) < ring.capacity:
            ring.push(i)
            i += 1


def test_a_producer_killed_mid_push_leaves_the_ring_usable(alloc, native):
    """SIGKILL lands wherever the producer is; the consumer still sees a gap-free prefix."""
    bell = Doorbell.allocate(alloc, "bell", native)
    ring = IntRing.allocate(alloc, "r", 16, 1, bell)
    ctx = mp.get_context("spawn")
    for _ in range(3):
        p = ctx.Process(target=_spin_producer, args=(ring,))
        p.start()
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 2000 and time.monotonic() < deadline:
            got += [r[0] for r in ring.pop_all()]
        os.kill(p.pid, signal.SIGKILL)
        p.join(5)
        got += [r[0] for r in ring.pop_all()]
        assert len(got) >= 2000 and np.all(np.diff(got) == 1)  # each producer counts from 0, in order
        ring.push(-1)  # the ring still works after the kill
        assert ring.pop_all() == [(-1,)]


def test_native_and_python_ends_interoperate(alloc):
    ring = IntRing.allocate(alloc, "r", 8, 3, Doorbell.allocate(alloc, "bell", False))
    native_end = as_impl(ring, True)
    for i in range(20):
        native_end.push_many([(i, 1, 2), (i, -1, -2)])
        assert ring.pop_all() == [(i, 1, 2), (i, -1, -2)]
        ring.push((i, 0, 0))
        assert native_end.pop_all() == [(i, 0, 0)]


def test_native_rejects_bad_records_without_publishing(alloc):
    ring = IntRing.allocate(alloc, "r", 4, 2, Doorbell.allocate(alloc, "bell", True))
    with pytest.raises(ValueError):
        ring.push((1, 2, 3))
    with pytest.raises(TypeError):
        ring.push_many([(1, 2), ("x", 3)])
    with pytest.raises(OverflowError):
        ring.push_many([(i, i) for i in range(5)])
    assert len(ring) == 0 and ring.pop_all() == []


def _echo(requests, replies, n):
    for _ in range(n):
        got = []
        while not got:
            wait_any(requests.bell, [requests], 10.0)
            got = requests.pop_all()
        replies.push_many(got)


@pytest.mark.parametrize("echo_native", [False, True], ids=["echo-python", "echo-native"])
def test_ping_pong_never_loses_a_wake_up(alloc, native, echo_native):
    """2,000 round trips, each side asleep between them: a lost wake-up would stall a round trip
    for the 10 s timeout, so finishing in time shows the skip-the-syscall protocol is safe."""
    n = 2000
    requests = IntRing.allocate(alloc, "req", 4, 1, Doorbell.allocate(alloc, "bell.echo", echo_native))
    replies = IntRing.allocate(alloc, "rep", 4, 1, Doorbell.allocate(alloc, "bell.main", native))
    p = mp.get_context("spawn").Process(target=_echo, args=(as_impl(requests, native), as_impl(replies, echo_native), n))
    p.start()
    started = time.monotonic()
    try:
        for i in range(n):
            requests.push(i)
            got = []
            while not got:
                wait_any(replies.bell, [replies], 10.0)
                got = replies.pop_all()
            assert got == [(i,)]
            assert time.monotonic() - started < 60
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
