"""Every channel between the processes of a run: single-producer single-consumer rings in shared
memory (fastrl.ipc.rings). They carry slot indices and small records only; arrays live in the
trajectory slots (fastrl.buffers).

    rollout w --(w, generation, split, token, slot, t)--> requests[w]    (inference worker w % M)
    inference --(generation, split, token)--------------> replies[w]     (rollout w)
    rollout w --(slot)----------------------------------> full_slots[w]  (learner)
    learner   --(slot)----------------------------------> free_slots[w]  (rollout w)
    process p --(pickled dict)--------------------------> reports[p]     (runner: stats, errors)

Each consumer sleeps on one doorbell: inference worker i on inference_bells[i], rollout w on
rollout_bells[w] (replies and free slots), the learner on learner_bell, the runner on runner_bell.

The generation (bumped by the runner each time rollout worker w is replaced) and the per-split
request token let a replacement rollout worker, or a replacement inference worker, ignore
anything meant for the process it replaced. Reports are pickles exchanged between this run's own
processes through owner-only shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.buffers.shm import ShmAllocator
from fastrl.ipc.rings import Doorbell, IntRing, MsgRing, wait_any

REQUEST_WIDTH, REPLY_WIDTH = 6, 3
REPORT_CAPACITY, REPORT_BYTES = 64, 32 << 10
# Reports the runner reads at its next poll (REPORT_POLL_S) instead of being woken for: a learner
# batch or a rollout slot's finished episodes arrive up to ~250 times a second on CartPole, and each
# wake-up cost the runner CPU and preempted the process that sent it.
ROUTINE_REPORTS = frozenset({"episodes", "learner"})
REPORT_POLL_S = 0.05


@dataclass
class Channels:
    requests: list[IntRing]
    replies: list[IntRing]
    full_slots: list[IntRing]
    free_slots: list[IntRing]
    reports: list[MsgRing]          # indexed like the heartbeats (fastrl.workers.process.heartbeat_index)
    inference_bells: list[Doorbell]
    rollout_bells: list[Doorbell]
    learner_bell: Doorbell
    runner_bell: Doorbell

    @staticmethod
    def allocate(alloc: ShmAllocator, num_rollout_workers: int, num_inference_workers: int, num_slots: int,
                 num_splits: int, num_processes: int, native: bool = False) -> "Channels":
        """`native`: push, pop and wait through fastrl_ext (C++) rather than the Python reference."""
        w_range, m = range(num_rollout_workers), num_inference_workers

        def bell(name: str) -> Doorbell:
            return Doorbell.allocate(alloc, name, native)

        inference_bells = [bell(f"bell.inference{i}") for i in range(m)]
        rollout_bells = [bell(f"bell.rollout{w}") for w in w_range]
        learner_bell, runner_bell = bell("bell.learner"), bell("bell.runner")
        # requests/replies: one per split outstanding, plus re-sends after inference restarts
        small = 4 * num_splits + 8
        # no inference workers (m == 0): each rollout worker acts itself, so no requests or replies
        return Channels(
            requests=[IntRing.allocate(alloc, f"requests{w}", small, REQUEST_WIDTH, inference_bells[w % m])
                      for w in w_range] if m else [],
            replies=[IntRing.allocate(alloc, f"replies{w}", small, REPLY_WIDTH, rollout_bells[w])
                     for w in w_range] if m else [],
            full_slots=[IntRing.allocate(alloc, f"full{w}", num_slots + 1, 1, learner_bell) for w in w_range],
            free_slots=[IntRing.allocate(alloc, f"free{w}", num_slots + 1, 1, rollout_bells[w]) for w in w_range],
            reports=[MsgRing.allocate(alloc, f"reports{p}", REPORT_CAPACITY, REPORT_BYTES, runner_bell)
                     for p in range(num_processes)],
            inference_bells=inference_bells, rollout_bells=rollout_bells,
            learner_bell=learner_bell, runner_bell=runner_bell)

    def rollouts_of(self, inference_index: int) -> list[int]:
        m = len(self.inference_bells)
        return [w for w in range(len(self.requests)) if w % m == inference_index]

    def take_reports(self, timeout_s: float) -> list[dict]:
        """Runner: every waiting report, waiting up to `timeout_s` for the first."""
        wait_any(self.runner_bell, self.reports, timeout_s)
        out = []
        for ring in self.reports:
            out.extend(ring.pop_all())
        return out


def put_report(ring: MsgRing, message: dict) -> None:
    """Reports are best-effort: a runner that stopped reading must not wedge a worker."""
    if not ring.push(message, timeout_s=1.0, wake=message.get("kind") not in ROUTINE_REPORTS) \
            and message.get("kind") == "error":
        tb = message.get("traceback", "")
        ring.push(dict(message, traceback=tb[-8000:]), timeout_s=1.0)  # too big: keep the end of it
