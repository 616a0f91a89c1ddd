"""The records a run appends to while it trains: learner.jsonl, metrics.jsonl and the TensorBoard
event file.

A disk fills up, a quota runs out, a network mount goes away: a record that cannot be written
must neither crash the runner (its traceback would skip the final checkpoint and the summary) nor
hang it. tensorboardX's SummaryWriter did the latter: its writer thread dies of the OSError,
and the runner's next add_scalar then blocks for ever on the thread's full queue, with no one
left to watch the workers. So each record here is written by the runner's own thread, one whole
row per write(2): a row that does not fit is cut off again (the file ends with whole rows, which
a resumed run appends to), the first error is kept as `error`, and later rows are dropped. The
runner stops the run in order with that error as its reason.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path
from types import SimpleNamespace


class AppendOnlyFile:
    """A file that only grows, by whole rows of bytes, until the first failed write."""

    def __init__(self, path: Path):
        self.path = path
        self.error: str | None = None
        self._fd: int | None = None
        self._size_bytes = 0
        try:  # O_APPEND: a resumed run continues the same file
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
            self._size_bytes = os.fstat(self._fd).st_size
        except OSError as e:  # no room even for the file's name: the same stop as a row that does not fit
            self._fail(e)

    def append(self, data: bytes) -> None:
        """Write `data` whole, or not at all and `error` says why (dropped once a write has failed)."""
        if self._fd is None:
            return
        written = 0
        try:
            while written < len(data):
                # a disk that fills mid-row takes what fits; writing the rest then raises the reason
                step = os.write(self._fd, data[written:])
                if step == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += step
        except OSError as e:
            self._fail(e)
            return
        self._size_bytes += written

    def _fail(self, error: OSError) -> None:
        self.error = f"could not write {self.path}: {error}"
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size_bytes)  # the partial row goes, so the file ends whole
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JsonLinesRecord:
    """One JSON object per line (learner.jsonl, metrics.jsonl)."""

    def __init__(self, path: Path):
        self._file = AppendOnlyFile(path)

    @property
    def error(self) -> str | None:
        return self._file.error

    def append(self, row: dict) -> None:
        self._file.append((json.dumps(row) + "\n").encode())

    def close(self) -> None:
        self._file.close()


class ScalarEventsRecord:
    """A TensorBoard event file of scalars, written synchronously: one Event per report, holding all
    its scalars at one step. The framing is TFRecord's: length, its masked CRC-32C, the Event
    proto, the proto's masked CRC-32C."""

    def __init__(self, run_dir: Path):
        self._pb = _tensorboard_protos()
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        self._file = AppendOnlyFile(run_dir / name)
        self._write(self._pb.Event(wall_time=time.time(), file_version="brain.Event:2"))

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def error(self) -> str | None:
        return self._file.error

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        summary = self._pb.Summary(value=[self._pb.Summary.Value(tag=tag, simple_value=float(value))
                                          for tag, value in scalars.items()])
        self._write(self._pb.Event(wall_time=time.time(), step=int(step), summary=summary))

    def _write(self, event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        crc = self._pb.masked_crc32c
        self._file.append(header + struct.pack("<I", crc(header)) + data + struct.pack("<I", crc(data)))

    def close(self) -> None:
        self._file.close()


def _tensorboard_protos() -> SimpleNamespace:
    """tensorboardX's Event proto and CRC, imported without loading torch when this process has not.

    Importing any part of tensorboardX runs its package __init__, which imports torch, if installed,
    only to recognise torch tensors among the values it is given; these records hold plain floats.
    A fresh run with inference workers never loads torch in the runner otherwise, and loading it
    would cost ~2 CPU-s (while the learner starts) and ~100 MB. A None entry in sys.modules makes
    `import torch` raise ImportError, which tensorboardX catches; the entry is removed again at once."""
    blocked = "torch" not in sys.modules
    if blocked:
        sys.modules["torch"] = None
    try:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.record_writer import masked_crc32c
    finally:
        if blocked:
            del sys.modules["torch"]
    return SimpleNamespace(Event=Event, Summary=Summary, masked_crc32c=masked_crc32c)
