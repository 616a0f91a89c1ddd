"""Small shared counters every process reads or writes: the stop flag, heartbeats, env steps.

Each cell has exactly one writer (a worker's own heartbeat and env-step counter; the runner's
stop flag), so no locking is needed.
"""

from __future__ import annotations

import time

import numpy as np

from fastrl.buffers.shm import ShmAllocator, ShmArray


class SharedControl:
    def __init__(self, flags: ShmArray, heartbeats: ShmArray, env_steps: ShmArray):
        self.flags, self.heartbeats, self.env_steps = flags, heartbeats, env_steps

    @staticmethod
    def allocate(alloc: ShmAllocator, num_processes: int, num_rollout_workers: int) -> "SharedControl":
        return SharedControl(alloc.array("flags", (1,), np.int64),
                             alloc.array("heartbeats", (num_processes,), np.float64),
                             alloc.array("env_steps", (num_rollout_workers,), np.int64))

    def request_stop(self) -> None:
        self.flags.array[0] = 1

    @property
    def stop_requested(self) -> bool:
        return bool(self.flags.array[0])

    def beat(self, process_index: int) -> None:
        self.heartbeats.array[process_index] = time.time()

    def total_env_steps(self) -> int:
        return int(self.env_steps.array.sum())
