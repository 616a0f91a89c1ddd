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
"""

from __future__ import annotations

import time

import numpy as np

from fastrl.buffers.shm import ShmAllocator, ShmArray

STOP, RECLAIM_EPOCH, INFERENCE_EPOCH = 0, 1, 2
NO_OWNER = -1


class SharedControl:
    def __init__(self, flags: ShmArray, heartbeats: ShmArray, env_steps: ShmArray, wait_s: ShmArray,
                 inference_counts: ShmArray, rollout_generation: ShmArray, inference_seen_epoch: ShmArray,
                 slot_owner: ShmArray, nonfinite: ShmArray, inflight_steps: ShmArray):
        self.flags, self.heartbeats, self.env_steps = flags, heartbeats, env_steps
        self.wait_s = wait_s  # per process (heartbeat index): seconds blocked waiting for another process
        self.inference_counts = inference_counts  # per inference worker: [batches, samples]
        self.rollout_generation = rollout_generation  # per rollout worker: bumped each time it is replaced
        self.inference_seen_epoch = inference_seen_epoch  # per inference worker: reclaim epoch at its last batch
        self.slot_owner = slot_owner  # per trajectory slot: rollout worker holding it, or NO_OWNER
        self.nonfinite = nonfinite  # per rollout worker: transitions masked for non-finite obs/reward
        self.inflight_steps = inflight_steps  # per rollout worker: env steps in its unfinished slots (lost if it dies)

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
                                alloc.array("inflight_steps", (num_rollout_workers,), np.int64))
        control.slot_owner.array[:] = NO_OWNER
        return control

    def request_stop(self) -> None:
        self.flags.array[STOP] = 1

    @property
    def stop_requested(self) -> bool:
        return bool(self.flags.array[STOP])

    def beat(self, process_index: int) -> None:
        self.heartbeats.array[process_index] = time.time()

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
