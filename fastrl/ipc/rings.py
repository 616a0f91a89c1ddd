"""Single-producer single-consumer rings in shared memory, with futex doorbells.

Why not a locked queue: a process killed with SIGKILL while it holds a queue's mutex leaves it
locked forever, and every process that touches that queue afterwards hangs. A worker can die at
any instant (kill -9, a segfaulting env), and the run must go on, so every hot-path channel is a
ring with exactly one writer per cell: the producer alone advances `head`, the consumer alone
advances `tail`. A producer killed mid-push has published nothing (head moves last); a consumer
killed mid-pop leaves the record for its replacement. No lock exists that could be left held.

Ordering: the producer writes the record, then head; the consumer reads head, then the record.
On x86-64 stores are seen in program order, which this relies on (fastrl targets x86-64 Linux).

Waking: each consumer has a Doorbell, [seq, waiters] as int32 in shared memory. A producer
bumps seq after pushing and calls FUTEX_WAKE; a consumer with nothing to read sets waiters and
sleeps in FUTEX_WAIT on the seq it saw before checking its rings, so a push that lands in between
makes the wait return at once. Several producers may share one doorbell; in the Python version a
lost increment can only delay a wake-up until the wait's timeout, never lose a record.

Two implementations share this memory layout: these classes in Python (the reference), and
fastrl_ext._rings in C++ (`native=True`, chosen by `system.native_rings`). The native one bumps
seq with a locked add, which lets it read `waiters` safely and skip the wake-up syscall while the
consumer is awake; Python has no fence to offer, so it always pays the syscall.
"""

from __future__ import annotations

import ctypes
import pickle
import time

import numpy as np

import fastrl_ext
from fastrl.buffers.shm import ShmAllocator, ShmArray

_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Doorbell:
    """A futex word and its consumer's waiting flag: producers ring it, one consumer sleeps on it."""

    def __init__(self, cell: ShmArray, native: bool = False):
        if native and fastrl_ext._rings is None:
            raise RuntimeError(f"fastrl_ext is not built ({fastrl_ext.BUILD_ERROR}); reinstall with a C++ compiler")
        self.cell, self.native = cell, native
        self._addr = None

    @staticmethod
    def allocate(alloc: ShmAllocator, name: str, native: bool = False) -> "Doorbell":
        return Doorbell(alloc.array(name, (2,), np.int32), native)

    def __getstate__(self):
        return {"cell": self.cell, "native": self.native}

    def __setstate__(self, state):
        self.cell, self.native, self._addr = state["cell"], state["native"], None

    @property
    def address(self) -> int:
        if self._addr is None:
            self._addr = int(self.cell.array.ctypes.data)
        return self._addr

    @property
    def value(self) -> int:
        return int(self.cell.array[0])

    def ring(self) -> None:
        if self.native:
            fastrl_ext._rings.ring(self.address)
            return
        arr = self.cell.array
        arr[0] = (int(arr[0]) + 1) & 0x7FFFFFFF
        _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self.address), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)

    def wait(self, seen: int, timeout_s: float) -> None:
        """Sleep until rung (or `timeout_s`), unless it was rung since `seen` was read."""
        if self.native:
            fastrl_ext._rings.wait(self.address, seen, float(timeout_s))
            return
        if timeout_s <= 0:
            return
        ts = _Timespec(int(timeout_s), int((timeout_s % 1.0) * 1e9))
        arr = self.cell.array
        arr[1] = 1  # a native producer skips the wake-up unless this is set
        _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self.address), _FUTEX_WAIT, ctypes.c_int(seen),
                      ctypes.byref(ts), None, 0)
        arr[1] = 0


class IntRing:
    """SPSC ring of fixed-width int64 records (slot indices, request tuples): no pickling."""

    def __init__(self, counters: ShmArray, data: ShmArray, bell: Doorbell):
        self.counters, self.data, self.bell = counters, data, bell  # counters: [head, tail]
        self._native_args = None

    @staticmethod
    def allocate(alloc: ShmAllocator, name: str, capacity: int, width: int, bell: Doorbell) -> "IntRing":
        return IntRing(alloc.array(f"{name}.counters", (2,), np.int64),
                       alloc.array(f"{name}.data", (capacity, width), np.int64), bell)

    def __getstate__(self):
        return {"counters": self.counters, "data": self.data, "bell": self.bell}

    def __setstate__(self, state):
        self.__init__(state["counters"], state["data"], state["bell"])

    @property
    def capacity(self) -> int:
        return self.data.shape[0]

    @property
    def counters_address(self) -> int:
        return self._addresses()[0]

    def _addresses(self) -> tuple:
        """(counters, data, capacity, width) for fastrl_ext: resolved once per process, since
        wait_any asks for the counters' address on every wait of the hot path."""
        if self._native_args is None:
            self._native_args = (int(self.counters.array.ctypes.data), int(self.data.array.ctypes.data),
                                 *self.data.shape)
        return self._native_args

    def __len__(self) -> int:
        c = self.counters.array
        return int(c[0] - c[1])

    @property
    def head(self) -> int:
        """Records ever pushed (the producer's position)."""
        return int(self.counters.array[0])

    @property
    def tail(self) -> int:
        """Records ever popped (the consumer's position)."""
        return int(self.counters.array[1])

    def record_at(self, position: int) -> tuple:
        """The record pushed at `position` (a head value), while no later push has reused its cell."""
        return tuple(self.data.array[position % self.capacity].tolist())

    def push(self, record) -> None:
        """Producer only. Capacity is sized so that the ring cannot overflow (see Channels)."""
        self.push_many((record,))

    def push_many(self, records) -> None:
        """Producer only: publish several records with one head update and one wake-up."""
        if self.bell.native:
            fastrl_ext._rings.push_many(*self._addresses(), self.bell.address, records)
            return
        c = self.counters.array
        head = int(c[0])
        if head - int(c[1]) + len(records) > self.capacity:
            raise OverflowError("ring full: more records in flight than it was sized for")
        for k, record in enumerate(records):
            self.data.array[(head + k) % self.capacity] = record
        c[0] = head + len(records)  # publish after the records are written
        self.bell.ring()

    def pop_all(self, max_records: int = 1 << 30) -> list[tuple]:
        """Consumer only: every waiting record, oldest first."""
        if self.bell.native:
            return fastrl_ext._rings.pop_all(*self._addresses(), max_records)
        c = self.counters.array
        head, tail = int(c[0]), int(c[1])
        n = min(head - tail, max_records)
        if n <= 0:
            return []
        idx = np.arange(tail, tail + n) % self.capacity
        records = [tuple(r) for r in self.data.array[idx].tolist()]
        c[1] = tail + n
        return records

    def peek_all(self) -> list[tuple]:
        """Anyone: the waiting records, without taking them."""
        c = self.counters.array
        head, tail = int(c[0]), int(c[1])
        idx = np.arange(tail, head) % self.capacity
        return [tuple(r) for r in self.data.array[idx].tolist()]


class MsgRing:
    """SPSC ring of pickled messages of bounded size (reports to the runner)."""

    def __init__(self, counters: ShmArray, lengths: ShmArray, data: ShmArray, bell: Doorbell):
        self.counters, self.lengths, self.data, self.bell = counters, lengths, data, bell

    @staticmethod
    def allocate(alloc: ShmAllocator, name: str, capacity: int, record_bytes: int, bell: Doorbell) -> "MsgRing":
        return MsgRing(alloc.array(f"{name}.counters", (2,), np.int64),
                       alloc.array(f"{name}.lengths", (capacity,), np.int64),
                       alloc.array(f"{name}.data", (capacity, record_bytes), np.uint8), bell)

    @property
    def counters_address(self) -> int:
        return int(self.counters.array.ctypes.data)

    def __len__(self) -> int:
        c = self.counters.array
        return int(c[0] - c[1])

    def try_push(self, message: dict, wake: bool = True) -> bool:
        """Producer only. False if the ring is full or the message too big (reports are best-effort).
        `wake=False` leaves the consumer asleep: it finds the message at its next poll."""
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        c = self.counters.array
        head = int(c[0])
        capacity, record_bytes = self.data.shape
        if head - int(c[1]) >= capacity or len(payload) > record_bytes:
            return False
        i = head % capacity
        self.data.array[i, :len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        self.lengths.array[i] = len(payload)
        c[0] = head + 1
        if wake:
            self.bell.ring()
        return True

    def push(self, message: dict, timeout_s: float = 1.0, wake: bool = True) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.try_push(message, wake):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def pop_all(self) -> list[dict]:
        c = self.counters.array
        head, tail = int(c[0]), int(c[1])
        capacity = self.data.shape[0]
        out = []
        for k in range(tail, head):
            i = k % capacity
            out.append(pickle.loads(self.data.array[i, :int(self.lengths.array[i])].tobytes()))
        c[1] = head
        return out


def wait_any(bell: Doorbell, rings: list, timeout_s: float) -> None:
    """Consumer: return when one of `rings` (all rung on `bell`) has a record, or after the timeout."""
    if bell.native:
        fastrl_ext._rings.wait_any(bell.address, [r.counters_address for r in rings], float(timeout_s))
        return
    seen = bell.value
    if any(len(r) for r in rings):
        return
    bell.wait(seen, timeout_s)
