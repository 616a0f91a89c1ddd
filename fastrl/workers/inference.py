"""Inference worker: one batched policy forward over every pending request.

A request names (rollout worker, generation, split, token, slot, t). The worker acts on all of
them in one forward pass (fastrl.workers.acting: observations read in place, results written
into the same slots) and tells each rollout worker which splits are ready.

On a fresh run the runner does not build the network (it would load torch, ~2 CPU-s on the
path to the first sample): inference worker 0 publishes the starting weights as version 0, in a
data block the runner allocates for the layout it reports (`publish_first_weights`).

Requests from a replaced rollout worker (an old generation) are dropped, and a request re-sent
after an inference restart is answered once: after the runner has reclaimed a dead worker's
slots, nothing is written into them from here.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict

from fastrl.ipc import wait_any
from fastrl.workers.acting import PolicyActor
from fastrl.workers.first_weights import INFERENCE, hand_over_first_weights
from fastrl.workers.process import WorkerContext, heartbeat_index, lower_priority, seconds_since_process_start

POLL_S = 0.1


class InferenceWorker:
    def __init__(self, ctx: WorkerContext, index: int, log: logging.Logger):
        self.ctx, self.index, self.log = ctx, index, log
        self.actor = PolicyActor(ctx, seed=ctx.cfg.run.seed * 7919 + index)
        self.hb = heartbeat_index(ctx.cfg, "inference", index)
        self.rings = [ctx.channels.requests[w] for w in ctx.channels.rollouts_of(index)]
        self.bell = ctx.channels.inference_bells[index]
        self.answered: dict[tuple, int] = {}  # (worker, generation, split) -> last token answered

    def _idle(self) -> bool:
        self.ctx.control.beat(self.hb)
        return self.ctx.control.stop_requested

    def _live(self, requests: list) -> list:
        generations = self.ctx.control.rollout_generation.array
        live = []
        for req in requests:
            worker, generation, split, token = req[:4]
            if generation != generations[worker]:
                continue  # its sender was replaced; the runner reclaims that slot
            key = (worker, generation, split)
            if self.answered.get(key, -1) >= token:
                continue  # a duplicate re-sent after an inference restart
            self.answered[key] = token
            live.append(req)
        return live

    def step(self, requests: list) -> None:
        requests = self._live(requests)
        if not requests:
            return
        samples = self.actor.act([(slot, t) for (*_, slot, t) in requests])
        replies = defaultdict(list)
        for worker, generation, split, token, _slot, _t in requests:
            replies[worker].append((generation, split, token))
        for worker, msgs in replies.items():
            self.ctx.channels.replies[worker].push_many(msgs)
        counts = self.ctx.control.inference_counts.array[self.index]
        counts[0] += 1
        counts[1] += samples

    def pump(self, timeout_s: float) -> None:
        """Answer whatever requests are waiting (waiting up to `timeout_s` for the first)."""
        control = self.ctx.control
        # Recorded before reading requests: once the runner sees this epoch, every batch from
        # here on checks the generations it bumped before raising the epoch.
        control.inference_seen_epoch.array[self.index] = control.reclaim_epoch
        started = time.perf_counter()
        wait_any(self.bell, self.rings, timeout_s)
        requests = [req for ring in self.rings for req in ring.pop_all()]
        control.add_wait(self.hb, time.perf_counter() - started)
        control.beat(self.hb)
        if requests:
            self.step(requests)

    def run(self) -> None:
        if self.ctx.first_weights_by == INFERENCE and self.index == 0:
            if not hand_over_first_weights(self.ctx, self.hb, self.actor.forward.model, self.log):
                return
        self.actor.wait_for_first_weights(self._idle)
        lower_priority(self.ctx.cfg.system.inference_nice)
        self.log.info("ready to act, %.1f s after process start, nice %d (%s)", seconds_since_process_start(),
                      os.nice(0), self.actor.forward.kind)
        while not self.ctx.control.stop_requested:
            self.pump(POLL_S)


def inference_loop(ctx: WorkerContext, index: int, log: logging.Logger) -> None:
    InferenceWorker(ctx, index, log).run()
