"""Numpy arrays backed by owner-only files in /dev/shm, shared between processes by name.

We open /dev/shm files ourselves instead of using multiprocessing.shared_memory: its
resource tracker unlinks segments when any attaching child exits (a known CPython bug before
3.13), and we want the runner alone to own creation and unlinking.

A runner killed outright (kill -9, the OOM killer, a signal it does not handle) runs no cleanup,
and /dev/shm is memory: its segments would hold RAM until something removed them. So the
allocator's first segment starts a janitor, a `sh` in its own session that blocks reading a
pipe only this process writes to. Whichever way this process ends, the kernel closes that pipe,
the janitor's read returns, and it removes every segment under the run's prefix (nothing, after
an orderly end). Each segment name also carries the runner's pid, so that a later run removes
what a dead run left behind should the janitor itself have been killed.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import subprocess
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
PREFIX = "fastrl"


class SharedMemoryFull(RuntimeError):
    """/dev/shm cannot hold a segment: one line saying how much, how much is free, and what to do."""


def _reserve(fd: int, path: Path, nbytes: int) -> None:
    """Give the new segment its pages now. A segment only ftruncate'd is sparse: with /dev/shm too
    small (Docker's default is 64 MiB, the Pong preset needs 136) the run started, and a worker died
    of SIGBUS at its first write past the end of the space, which says nothing about the cause."""
    os.ftruncate(fd, nbytes)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            return  # a filesystem without fallocate: stay sparse, as before
        os.unlink(path)
        fs = os.statvfs(SHM_DIR)
        raise SharedMemoryFull(
            f"{SHM_DIR} has no room for {nbytes / 2**20:.1f} MiB more ({path.name}): "
            f"{fs.f_bavail * fs.f_frsize / 2**20:.1f} MiB free of {fs.f_blocks * fs.f_frsize / 2**20:.1f} MiB. "
            f"Give it more (Docker: run with --shm-size=2g), or make the trajectory slots fewer or smaller "
            f"(sampler.num_envs_per_worker, sampler.rollout_len)") from None


class ShmArray:
    """A fixed-shape numpy array in shared memory; pickles as its name and reattaches."""

    def __init__(self, name: str, shape: tuple, dtype, create: bool = False):
        self.name, self.shape, self.dtype = name, tuple(int(s) for s in shape), np.dtype(dtype)
        nbytes = max(1, int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize)
        path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                _reserve(fd, path, nbytes)
            self._mmap = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self.array = np.ndarray(self.shape, dtype=self.dtype, buffer=self._mmap)

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def __reduce__(self):
        return (ShmArray, (self.name, self.shape, self.dtype.str, False))

    def unlink(self) -> None:
        try:
            os.unlink(SHM_DIR / self.name)
        except FileNotFoundError:
            pass


# `read` returns at EOF, which comes once every copy of the pipe's writing end is closed, however
# the writer ended. The prefix travels in the environment, not the command line, so that a
# `pkill -9 -f fastrl` meant for the run does not kill the one process that cleans up after it.
JANITOR_SCRIPT = 'read _; rm -f -- "$SEGMENTS".*'
JANITOR_EXIT_S = 2.0


class ShmAllocator:
    """Creates this run's segments under one unique prefix and unlinks them all at the end."""

    def __init__(self):
        self.prefix = f"{PREFIX}.{os.getpid()}.{secrets.token_hex(3)}"
        self.arrays: list[ShmArray] = []
        self.janitor: subprocess.Popen | None = None

    def _start_janitor(self) -> None:
        # its own session: a terminal's Ctrl-C or hang-up must not stop it before it has cleaned up;
        # the pipe's writing end is not inheritable, so spawned workers do not hold it open
        try:
            self.janitor = subprocess.Popen(["/bin/sh", "-c", JANITOR_SCRIPT, "shm-janitor"],
                                            env={**os.environ, "SEGMENTS": str(SHM_DIR / self.prefix)},
                                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            pass  # no /bin/sh (a distroless image): the next start's sweep of stale segments remains

    def name_of(self, name: str) -> str:
        """The segment name `array(name, ...)` creates (known before the segment exists)."""
        return f"{self.prefix}.{name}"

    def array(self, name: str, shape: tuple, dtype) -> ShmArray:
        if not self.arrays and self.janitor is None:
            self._start_janitor()
        arr = ShmArray(self.name_of(name), shape, dtype, create=True)
        self.arrays.append(arr)
        return arr

    @property
    def total_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def unlink_all(self) -> None:
        for a in self.arrays:
            a.unlink()
        self.arrays = []  # a later array() starts afresh, with a janitor of its own
        # anything created under our prefix by a path we did not track
        for path in SHM_DIR.glob(self.prefix + ".*"):
            path.unlink(missing_ok=True)
        self._stop_janitor()

    def _stop_janitor(self) -> None:
        """Let the janitor go (it finds nothing left to remove) and reap it."""
        janitor, self.janitor = self.janitor, None
        if janitor is None:
            return
        janitor.stdin.close()
        try:
            janitor.wait(JANITOR_EXIT_S)
        except subprocess.TimeoutExpired:
            janitor.kill()
            janitor.wait()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_segments() -> list[str]:
    """Unlink segments of fastrl runs whose runner process no longer exists."""
    removed = []
    pattern = re.compile(rf"^{PREFIX}\.(\d+)\.")
    for path in SHM_DIR.glob(PREFIX + ".*"):
        m = pattern.match(path.name)
        if m and not _pid_alive(int(m.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed
