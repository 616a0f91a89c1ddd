"""A slot changing hands between a rollout worker and its rings (RolloutWorker._take_free_slot and
_record), with the worker killed between any two lines of it.

The run's books stay right only if, at the moment a slot index reaches the learner's ring, the
worker no longer owns the slot (else the supervisor would reclaim it and it would be trained twice)
and its env steps are already counted (else a slot could be trained uncounted). And once the runner
has read the dead worker's slot journal (SharedControl.repair_journal), every slot must again be in
exactly one place (its free ring, its full ring, or owned by the worker, for the replacement to
adopt), with the worker's env steps counting exactly the slots it delivered: no slot lost, none
twice."""

import os
import signal
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from fastrl.buffers import ShmAllocator
from fastrl.buffers.control import JOURNAL_HANDOVER, NO_OWNER, SharedControl
from fastrl.ipc.rings import Doorbell, IntRing
from fastrl.workers.rollout import RolloutWorker, WouldBlock

T, NUM_ENVS, NUM_SLOTS = 4, 3, 4


class RecordingRing(IntRing):
    """A full-slot ring that notes what the shared counters and the journal said when each slot arrived."""

    def push_many(self, records) -> None:
        c = self.control
        for record in records:
            slot = int(np.ravel(record)[0])
            self.seen.append((slot, int(c.slot_owner.array[slot]), int(c.env_steps.array[0]),
                              tuple(int(x) for x in c.slot_journal.array[0])))
        super().push_many(records)


@pytest.fixture()
def alloc():
    alloc = ShmAllocator()
    yield alloc
    alloc.unlink_all()


def _worker(alloc, recording: bool = False):
    """Rollout worker 0 of one group, holding slot 0 one step before it fills; slots 1-3 in its free ring."""
    control = SharedControl.allocate(alloc, num_processes=3, num_rollout_workers=1, num_inference_workers=1,
                                     num_slots=NUM_SLOTS)
    bell = Doorbell.allocate(alloc, "bell")
    full = IntRing.allocate(alloc, "full", NUM_SLOTS + 1, 1, bell)
    if recording:
        full.__class__ = RecordingRing
        full.control, full.seen = control, []
    free = IntRing.allocate(alloc, "free", NUM_SLOTS + 1, 1, bell)
    free.push_many([1, 2, 3])
    control.slot_owner.array[0] = 0
    recorder = SimpleNamespace(record=lambda *args: None, take_finished=lambda: ([], []))
    w = SimpleNamespace(index=0, hb=0, T=T, num_envs=NUM_ENVS, control=control, recorder=recorder, envs=[None],
                        full_ring=full, free_ring=free, bell=bell, adopted=[], block=False, slot=[0], t=[T - 1],
                        next_slot=[-1], obs=np.zeros((NUM_SLOTS, T + 1, 2), np.float32), slots_handed_over=0,
                        reports=None, env_steps_budget=2 * T * NUM_ENVS, budget_spent=False)
    return w


def _one_handover(w) -> None:
    """What pump does around a slot boundary: take the next slot a step early, then fill the current one."""
    w.next_slot[0] = RolloutWorker._take_free_slot(w)
    RolloutWorker._record(w, 0)


def test_a_full_slot_reaches_the_ring_unowned_counted_and_journaled(alloc):
    w = _worker(alloc, recording=True)
    _one_handover(w)
    (slot, owner, env_steps, journal), = w.full_ring.seen
    assert (slot, owner, env_steps) == (0, NO_OWNER, T * NUM_ENVS)
    assert journal == (JOURNAL_HANDOVER, 0, 0, 0)  # the runner could tell whether this push landed
    assert w.slots_handed_over == 1 and w.slot == [1] and w.t == [0]
    assert w.control.slot_journal.array[0, 0] == 0 and w.control.slot_owner.array[1] == 0


def test_in_flight_steps_count_the_unfinished_slot_only(alloc):
    w = _worker(alloc)
    _one_handover(w)
    RolloutWorker._record(w, 0)
    assert int(w.control.inflight_steps.array[0]) == NUM_ENVS


def test_the_handover_that_reaches_the_env_step_target_spends_the_budget(alloc):
    """A worker steps no further once a slot it hands over brings the run to train_for_env_steps (here two
    slots' worth), and not before."""
    w = _worker(alloc)
    _one_handover(w)
    assert not w.budget_spent
    for _ in range(T - 1):
        RolloutWorker._record(w, 0)
    assert not w.budget_spent  # steps in an unfinished slot do not count
    _one_handover(w)
    assert w.budget_spent and int(w.control.env_steps.array[0]) == 2 * T * NUM_ENVS
    with pytest.raises(WouldBlock):  # the serial driver's worker: nothing to do until the run stops
        RolloutWorker._wait_for_stop(w)


# the code a kill can land in: the worker's two methods and what they call that writes shared memory
TRACED = {f.__code__ for f in (RolloutWorker._take_free_slot, RolloutWorker._record, SharedControl.journal_handover,
                               SharedControl.journal_take, SharedControl.journal_done, IntRing.push_many,
                               IntRing.pop_all)}


def _killed_at_line(w, k: int) -> bool:
    """Runs one handover in a forked child that SIGKILLs itself at the k-th line it executes in TRACED
    (a real kill: no finally block runs); True if it died, False if it got through."""
    pid = os.fork()
    if pid == 0:  # the child: shares the slots' memory, dies mid-way
        lines = 0

        def local(frame, event, arg):
            nonlocal lines
            if event == "line":
                lines += 1
                if lines == k:
                    os.kill(os.getpid(), signal.SIGKILL)
            return local

        sys.settrace(lambda frame, event, arg: local if frame.f_code in TRACED else None)
        try:
            _one_handover(w)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _census(w) -> list[int]:
    """Where each slot is: every slot once across the free ring, the full ring and the worker's own."""
    free = [r[0] for r in w.free_ring.peek_all()]
    full = [r[0] for r in w.full_ring.peek_all()]
    owned = w.control.slots_held_by(0)
    assert sorted(free + full + owned) == list(range(NUM_SLOTS)), (free, full, owned)
    assert int(w.control.env_steps.array[0]) == T * NUM_ENVS * len(full), (full, w.control.env_steps.array[0])
    return full


def test_a_worker_killed_anywhere_in_a_handover_loses_no_slot():
    """Kill points: every line of the take and the handover (each one a fresh worker), then one run
    that gets through. After repair_journal, every slot is somewhere once and counted iff delivered."""
    outcomes, k = [], 1
    while True:
        fresh = ShmAllocator()
        try:
            w = _worker(fresh)
            killed = _killed_at_line(w, k)
            repaired = w.control.repair_journal(0, w.full_ring, w.free_ring)
            full = _census(w)
            assert w.control.slot_journal.array[0, 0] == 0
        finally:
            fresh.unlink_all()
        outcomes.append((k, killed, full, repaired))
        if not killed:
            break
        k += 1
        assert k < 200, "the handover never completed"
    assert outcomes[-1][2] == [0]  # got through: slot 0 delivered
    repairs = [o[3] for o in outcomes if o[3]]
    # the two windows the journal exists for were both hit, and repaired
    assert any("died taking" in r for r in repairs) and any("died handing over" in r for r in repairs), outcomes
