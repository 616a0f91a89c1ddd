"""Acting: the policy forward that turns observations in trajectory slots into actions there.

One object does it wherever the policy runs: in an inference worker process (batched over
every rollout worker's requests), or inside a rollout worker when `sampler.num_inference_workers`
is 0 (tiny models, where a forward costs less than the round trip to another process). It reads
observations in place, writes actions, log-probs, values and the acting policy's version back
into the same slot cells, and picks up weights the learner has published since the last call.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from fastrl.models import ActorCritic
from fastrl.workers.process import WorkerContext


class PolicyActor:
    def __init__(self, ctx: WorkerContext, seed: int):
        self.ctx = ctx
        self.device = torch.device(ctx.cfg.system.device)
        self.model = ActorCritic(ctx.spec, ctx.cfg.model).to(self.device).eval()
        self.staging = ctx.weights.new_staging()
        self.seen_seq = -1
        self.version = -1
        b = ctx.bufs
        self.obs, self.actions, self.log_probs = b.obs.array, b.actions.array, b.log_probs.array
        self.values, self.policy_version = b.values.array, b.policy_version.array
        torch.manual_seed(seed)  # action sampling: reproducible in serial mode

    def refresh_weights(self) -> None:
        seq = int(self.ctx.weights.header.array[0])
        if seq == self.seen_seq or seq == 0:
            return
        version = self.ctx.weights.try_read(self.staging)
        if version is None:  # caught the learner mid-write; keep the current weights for this batch
            return
        self.ctx.weights.load_into(self.model, self.staging.to(self.device) if self.device.type != "cpu" else self.staging)
        self.seen_seq, self.version = seq, version

    def wait_for_first_weights(self, idle) -> None:
        """`idle()` beats the heartbeat and returns True when the run is stopping."""
        while self.version < 0:
            self.refresh_weights()
            if self.version < 0:
                if idle():
                    return
                time.sleep(0.01)

    def act(self, cells: list) -> int:
        """Fill actions, log-probs, values and versions at each (slot, t) in `cells`; returns samples."""
        self.refresh_weights()
        views = [self.obs[slot, t] for slot, t in cells]
        obs = torch.from_numpy(views[0] if len(views) == 1 else np.concatenate(views))
        with torch.inference_mode():
            params, values = self.model(obs.to(self.device, non_blocking=True))
            actions, log_probs = self.model.sample(params)
        actions, log_probs, values = actions.cpu().numpy(), log_probs.cpu().numpy(), values.cpu().numpy()
        offset = 0
        for (slot, t), view in zip(cells, views):
            n = view.shape[0]
            self.actions[slot, t] = actions[offset:offset + n]
            self.log_probs[slot, t] = log_probs[offset:offset + n]
            self.values[slot, t] = values[offset:offset + n]
            self.policy_version[slot, t] = self.version
            offset += n
        return offset
