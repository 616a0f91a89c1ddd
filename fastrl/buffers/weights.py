"""Learner -> inference weight publication through shared memory, guarded by a seqlock.

The learner bumps a sequence number to odd, writes every tensor, then bumps it to even and
stores the new policy version. A reader copies the whole block and keeps the copy only if the
sequence was even and unchanged around the copy, so it never uses half-written weights and
the learner never blocks on a reader. (On x86, loads are not reordered with loads and stores
not with stores, which is all a seqlock of plain memory accesses needs.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fastrl.buffers.shm import ShmAllocator, ShmArray

if TYPE_CHECKING:
    import torch

# torch is imported where weights are touched, not here: a rollout worker that leaves acting to an
# inference process unpickles this class but never loads torch, which saves ~1 CPU-second per
# worker at startup on a 2-core box


def state_layout(module: torch.nn.Module) -> list[tuple[str, tuple, int]]:
    layout, offset = [], 0
    for name, tensor in module.state_dict().items():
        n = tensor.numel()
        layout.append((name, tuple(tensor.shape), offset))
        offset += n
    return layout


class SharedWeights:
    def __init__(self, header: ShmArray, data: ShmArray, layout: list):
        self.header, self.data, self.layout = header, data, layout

    @staticmethod
    def allocate(alloc: ShmAllocator, module: torch.nn.Module) -> "SharedWeights":
        layout = state_layout(module)
        total = sum(int(np.prod(shape, dtype=np.int64)) for _, shape, _ in layout)
        header = alloc.array("weights_header", (2,), np.int64)  # [seq, policy_version]
        data = alloc.array("weights_data", (total,), np.float32)
        return SharedWeights(header, data, layout)

    @property
    def version(self) -> int:
        return int(self.header.array[1])

    def publish(self, module: torch.nn.Module, version: int) -> None:
        import torch

        h = self.header.array
        flat = torch.from_numpy(self.data.array)
        state = module.state_dict()
        h[0] += 1  # odd: write in progress
        for name, shape, offset in self.layout:
            t = state[name]
            flat[offset:offset + t.numel()].copy_(t.detach().reshape(-1))
        h[1] = version
        h[0] += 1  # even: consistent

    def try_read(self, staging: torch.Tensor) -> int | None:
        """Copy the published weights into `staging` (flat float32, CPU); return their version or None if torn."""
        return self.try_read_array(staging.numpy())

    def try_read_array(self, staging: np.ndarray) -> int | None:
        """try_read into a numpy array: what a worker that acts in numpy (no torch) reads with."""
        h = self.header.array
        seq_before = int(h[0])
        if seq_before & 1:
            return None
        version = int(h[1])
        np.copyto(staging, self.data.array)
        if int(h[0]) != seq_before:
            return None
        return version

    def load_into(self, module: torch.nn.Module, staging: torch.Tensor) -> None:
        import torch

        state = module.state_dict()
        with torch.no_grad():
            for name, shape, offset in self.layout:
                t = state[name]
                t.copy_(staging[offset:offset + t.numel()].view(shape))

    def new_staging(self) -> torch.Tensor:
        import torch

        return torch.empty(self.data.shape[0], dtype=torch.float32)

