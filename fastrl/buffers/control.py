"""Small shared counters every process reads or writes: the stop flag, heartbeats, env steps,
the time each process spent waiting on the others (what `fastrl bench` turns into busy and idle
fractions), and the bookkeeping that lets the runner replace a dead worker safely.

Each cell has exactly one writer, so no locking is needed:
- runner: flags (stop, reclaim epoch, inference epoch), rollout generations
- each worker: its own heartbeat, wait time and counters
- rollout worker w: slot_owner cells of the slots it holds (the runner clears them after w died)

Replacing a dead rollout worker w: the runner bumps `rollout_generation[w]` (inference workers
then ignore w's old requests) and the reclaim epoch, waits until every inference worker has
begun a batch after that (`inference_seen_epoch`), so no late write can land in w's slots, and
only then frees the slots `slot_owner` says w held.

The two moments a slot changes hands between w and its rings (taken from the free ring, handed to
the full ring) are each a few lines, and w can die between any two. `slot_journal[w]` says which
one w is inside and where the ring stood, so that the runner can finish or undo it afterwards
(`repair_journal`): without it a slot popped but not yet owned, or disowned but not yet pushed, was
in no ring and owned by nobody, lost to the run for good.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from fastrl.buffers.shm import ShmAllocator, ShmArray

STOP, RECLAIM_EPOCH, INFERENCE_EPOCH = 0, 1, 2
NO_OWNER = -1
# slot_journal[w] = [op, slot, ring position before the op, w's env_steps before the op]
JOURNAL_IDLE, JOURNAL_HANDOVER, JOURNAL_TAKE = 0, 1, 2


class SharedControl:
    def __init__(self, flags: ShmArray, heartbeats: ShmArray, env_steps: ShmArray, wait_s: ShmArray,
                 inference_counts: ShmArray, rollout_generation: ShmArray, inference_seen_epoch: ShmArray,
                 slot_owner: ShmArray, nonfinite: ShmArray, inflight_steps: ShmArray, slot_journal: ShmArray,
                 making_envs_since: ShmArray):
        self.flags, self.heartbeats, self.env_steps = flags, heartbeats, env_steps
        self.wait_s = wait_s  # per process (heartbeat index): seconds blocked waiting for another process
        self.inference_counts = inference_counts  # per inference worker: [batches, samples]
        self.rollout_generation = rollout_generation  # per rollout worker: bumped each time it is replaced
        self.inference_seen_epoch = inference_seen_epoch  # per inference worker: reclaim epoch at its last batch
        self.slot_owner = slot_owner  # per trajectory slot: rollout worker holding it, or NO_OWNER
        self.nonfinite = nonfinite  # per rollout worker: transitions masked for non-finite obs/reward
        self.inflight_steps = inflight_steps  # per rollout worker: env steps in its unfinished slots (lost if it dies)
        self.slot_journal = slot_journal  # per rollout worker: the slot hand-off it is inside (see the module doc)
        # per process: when its current env-making call began (0: none; see making_envs)
        self.making_envs_since = making_envs_since

    @staticmethod
    def allocate(alloc: ShmAllocator, num_processes: int, num_rollout_workers: int,
                 num_inference_workers: int, num_slots: int) -> "SharedControl":
        control = SharedControl(alloc.array("flags", (3,), np.int64),
                                alloc.array("heartbeats", (num_processes,), np.float64),
                                alloc.array("env_steps", (num_rollout_workers,), np.int64),
                                alloc.array("wait_s", (num_processes,), np.float64),
                                alloc.array("inference_counts", (num_inference_workers, 2), np.int64),
                                alloc.array("rollout_generation", (num_rollout_workers,), np.int64),
                                alloc.array("inference_seen_epoch", (num_inference_workers,), np.int64),
                                alloc.array("slot_owner", (num_slots,), np.int64),
                                alloc.array("nonfinite", (num_rollout_workers,), np.int64),
                                alloc.array("inflight_steps", (num_rollout_workers,), np.int64),
                                alloc.array("slot_journal", (num_rollout_workers, 4), np.int64),
                                alloc.array("making_envs_since", (num_processes,), np.float64))
        control.slot_owner.array[:] = NO_OWNER
        return control

    def request_stop(self) -> None:
        self.flags.array[STOP] = 1

    @property
    def stop_requested(self) -> bool:
        return bool(self.flags.array[STOP])

    def beat(self, process_index: int) -> None:
        self.heartbeats.array[process_index] = time.time()

    @contextlib.contextmanager
    def making_envs(self, process_index: int):
        """Around a call that makes envs and cannot beat meanwhile: envpool makes a group's envs in one
        call that holds the GIL (a helper thread could not beat either), ~0.2 CPU-s per Atari env here,
        so hundreds of envs at idle priority beside a running pipeline took minutes and were taken
        for a hang. The runner allows such a call system.env_make_timeout_s instead."""
        self.beat(process_index)
        self.making_envs_since.array[process_index] = time.time()
        try:
            yield
        finally:
            self.making_envs_since.array[process_index] = 0.0
            self.beat(process_index)

    def add_wait(self, process_index: int, seconds: float) -> None:
        self.wait_s.array[process_index] += seconds

    def total_env_steps(self) -> int:
        return int(self.env_steps.array.sum())

    @property
    def reclaim_epoch(self) -> int:
        return int(self.flags.array[RECLAIM_EPOCH])

    @property
    def inference_epoch(self) -> int:
        return int(self.flags.array[INFERENCE_EPOCH])

    def slots_held_by(self, rollout_index: int) -> list[int]:
        return np.flatnonzero(self.slot_owner.array == rollout_index).tolist()

    # --- the slot journal: written by rollout worker w, read and cleared by the runner once w is dead
    def journal_handover(self, rollout_index: int, slot: int, full_ring_head: int) -> None:
        """w is about to disown `slot`, count its steps and push it to its full ring, whose head is this."""
        self._journal(rollout_index, JOURNAL_HANDOVER, slot, full_ring_head)

    def journal_take(self, rollout_index: int, free_ring_tail: int) -> None:
        """w is about to pop a slot from its free ring, whose tail is this, and own it."""
        self._journal(rollout_index, JOURNAL_TAKE, NO_OWNER, free_ring_tail)

    def _journal(self, rollout_index: int, op: int, slot: int, position: int) -> None:
        entry = self.slot_journal.array[rollout_index]
        entry[1:] = (slot, position, self.env_steps.array[rollout_index])
        entry[0] = op  # last: an entry that says an op is under way is whole

    def journal_done(self, rollout_index: int) -> None:
        self.slot_journal.array[rollout_index, 0] = JOURNAL_IDLE

    def repair_journal(self, rollout_index: int, full_ring, free_ring) -> str | None:
        """After w died: finish or undo the hand-off its journal says it was inside, so that every slot
        is again in a ring or owned. A handover whose push had not landed is undone (w owns the slot
        again and its steps are uncounted); a take whose pop had landed is finished (w owns the slot
        it popped). The caller then reclaims w's slots as usual. Says what it did, or None."""
        op, slot, position, steps_before = (int(x) for x in self.slot_journal.array[rollout_index])
        self.journal_done(rollout_index)
        if op == JOURNAL_HANDOVER and full_ring.head <= position:
            self.slot_owner.array[slot] = rollout_index
            self.env_steps.array[rollout_index] = steps_before
            return f"took back slot {slot}, which it died handing over"
        if op == JOURNAL_TAKE and free_ring.tail > position:
            slot = free_ring.record_at(position)[0]  # still there: the ring holds more cells than slots
            if self.slot_owner.array[slot] != rollout_index:
                self.slot_owner.array[slot] = rollout_index
                return f"kept slot {slot}, which it died taking"
        return None
