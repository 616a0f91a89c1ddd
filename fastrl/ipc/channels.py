"""The faster-fifo queues between processes. They carry slot indices and small messages only;
every array lives in shared memory (fastrl.buffers).

    rollout w --(worker, split, slot, t)--> inference_requests[w % M]
    inference --(split)-------------------> action_replies[w]
    rollout   --(slot)--------------------> full_slots   (learner)
    learner   --(slot)--------------------> free_slots   (rollout workers)
    everyone  --(dict)--------------------> reports      (runner: stats, errors)
"""

from __future__ import annotations

import queue
from dataclasses import dataclass

import faster_fifo


@dataclass
class Channels:
    inference_requests: list
    action_replies: list
    full_slots: faster_fifo.Queue
    free_slots: faster_fifo.Queue
    reports: faster_fifo.Queue

    @staticmethod
    def create(num_rollout_workers: int, num_inference_workers: int) -> "Channels":
        small = 1 << 20
        return Channels(
            inference_requests=[faster_fifo.Queue(small) for _ in range(num_inference_workers)],
            action_replies=[faster_fifo.Queue(small) for _ in range(num_rollout_workers)],
            full_slots=faster_fifo.Queue(small),
            free_slots=faster_fifo.Queue(small),
            reports=faster_fifo.Queue(16 << 20),
        )


def get_many(q: faster_fifo.Queue, timeout_s: float, max_messages: int = 1_000_000) -> list:
    """All messages waiting (at least one unless `timeout_s` passes first); [] on timeout."""
    try:
        return q.get_many(block=True, timeout=timeout_s, max_messages_to_get=max_messages)
    except queue.Empty:
        return []


def put_report(q: faster_fifo.Queue, message: dict) -> None:
    """Reports are best-effort: a runner that stopped reading must not wedge a worker."""
    try:
        q.put(message, block=True, timeout=1.0)
    except queue.Full:
        pass
