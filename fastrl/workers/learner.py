"""Learner: assembles batches from full trajectory slots, trains APPO, publishes weights.

Slots are copied out and freed before training starts, so rollout workers refill them while
the learner computes: the number of slots bounds how far sampling can run ahead (back-pressure).
Weights go to shared memory after every optimizer step; checkpoints are written periodically
and once more on the way out.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from fastrl.algo.appo import BATCH_KEYS, APPOTrainer, scheduled_lr
from fastrl.config.checks import slots_per_batch
from fastrl.host import CoresDuringWaits
from fastrl.ipc import put_report, wait_any
from fastrl.models import ActorCritic, seeded_model
from fastrl.rundir import load_checkpoint, save_checkpoint
from fastrl.workers.first_weights import LEARNER, hand_over_first_weights
from fastrl.workers.process import WorkerContext, heartbeat_index

POLL_S = 0.1


def build_learner_model(spec, cfg, seed: int | None = None) -> ActorCritic:
    """The model as the learner trains it (also what `fastrl bench` times); with `seed`, the run's
    starting weights (fastrl.models.seeded_model), which any process building them gets alike."""
    model = ActorCritic(spec, cfg.model) if seed is None else seeded_model(spec, cfg.model, seed)
    return model.to(torch.device(cfg.system.device)).train().use_channels_last()


def pick_free_ring(waiting: list[int], last: int) -> int:
    """Which rollout worker gets the next freed slot: the one with the fewest free slots waiting
    (`waiting[w]`), ties going round-robin from the worker after `last`.

    Ties used to go to worker 0. With one slot per batch every freed slot found all rings empty (a
    running worker pops its slot at once), so worker 0 got every one: on the CartPole preset with
    `sampler.num_splits=1`, worker 1 handed over 2 slots in a whole run against worker 0's 290, and
    its half-filled slot of version-0 actions reached the learner at the end, 1,897 versions stale."""
    fewest = min(waiting)
    n = len(waiting)
    return next(w for w in ((last + k) % n for k in range(1, n + 1)) if waiting[w] == fewest)


class Learner:
    def __init__(self, ctx: WorkerContext, log: logging.Logger):
        cfg = ctx.cfg
        self.ctx, self.cfg, self.log = ctx, cfg, log
        self.hb = heartbeat_index(cfg, "learner", 0)
        self.device = torch.device(cfg.system.device)
        self.builds_first_weights = ctx.first_weights_by == LEARNER
        if self.builds_first_weights:  # published in run(), once the runner has the block for them
            self.model = build_learner_model(ctx.spec, cfg, seed=cfg.run.seed)
            initial_version = 0
        else:
            # The starting weights (seeded init, or the resumed checkpoint's model) were published
            # with their policy version before any sample existed, by the runner or by inference
            # worker 0; start from exactly those instead of building or loading them twice.
            self.model = build_learner_model(ctx.spec, cfg)
            staging = ctx.weights.new_staging()
            initial_version = ctx.weights.try_read(staging)
            if initial_version is None:
                raise RuntimeError("the starting weights were not published before the learner started")
            ctx.weights.load_into(self.model, staging)
        self.trainer = APPOTrainer(self.model, cfg.algo, cfg.sampler.max_policy_lag, seed=cfg.run.seed,
                                   shards=cfg.system.learner_shards, split=cfg.system.learner_split)
        self.trainer.policy_version = initial_version
        self.train_steps = 0  # batches trained
        self.slots_needed = slots_per_batch(cfg)
        self.pending: list[int] = []  # full slots taken from the rollout workers' rings, oldest first
        # In the last learner_serial_tail of each batch's minibatches the other shard threads join one only
        # while this many of the next batch's slots are full (see _parallel_now_ok)
        self.parallel_after_slots = math.ceil(cfg.system.learner_parallel_backlog * self.slots_needed)
        self.parallel_until = (1 - cfg.system.learner_serial_tail) * cfg.algo.num_epochs * cfg.algo.num_minibatches
        if cfg.system.learner_serial_tail > 0 and self.parallel_after_slots > 0:
            self.trainer.parallel_when = self._parallel_now_ok
        ch = ctx.channels
        self.full_rings, self.free_rings, self.bell = ch.full_slots, ch.free_slots, ch.learner_bell
        self.last_freed_to = -1  # the rollout worker that got the last freed slot
        self.reports = ch.reports[self.hb]
        self.busy_s = self.wait_s = 0.0
        # the cores' time, and of it the idle time, over the learner's waits for data: a wait that the
        # samplers fill with work is their share of a shared machine, one the cores idle through is waste
        self.wait_cores = CoresDuringWaits()
        self.ckpt_dir = Path(ctx.checkpoint_dir)
        if ctx.resume_checkpoint:
            self._restore(Path(ctx.resume_checkpoint))

    # --- checkpoints
    def _restore(self, path: Path) -> None:
        """Optimizer, counters and RNG; the model itself arrived through the published weights."""
        state = load_checkpoint(path)
        self.trainer.optimizer.load_state_dict(state["optimizer"])
        self.train_steps = int(state["train_steps"])
        self.trainer.skipped_total = int(state.get("nonfinite_steps_skipped", 0))
        if "torch_rng" in state:
            self.trainer.generator.set_state(state["torch_rng"])
        self.log.info("resumed from %s at policy version %d", path, self.trainer.policy_version)

    def env_steps(self) -> int:
        return self.ctx.base_env_steps + self.ctx.control.total_env_steps()

    def save(self) -> Path | None:
        finite = all(torch.isfinite(p).all() for p in self.model.state_dict().values())
        if not finite:
            self.log.error("weights are not finite; checkpoint skipped")
            return None
        state = {"model": self.model.state_dict(), "optimizer": self.trainer.optimizer.state_dict(),
                 "policy_version": self.trainer.policy_version, "train_steps": self.train_steps,
                 "env_steps": self.env_steps(), "env_id": self.cfg.env.id,
                 "lr": self.trainer.optimizer.param_groups[0]["lr"], "torch_rng": self.trainer.generator.get_state(),
                 "nonfinite_steps_skipped": self.trainer.skipped_total}
        path = save_checkpoint(self.ckpt_dir, state, self.cfg.run.keep_checkpoints)
        self.log.info("saved %s", path.name)
        return path

    def _between_minibatches(self) -> bool:
        """Before each minibatch: a heartbeat, since one batch can outlast the supervisor's patience
        (a batch that took longer than system.heartbeat_timeout_s stopped the run as a hung learner),
        and whether to stop."""
        self.ctx.control.beat(self.hb)
        return self.ctx.control.stop_requested

    def _publish(self) -> None:
        weights, working_copy = self.ctx.weights, self.trainer.bf16_copy
        # actors that load bf16 get the working copy's weights, which the optimizer's step rounded already
        acting = (working_copy.current_copies(weights.layout_tensors(self.model))
                  if weights.has_acting_block and working_copy is not None else None)
        weights.publish(self.model, self.trainer.policy_version, acting)

    # --- data
    def collect(self, block: bool = True) -> bool:
        """True once a batch worth of slots is pending. Blocking: waits, False if asked to stop first;
        non-blocking (serial driver): False if not enough slots are full yet."""
        started = time.perf_counter()
        try:
            while len(self.pending) < self.slots_needed:
                self._take_full_slots()
                self.ctx.control.beat(self.hb)
                if len(self.pending) >= self.slots_needed:
                    break
                if self.ctx.control.stop_requested or not block:
                    return False
                self.wait_cores.begin()  # only once it blocks, about once a batch
                wait_any(self.bell, self.full_rings, POLL_S)
            return True
        finally:
            waited = time.perf_counter() - started
            self.wait_s += waited
            self.ctx.control.add_wait(self.hb, waited)
            self.wait_cores.end()

    def _parallel_now_ok(self, minibatches_done: int) -> bool:
        """Asked during training, with how many of the batch's minibatches have run: may the other shard
        threads join what comes next? Yes before the batch's serial tail; in it, only while
        system.learner_parallel_backlog's share of the next batch is full."""
        if minibatches_done < self.parallel_until:
            return True
        if len(self.pending) < self.parallel_after_slots:
            self._take_full_slots()
        return len(self.pending) >= self.parallel_after_slots

    def _take_full_slots(self) -> None:
        """Every slot the rollout workers have filled since the last look, onto `pending`."""
        for ring in self.full_rings:
            self.pending.extend(slot for (slot,) in ring.pop_all())

    def _assemble(self) -> dict:
        """Copy the batch's slots out of shared memory, time-major [T(+1), slots*envs, ...], and free them."""
        ids = self._take_batch_slots()
        bufs = self.ctx.bufs
        batch = {}
        for key in BATCH_KEYS:
            arr = getattr(bufs, key).array
            batch[key] = torch.from_numpy(np.concatenate([arr[i] for i in ids], axis=1)).to(self.device)
        self._free(ids)
        return batch

    def _take_batch_slots(self) -> list[int]:
        ids, self.pending = self.pending[:self.slots_needed], self.pending[self.slots_needed:]
        return ids

    def _free(self, slots: list[int]) -> None:
        """Each freed slot goes to the rollout worker with the fewest free slots waiting: a slow or
        replaced worker does not hoard them, and none is starved (see pick_free_ring)."""
        for slot in slots:
            self.last_freed_to = pick_free_ring([len(r) for r in self.free_rings], self.last_freed_to)
            self.free_rings[self.last_freed_to].push(slot)

    def train_one(self) -> dict:
        """Train on the pending batch (or free it untrained in benchmark mode) and report."""
        cfg = self.cfg
        started = time.perf_counter()
        if cfg.system.learner_discards_batches:
            self._free(self._take_batch_slots())
            stats = {"valid_samples": 0, "samples": 0, "dropped_for_lag": 0}
        else:
            batch = self._assemble()
            self.trainer.set_lr(scheduled_lr(cfg.algo, self.env_steps(), cfg.run.train_for_env_steps))
            stats = self.trainer.train(batch, publish=self._publish, should_stop=self._between_minibatches)
            self.train_steps += 1
        self.busy_s += time.perf_counter() - started
        stats.update(kind="learner", policy_version=self.trainer.policy_version, train_steps=self.train_steps,
                     busy_s=self.busy_s, wait_s=self.wait_s, wait_core_s=self.wait_cores.core_s,
                     wait_idle_core_s=self.wait_cores.idle_core_s, nonfinite_steps_skipped=self.trainer.skipped_total,
                     minibatches=self.trainer.minibatches_run, parallel_minibatches=self.trainer.minibatches_parallel)
        put_report(self.reports, stats)
        self.ctx.control.beat(self.hb)
        limit = cfg.system.max_nonfinite_steps_in_row
        if self.trainer.skipped_in_row >= limit:
            path = self.save()  # the weights are still the last good ones: skipped steps never touched them
            raise NonFiniteTraining(
                f"{self.trainer.skipped_in_row} optimizer steps in a row had a non-finite loss or gradient "
                f"(system.max_nonfinite_steps_in_row={limit}); stopped with the last good checkpoint "
                f"{path.name if path else '(none: weights not finite)'}")
        return stats

    def run(self) -> None:
        if self.builds_first_weights and not hand_over_first_weights(self.ctx, self.hb, self.model, self.log):
            self.save()  # stopped before any sample: the starting weights, as any orderly stop leaves a checkpoint
            return
        last_save = time.monotonic()
        while self.collect():
            self.train_one()
            if time.monotonic() - last_save >= self.cfg.run.save_every_s:
                self.save()
                last_save = time.monotonic()
        self.save()


class NonFiniteTraining(RuntimeError):
    """Training keeps producing NaN/inf: stopping beats burning hours of compute on it."""


def learner_loop(ctx: WorkerContext, index: int, log: logging.Logger) -> None:
    Learner(ctx, log).run()
