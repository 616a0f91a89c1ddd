"""Inference worker: one batched policy forward over every pending request.

A request names (rollout worker, generation, split, token, slot, t). The worker reads those
observations in place from the trajectory slots, runs one forward pass, writes actions,
log-probs, values and the policy version back into the same slots, and tells each rollout
worker which splits are ready. Before each batch it picks up newer weights if the learner has
published some.

Requests from a replaced rollout worker (an old generation) are dropped, and a request re-sent
after an inference restart is answered once: after the runner has reclaimed a dead worker's
slots, nothing is written into them from here.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import numpy as np
import torch

from fastrl.ipc import wait_any
from fastrl.models import ActorCritic
from fastrl.workers.process import WorkerContext, heartbeat_index

POLL_S = 0.1


class InferenceWorker:
    def __init__(self, ctx: WorkerContext, index: int, log: logging.Logger):
        self.ctx, self.index, self.log = ctx, index, log
        self.device = torch.device(ctx.cfg.system.device)
        self.model = ActorCritic(ctx.spec, ctx.cfg.model).to(self.device).eval()
        self.staging = ctx.weights.new_staging()
        self.seen_seq = -1
        self.version = -1
        self.hb = heartbeat_index(ctx.cfg, "inference", index)
        b = ctx.bufs
        self.obs, self.actions, self.log_probs = b.obs.array, b.actions.array, b.log_probs.array
        self.values, self.policy_version = b.values.array, b.policy_version.array
        self.rings = [ctx.channels.requests[w] for w in ctx.channels.rollouts_of(index)]
        self.bell = ctx.channels.inference_bells[index]
        self.answered: dict[tuple, int] = {}  # (worker, generation, split) -> last token answered
        torch.manual_seed(ctx.cfg.run.seed * 7919 + index)  # action sampling: reproducible in serial mode

    def _refresh_weights(self) -> None:
        seq = int(self.ctx.weights.header.array[0])
        if seq == self.seen_seq or seq == 0:
            return
        version = self.ctx.weights.try_read(self.staging)
        if version is None:  # caught the learner mid-write; keep the current weights for this batch
            return
        self.ctx.weights.load_into(self.model, self.staging.to(self.device) if self.device.type != "cpu" else self.staging)
        self.seen_seq, self.version = seq, version

    def wait_for_first_weights(self) -> None:
        while self.version < 0:
            self._refresh_weights()
            if self.version < 0:
                self.ctx.control.beat(self.hb)
                if self.ctx.control.stop_requested:
                    return
                time.sleep(0.01)

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
        self._refresh_weights()
        views = [self.obs[slot, t] for (*_, slot, t) in requests]
        obs = torch.from_numpy(views[0] if len(views) == 1 else np.concatenate(views))
        with torch.inference_mode():
            params, values = self.model(obs.to(self.device, non_blocking=True))
            actions, log_probs = self.model.sample(params)
        actions, log_probs, values = actions.cpu().numpy(), log_probs.cpu().numpy(), values.cpu().numpy()
        replies = defaultdict(list)
        offset = 0
        for (worker, generation, split, token, slot, t), view in zip(requests, views):
            n = view.shape[0]
            self.actions[slot, t] = actions[offset:offset + n]
            self.log_probs[slot, t] = log_probs[offset:offset + n]
            self.values[slot, t] = values[offset:offset + n]
            self.policy_version[slot, t] = self.version
            offset += n
            replies[worker].append((generation, split, token))
        for worker, msgs in replies.items():
            self.ctx.channels.replies[worker].push_many(msgs)
        counts = self.ctx.control.inference_counts.array[self.index]
        counts[0] += 1
        counts[1] += offset

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
        self.wait_for_first_weights()
        while not self.ctx.control.stop_requested:
            self.pump(POLL_S)


def inference_loop(ctx: WorkerContext, index: int, log: logging.Logger) -> None:
    InferenceWorker(ctx, index, log).run()
