"""The order in which a rollout worker hands a full slot to the learner (RolloutWorker._record).

A worker can be killed between any two lines. The run's counters stay consistent only if, at the
moment a slot index reaches the learner's ring, the worker no longer owns the slot (else the
supervisor would reclaim it and it would be trained twice) and its env steps are already counted
(else a slot could be trained without being counted: trained > delivered)."""

from types import SimpleNamespace

import numpy as np

from fastrl.buffers.control import NO_OWNER
from fastrl.workers.rollout import RolloutWorker

T, NUM_ENVS = 4, 3


class RecordingRing:
    """A full-slot ring that notes what the shared counters said when each slot arrived."""

    def __init__(self, control):
        self.control, self.seen = control, []

    def push(self, slot):
        self.seen.append((slot, int(self.control.slot_owner.array[slot]), int(self.control.env_steps.array[0])))


def _worker():
    control = SimpleNamespace(slot_owner=SimpleNamespace(array=np.zeros(4, np.int64)),
                              env_steps=SimpleNamespace(array=np.zeros(1, np.int64)),
                              inflight_steps=SimpleNamespace(array=np.zeros(1, np.int64)))
    recorder = SimpleNamespace(record=lambda *args: None, take_finished=lambda: ([], []))
    return SimpleNamespace(index=0, T=T, num_envs=NUM_ENVS, control=control, recorder=recorder, envs=[None],
                           full_ring=RecordingRing(control), slot=[0], t=[0], next_slot=[1],
                           obs=np.zeros((4, T + 1, 2), np.float32), slots_handed_over=0, reports=None)


def test_a_full_slot_reaches_the_ring_unowned_and_already_counted():
    w = _worker()
    for step in range(2 * T):
        if step == T:
            w.next_slot[0] = 2
        RolloutWorker._record(w, 0)
    assert w.full_ring.seen == [(0, NO_OWNER, T * NUM_ENVS), (1, NO_OWNER, 2 * T * NUM_ENVS)]
    assert w.slots_handed_over == 2 and w.slot == [2] and w.t == [0]


def test_in_flight_steps_count_the_unfinished_slot_only():
    w = _worker()
    for _ in range(T + 1):
        RolloutWorker._record(w, 0)
    assert int(w.control.inflight_steps.array[0]) == NUM_ENVS
