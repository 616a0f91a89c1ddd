"""Shared-memory arrays, the seqlocked weight publication, and the cleanup of segments whose owner
died (its janitor, and the next run's sweep of stale segments)."""

import errno
import multiprocessing as mp
import os
import pickle
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from fastrl.buffers import SharedWeights, ShmAllocator, remove_stale_segments
from fastrl.buffers.shm import SHM_DIR, SharedMemoryFull, ShmArray
from fastrl.buffers.weights import state_layout


def test_segments_are_owner_only_and_unlinked():
    alloc = ShmAllocator()
    arr = alloc.array("x", (3, 4), np.float32)
    mode = stat.S_IMODE(os.stat(SHM_DIR / arr.name).st_mode)
    assert mode == 0o600
    alloc.unlink_all()
    assert not list(SHM_DIR.glob(alloc.prefix + "*"))


def _child_writes(arr):
    arr.array[1, 2] = 42.0


def test_array_is_shared_with_a_spawned_process():
    alloc = ShmAllocator()
    try:
        arr = alloc.array("shared", (2, 3), np.float64)
        assert len(pickle.dumps(arr)) < 300  # travels by name, not by content
        p = mp.get_context("spawn").Process(target=_child_writes, args=(arr,))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        assert arr.array[1, 2] == 42.0
    finally:
        alloc.unlink_all()


OWNER = """
import sys, time
import numpy as np
from fastrl.buffers import ShmAllocator
alloc = ShmAllocator()
arr = alloc.array("obs", (1024,), np.uint8)
print(alloc.prefix, alloc.janitor.pid, flush=True)
time.sleep(60)
"""


def test_a_killed_owners_segments_are_removed_by_its_janitor():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        prefix, janitor_pid = owner.stdout.readline().split()
        assert list(SHM_DIR.glob(prefix + ".*"))
        # a `pkill -f fastrl` aimed at the run must not match the process that cleans up after it
        with open(f"/proc/{janitor_pid}/cmdline") as cmdline:
            assert "fastrl" not in cmdline.read()
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
    deadline = time.monotonic() + 10
    while list(SHM_DIR.glob(prefix + ".*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(SHM_DIR.glob(prefix + ".*")), "a kill -9 left the owner's segments in /dev/shm"


def test_an_orderly_end_lets_the_janitor_go():
    alloc = ShmAllocator()
    alloc.array("x", (4,), np.uint8)
    janitor = alloc.janitor
    assert janitor.poll() is None
    alloc.unlink_all()
    assert janitor.returncode == 0 and alloc.janitor is None
    alloc.array("y", (4,), np.uint8)  # used again: a new janitor watches the new segment
    assert alloc.janitor is not None and alloc.janitor.poll() is None
    alloc.unlink_all()


def test_segments_are_made_without_a_janitor_where_none_can_start(monkeypatch):
    tries = []

    def no_shell(*args, **kwargs):
        tries.append(args)
        raise FileNotFoundError("/bin/sh")

    monkeypatch.setattr(subprocess, "Popen", no_shell)
    alloc = ShmAllocator()
    try:
        arr = alloc.array("x", (4,), np.uint8)
        alloc.array("y", (4,), np.uint8)  # one try per allocator, not one per segment
        assert alloc.janitor is None and (SHM_DIR / arr.name).exists() and len(tries) == 1
    finally:
        alloc.unlink_all()
    assert not list(SHM_DIR.glob(alloc.prefix + ".*"))


def test_a_segment_that_does_not_fit_is_refused_up_front_with_the_space_left(monkeypatch):
    # tmpfs answers posix_fallocate with ENOSPC when full; a sparse segment would instead have
    # killed its first writer with SIGBUS (seen with Docker's 64 MiB /dev/shm and the Pong preset)
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    alloc = ShmAllocator()
    try:
        with pytest.raises(SharedMemoryFull, match=r"no room for 1\.0 MiB more .*obs.*MiB free of .*--shm-size"):
            alloc.array("obs", (1024, 1024), np.uint8)
        assert not list(SHM_DIR.glob(alloc.prefix + ".*")), "the refused segment was left behind"
    finally:
        alloc.unlink_all()


def test_segments_are_reserved_in_full_when_made(monkeypatch):
    reserved = []
    real = os.posix_fallocate
    monkeypatch.setattr(os, "posix_fallocate", lambda fd, offset, length: reserved.append(length) or real(fd, offset, length))
    alloc = ShmAllocator()
    try:
        arr = alloc.array("obs", (3, 5), np.float32)
        assert reserved == [60]
        assert os.stat(SHM_DIR / arr.name).st_blocks * 512 >= 60  # pages allocated, not a sparse file
    finally:
        alloc.unlink_all()


def test_stale_segments_of_dead_runs_are_removed():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = ShmArray(f"fastrl.{dead_pid}.abc.obs", (4,), np.uint8, create=True)
    mine = ShmAllocator()
    live = mine.array("obs", (4,), np.uint8)
    try:
        removed = remove_stale_segments()
        assert stale.name in removed
        assert (SHM_DIR / live.name).exists()
    finally:
        stale.unlink()
        mine.unlink_all()


def test_weights_roundtrip_and_torn_read_detection():
    alloc = ShmAllocator()
    try:
        src = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        dst = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        weights = SharedWeights.allocate(alloc, src)
        weights.publish(src, version=7)
        staging = weights.new_staging()
        assert weights.try_read(staging) == 7
        weights.load_into(dst, staging)
        for a, b in zip(src.state_dict().values(), dst.state_dict().values()):
            assert torch.equal(a, b)
        weights.header.array[0] += 1  # a writer is mid-publication
        assert weights.try_read(staging) is None
    finally:
        alloc.unlink_all()


class _ConvNet(torch.nn.Module):
    """A channels-last conv (its weight is not contiguous in logical order) and a buffer, as the
    learner's models have."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 2)
        self.head = torch.nn.Linear(3, 2)
        self.register_buffer("scale", torch.arange(4.0))


def _flat_state(module) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in module.state_dict().values()])


def test_publish_writes_the_state_dict_in_order_and_follows_replaced_tensors():
    alloc = ShmAllocator()
    try:
        src = _ConvNet().to(memory_format=torch.channels_last)
        assert not src.conv.weight.is_contiguous()
        weights = SharedWeights.allocate(alloc, src)
        weights.publish(src, version=1)
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src))
        assert weights._plan.copies is not None  # the strided weight is read in place, not through torch.cat
        # after the first publication: an optimizer step in place, a parameter whose data was
        # swapped, a buffer reassigned; each must be what the next publication carries
        with torch.no_grad():
            src.head.weight.add_(1.0)
        src.conv.bias.data = torch.full((3,), 5.0)
        src.scale = torch.full((4,), -2.0)
        weights.publish(src, version=2)
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src))
        # the same storage and address seen through other strides: other values in logical order
        conv_weight = src.conv.weight.data
        src.conv.weight.data = conv_weight.as_strided(conv_weight.shape, torch.empty(conv_weight.shape).stride())
        assert src.conv.weight.data_ptr() == conv_weight.data_ptr()
        assert not torch.equal(src.conv.weight, conv_weight)
        weights.publish(src, version=2)
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src))
        staging = weights.new_staging()
        assert weights.try_read(staging) == 2
        dst = _ConvNet()
        weights.load_into(dst, staging)
        assert torch.equal(_flat_state(dst), _flat_state(src))
        assert pickle.loads(pickle.dumps(weights))._tensors is None  # the module never travels with the handle
    finally:
        alloc.unlink_all()


class _FlatNet(torch.nn.Module):
    """A buffer first in the state_dict, then parameters that are views of one flat buffer, as the MLP
    presets' learner model is laid out (the normaliser's statistics, then fastrl.algo.flat_params)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.arange(4.0))
        self.body = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def test_publish_copies_runs_of_adjacent_tensors_and_follows_moved_ones():
    from fastrl.algo.flat_params import FlatParams

    alloc = ShmAllocator()
    try:
        src = _FlatNet()
        flat = FlatParams(list(src.parameters()))
        weights = SharedWeights.allocate(alloc, src)
        weights.publish(src, version=1)
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src))
        assert len(weights._plan.copies) == 2  # the buffer, then the four parameters as one run
        with torch.no_grad():
            flat.data.add_(1.0)  # an optimizer step over the flat buffer
        src.scale.mul_(3.0)
        weights.publish(src, version=2)
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src))
        src.body[0].bias.data = torch.full((6,), 7.0)  # moved out of the flat buffer: the run splits
        src.scale = torch.full((4,), -2.0)
        weights.publish(src, version=3)
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src))
        assert len(weights._plan.copies) == 4
        assert weights.version == 3
        other = torch.randn(60)  # one storage, the layer's weight and bias 10 elements apart: two runs
        src.body[0].weight.data, src.body[0].bias.data = other[:30].view(6, 5), other[40:46]
        weights.publish(src, version=3)
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src))
        src.body.to(torch.float64)  # not float32: written through torch.cat, cast
        weights.publish(src, version=4)
        assert weights._plan.copies is None
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src).float())
        assert pickle.loads(pickle.dumps(weights))._plan is None
    finally:
        alloc.unlink_all()


class _Interleaved(torch.nn.Module):
    """A strided parameter between two that are adjacent in one storage: the two must not merge into one
    copy, or the second would land where the strided one belongs in the block."""

    def __init__(self):
        super().__init__()
        flat = torch.arange(8.0)
        self.first = torch.nn.Parameter(flat[:4])
        self.middle = torch.nn.Parameter(torch.arange(100.0, 106.0).view(3, 2).t())  # not contiguous
        self.last = torch.nn.Parameter(flat[4:])


def test_publish_keeps_a_strided_tensor_between_neighbours_in_storage():
    alloc = ShmAllocator()
    try:
        src = _Interleaved()
        assert src.first.untyped_storage().data_ptr() == src.last.untyped_storage().data_ptr()
        weights = SharedWeights.allocate(alloc, src)
        weights.publish(src, version=1)
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src))
        assert len(weights._plan.copies) == 3
    finally:
        alloc.unlink_all()


def _attach_in_child(header_only: SharedWeights, result):
    """A process spawned holding only the header, as an inference worker of a fresh run is."""
    import time

    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    deadline = time.monotonic() + 30
    while not header_only.attach(module) or not header_only.is_published:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    staging = header_only.new_staging()
    result[0] = header_only.try_read(staging)
    header_only.load_into(module, staging)
    result[1] = float(sum(p.sum() for p in module.state_dict().values()))


def test_weights_reserved_first_are_attached_by_a_process_holding_only_the_header():
    alloc = ShmAllocator()
    try:
        src = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        reserved = SharedWeights.reserve(alloc)
        assert not reserved.is_complete and not reserved.is_published
        assert not reserved.attach(src)  # no data block yet
        result = mp.get_context("spawn").Array("d", 2)
        p = mp.get_context("spawn").Process(target=_attach_in_child, args=(reserved, result))
        p.start()
        complete = reserved.complete(alloc, state_layout(src))
        assert not reserved.is_complete and complete.is_complete  # the handle given to later processes
        assert complete.try_read(complete.new_staging()) is None  # nothing published yet: no version 0 of zeros
        complete.publish(src, version=0)
        p.join(60)
        assert p.exitcode == 0
        assert result[0] == 0
        assert result[1] == pytest.approx(float(sum(t.sum() for t in src.state_dict().values())), rel=1e-6)
        with pytest.raises(RuntimeError, match="different configs"):
            SharedWeights(reserved.header, None, None, reserved.data_name).attach(torch.nn.Linear(4, 3))
    finally:
        alloc.unlink_all()
    assert not list(SHM_DIR.glob(alloc.prefix + "*"))


def test_a_process_without_a_model_attaches_with_the_layout_written_beside_the_header(monkeypatch):
    """A rollout worker acting in numpy, spawned before the learner built the network, has no model to
    read a layout from: it reads the one the runner wrote when it allocated the block."""
    alloc = ShmAllocator()
    try:
        src = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
        reserved = SharedWeights.reserve(alloc)
        header_only = pickle.loads(pickle.dumps(reserved))  # what a child spawned now holds
        assert not header_only.attach_layout()
        complete = reserved.complete(alloc, state_layout(src))
        complete.publish(src, version=0)
        assert header_only.attach_layout() and header_only.layout == state_layout(src)
        staging = np.empty(header_only.data.shape[0], dtype=np.float32)
        assert header_only.try_read_array(staging) == 0
        assert torch.equal(torch.from_numpy(staging), _flat_state(src))
    finally:
        alloc.unlink_all()
    assert not list(SHM_DIR.glob(alloc.prefix + "*"))
    monkeypatch.setattr("fastrl.buffers.weights.LAYOUT_BYTES", 64)
    alloc = ShmAllocator()
    try:
        with pytest.raises(ValueError, match="more than the 56 reserved"):
            SharedWeights.reserve(alloc).complete(alloc, state_layout(src))
    finally:
        alloc.unlink_all()


def test_try_load_reads_straight_into_the_module_and_reads_a_torn_copy_again(monkeypatch):
    alloc = ShmAllocator()
    try:
        src = _ConvNet().to(memory_format=torch.channels_last)
        weights = SharedWeights.allocate(alloc, src)
        dst = _ConvNet().to(dtype=torch.bfloat16)  # held in bf16, as an inference worker's layers are
        assert weights.try_load(dst) is None  # nothing published yet
        weights.publish(src, version=3)
        weights.header.array[0] += 1  # a write in progress: the module is left as it was
        before = _flat_state(dst).clone()
        assert weights.try_load(dst) is None and torch.equal(_flat_state(dst), before)
        weights.header.array[0] += 1
        assert weights.try_load(dst) == 3
        assert torch.equal(_flat_state(dst), _flat_state(src).to(torch.bfloat16))

        # the learner publishes version 4 while the first copy is under way: that copy is torn,
        # and the module must end up holding version 4 whole
        with torch.no_grad():
            src.head.weight.add_(1.0)
        load_into, calls = weights.load_into, []

        def publish_during_first_copy(module, flat):
            load_into(module, flat)
            if not calls:
                weights.publish(src, version=4)
            calls.append(int(weights.header.array[1]))

        monkeypatch.setattr(weights, "load_into", publish_during_first_copy)
        assert weights.try_load(dst) == 4 and calls == [4, 4]
        assert torch.equal(_flat_state(dst), _flat_state(src).to(torch.bfloat16))
    finally:
        alloc.unlink_all()


def test_try_load_gives_up_on_a_write_that_never_ends(monkeypatch):
    alloc = ShmAllocator()
    try:
        src = _ConvNet()
        weights = SharedWeights.allocate(alloc, src)
        weights.publish(src, version=1)
        load_into = weights.load_into

        def writer_dies_mid_write(module, flat):
            load_into(module, flat)
            weights.header.array[0] += 1  # odd, and it stays odd

        monkeypatch.setattr(weights, "load_into", writer_dies_mid_write)
        with pytest.raises(RuntimeError, match="torn"):
            weights.try_load(_ConvNet(), deadline_s=0.05)
    finally:
        alloc.unlink_all()


def _bf16_net() -> torch.nn.Module:
    """Layers only, as a bf16 CNN's state is; a conv held channels-last, as the learner and actors hold it."""
    torch.manual_seed(4)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 2), torch.nn.Flatten(), torch.nn.Linear(4 * 3 * 3, 5))
    return net.to(memory_format=torch.channels_last)


def _load_in_child(handle: SharedWeights, want_version: int, result):
    """An actor spawned with the complete handle: holds its layers in bf16 and loads what it is given."""
    net = _bf16_net().to(torch.bfloat16)
    with torch.no_grad():
        for t in net.state_dict().values():
            t.zero_()
    deadline = time.monotonic() + 30
    while handle.try_load(net) != want_version:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    flat = torch.cat([t.reshape(-1) for t in net.state_dict().values()]).view(torch.int16)
    result[:] = flat.tolist()


def test_an_acting_block_carries_the_bf16_roundings_and_the_learners_versions_alone():
    """With an acting block (a run whose actors hold the network in bf16), the starting weights go into both
    blocks; a learner's bf16 copies into the acting block alone, which the actors load from and watch; the
    float32 block keeps the starting weights the learner starts from."""
    alloc = ShmAllocator()
    try:
        src = _bf16_net()
        reserved = SharedWeights.reserve(alloc)
        assert reserved.actors_header is reserved.header.array  # before the block exists
        weights = reserved.complete(alloc, state_layout(src), acting_bf16=True)
        assert weights.has_acting_block and reserved.actors_header is weights.acting_header.array
        weights.publish(src, version=0)
        rounded = torch.cat([t.reshape(-1).to(torch.bfloat16) for t in src.state_dict().values()])
        assert torch.equal(torch.from_numpy(weights.acting.array.copy()).view(torch.bfloat16), rounded)
        assert torch.equal(torch.from_numpy(weights.data.array.copy()), _flat_state(src))
        assert weights.is_published and weights.version == 0 and int(weights.actors_header[1]) == 0
        start = weights.data.array.copy()

        # the learner's next version: its optimizer's bf16 roundings, written into the acting block alone
        with torch.no_grad():
            for t in src.state_dict().values():
                t.add_(0.25)
        copies = [t.to(torch.bfloat16) for t in weights.layout_tensors(src)]
        seq = int(weights.actors_header[0])
        weights.publish(src, version=7, acting_tensors=copies)
        assert int(weights.actors_header[0]) == seq + 2 and int(weights.actors_header[1]) == 7
        assert np.array_equal(weights.data.array, start) and weights.version == 0
        result = mp.get_context("spawn").Array("l", int(weights.acting.shape[0]))
        p = mp.get_context("spawn").Process(target=_load_in_child, args=(pickle.loads(pickle.dumps(weights)), 7, result))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        want = torch.cat([c.reshape(-1) for c in
                          (t.contiguous() for t in copies)]).view(torch.int16)  # the layout's (logical) order
        assert torch.equal(torch.tensor(result[:], dtype=torch.int16), want)
        # a handle attached from the headers alone (a process spawned before the block) finds the acting block
        late = SharedWeights(reserved.header, None, None, reserved.data_name, reserved.layout_bytes,
                             reserved.acting_header, reserved.acting_name)
        assert late.attach(src) and late.has_acting_block
        net = _bf16_net().to(torch.bfloat16)
        assert late.try_load(net) == 7
        assert torch.equal(torch.cat([t.reshape(-1) for t in net.state_dict().values()]), want.view(torch.bfloat16))
    finally:
        alloc.unlink_all()
    assert not list(SHM_DIR.glob(alloc.prefix + "*"))


def test_without_an_acting_block_actors_load_and_watch_the_float32_block():
    alloc = ShmAllocator()
    try:
        src = _bf16_net()
        weights = SharedWeights.allocate(alloc, src)
        assert not weights.has_acting_block and weights.actors_header is weights.header.array
        weights.publish(src, version=3)
        net = _bf16_net().to(torch.bfloat16)
        assert weights.try_load(net) == 3
        for got, t in zip(net.state_dict().values(), src.state_dict().values()):
            assert torch.equal(got, t.to(torch.bfloat16))  # each actor rounds at its load
    finally:
        alloc.unlink_all()
