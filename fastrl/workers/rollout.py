"""Rollout worker: steps its envs and writes each observation once into a shared trajectory slot.

Each worker owns `num_splits` groups of envs. While one group waits for its actions from an
inference worker, the previous group is stepping in envpool's C++ threads: the loop sends a
group's actions, then collects the group sent before it. A slot holds one group's rollout of
T steps; when it is full the slot index goes to the learner and the group continues in a slot
taken from the free queue, carrying the bootstrap observation over as the new slot's first.
Where each group is its own envpool, only the first is built at start, the others once it has filled
a batch's worth of slots (one envpool shared by the groups makes all their envs at once):
the first sample and the first trained batch need one group, and building envs can take seconds
(Atari).

`pump()` advances one group by one env step. In a worker process it blocks where it must wait;
the serial driver (fastrl.runner.serial) calls it with `block=False`, and then every wait point
comes before any state changes, raising WouldBlock so the same call can simply be repeated.
"""

from __future__ import annotations

import logging
import os
import time

from fastrl.algo.reward_scaling import ReturnScaler
from fastrl.buffers.control import NO_OWNER
from fastrl.config.checks import envs_per_split, rollout_workers_act, slots_per_batch
from fastrl.envs import make_group, make_groups
from fastrl.envs.actions import EnvActions
from fastrl.envs.vector import PooledGroup
from fastrl.ipc import put_report, wait_any
from fastrl.workers.native_steps import NativeSteps, unavailable_reason
from fastrl.workers.recording import make_recorder
from fastrl.workers.process import (SCHED_POLICIES, WorkerContext, heartbeat_index, lower_priority,
                                   seconds_since_process_start)

POLL_S = 0.1
FIRST_SAMPLE_WAIT_S = 10.0  # the longest a worker other than the first waits for it before making envs


class Stopped(Exception):
    """The run is stopping; raised from inside a wait."""


class WouldBlock(Exception):
    """Non-blocking mode: this worker cannot progress until another component has."""


class RolloutWorker:
    def __init__(self, ctx: WorkerContext, worker_index: int, log: logging.Logger, block: bool = True):
        cfg = ctx.cfg
        self.ctx, self.index, self.log, self.block = ctx, worker_index, log, block
        self.num_splits, self.num_envs, self.T = cfg.sampler.num_splits, envs_per_split(cfg), cfg.sampler.rollout_len
        self.hb = heartbeat_index(cfg, "rollout", worker_index)
        self.control = ctx.control
        self.generation = int(self.control.rollout_generation.array[worker_index])
        ch = ctx.channels
        acts = rollout_workers_act(cfg)
        self.actor = None  # made once the envs are: it may need a network's layout that is not there yet
        self.requests = None if acts else ch.requests[worker_index]
        self.replies = None if acts else ch.replies[worker_index]
        self.free_ring, self.full_ring, self.bell = ch.free_slots[worker_index], ch.full_slots[worker_index], \
            ch.rollout_bells[worker_index]
        self.reports = ch.reports[self.hb]
        # slots a dead predecessor held: the runner made sure nothing else writes them any more
        self.adopted = self.control.slots_held_by(worker_index)
        b = ctx.bufs
        self.obs, self.actions = b.obs.array, b.actions.array
        spec = ctx.spec
        self.env_actions = EnvActions(spec)
        # a replacement worker gets fresh env seeds, so it does not replay its predecessor's episodes
        total_envs = cfg.sampler.num_rollout_workers * cfg.sampler.num_envs_per_worker
        self.first_env = (cfg.run.seed * 1_000_003 + self.generation * total_envs
                          + worker_index * cfg.sampler.num_envs_per_worker)
        # Only the first group is built now; the others later (_build_other_groups).
        # Making an env can cost far more than stepping it (an Atari env ~130 CPU-ms, mostly ALE's
        # palette tables), and the first sample, hence the first trained batch, needs one group only:
        # on the Pong preset this brings both ~1.5 s earlier.
        if self._on_first_sample_path():
            self.envs = self._make_first_groups()
            self._lower_priority()
        else:  # the learner, or a running pipeline, comes before this worker's envs
            self._wait_for_first_sample()
            self._lower_priority()
            self.envs = self._make_first_groups()
        if acts:
            self.actor = self._make_actor()
        self.slots_handed_over = 0
        # this sitting's share of run.train_for_env_steps: a worker whose hand-over finds the run's count
        # there steps no further, so a run ends within a slot per rollout worker of its target instead of
        # sampling on until the runner's next look and its shutdown (CartPole's preset asked for 20,000 and
        # counted 27,648)
        self.env_steps_budget = cfg.run.train_for_env_steps - ctx.base_env_steps
        self.budget_spent = False
        # the first trained batch needs this many slots; the learner, waiting for them (or starting
        # at the first sample), gets them sooner from groups that keep stepping than from groups
        # stopped to make envs
        self.slots_before_other_groups = max(1, slots_per_batch(cfg))
        n = self.num_splits
        self.slot = [-1] * n
        self.next_slot = [-1] * n  # taken one step before the current slot fills, while nothing is half-done
        self.t = [0] * n
        self.token = [0] * n       # id of each group's outstanding action request
        self.sent = [False] * n    # actions sent to the envs, result not yet collected
        self.k = 0                 # the group collected next
        self.ready: dict[int, int] = {}  # group -> token of the latest reply received
        self.inference_epoch = self.control.inference_epoch
        # reward scaling statistics are per worker; they restart with the worker (and on resume) and
        # settle within a few rollouts
        scaler = ReturnScaler((n, self.num_envs), cfg.algo.gamma) if cfg.algo.normalize_rewards else None
        self.recorder = make_recorder(cfg.system.native_record, self.envs[0], b, n, self.num_envs, scaler,
                                      self._count_nonfinite)
        # the steps between slot boundaries in one C++ call, where this worker acts and records natively
        self.why_no_native_steps = unavailable_reason(self)
        self.native_steps = NativeSteps(self) if self.why_no_native_steps is None else None

    def _count_nonfinite(self, env_steps: int) -> None:
        self.control.nonfinite.array[self.index] += env_steps

    def _on_first_sample_path(self) -> bool:
        """Only the first worker of a fresh start makes its envs at full priority and at once: envpool
        already makes one group's envs on every core, so two workers making theirs together only
        delay the first sample (by ~1.5 s on the Pong preset here). A replacement worker is not on
        that path either. The serial driver's workers make theirs at once (nothing runs meanwhile)."""
        return (self.index == 0 and self.generation == 0) or not self.block

    def _make_actor(self):
        """The policy this worker acts with. On a fresh run the learner builds the network while this
        worker makes its envs (fastrl.workers.first_weights): wait for its layout first."""
        from fastrl.models.numpy_policy import acting_backend
        from fastrl.workers.acting import PolicyActor

        ctx = self.ctx
        while not ctx.weights.attach_layout():
            self._idle()
            time.sleep(0.005)
        return PolicyActor(ctx, seed=ctx.cfg.run.seed * 7919 + 104729 * (self.index + 1),
                           backend=acting_backend(ctx.cfg, ctx.spec))

    def _wait_for_first_sample(self) -> None:
        """Until the run's first slot is full, or FIRST_SAMPLE_WAIT_S (a replacement never waits)."""
        if self.generation > 0:
            return
        started = time.monotonic()
        while self.control.total_env_steps() == 0 and time.monotonic() - started < FIRST_SAMPLE_WAIT_S:
            self._idle()
            time.sleep(0.01)
        self.log.info("waited %.1f s for the run's first sample before making envs%s", time.monotonic() - started,
                      "" if self.control.total_env_steps() else " (gave up waiting)")

    def _lower_priority(self) -> None:
        if self.block:  # a worker process; the serial driver's workers live in the runner's
            lower_priority(self.ctx.cfg.system.rollout_nice, self.ctx.cfg.system.rollout_sched_policy)

    def _make_first_groups(self) -> list:
        """The first group, or every group where they share one envpool (sampler.env_pool), which makes all
        their envs at once: then nothing is left to build later."""
        with self.control.making_envs(self.hb):
            return make_groups(self.ctx.cfg.env, self.ctx.spec, self.ctx.cfg.sampler, seed=self.first_env,
                               first_only=True)

    def _build_other_groups(self) -> None:
        started = time.perf_counter()
        while len(self.envs) < self.num_splits:
            with self.control.making_envs(self.hb):
                self.envs.append(make_group(self.ctx.cfg.env, self.ctx.spec, self.ctx.cfg.sampler, self.first_env,
                                            len(self.envs)))
        self.log.info("built the other %d group(s) of %d envs in %.1f s, after handing over %d slot(s)",
                      self.num_splits - 1, self.num_envs, time.perf_counter() - started, self.slots_handed_over)

    # --- waiting, always with an eye on the stop flag
    def _idle(self) -> None:
        self.control.beat(self.hb)
        if self.control.stop_requested:
            raise Stopped

    def _wait_for_stop(self) -> None:
        """The run has sampled all the env steps it is to train for: nothing more to step until the runner
        stops it (the serial driver sees budget_spent instead)."""
        if not self.block:
            raise WouldBlock
        while True:
            self._idle()
            time.sleep(POLL_S)

    def _take_free_slot(self) -> int:
        if self.adopted:
            return self.adopted.pop(0)
        started = time.perf_counter()
        # journaled: if we die between the pop and owning the slot, the runner gives it to our replacement
        # (SharedControl.repair_journal); only we move this ring's tail, so it stands still while we wait
        self.control.journal_take(self.index, self.free_ring.tail)
        try:
            while True:
                got = self.free_ring.pop_all(max_records=1)
                if got:
                    slot = got[0][0]
                    self.control.slot_owner.array[slot] = self.index  # so the runner can reclaim it if we die
                    return slot
                if not self.block:
                    raise WouldBlock
                self._idle()
                wait_any(self.bell, [self.free_ring], POLL_S)
        finally:
            self.control.journal_done(self.index)
            self.control.add_wait(self.hb, time.perf_counter() - started)

    def _take_replies(self) -> None:
        if self.actor is not None:
            return
        for generation, split, token in self.replies.pop_all():
            if generation == self.generation:  # replies to a predecessor are not ours
                self.ready[split] = token

    def _wait_actions(self, split: int) -> None:
        if self.ready.get(split) == self.token[split]:
            return
        started = time.perf_counter()
        try:
            while True:
                self._take_replies()
                if self.ready.get(split) == self.token[split]:
                    return
                if not self.block:
                    raise WouldBlock
                self._idle()
                self._resend_if_inference_restarted()
                wait_any(self.bell, [self.replies], POLL_S)
        finally:
            self.control.add_wait(self.hb, time.perf_counter() - started)

    def _resend_if_inference_restarted(self) -> None:
        """A replacement inference worker never saw the requests its predecessor had taken."""
        if self.actor is not None:
            return
        epoch = self.control.inference_epoch
        if epoch == self.inference_epoch:
            return
        self.inference_epoch = epoch
        self._take_replies()
        for split in range(len(self.envs)):
            if self.slot[split] >= 0 and not self.sent[split] and self.ready.get(split) != self.token[split]:
                self._request(split)  # same token: the inference worker answers it once
        self.log.info("inference worker replaced; re-sent outstanding requests")

    # --- the per-step work
    def _request(self, split: int) -> None:
        if self.actor is not None:  # acting here and now: the request is answered on the spot
            self.actor.act([(self.slot[split], self.t[split])])
            self.ready[split] = self.token[split]
            return
        self.requests.push((self.index, self.generation, split, self.token[split], self.slot[split], self.t[split]))

    def _send(self, split: int) -> None:
        self.envs[split].send(self.env_actions(self.actions[self.slot[split], self.t[split]]))

    def _record(self, split: int) -> None:
        """Collect group `split`'s env step into its slot; hand the slot over when it is full."""
        slot, t = self.slot[split], self.t[split]
        self.recorder.record(split, self.envs[split], slot, t)
        t += 1
        if t == self.T:
            new_slot, self.next_slot[split] = self.next_slot[split], -1
            self.obs[new_slot, 0] = self.obs[slot, t]
            # give up ownership and count the steps before handing over, so that no slot is trained twice or
            # trained uncounted; journaled, so that if we die in between the runner takes the slot back
            # uncounted (SharedControl.repair_journal) instead of losing it
            self.control.journal_handover(self.index, slot, self.full_ring.head)
            self.control.slot_owner.array[slot] = NO_OWNER
            self.control.env_steps.array[self.index] += self.T * self.num_envs
            self.full_ring.push(slot)
            self.control.journal_done(self.index)
            self.slots_handed_over += 1
            self.slot[split], t = new_slot, 0
            scores, lengths = self.recorder.take_finished()
            if scores:
                put_report(self.reports, {"kind": "episodes", "scores": scores, "lengths": lengths})
            self.budget_spent = self.control.total_env_steps() >= self.env_steps_budget
        self.t[split] = t
        self.control.inflight_steps.array[self.index] = sum(self.t) * self.num_envs

    def start(self) -> None:
        """Give every group a slot, its first observation and its first action request."""
        if self.actor is not None and self.actor.version < 0:
            self.actor.wait_for_first_weights(lambda: self.control.beat(self.hb) or self.control.stop_requested)
            if self.actor.version < 0:
                raise Stopped
        for s, env in enumerate(self.envs):
            if self.slot[s] < 0:
                self.slot[s] = self._take_free_slot()
                self.obs[self.slot[s], 0] = env.reset().obs
                self._request(s)

    def pump(self) -> None:
        """Collect one env step of group k, keeping group k+1 stepping meanwhile."""
        self.control.beat(self.hb)
        if self.budget_spent:
            self._wait_for_stop()
        if len(self.envs) < self.num_splits and self.slots_handed_over >= self.slots_before_other_groups:
            self._build_other_groups()
        if self.slot[len(self.envs) - 1] < 0:
            self.start()  # groups just built: slots, first observations, first requests
        if self.native_steps is not None:
            # the steps before the next boundary first, so that a boundary step ends the call as in the
            # Python-only loop: in serial mode the learner then trains at the same step either way
            self.native_steps.run()
        k, groups = self.k, len(self.envs)
        for split in (k, (k + 1) % groups):
            if not self.sent[split]:
                self._wait_actions(split)
                self._send(split)
                self.sent[split] = True
        if self.t[k] == self.T - 1 and self.next_slot[k] < 0:
            self.next_slot[k] = self._take_free_slot()
        self.sent[k] = False
        self._record(k)
        self.token[k] += 1
        self._request(k)
        self.k = (k + 1) % groups

    def run(self) -> None:
        try:
            self.start()  # a stop can arrive while waiting for a first free slot: waits raise Stopped
            self.log.info("%d x %d envs reset%s, first actions requested, %.1f s after process start, nice %d%s%s",
                          len(self.envs), self.num_envs,
                          " (one shared envpool)" if isinstance(self.envs[0], PooledGroup) else "",
                          seconds_since_process_start(), os.nice(0),
                          "" if self.ctx.cfg.system.rollout_sched_policy == "normal"
                          else f", {SCHED_POLICIES[self.ctx.cfg.system.rollout_sched_policy]}",
                          ", steps between slot boundaries in one C++ call" if self.native_steps
                          else f", every step through Python ({self.why_no_native_steps})")
            while not self.control.stop_requested:
                self.pump()
        except Stopped:
            pass
        finally:
            self.close()

    def close(self) -> None:
        for env in self.envs:
            env.close()


def rollout_loop(ctx: WorkerContext, index: int, log: logging.Logger) -> None:
    try:
        worker = RolloutWorker(ctx, index, log)
    except Stopped:  # the run stopped before this worker made its envs
        return
    worker.run()
