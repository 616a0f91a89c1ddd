"""Where the rollout workers' threads run (system.rollout_pinning), decided by the runner while the run goes.

A rollout worker that acts itself hands every env step to envpool's thread and waits for it to come
back, thousands of times a second with CartPole's ~2 µs envs. Where the kernel puts those threads
decides much of a round's rate: unpinned, CartPole's sample stage read 747-826k env steps/s over
four rounds, pinned 823-838k (the threads rarely migrate, so a placement lasts the round). Keeping
each worker's threads on one core removes that spread, but it also takes away the scheduler's
freedom to give a busy learner its share: a learner that needs a core then shares one with a pinned
worker and gets half of it instead of two thirds.

So `auto` pins only while the learner mostly waits for data, that is while the samplers set the
run's rate and the learner needs little CPU, and releases the workers when it stops waiting.
Measured on CartPole (2 cores, bench/README "Rollout workers pinned while the learner waits"):
pinned from the start, the sample stage 1.10x and steadier, the learner-bound train stage 0.86x.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

LEARNER_WAIT_TO_PIN = 0.5     # the learner waited at least this share of the last window: pin
LEARNER_WAIT_TO_RELEASE = 0.25  # ...at most this share: release (the gap keeps it from flapping)
WINDOW_S = 1.0                # how much of the learner's recent time a decision looks at
HOLD_S = 3.0                  # the least time between two changes, so each one is judged on its own effect


def worker_cpus(num_workers: int, cpus: list[int]) -> list[int]:
    """The CPU each rollout worker is kept on: worker i on the i-th usable CPU, wrapping around."""
    return [cpus[i % len(cpus)] for i in range(num_workers)]


def why_not_auto(num_workers: int, num_cpus: int, workers_act: bool) -> str | None:
    """Why `auto` must leave these workers alone, or None.

    A worker that waits for an inference process's actions would leave its core idle meanwhile (the
    Pong preset, pinned: sampling 0.90x); workers that do not divide evenly onto the cores would sit
    two to one core beside one alone, and the run would go at the crowded core's pace."""
    if not workers_act:
        return "they wait for an inference process's actions, and a pinned worker's core would idle meanwhile"
    if num_workers > num_cpus and num_workers % num_cpus:
        return (f"{num_workers} rollout workers do not divide evenly onto {num_cpus} cores, so pinning would put "
                f"more of them on some cores than on others")
    return None


def set_thread_affinity(pid: int, cpus: set[int]) -> int:
    """Move every thread of process `pid` onto `cpus` (threads it creates later inherit their creator's
    mask). The number of threads moved; 0 if the process has gone."""
    moved = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            if os.sched_getaffinity(int(tid)) != cpus:
                os.sched_setaffinity(int(tid), cpus)
            moved += 1
        except OSError:  # a thread that has just exited
            pass
    return moved


class RolloutPlacement:
    """Called from the runner's loop; pins or releases the rollout workers' threads.

    `wait_s` reads the learner's cumulative seconds spent waiting for data (control.wait_s), `pids`
    the rollout workers' current pids by worker index (a replaced worker has a new one), `apply`
    moves a process's threads onto a set of CPUs."""

    def __init__(self, mode: str, num_workers: int, workers_act: bool, cpus: list[int], wait_s: Callable[[], float],
                 pids: Callable[[], dict[int, int]], log: logging.Logger, now: float,
                 apply: Callable[[int, set[int]], int] = set_thread_affinity):
        if mode not in ("auto", "always"):
            raise ValueError(f"rollout pinning mode {mode!r}: a placement is made for auto or always only")
        self.mode, self.cpus, self.wait_s, self.pids, self.log = mode, list(cpus), wait_s, pids, log
        self.apply = apply
        self.targets = worker_cpus(num_workers, self.cpus)
        self.blocked = why_not_auto(num_workers, len(self.cpus), workers_act) if mode == "auto" else None
        if self.blocked:
            log.info("system.rollout_pinning=auto leaves the rollout workers unpinned: %s", self.blocked)
        self.pinned = False
        self.window_start, self.window_wait_s = now, wait_s()
        self.changed_at = now - HOLD_S
        self.started = self.last_now = self.verified_at = now
        self.pinned_s = 0.0
        self.applied: dict[int, tuple[int, bool]] = {}  # worker index -> (pid, pinned) last applied

    def _want(self, now: float) -> bool:
        if self.mode == "always":
            return True
        elapsed = now - self.window_start
        if elapsed < WINDOW_S:
            return self.pinned
        waited = self.wait_s()
        wait_share = (waited - self.window_wait_s) / elapsed
        self.window_start, self.window_wait_s = now, waited
        if now - self.changed_at < HOLD_S:
            return self.pinned
        if not self.pinned and wait_share >= LEARNER_WAIT_TO_PIN:
            self.log.info("the learner waited %.0f%% of the last %.1f s: rollout workers pinned to CPUs %s",
                          100 * wait_share, elapsed, self.targets)
            return True
        if self.pinned and wait_share <= LEARNER_WAIT_TO_RELEASE:
            self.log.info("the learner waited %.0f%% of the last %.1f s: rollout workers released onto CPUs %s",
                          100 * wait_share, elapsed, self.cpus)
            return False
        return self.pinned

    def update(self, now: float) -> None:
        if self.blocked:
            return
        if self.pinned:
            self.pinned_s += now - self.last_now
        self.last_now = now
        want = self._want(now)
        if want != self.pinned:
            self.pinned, self.changed_at = want, now
        if now - self.verified_at >= WINDOW_S:
            # a thread a worker created while its threads were being moved kept its creator's old mask
            self.applied.clear()
            self.verified_at = now
        for index, pid in self.pids().items():
            if self.applied.get(index) == (pid, want):
                continue
            cpus = {self.targets[index]} if want else set(self.cpus)
            if self.apply(pid, cpus):
                self.applied[index] = (pid, want)

    def pinned_fraction(self) -> float:
        """The share of the run so far that the workers were pinned."""
        total = self.last_now - self.started
        return self.pinned_s / total if total > 0 else 0.0
