"""The runner's child processes: start them, notice a death or a hang within a second or a
heartbeat timeout, replace a dead rollout or inference worker, and stop them all in order.

Replacing rollout worker w (its envs crashed, it was killed, it hung):
  1. kill what is left of it;
  2. bump its generation (inference workers drop its old requests, it ignores their replies)
     and the reclaim epoch, then wait until every inference worker has started a batch after
     that, so nothing can still be writing into w's slots;
  3. start a new process for w (fresh env seeds, same env-step counter), which adopts the slots
     control.slot_owner says w held and rewrites them from t=0: only w's in-flight rollout is
     lost; the full slots w had already handed over are trained once, as usual.
Replacing inference worker i: start a new one on the same request queue and bump the inference
epoch; rollout workers then re-send their unanswered requests (answered once, by token).
A worker replaced more than `max_restarts_per_worker` times within `restart_window_s`, or any
learner death, stops the run.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from fastrl.buffers.control import INFERENCE_EPOCH, RECLAIM_EPOCH
from fastrl.config.schema import Config
from fastrl.runner.warm_start import WarmChildren
from fastrl.workers.process import (WorkerContext, child_environment, child_env_overrides, child_main, heartbeat_index,
                                   process_name, terminal_signals_ignored_from_birth)

LEARNER_JOIN_S = 60.0  # the learner may be mid-batch and then writes the final checkpoint
WORKER_JOIN_S = 10.0
RECLAIM_WAIT_S = 5.0
# The runner checks its children every ~0.2 s; a longer gap between two checks means it was not
# running either (Ctrl-Z then fg, a suspended laptop whose wall clock jumped on waking, a starved
# box), so its children's silence over the gap says nothing about them
CHECK_GAP_S = 5.0
# each child's loop, imported in the child (child_main): the learner's and inference worker's
# modules load torch (~2 CPU-s), which the runner need not load at all
LOOPS = {"learner": "fastrl.workers.learner:learner_loop", "inference": "fastrl.workers.inference:inference_loop",
         "rollout": "fastrl.workers.rollout:rollout_loop"}


@dataclass
class Child:
    role: str
    index: int
    process: mp.Process
    spawned_at: float
    hb: int
    restarts: deque = field(default_factory=deque)  # times of recent replacements
    last_error: str | None = None


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Supervisor:
    def __init__(self, cfg: Config, ctx: WorkerContext, log: logging.Logger, say: Callable[[str], None],
                 warm: WarmChildren | None = None):
        # `ctx` is what children spawned from now on get: the runner replaces it once the weights'
        # data block exists, so the learner and any replacement worker get the complete handle
        self.cfg, self.ctx, self.log, self.say = cfg, ctx, log, say
        self.control = ctx.control
        self.children: dict[str, Child] = {}
        self.restarts_total: dict[str, int] = {}
        self.lost_env_steps = 0  # stepped by workers that died before handing their slots over
        self._spawn_ctx = mp.get_context("spawn")
        self.warm = warm  # first instances already spawned and importing (fastrl.runner.warm_start)
        self._last_check: float | None = None
        self._watching_since = 0.0  # wall time from which a child's silence counts (CHECK_GAP_S)

    @property
    def procs(self) -> dict[str, mp.Process]:
        return {name: c.process for name, c in self.children.items()}

    def rollout_pids(self) -> dict[int, int]:
        """The live rollout workers' pids by worker index (fastrl.runner.placement)."""
        return {c.index: c.process.pid for c in self.children.values()
                if c.role == "rollout" and c.process.pid is not None and c.process.is_alive()}

    def _start(self, role: str, index: int) -> None:
        name = process_name(role, index)
        hb = heartbeat_index(self.cfg, role, index)
        self.control.heartbeats.array[hb] = 0.0
        self.control.making_envs_since.array[hb] = 0.0  # a predecessor killed while making its envs
        args = (role, index, self.ctx, LOOPS[role])
        overrides = child_env_overrides(self.cfg, role)
        p = None if self.warm is None else self.warm.take(role, index, args)  # spawned with `overrides` too
        if p is None:
            p = self._spawn_ctx.Process(target=child_main, args=args, name=name, daemon=True)
            with child_environment(overrides), terminal_signals_ignored_from_birth():
                p.start()
        old = self.children.get(name)
        self.children[name] = Child(role, index, p, time.time(), hb, old.restarts if old else deque())

    def start_rollouts(self) -> None:
        for i in range(self.cfg.sampler.num_rollout_workers):
            self._start("rollout", i)

    def start_inference(self) -> None:
        for i in range(self.cfg.sampler.num_inference_workers):
            self._start("inference", i)

    def start_learner(self) -> None:
        if process_name("learner", 0) not in self.children:
            self._start("learner", 0)

    def note_error(self, name: str, traceback_text: str) -> None:
        if name in self.children:
            lines = [ln for ln in traceback_text.strip().splitlines() if ln.strip()]
            self.children[name].last_error = lines[-1] if lines else None

    # --- watching
    def _fault(self, name: str, child: Child, now: float) -> str | None:
        code = child.process.exitcode
        if code is not None:
            why = describe_exit(code)
            return f"{why} ({child.last_error})" if child.last_error else why
        # each clock below starts no earlier than the end of a gap in the runner's own checks
        making_envs_since = self.control.making_envs_since.array[child.hb]
        if making_envs_since != 0.0:  # inside one long call that cannot beat (SharedControl.making_envs)
            limit = self.cfg.system.env_make_timeout_s
            making_s = now - max(making_envs_since, self._watching_since)
            return f"took more than {limit:g} s to make its envs (hung)" if making_s > limit else None
        beat = self.control.heartbeats.array[child.hb]
        if beat == 0.0 and now - max(child.spawned_at, self._watching_since) > self.cfg.system.startup_timeout_s:
            return f"did not start within {self.cfg.system.startup_timeout_s:g} s"
        silent_s = now - max(beat, self._watching_since)
        if beat != 0.0 and silent_s > self.cfg.system.heartbeat_timeout_s:
            return f"sent no heartbeat for {silent_s:.0f} s (hung)"
        return None

    def check(self) -> str | None:
        """Replace dead or hung workers; the reason the run must stop, or None."""
        now = time.time()
        if self._last_check is not None and now - self._last_check > CHECK_GAP_S:
            self._watching_since = now
            self.log.info("the runner did not check on its children for %.0f s (paused, suspended, starved or "
                          "busy): their heartbeats count from now", now - self._last_check)
        self._last_check = now
        for name, child in list(self.children.items()):
            why = self._fault(name, child, now)
            if why is None:
                continue
            if child.process.is_alive():
                child.process.kill()
                child.process.join(5.0)
            if child.role == "learner":
                return f"{name} {why}"
            window = self.cfg.system.restart_window_s
            while child.restarts and now - child.restarts[0] > window:
                child.restarts.popleft()
            if len(child.restarts) >= self.cfg.system.max_restarts_per_worker:
                return (f"{name} {why}; it was already replaced {len(child.restarts)} times within {window:g} s "
                        f"(system.max_restarts_per_worker={self.cfg.system.max_restarts_per_worker})")
            child.restarts.append(now)
            self._replace(name, child, why)
        return None

    def _replace(self, name: str, child: Child, why: str) -> None:
        started = time.monotonic()
        extra = ""
        if child.role == "rollout":
            lost = int(self.control.inflight_steps.array[child.index])
            self.control.inflight_steps.array[child.index] = 0
            self.lost_env_steps += lost
            reclaimed = self._reclaim_slots(child.index)
            extra = f"; reclaimed {len(reclaimed)} trajectory slot(s), lost its {lost} in-flight env steps"
            self._start("rollout", child.index)
        else:
            self._start("inference", child.index)
            self.control.flags.array[INFERENCE_EPOCH] += 1
        self.restarts_total[name] = self.restarts_total.get(name, 0) + 1
        self.say(f"WARNING: {name} {why}{extra}; replaced it in {time.monotonic() - started:.2f} s "
                 f"(restart {len(child.restarts)} of at most {self.cfg.system.max_restarts_per_worker} "
                 f"within {self.cfg.system.restart_window_s:g} s)")

    def _reclaim_slots(self, rollout_index: int) -> list[int]:
        control = self.control
        control.rollout_generation.array[rollout_index] += 1
        control.flags.array[RECLAIM_EPOCH] += 1
        epoch = control.reclaim_epoch
        deadline = time.monotonic() + RECLAIM_WAIT_S
        inference = [c for c in self.children.values() if c.role == "inference"]
        while time.monotonic() < deadline:
            behind = [c for c in inference if c.process.is_alive()
                      and control.inference_seen_epoch.array[c.index] < epoch]
            if not behind:
                break
            time.sleep(0.005)
        else:
            self.log.warning("inference workers did not confirm reclaim epoch %d within %.0f s", epoch, RECLAIM_WAIT_S)
        # a slot it died taking or handing over belongs to it again or was delivered (see the journal)
        repaired = control.repair_journal(rollout_index, self.ctx.channels.full_slots[rollout_index],
                                          self.ctx.channels.free_slots[rollout_index])
        if repaired:
            self.log.info("rollout worker %d's slot journal: %s", rollout_index, repaired)
        # the replacement adopts these (control.slot_owner) before taking new ones from its ring
        return control.slots_held_by(rollout_index)

    # --- stopping
    def shutdown(self) -> None:
        self.control.request_stop()
        self._kill_workers_that_cannot_see_the_stop()
        deadline = {name: time.monotonic() + (LEARNER_JOIN_S if c.role == "learner" else WORKER_JOIN_S)
                    for name, c in self.children.items()}
        for name, c in self.children.items():
            p = c.process
            p.join(max(0.0, deadline[name] - time.monotonic()))
            if p.is_alive():
                self.log.warning("%s did not stop in time; terminating", name)
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)

    def _kill_workers_that_cannot_see_the_stop(self) -> None:
        """A rollout or inference worker still starting (no heartbeat yet: importing torch, unpickling
        its context) or inside one env-making call sees the stop flag only once that is over: seconds
        on two cores (a Ctrl-C in a run's first seconds took 3-4.5 s to take effect). Such a worker
        has nothing to save, so it is killed at once rather than waited for. The learner is always
        waited for, even while it starts: a stop leaves a checkpoint, whenever it comes."""
        heartbeats, making_envs_since = self.control.heartbeats.array, self.control.making_envs_since.array
        for name, c in self.children.items():
            if c.role == "learner" or not c.process.is_alive():
                continue
            if heartbeats[c.hb] == 0.0 or making_envs_since[c.hb] != 0.0:
                doing = "still starting" if heartbeats[c.hb] == 0.0 else "making envs"
                self.log.info("%s was %s at the stop, which it cannot see until that is over: killed it", name, doing)
                c.process.kill()

    def kill_all(self) -> None:
        for c in self.children.values():
            if c.process.is_alive():
                c.process.kill()
