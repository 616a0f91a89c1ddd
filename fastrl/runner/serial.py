"""Serial (debug) mode: the rollout workers, inference workers and learner of a run as objects
in the runner's own process, stepped in a fixed order through the same classes and methods the
worker processes run. With a fixed seed two runs give bit-identical losses; a user can also set
breakpoints anywhere in the pipeline.

One `advance()` trains a batch if the learner has one waiting; otherwise it pumps every rollout worker
once and lets every inference worker answer all waiting requests, repeating until one batch was trained.
"""

from __future__ import annotations

import logging

import torch

from fastrl.workers.inference import InferenceWorker
from fastrl.workers.learner import Learner
from fastrl.workers.process import WorkerContext, flush_denormals
from fastrl.workers.rollout import RolloutWorker, WouldBlock

MAX_IDLE_ROUNDS = 10_000  # rounds without any progress before declaring a deadlock


class SerialDriver:
    def __init__(self, ctx: WorkerContext, log: logging.Logger):
        torch.set_num_threads(1)  # one thread: the same float summation order on every run
        # as the worker processes compute; close() gives the runner's process its own setting back
        self._flushed_before = flush_denormals(ctx.cfg.system.flush_denormals)
        s = ctx.cfg.sampler
        self.learner = Learner(ctx, log)
        self.inference = [InferenceWorker(ctx, i, log) for i in range(s.num_inference_workers)]
        for inf in self.inference:
            inf.actor.wait_for_first_weights(inf._idle)  # the runner published them before creating us
        self.rollouts = [RolloutWorker(ctx, w, log, block=False) for w in range(s.num_rollout_workers)]

    def advance(self) -> dict | None:
        """Run the pipeline until the learner has trained one batch; its report. None when the rollout
        workers have sampled the run's train_for_env_steps and no batch is left to train."""
        idle = 0
        while True:
            # a batch left waiting (two slots handed over in one round) is trained before anything steps
            # again, as the learner would the moment it is free: a rollout worker acting natively hands
            # a slot over every pump, and the slots would otherwise pile up, ever staler
            if self.learner.collect(block=False):
                return self.learner.train_one()
            if all(rollout.budget_spent for rollout in self.rollouts):
                return None
            progressed = False
            for rollout in self.rollouts:
                try:
                    rollout.start()  # does nothing once every group has its slot
                    rollout.pump()
                    progressed = True
                except WouldBlock:
                    pass
            for inf in self.inference:
                inf.pump(0.0)
            idle = 0 if progressed else idle + 1
            if idle > MAX_IDLE_ROUNDS:
                raise RuntimeError("serial mode made no progress (deadlock); check sampler.num_traj_buffers")

    def close(self) -> None:
        try:
            self.learner.save()
            for rollout in self.rollouts:
                rollout.close()
        finally:
            flush_denormals(self._flushed_before)
