"""What every child process does around its loop: name itself, die with its parent, set torch
threads, ignore Ctrl-C and a terminal's hang-up (the runner orchestrates shutdown), log to the
run's log file, and report a crash with its traceback to the runner before exiting (the runner
then replaces a rollout or inference worker, or stops the run if it was the learner). Also the
signal conventions the runner shares with its children: which signals a terminal sends, starting
children that ignore them from birth, and dying of a signal once its stop is done.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import NoReturn

from fastrl.buffers import SharedControl, SharedWeights, TrajBuffers
from fastrl.config.checks import rollout_workers_act
from fastrl.config.schema import Config
from fastrl.envs.spec import EnvSpec
from fastrl.ipc import Channels, put_report
from fastrl.rundir.checkpoints import CheckpointWriteError

PR_SET_NAME, PR_SET_PDEATHSIG = 15, 1
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
GLIBC_MAX_MMAP_THRESHOLD_BYTES = 32 << 20  # mallopt refuses more on 64-bit


@dataclass
class WorkerContext:
    """Everything a child needs, pickled once at spawn (shared arrays travel as names)."""
    cfg: Config
    spec: EnvSpec
    bufs: TrajBuffers
    control: SharedControl
    # the header alone (no data block) for processes spawned before anyone built the model
    weights: SharedWeights
    channels: Channels
    log_path: str
    checkpoint_dir: str
    base_env_steps: int = 0
    resume_checkpoint: str | None = None
    # who publishes version 0: "runner", "inference" (worker 0) or "learner" (fastrl.workers.first_weights)
    first_weights_by: str = "runner"


def seconds_since_process_start() -> float:
    """Wall time since this process was created (startup diagnostics in the log). On Linux from
    /proc, to 10 ms; psutil's create_time adds the boot time rounded to a whole second."""
    try:
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
        return uptime_s - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks
    except (OSError, ValueError, IndexError):
        import psutil

        return time.time() - psutil.Process().create_time()


def heartbeat_index(cfg: Config, role: str, index: int) -> int:
    """Slot of a process in the heartbeat array: rollouts, then inference workers, then the learner."""
    w, m = cfg.sampler.num_rollout_workers, cfg.sampler.num_inference_workers
    return {"rollout": index, "inference": w + index, "learner": w + m}[role]


def num_processes(cfg: Config) -> int:
    return cfg.sampler.num_rollout_workers + cfg.sampler.num_inference_workers + 1


def process_name(role: str, index: int) -> str:
    return f"fastrl-{role}" if role == "learner" else f"fastrl-{role}-{index}"


class RunLogHandler(logging.FileHandler):
    """train.log's handler. A line that cannot be written (a full disk) is said once on stderr and
    this process's later lines are dropped; logging's default prints a traceback for every line,
    from every process, and the runner's stop line drowns in them."""

    def __init__(self, log_path: str, process: str):
        super().__init__(log_path)  # opened O_APPEND: lines from many processes interleave whole
        self.process = process
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self.failed = True
        with contextlib.suppress(OSError, ValueError):
            self.close()  # flushing what is left in its buffer fails again, the same way
        with contextlib.suppress(OSError):
            print(f"{self.process}: could not write {self.baseFilename}: {error}; its further lines are dropped",
                  file=sys.stderr, flush=True)


def setup_logging(log_path: str, name: str, echo: bool) -> logging.Logger:
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    fmt = logging.Formatter(f"%(asctime)s {name} %(levelname)s %(message)s")
    handler = RunLogHandler(log_path, name)
    handler.setFormatter(fmt)
    root.addHandler(handler)
    if echo:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(fmt)
        stream.setLevel(logging.WARNING)
        root.addHandler(stream)
    return logging.getLogger(name)


def name_process_and_die_with_parent(name: str) -> None:
    """Show `name` in top/ps, and get SIGKILL when the parent dies (even by kill -9)."""
    try:
        import setproctitle

        setproctitle.setproctitle(name)
    except ImportError:
        pass
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)  # what `top` shows
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # never outlive a killed runner
    except (OSError, AttributeError):
        pass


def keep_freed_heap(keep_mib: int) -> bool:
    """Let glibc keep up to `keep_mib` MiB of freed memory for reuse (system.heap_keep_mib).

    By default glibc maps every block above a (self-adjusting) threshold fresh from the kernel and
    returns free memory at the top of the heap once it exceeds twice that: a learner that frees and
    reallocates the same few-MiB tensors every minibatch (autocast's bf16 weight copies, activations)
    pays a page fault per 4 KiB each time, ~25,000 per Pong batch and ~5% of its time. Returns
    whether glibc took the settings (False elsewhere, or with keep_mib 0)."""
    if keep_mib <= 0:
        return False
    try:
        libc = ctypes.CDLL(None)
        keep_bytes = keep_mib << 20
        return bool(libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(min(keep_bytes, 2**31 - 1)))
                    and libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(min(keep_bytes, GLIBC_MAX_MMAP_THRESHOLD_BYTES))))
    except (OSError, AttributeError):
        return False


def flush_denormals(on: bool) -> bool:
    """Flush denormal floats to zero in this thread, and in every thread it starts afterwards (they
    inherit the SSE control register), or stop (system.flush_denormals); returns the setting it found.
    A no-op where torch cannot set it (not x86 SSE3), where it then reads False."""
    import torch

    tiny = torch.tensor([1e-39], dtype=torch.float32)  # a denormal: read as 0 under DAZ
    was = bool((tiny * 1.0).item() == 0.0)
    torch.set_flush_denormal(on)
    return was


def torch_process_settings(system) -> bool:
    """The process-wide settings every process that runs torch makes once its thread counts are set and
    before any thread starts (system.flush_denormals, system.heap_keep_mib); the bench's stages call
    this too, so that they time what the workers run. Returns whether glibc kept the freed heap."""
    flush_denormals(system.flush_denormals)  # before any thread starts: they inherit it
    return keep_freed_heap(system.heap_keep_mib)


SCHED_POLICIES = {"normal": "SCHED_OTHER", "batch": "SCHED_BATCH", "idle": "SCHED_IDLE"}


def lower_priority(nice: int, sched_policy: str = "normal") -> None:
    """Add `nice` to every thread of this process (system.rollout_nice / inference_nice), and move them to
    Linux's scheduling policy `sched_policy` (system.rollout_sched_policy: normal, batch or idle).

    A learner-bound run wants the learner never preempted; samplers at a lower priority still get
    every cycle the learner leaves, and it leaves them all while it waits for data. Samplers call
    this once they are ready (first envs made, network built): until the first sample no learner
    runs, and their startup is the path to it. On Linux os.nice() changes the calling thread only,
    and envpool's threads exist by then; threads created afterwards inherit their creator's value
    and policy."""
    if not nice and sched_policy == "normal":
        return
    policy = getattr(os, SCHED_POLICIES[sched_policy], None)
    if policy is None:
        raise RuntimeError(f"system.rollout_sched_policy={sched_policy} needs Linux's {SCHED_POLICIES[sched_policy]}")
    for tid in os.listdir("/proc/self/task"):
        try:
            if sched_policy != "normal":
                os.sched_setscheduler(int(tid), policy, os.sched_param(0))
            if nice:
                os.setpriority(os.PRIO_PROCESS, int(tid), os.getpriority(os.PRIO_PROCESS, int(tid)) + nice)
        except (ProcessLookupError, ValueError):
            pass  # a thread that has just exited


def child_env_overrides(cfg: Config, role: str) -> dict[str, str]:
    """Environment a child must have from its first instruction: libgomp reads OMP_WAIT_POLICY once,
    when torch loads it, and unpickling a child's context may load torch before child_main runs."""
    if role == "learner" and cfg.system.learner_omp_wait != "inherit":
        return {"OMP_WAIT_POLICY": cfg.system.learner_omp_wait.upper()}
    return {}


@contextlib.contextmanager
def child_environment(overrides: dict[str, str]):
    """Set `overrides` in this process's environment while a child is spawned (it inherits them), then restore."""
    saved = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# what a terminal sends the whole foreground process group: Ctrl-C, and SIGHUP when it goes away
# (a closed window, a dropped ssh session). The runner alone decides how the run stops on either.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP)


def die_of_signal(signum: int) -> NoReturn:
    """End this process by `signum`'s default action, as an unhandled signal would have, once a
    stop it asked for is done. A shell loop (`for seed in 1 2 3; do fastrl train ...; done`) goes on
    to its next command after one that merely exits, even with 130, and a job scheduler's SIGTERM
    that ends in exit 0 reads as a completed job: only a death by the signal says "stopped"."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached: the signal's default action ends the process first


def ignore_terminal_signals() -> None:
    """A child's first act (already so from birth where it was started in terminal_signals_ignored_from_birth)."""
    for terminal_signal in TERMINAL_SIGNALS:
        signal.signal(terminal_signal, signal.SIG_IGN)


@contextlib.contextmanager
def terminal_signals_ignored_from_birth():
    """Children started inside this block ignore the terminal's signals from their first instruction.

    A spawned child sets SIG_IGN only once child_main runs, after the spawn bootstrap has
    re-imported the main module and unpickled its arguments; a Ctrl-C in that second printed a
    KeyboardInterrupt traceback per starting child, while the runner shut the run down cleanly
    anyway. An exec keeps an ignored disposition (the signal mask it does not: the spawn resets
    it), and Python then installs no KeyboardInterrupt handler. This process's own signals
    meanwhile are blocked rather than lost: Linux queues a blocked signal even while its action
    is SIG_IGN, and delivers it to the restored handler when the block lifts. The block covers
    the calling thread only: with other threads alive (envpool's during the env probe), a signal
    in the ~1 ms a spawn's start() takes can land on one of them and be dropped, and the next
    Ctrl-C then stops the run. Off the main thread (signal.signal would refuse), the block does
    nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, set(TERMINAL_SIGNALS))
    # setting SIG_IGN discards a signal already pending: one that came in the moment since the block
    came_before = set(TERMINAL_SIGNALS) & signal.sigpending()
    old = {s: signal.signal(s, signal.SIG_IGN) for s in TERMINAL_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(TERMINAL_SIGNALS))
        for s in came_before:
            signal.raise_signal(s)


def environment_at_exec() -> dict[str, str]:
    """This process's environment as it was exec'd (what libraries loaded at startup saw)."""
    try:
        raw = open("/proc/self/environ", "rb").read()
    except OSError:
        return dict(os.environ)
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def worker_needs_torch(ctx: WorkerContext, role: str) -> bool:
    """A rollout worker needs torch only to act with it (importing it costs ~2.5 CPU-s here)."""
    if role != "rollout":
        return True
    from fastrl.models.numpy_policy import acting_backend

    return rollout_workers_act(ctx.cfg) and acting_backend(ctx.cfg, ctx.spec) == "torch"


def warm_child_main(role: str, index: int, imports: tuple[str, ...], reader) -> None:
    """Entry point of a child spawned before the runner's setup (fastrl.runner.warm_start): import
    what the role will need, then run `child_main` with the arguments the supervisor sends, or
    return if the runner closes the pipe first (the run never started)."""
    name_process_and_die_with_parent(process_name(role, index))
    ignore_terminal_signals()
    for module in imports:
        importlib.import_module(module)
    imported_at = time.monotonic()
    try:
        args = reader.recv()
    except (EOFError, OSError):
        return
    finally:
        reader.close()
    child_main(*args, warm_wait_s=time.monotonic() - imported_at)


def error_report(process: str, error: BaseException, tb: str) -> dict:
    """The runner's report of a child's crash. An error that says it all in one line (a checkpoint
    the disk had no room for) also carries it as `reason`, which the console shows instead of the
    traceback; train.log keeps the traceback either way."""
    report = {"kind": "error", "process": process, "traceback": tb}
    if isinstance(error, CheckpointWriteError):
        report["reason"] = str(error)
    return report


def child_main(role: str, index: int, ctx: WorkerContext, loop_path: str, warm_wait_s: float | None = None) -> None:
    """Entry point of every child: bootstrap, run `loop(ctx, index, log)`, report any crash.

    `loop_path` ("module:function") is imported here, in the child: importing the learner's or
    an inference worker's module loads torch, which the runner need not load to spawn them.
    `warm_wait_s`: for a child spawned warm (warm_child_main), how long it waited for its context
    once its imports were done (~0 when the context was there first)."""
    name = process_name(role, index)
    # read first: setproctitle may reuse the memory /proc/self/environ shows for the title
    omp_wait_at_exec = environment_at_exec().get("OMP_WAIT_POLICY", "unset")
    name_process_and_die_with_parent(name)
    ignore_terminal_signals()
    signal.signal(signal.SIGTERM, lambda *_: ctx.control.request_stop())
    if os.getppid() == 1:  # the runner died before we got here
        return
    module, function = loop_path.split(":")
    loop = getattr(importlib.import_module(module), function)
    threads = {"learner": ctx.cfg.system.learner_threads, "inference": ctx.cfg.system.inference_threads}.get(role, 1)
    heap_kept = False
    if worker_needs_torch(ctx, role):
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        heap_kept = torch_process_settings(ctx.cfg.system)
    log = setup_logging(ctx.log_path, name, echo=False)
    try:
        log.info("started (pid %d, torch threads %d, nice %d, torch %s, OMP_WAIT_POLICY at exec %s, freed heap %s%s)",
                 os.getpid(), threads, os.nice(0),
                 f"loaded, denormals {'flushed' if ctx.cfg.system.flush_denormals else 'kept'}"
                 if "torch" in sys.modules else "not loaded",
                 omp_wait_at_exec, f"kept up to {ctx.cfg.system.heap_keep_mib} MiB" if heap_kept else "glibc default",
                 "" if warm_wait_s is None else
                 f", spawned warm: waited {warm_wait_s:.2f} s for its context after its imports")
        loop(ctx, index, log)
        log.info("stopped")
    except BaseException as e:  # noqa: BLE001 - report everything, including KeyboardInterrupt
        tb = traceback.format_exc()
        log.error("crashed: %s\n%s", e, tb)
        put_report(ctx.channels.reports[heartbeat_index(ctx.cfg, role, index)], error_report(name, e, tb))
        if role == "learner":  # nothing can train without it; a rollout/inference worker gets replaced
            ctx.control.request_stop()
        raise SystemExit(1)
