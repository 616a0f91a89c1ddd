"""Small shared counters every process reads or writes: the stop flag, heartbeats, env steps,
and the time each process spent waiting on the others (what `fastrl bench` turns into busy and
idle fractions).

Each cell has exactly one writer (a worker's own heartbeat, wait time and counters; the runner's
stop flag), so no locking is needed.
"""

from __future__ import annotations

import time

import numpy as np

from fastrl.buffers.shm import ShmAllocator, ShmArray


class SharedControl:
    def __init__(self, flags: ShmArray, heartbeats: ShmArray, env_steps: ShmArray, wait_s: ShmArray,
                 inference_counts: ShmArray):
        self.flags, self.heartbeats, self.env_steps = flags, heartbeats, env_steps
        self.wait_s = wait_s  # per process (heartbeat index): seconds blocked waiting for another process
        self.inference_counts = inference_counts  # per inference worker: [batches, samples]

    @staticmethod
    def allocate(alloc: ShmAllocator, num_processes: int, num_rollout_workers: int,
                 num_inference_workers: int) -> "SharedControl":
        return SharedControl(alloc.array("flags", (1,), np.int64),
                             alloc.array("heartbeats", (num_processes,), np.float64),
                             alloc.array("env_steps", (num_rollout_workers,), np.int64),
                             alloc.array("wait_s", (num_processes,), np.float64),
                             alloc.array("inference_counts", (num_inference_workers, 2), np.int64))

    def request_stop(self) -> None:
        self.flags.array[0] = 1

    @property
    def stop_requested(self) -> bool:
        return bool(self.flags.array[0])

    def beat(self, process_index: int) -> None:
        self.heartbeats.array[process_index] = time.time()

    def add_wait(self, process_index: int, seconds: float) -> None:
        self.wait_s.array[process_index] += seconds

    def total_env_steps(self) -> int:
        return int(self.env_steps.array.sum())
