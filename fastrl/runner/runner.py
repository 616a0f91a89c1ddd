"""The runner (main process): allocates shared memory, spawns the workers, watches them,
reports progress, and stops everything in order.

Shutdown order: set the shared stop flag; the learner writes its final checkpoint; every child
is joined (then terminated, then killed if it will not go); every shared-memory segment is
unlinked. That runs on a normal end, on Ctrl-C / SIGTERM, and when a child fails.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from typing import Callable

import torch

from fastrl.buffers import SharedControl, SharedWeights, ShmAllocator, TrajBuffers, remove_stale_segments
from fastrl.config.checks import envs_per_split, num_traj_buffers
from fastrl.config.loader import config_to_dict
from fastrl.config.schema import Config
from fastrl.envs import EnvSpec
from fastrl.ipc import Channels, get_many
from fastrl.models import ActorCritic
from fastrl.rundir import load_checkpoint, write_json
from fastrl.runner.stats import RunStats
from fastrl.workers.inference import inference_loop
from fastrl.workers.learner import learner_loop
from fastrl.workers.process import WorkerContext, child_main, heartbeat_index, num_processes, process_name, setup_logging
from fastrl.workers.rollout import rollout_loop

LEARNER_JOIN_S = 60.0  # the learner may be mid-batch and then writes the final checkpoint
WORKER_JOIN_S = 10.0


class Runner:
    def __init__(self, cfg: Config, spec: EnvSpec, run_dir: Path, resume_checkpoint: Path | None = None,
                 echo: bool = True, on_tick: Callable[["Runner", RunStats, SharedControl], None] | None = None):
        """`on_tick` is called from the monitoring loop (every ~0.2 s); `fastrl bench` measures through it."""
        self.cfg, self.spec, self.run_dir = cfg, spec, run_dir
        self.resume_checkpoint = resume_checkpoint
        self.echo = echo
        self.on_tick = on_tick
        self.log = setup_logging(str(run_dir / "train.log"), "fastrl-runner", echo=False)
        self.stop_reason: str | None = None
        self.failure: str | None = None
        self.interrupts = 0
        self.procs: dict[str, mp.Process] = {}
        self.hb_index: dict[str, int] = {}  # process name -> its cell in the heartbeat array
        self.alloc = ShmAllocator()

    def say(self, text: str) -> None:
        self.log.info(text)
        if self.echo:
            print(text, flush=True)

    # --- signals: the first asks for an orderly stop, the second leaves at once
    def _on_signal(self, signum, _frame) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            self.stop_reason = f"received {signal.Signals(signum).name}"
            return
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
        self.alloc.unlink_all()
        os._exit(130)

    def _initial_model(self) -> tuple[ActorCritic, int, int]:
        torch.manual_seed(self.cfg.run.seed)
        model = ActorCritic(self.spec, self.cfg.model)
        version = env_steps = 0
        if self.resume_checkpoint is not None:
            state = load_checkpoint(self.resume_checkpoint)
            model.load_state_dict(state["model"])
            version, env_steps = int(state["policy_version"]), int(state["env_steps"])
        return model, version, env_steps

    def _spawn(self, ctx: WorkerContext) -> None:
        spawn = mp.get_context("spawn")
        roles = [("learner", 0, learner_loop)]
        roles += [("inference", i, inference_loop) for i in range(self.cfg.sampler.num_inference_workers)]
        roles += [("rollout", i, rollout_loop) for i in range(self.cfg.sampler.num_rollout_workers)]
        for role, index, loop in roles:
            name = process_name(role, index)
            p = spawn.Process(target=child_main, args=(role, index, ctx, loop), name=name, daemon=True)
            p.start()
            self.procs[name] = p
            self.hb_index[name] = heartbeat_index(self.cfg, role, index)

    def _check_children(self, control: SharedControl, spawned_at: float) -> None:
        now = time.time()
        for name, p in self.procs.items():
            if p.exitcode is not None:
                self.failure = self.failure or f"{name} exited unexpectedly with code {p.exitcode}"
                return
            beat = control.heartbeats.array[self.hb_index[name]]
            if beat == 0.0:
                if now - spawned_at > self.cfg.system.startup_timeout_s:
                    self.failure = f"{name} did not start within {self.cfg.system.startup_timeout_s:.0f} s"
                    return
            elif now - beat > self.cfg.system.heartbeat_timeout_s:
                self.failure = f"{name} sent no heartbeat for {now - beat:.0f} s (hung?)"
                return

    def _handle_reports(self, channels: Channels, stats: RunStats, timeout_s: float) -> None:
        for msg in get_many(channels.reports, timeout_s):
            if msg["kind"] == "error":
                self.failure = self.failure or f"{msg['process']} crashed"
                self.say(f"ERROR: {msg['process']} crashed:\n{msg['traceback']}")
            else:
                stats.on_report(msg)

    def _shutdown(self, control: SharedControl) -> None:
        control.request_stop()
        deadline = {name: time.monotonic() + (LEARNER_JOIN_S if name == "fastrl-learner" else WORKER_JOIN_S)
                    for name in self.procs}
        for name, p in self.procs.items():
            p.join(max(0.0, deadline[name] - time.monotonic()))
            if p.is_alive():
                self.log.warning("%s did not stop in time; terminating", name)
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)

    def run(self) -> int:
        cfg = self.cfg
        removed = remove_stale_segments()
        if removed:
            self.log.info("removed %d shared-memory segments left by dead runs", len(removed))
        old_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(str(self.run_dir))
        try:
            model, version, base_env_steps = self._initial_model()
            weights = SharedWeights.allocate(self.alloc, model)
            weights.publish(model, version)
            num_slots = num_traj_buffers(cfg)
            bufs = TrajBuffers.allocate(self.alloc, self.spec, num_slots, cfg.sampler.rollout_len, envs_per_split(cfg))
            control = SharedControl.allocate(self.alloc, num_processes(cfg), cfg.sampler.num_rollout_workers,
                                             cfg.sampler.num_inference_workers)
            channels = Channels.create(cfg.sampler.num_rollout_workers, cfg.sampler.num_inference_workers)
            channels.free_slots.put_many(list(range(num_slots)))
            self.say(f"fastrl: {cfg.env.id} ({self.spec.backend}), {cfg.sampler.num_rollout_workers} rollout workers x "
                     f"{cfg.sampler.num_envs_per_worker} envs in {cfg.sampler.num_splits} splits, "
                     f"{cfg.sampler.num_inference_workers} inference worker(s), {num_slots} trajectory slots "
                     f"({self.alloc.total_bytes / 2**20:.1f} MiB shared), run dir {self.run_dir}")
            ctx = WorkerContext(cfg, self.spec, bufs, control, weights, channels, str(self.run_dir / "train.log"),
                                str(self.run_dir / "checkpoints"), base_env_steps,
                                None if self.resume_checkpoint is None else str(self.resume_checkpoint))
            stats = RunStats(self.spec.frames_per_env_step, base_env_steps)
            spawned_at = time.time()
            self._spawn(ctx)
            last_report = time.monotonic()
            while self.stop_reason is None and self.failure is None:
                self._handle_reports(channels, stats, 0.2)
                stats.on_env_steps(base_env_steps + control.total_env_steps())
                self._check_children(control, spawned_at)
                self.stop_reason = self.stop_reason or finished_reason(cfg, stats)
                if self.on_tick is not None:
                    self.on_tick(self, stats, control)
                if time.monotonic() - last_report >= cfg.run.report_interval_s:
                    last_report = time.monotonic()
                    self.say(stats.console_line(cfg.run.train_for_env_steps))
                    for key, value in stats.scalars().items():
                        writer.add_scalar(key, value, stats.env_steps)
            self.say(f"stopping: {self.failure or self.stop_reason}")
            self._shutdown(control)
            self._handle_reports(channels, stats, 0.05)
            stats.on_env_steps(base_env_steps + control.total_env_steps())
            summary = stats.summary()
            summary.update(stop_reason=self.stop_reason, failure=self.failure)
            write_json(self.run_dir / "summary.json", summary)
            for key, value in stats.scalars().items():
                writer.add_scalar(key, value, stats.env_steps)
            self.say(format_summary(summary, self.run_dir))
            return 1 if self.failure else 0
        finally:
            for p in self.procs.values():
                if p.is_alive():
                    p.kill()
            writer.close()
            self.alloc.unlink_all()
            for s, h in old_handlers.items():
                signal.signal(s, h)


def finished_reason(cfg: Config, stats: RunStats) -> str | None:
    """Why the run has reached one of its configured ends, or None while it should go on."""
    run = cfg.run
    if stats.env_steps >= run.train_for_env_steps:
        return f"reached train_for_env_steps={run.train_for_env_steps:,}"
    if run.train_for_seconds is not None and stats.wall_s >= run.train_for_seconds:
        return f"reached train_for_seconds={run.train_for_seconds:g}"
    full_window = len(stats.scores) == stats.scores.maxlen
    if run.stop_at_mean_return is not None and full_window and stats.mean_score >= run.stop_at_mean_return:
        return f"mean return of the last {len(stats.scores)} episodes reached {run.stop_at_mean_return}"
    return None


def format_summary(summary: dict, run_dir: Path) -> str:
    ret = summary["final_mean_return"]
    ret_text = "n/a" if ret is None else f"{ret:.2f} over the last {summary['episodes_in_mean']} episodes"
    frames = ""
    if summary["frames_per_env_step"] > 1:
        frames = f" ({summary['frames']:,} frames)"
    lag = summary["policy_lag"]
    return (f"summary: {summary['env_steps']:,} env steps{frames} in {summary['wall_s']:.1f} s "
            f"({summary['mean_env_steps_per_s']:,.0f} env steps/s); mean return {ret_text}; "
            f"policy lag min/mean/max {lag['min']}/{lag['mean']}/{lag['max']}; "
            f"learner busy {100 * summary['learner_busy_fraction']:.0f}%; saved in {run_dir}")
