"""The lock-free rings that connect the processes: order, capacity, wake-ups across processes,
and the property they exist for: a process killed with SIGKILL at any moment cannot wedge them."""

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

from fastrl.buffers import ShmAllocator
from fastrl.ipc import Doorbell, IntRing, MsgRing, wait_any


@pytest.fixture
def alloc():
    a = ShmAllocator()
    yield a
    a.unlink_all()


def test_int_ring_is_fifo_and_wraps(alloc):
    bell = Doorbell.allocate(alloc, "bell")
    ring = IntRing.allocate(alloc, "r", 4, 2, bell)
    seen = []
    for i in range(10):  # wraps around the 4 records twice
        ring.push((i, -i))
        ring.push((i + 100, 0))
        seen += ring.pop_all()
    assert seen == [x for i in range(10) for x in ((i, -i), (i + 100, 0))]
    assert ring.pop_all() == [] and len(ring) == 0


def test_int_ring_refuses_to_overwrite(alloc):
    ring = IntRing.allocate(alloc, "r", 3, 1, Doorbell.allocate(alloc, "bell"))
    for i in range(3):
        ring.push(i)
    with pytest.raises(OverflowError):
        ring.push(3)
    assert ring.peek_all() == [(0,), (1,), (2,)] and ring.pop_all(max_records=2) == [(0,), (1,)]
    assert ring.pop_all() == [(2,)]


def test_msg_ring_round_trips_and_rejects_oversized(alloc):
    ring = MsgRing.allocate(alloc, "m", 2, 256, Doorbell.allocate(alloc, "bell"))
    assert ring.try_push({"kind": "episodes", "scores": [1.5, 2.0]})
    assert not ring.try_push({"blob": "x" * 1000})
    assert ring.try_push({"kind": "x"}) and not ring.try_push({"kind": "full"})
    assert ring.pop_all() == [{"kind": "episodes", "scores": [1.5, 2.0]}, {"kind": "x"}]


def _producer(ring, n, delay_s):
    time.sleep(delay_s)
    for i in range(n):
        while len(ring) >= ring.capacity:
            time.sleep(0.0001)
        ring.push(i)


def test_consumer_sleeps_until_a_producer_in_another_process_pushes(alloc):
    bell = Doorbell.allocate(alloc, "bell")
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


def test_a_producer_killed_mid_push_leaves_the_ring_usable(alloc):
    """SIGKILL lands wherever the producer is; the consumer still sees a gap-free prefix."""
    bell = Doorbell.allocate(alloc, "bell")
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
