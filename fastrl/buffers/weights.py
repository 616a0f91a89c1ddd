"""Learner -> inference weight publication through shared memory, guarded by a seqlock.

The learner bumps a sequence number to odd, writes every tensor, then bumps it to even and
stores the new policy version. A reader copies the whole block and keeps the copy only if the
sequence was even and unchanged around the copy, so it never uses half-written weights and
the learner never blocks on a reader. (On x86, loads are not reordered with loads and stores
not with stores, which is all a seqlock of plain memory accesses needs.)

The block holds float32. A run whose actors all hold the whole network in bf16 (a bf16 CNN acting
in torch on the CPU: fastrl.workers.first_weights.acts_in_bf16) also gets an acting block: the same
layout as bf16 bits, behind its own seqlock. The starting weights go into both; the learner's
training versions into the acting block only, rounded by its optimizer already (its bf16 working
copy), and the actors load from it: the same roundings an actor made from float32 at every load, at
half the bytes each side (Pong: 3.4 MB a version, ~57 versions a second while training). The
float32 block then keeps the starting weights, which the learner starts from.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from fastrl.buffers.shm import ShmAllocator, ShmArray

if TYPE_CHECKING:
    import torch

LAYOUT_BYTES = 1 << 16  # a network's layout as JSON: Pong's Nature CNN takes ~0.6 KB
HEADER_LEN = 4  # [seq, policy_version, num_floats, whether an acting block exists]

# torch is imported where weights are touched, not here: a rollout worker that leaves acting to an
# inference process unpickles this class but never loads torch, which saves ~1 CPU-second per
# worker at startup on a 2-core box


def layout_floats(layout: list[tuple[str, tuple, int]]) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) for _, shape, _ in layout)


def state_layout(module: torch.nn.Module) -> list[tuple[str, tuple, int]]:
    layout, offset = [], 0
    for name, tensor in module.state_dict().items():
        n = tensor.numel()
        layout.append((name, tuple(tensor.shape), offset))
        offset += n
    return layout


class LayoutTensors:
    """A module's live parameters and buffers in a layout's order, located once.

    `module.state_dict()` costs 26-59 µs a call on the MLP presets, and the learner publishes
    after every optimizer step: with it and a copy per tensor, publishing took 100 µs of
    HalfCheetah's ~1,400 µs step, against 23 µs now with one `torch.cat` into the block. Each
    tensor is looked up in its owner's table at every call, so a parameter whose `.data` was
    replaced (`module.to(...)`) or a reassigned buffer is still the one read.
    """

    def __init__(self, module: torch.nn.Module, layout: list[tuple[str, tuple, int]]):
        self.module = module
        self.entries = []
        for name, _, _ in layout:
            prefix, _, key = name.rpartition(".")
            owner = module.get_submodule(prefix) if prefix else module
            self.entries.append((owner._parameters if key in owner._parameters else owner._buffers, key))

    def tensors(self) -> list:
        return [table[key] for table, key in self.entries]


class PublishPlan:
    """The copies that write a module's tensors into the block, where every tensor is float32 and on the
    CPU: one `np.copyto` per run of contiguous tensors adjacent in one storage, in the block's order, and
    one per other tensor (a channels-last conv weight), read through its strides into its logical order.

    Why: the MLP presets' learner publishes after every optimizer step, and its trained parameters are
    views of one flat buffer (fastrl.algo.flat_params), laid out in the block's order: their 12 layer
    tensors are one run, HalfCheetah's log-std and the observation normaliser's three buffers four more.
    A publication of HalfCheetah's model took 25 µs with `torch.cat` over the 17 tensors, 5.5 with these
    five copies and the address check (ad hoc, timeit), of a ~435 µs optimizer step. The Pong CNN's
    channels-last conv weights went through `torch.cat`, which first copies each into a new contiguous
    tensor: 873 and 993 µs a publication against 779 and 867 through their strides (bench/weights_microbench.py
    --rounds 21, two runs, caches evicted before each, AVX2 EPYC; the learner publishes ~30 times a second,
    so ~0.1% of its time). Made again when a tensor moves (by address) or a strided tensor's strides change."""

    def __init__(self, tensors: list, block: np.ndarray):
        import torch

        self.key = tuple(map(torch.Tensor.data_ptr, tensors))
        # (index, strides) of the tensors read through their strides: a strided source array is only
        # right while they hold, and a tensor's strides can change without its address changing
        self.strided: list[tuple[int, tuple]] = []
        self.copies: list[tuple[np.ndarray, np.ndarray]] | None = None
        if not all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors):
            return  # torch.cat then: it casts
        copies = []
        runs: list[list] = []  # [storage address, storage offset, elements, block offset, first tensor]
        at = 0
        for i, t in enumerate(tensors):
            n = t.numel()
            if not t.is_contiguous():  # into its logical (state_dict) order, as torch.cat would write it
                self.strided.append((i, t.stride()))
                copies.append((t.detach().numpy(), block[at:at + n].reshape(t.shape)))
                at += n
                continue
            storage, offset = t.untyped_storage().data_ptr(), t.storage_offset()
            last = runs[-1] if runs else None
            # a run grows only where the tensor follows it both in storage and in the block
            if last is not None and last[0] == storage and last[1] + last[2] == offset and last[3] + last[2] == at:
                last[2] += n
            else:
                runs.append([storage, offset, n, at, t])
            at += n
        self.copies = copies
        for _, offset, n, block_at, first in runs:
            source = torch.empty(0, dtype=torch.float32).set_(first.untyped_storage(), offset, (n,))
            self.copies.append((source.detach().numpy(), block[block_at:block_at + n]))

    def matches(self, tensors: list) -> bool:
        import torch

        return (tuple(map(torch.Tensor.data_ptr, tensors)) == self.key
                and all(tensors[i].stride() == strides for i, strides in self.strided))


class SharedWeights:
    """The header exists from the start of a run; the data block once someone has built the model.

    header: [seq, policy_version, num_floats]. num_floats is 0 until the runner has allocated the
    data block (`complete`). On a fresh run the runner does not load torch: inference worker 0 or
    the learner reports its model's layout (fastrl.workers.first_weights), the runner allocates the
    block for it, and processes spawned before that attach it, with their own model's layout
    (`attach`, which checks the sizes agree), or with the layout the runner wrote beside the header
    (`attach_layout`: a rollout worker acting in numpy, which has no model to read one from).
    """

    def __init__(self, header: ShmArray, data: ShmArray | None, layout: list | None, data_name: str,
                 layout_bytes: ShmArray | None = None, acting_header: ShmArray | None = None,
                 acting_name: str | None = None, acting: ShmArray | None = None):
        self.header, self.data, self.layout, self.data_name = header, data, layout, data_name
        # [length, JSON of the layout...] once the block exists (reserve/complete)
        self.layout_bytes = layout_bytes
        # the bf16 acting block (int16 bits, the layout's elements) and its seqlock [seq, policy_version]
        self.acting_header, self.acting_name, self.acting = acting_header, acting_name, acting
        self._tensors: LayoutTensors | None = None  # of the last module published or loaded; never pickled
        self._plan: PublishPlan | None = None  # the learner's copies into the block; never pickled
        self._acting_view = None  # the acting block as a bf16 tensor; never pickled

    def __getstate__(self) -> dict:
        return dict(self.__dict__, _tensors=None, _plan=None, _acting_view=None)

    def layout_tensors(self, module: torch.nn.Module) -> list:
        """`module`'s live tensors in the layout's order (the lookup kept for the module last seen)."""
        if self._tensors is None or self._tensors.module is not module:
            self._tensors = LayoutTensors(module, self.layout)
        return self._tensors.tensors()

    @staticmethod
    def reserve(alloc: ShmAllocator) -> "SharedWeights":
        """The headers alone: what processes spawned before the model exists are handed."""
        header = alloc.array("weights_header", (HEADER_LEN,), np.int64)
        layout_bytes = alloc.array("weights_layout", (LAYOUT_BYTES,), np.uint8)
        acting_header = alloc.array("weights_acting_header", (2,), np.int64)
        return SharedWeights(header, None, None, alloc.name_of("weights_data"), layout_bytes,
                             acting_header, alloc.name_of("weights_acting"))

    def complete(self, alloc: ShmAllocator, layout: list, acting_bf16: bool = False) -> "SharedWeights":
        """Runner: allocate the data block for `layout`, and the bf16 acting block if `acting_bf16`;
        returns the complete handle (self is left as it was)."""
        total = layout_floats(layout)
        encoded = np.frombuffer(json.dumps(layout).encode(), dtype=np.uint8)
        if encoded.size > LAYOUT_BYTES - 8:
            raise ValueError(f"the network's layout takes {encoded.size} bytes as JSON, more than the "
                             f"{LAYOUT_BYTES - 8} reserved for it (fastrl.buffers.weights.LAYOUT_BYTES)")
        self.layout_bytes.array[8:8 + encoded.size] = encoded
        self.layout_bytes.array[:8].view(np.int64)[0] = encoded.size
        data = alloc.array("weights_data", (total,), np.float32)
        acting = alloc.array("weights_acting", (total,), np.int16) if acting_bf16 else None
        self.header.array[3] = int(acting_bf16)
        # written last: readers holding only the header may attach from here on (x86 keeps stores in order)
        self.header.array[2] = total
        return SharedWeights(self.header, data, layout, self.data_name, self.layout_bytes, self.acting_header,
                             self.acting_name, acting)

    @staticmethod
    def allocate(alloc: ShmAllocator, module: torch.nn.Module, acting_bf16: bool = False) -> "SharedWeights":
        return SharedWeights.reserve(alloc).complete(alloc, state_layout(module), acting_bf16)

    @property
    def has_acting_block(self) -> bool:
        """Whether the actors load bf16 versions from the acting block (once attached or complete)."""
        return self.acting is not None

    @property
    def actors_header(self) -> np.ndarray:
        """The seqlock the actors' versions come through, [seq, policy_version, ...] (seq 0: nothing published
        yet): the acting block's where the runner made one, else the float32 block's. Readable before attaching."""
        return self.acting_header.array if self.header.array[3] else self.header.array

    @property
    def is_complete(self) -> bool:
        return self.data is not None

    def attach(self, module: torch.nn.Module) -> bool:
        """Attach the data block, once the runner has allocated it, with `module`'s layout (a torch
        process holding only the header). False while it does not exist yet."""
        def checked_layout(total: int) -> list:
            layout = state_layout(module)
            if layout_floats(layout) != total:
                raise RuntimeError(f"published weights hold {total} floats, this process's model "
                                   f"{layout_floats(layout)}: the two were built from different configs")
            return layout

        return self._attach_with(checked_layout)

    def attach_layout(self) -> bool:
        """`attach` for a process without a model: with the layout the runner wrote beside the header.
        False while the data block does not exist yet."""
        def written_layout(_total: int) -> list:
            size = int(self.layout_bytes.array[:8].view(np.int64)[0])
            return [(name, tuple(shape), offset)
                    for name, shape, offset in json.loads(self.layout_bytes.array[8:8 + size].tobytes())]

        return self._attach_with(written_layout)

    def _attach_with(self, layout_for: Callable[[int], list]) -> bool:
        """Attach the data block with `layout_for(its floats)` once the runner has allocated it."""
        if self.data is not None:
            return True
        total = int(self.header.array[2])
        if total == 0:
            return False
        layout = layout_for(total)
        if self.header.array[3]:
            self.acting = ShmArray(self.acting_name, (total,), np.int16)
        self.data, self.layout = ShmArray(self.data_name, (total,), np.float32), layout
        return True

    @property
    def is_published(self) -> bool:
        return int(self.header.array[0]) > 0

    @property
    def version(self) -> int:
        return int(self.header.array[1])

    def publish(self, module: torch.nn.Module, version: int, acting_tensors: list | None = None) -> None:
        """Write `module`'s weights as `version`: into the float32 block, and rounded into the acting block
        where there is one. `acting_tensors` (the learner's training versions, where the acting block
        exists): the layout's tensors already in bf16, written into the acting block alone."""
        if self.acting is not None:
            self._publish_acting(acting_tensors or self.layout_tensors(module), version)
            if acting_tensors is not None:
                return
        self._publish_float32(module, version)

    def _acting_tensor(self) -> torch.Tensor:
        import torch

        if self._acting_view is None:
            self._acting_view = torch.from_numpy(self.acting.array).view(torch.bfloat16)
        return self._acting_view

    def _publish_acting(self, tensors: list, version: int) -> None:
        import torch

        h, block = self.acting_header.array, self._acting_tensor()
        h[0] += 1  # odd: write in progress
        with torch.no_grad():  # each in its logical (state_dict) order, rounded to bf16 where it is not yet
            for t, (_, shape, offset) in zip(tensors, self.layout):
                block[offset:offset + t.numel()].view(shape).copy_(t)
        h[1] = version
        h[0] += 1  # even: consistent

    def _publish_float32(self, module: torch.nn.Module, version: int) -> None:
        import torch

        h = self.header.array
        tensors = self.layout_tensors(module)
        if self._plan is None or not self._plan.matches(tensors):
            self._plan = PublishPlan(tensors, self.data.array)
        h[0] += 1  # odd: write in progress
        if self._plan.copies is not None:
            for source, destination in self._plan.copies:
                np.copyto(destination, source)
        else:
            with torch.no_grad():  # reshape: a strided tensor is written in its logical (state_dict) order
                torch.cat([t.reshape(-1) for t in tensors], out=torch.from_numpy(self.data.array))
        h[1] = version
        h[0] += 1  # even: consistent

    def try_read(self, staging: torch.Tensor) -> int | None:
        """Copy the published weights into `staging` (flat float32, CPU); return their version or None if torn."""
        return self.try_read_array(staging.numpy())

    def try_read_array(self, staging: np.ndarray) -> int | None:
        """try_read into a numpy array: what a worker that acts in numpy (no torch) reads with."""
        h = self.header.array
        seq_before = int(h[0])
        if seq_before & 1 or seq_before == 0:  # mid-write, or nothing published yet
            return None
        version = int(h[1])
        np.copyto(staging, self.data.array)
        if int(h[0]) != seq_before:
            return None
        return version

    def try_load(self, module: torch.nn.Module, deadline_s: float = 10.0) -> int | None:
        """Load the published weights straight from shared memory into `module`'s tensors, each cast
        to its own dtype; return their version, or None (module untouched) if a write is in progress.

        Without the staging copy a refresh of Pong's CNN into bf16 layers costs 0.65 CPU-ms instead
        of 1.22 (bench/weights_microbench.py, caches cold as they are between an inference worker's
        refreshes; ~30 a second in training).
        The price: a copy the learner overwrote meanwhile has already landed in the module, so it is
        read again, whole, once the write in progress ends (a publication takes ~1 ms). A learner
        that dies mid-write would leave the module torn: after `deadline_s` this raises instead.
        """
        import torch

        # an actor holding the network in bf16 loads the acting block where there is one: the learner's
        # versions go there alone
        h = self.actors_header
        seq_before = int(h[0])
        if seq_before & 1 or seq_before == 0:  # mid-write, or nothing published yet
            return None
        flat = self._acting_tensor() if self.acting is not None else torch.from_numpy(self.data.array)
        give_up_at = time.monotonic() + deadline_s
        while True:
            version = int(h[1])
            self.load_into(module, flat)
            if int(h[0]) == seq_before:
                return version
            while True:  # torn: wait for this write to end, then read again
                if time.monotonic() > give_up_at:
                    raise RuntimeError(f"the published weights stayed torn for {deadline_s:g} s "
                                       "(did the learner stop in the middle of publishing?)")
                seq_before = int(h[0])
                if not seq_before & 1:
                    break
                time.sleep(100e-6)

    def load_into(self, module: torch.nn.Module, staging: torch.Tensor) -> None:
        import torch

        with torch.no_grad():
            for t, (_, shape, offset) in zip(self.layout_tensors(module), self.layout):
                t.copy_(staging[offset:offset + t.numel()].view(shape))

    def new_staging(self) -> torch.Tensor:
        import torch

        return torch.empty(self.data.shape[0], dtype=torch.float32)

