"""Shared memory: trajectory slots, published weights and control counters, allocated once by the runner."""

from fastrl.buffers.control import SharedControl
from fastrl.buffers.shm import ShmAllocator, ShmArray, remove_stale_segments
from fastrl.buffers.trajectories import TrajBuffers
from fastrl.buffers.weights import SharedWeights

__all__ = ["SharedControl", "SharedWeights", "ShmAllocator", "ShmArray", "TrajBuffers", "remove_stale_segments"]
