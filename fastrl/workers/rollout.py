"""Rollout worker: steps its envs and writes each observation once into a shared trajectory slot.

Each worker owns `num_splits` groups of envs. While one group waits for its actions from an
inference worker, the previous group is stepping in envpool's C++ threads: the loop sends a
group's actions, then collects the group sent before it. A slot holds one group's rollout of
T steps; when it is full the slot index goes to the learner and the group takes a free slot,
carrying the bootstrap observation over as the new slot's first.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from fastrl.config.checks import envs_per_split
from fastrl.envs import Step, make_split
from fastrl.ipc import get_many, put_report
from fastrl.workers.process import WorkerContext, heartbeat_index

POLL_S = 0.1


class _Stopped(Exception):
    pass


class RolloutWorker:
    def __init__(self, ctx: WorkerContext, worker_index: int, log: logging.Logger):
        cfg = ctx.cfg
        self.ctx, self.index, self.log = ctx, worker_index, log
        self.num_splits, self.num_envs, self.T = cfg.sampler.num_splits, envs_per_split(cfg), cfg.sampler.rollout_len
        self.hb = heartbeat_index(cfg, "rollout", worker_index)
        self.requests = ctx.channels.inference_requests[worker_index % cfg.sampler.num_inference_workers]
        self.replies = ctx.channels.action_replies[worker_index]
        b = ctx.bufs
        self.obs, self.actions, self.rewards = b.obs.array, b.actions.array, b.rewards.array
        self.terminated, self.truncated, self.valid = b.terminated.array, b.truncated.array, b.valid.array
        spec = ctx.spec
        self.action_low = None if spec.discrete else np.asarray(spec.action_low, dtype=np.float32)
        self.action_high = None if spec.discrete else np.asarray(spec.action_high, dtype=np.float32)
        first_env = (cfg.run.seed * 1_000_003 + worker_index * cfg.sampler.num_envs_per_worker)
        self.envs = [make_split(cfg.env, spec, self.num_envs, cfg.sampler.env_threads,
                                seed=first_env + s * self.num_envs) for s in range(self.num_splits)]
        n = self.num_splits
        self.slot = [-1] * n
        self.t = [0] * n
        self.reset_step = [np.zeros(self.num_envs, dtype=bool) for _ in range(n)]
        self.ep_score = [np.zeros(self.num_envs, dtype=np.float64) for _ in range(n)]
        self.ep_len = [np.zeros(self.num_envs, dtype=np.int64) for _ in range(n)]
        self.finished_scores: list[float] = []
        self.finished_lengths: list[int] = []
        self.ready: set[int] = set()

    # --- waiting, always with an eye on the stop flag
    def _free_slot(self) -> int:
        started = time.perf_counter()
        try:
            while True:
                got = get_many(self.ctx.channels.free_slots, POLL_S, max_messages=1)
                if got:
                    return got[0]
                self._idle()
        finally:
            self.ctx.control.add_wait(self.hb, time.perf_counter() - started)

    def _wait_actions(self, split: int) -> None:
        if split not in self.ready:
            started = time.perf_counter()
            while split not in self.ready:
                self.ready.update(get_many(self.replies, POLL_S))
                if split not in self.ready:
                    self._idle()
            self.ctx.control.add_wait(self.hb, time.perf_counter() - started)
        self.ready.discard(split)

    def _idle(self) -> None:
        self.ctx.control.beat(self.hb)
        if self.ctx.control.stop_requested:
            raise _Stopped

    # --- the per-step work
    def _request(self, split: int) -> None:
        self.requests.put((self.index, split, self.slot[split], self.t[split]))

    def _send(self, split: int) -> None:
        actions = self.actions[self.slot[split], self.t[split]]
        if self.action_low is not None:
            actions = np.clip(actions, self.action_low, self.action_high)
        self.envs[split].send(actions)

    def _record(self, split: int, step: Step) -> None:
        slot, t = self.slot[split], self.t[split]
        was_reset = self.reset_step[split]
        self.rewards[slot, t] = step.reward
        self.terminated[slot, t] = step.terminated
        self.truncated[slot, t] = step.truncated
        # envpool ignores the action of the step after an episode end: never train on it
        np.logical_not(was_reset, out=self.valid[slot, t])
        np.logical_or(step.terminated, step.truncated, out=was_reset)

        self.ep_score[split] += step.score
        self.ep_len[split] += self.valid[slot, t]
        if step.game_over.any():
            done = np.flatnonzero(step.game_over)
            self.finished_scores.extend(self.ep_score[split][done].tolist())
            self.finished_lengths.extend(self.ep_len[split][done].tolist())
            self.ep_score[split][done] = 0.0
            self.ep_len[split][done] = 0

        t += 1
        self.obs[slot, t] = step.obs
        if t == self.T:
            new_slot = self._free_slot()
            self.obs[new_slot, 0] = self.obs[slot, t]
            self.ctx.channels.full_slots.put(slot)
            self.slot[split], t = new_slot, 0
            self.ctx.control.env_steps.array[self.index] += self.T * self.num_envs
            self.ctx.control.beat(self.hb)
            if self.finished_scores:
                put_report(self.ctx.channels.reports, {"kind": "episodes", "scores": self.finished_scores,
                                                       "lengths": self.finished_lengths})
                self.finished_scores, self.finished_lengths = [], []
        self.t[split] = t

    def run(self) -> None:
        try:
            # a stop can arrive while waiting for a first free slot: all waits raise _Stopped
            for s, env in enumerate(self.envs):
                self.slot[s] = self._free_slot()
                self.obs[self.slot[s], 0] = env.reset().obs
                self._request(s)
            sent = [False] * self.num_splits
            k = 0
            while True:
                nxt = (k + 1) % self.num_splits
                for split in (k, nxt):  # keep the next group stepping while we collect this one
                    if not sent[split]:
                        self._wait_actions(split)
                        self._send(split)
                        sent[split] = True
                step = self.envs[k].recv()
                sent[k] = False
                self._record(k, step)
                self._request(k)
                k = nxt
                if self.ctx.control.stop_requested:
                    break
        except _Stopped:
            pass
        finally:
            for env in self.envs:
                env.close()


def rollout_loop(ctx: WorkerContext, index: int, log: logging.Logger) -> None:
    RolloutWorker(ctx, index, log).run()
