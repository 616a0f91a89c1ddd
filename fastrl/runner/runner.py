"""The runner (main process): allocates shared memory, spawns the workers, watches them,
reports progress, and stops everything in order.

Shutdown order: set the shared stop flag; the learner writes its final checkpoint; every child
is joined (then terminated, then killed if it will not go); every shared-memory segment is
unlinked. That runs on a normal end, on Ctrl-C / SIGTERM, and when a child fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from fastrl.buffers import SharedControl, SharedWeights, ShmAllocator, TrajBuffers, remove_stale_segments
from fastrl.config.checks import envs_per_split, num_traj_buffers, rollout_workers_act
from fastrl.config.schema import Config
from fastrl.envs import EnvSpec
from fastrl.ipc import Channels
from fastrl.rundir import load_checkpoint, write_json
from fastrl.runner.stats import RunStats
from fastrl.runner.supervisor import Supervisor
from fastrl.workers.process import WorkerContext, num_processes, setup_logging

if TYPE_CHECKING:
    from fastrl.models import ActorCritic


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
        self.supervisor: Supervisor | None = None  # the child processes (None in serial mode)
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
        if self.supervisor is not None:
            self.supervisor.kill_all()
        self.alloc.unlink_all()
        os._exit(130)

    @property
    def procs(self) -> dict:
        return {} if self.supervisor is None else self.supervisor.procs

    def _initial_model(self) -> tuple[ActorCritic, int, int]:
        import torch  # ~1.2 CPU-s: by now rollout workers that do not act are already creating envs

        from fastrl.models import ActorCritic

        torch.manual_seed(self.cfg.run.seed)
        model = ActorCritic(self.spec, self.cfg.model)
        version = env_steps = 0
        if self.resume_checkpoint is not None:
            state = load_checkpoint(self.resume_checkpoint)
            model.load_state_dict(state["model"])
            version, env_steps = int(state["policy_version"]), int(state["env_steps"])
        return model, version, env_steps

    def _handle_reports(self, channels: Channels, stats: RunStats, timeout_s: float) -> None:
        for msg in channels.take_reports(timeout_s):
            if msg["kind"] == "error":
                self.say(f"ERROR: {msg['process']} crashed:\n{msg['traceback']}")
                if self.supervisor is not None:
                    self.supervisor.note_error(msg["process"], msg["traceback"])
                if msg["process"] == "fastrl-learner":
                    self.failure = self.failure or f"fastrl-learner crashed: {msg['traceback'].strip().splitlines()[-1]}"
            else:
                if msg["kind"] == "learner":
                    self._log_learner(msg)
                stats.on_report(msg)

    def _log_learner(self, msg: dict) -> None:
        """One line per trained batch in learner.jsonl: losses, counters (what the determinism test compares)."""
        row = {k: v for k, v in msg.items() if isinstance(v, (int, float)) and k != "kind"}
        self._learner_log.write(json.dumps(row) + "\n")

    def _setup_buffers(self) -> WorkerContext:
        """Allocate the trajectory slots, the control block and the rings: all a rollout worker that
        does not act needs. The weights come later (they need torch), so such workers can start
        creating envs, the longest part of startup (~90 ms of CPU per Atari env), meanwhile."""
        cfg = self.cfg
        num_slots = num_traj_buffers(cfg)
        bufs = TrajBuffers.allocate(self.alloc, self.spec, num_slots, cfg.sampler.rollout_len, envs_per_split(cfg))
        control = SharedControl.allocate(self.alloc, num_processes(cfg), cfg.sampler.num_rollout_workers,
                                         cfg.sampler.num_inference_workers, num_slots)
        channels = Channels.allocate(self.alloc, cfg.sampler.num_rollout_workers, cfg.sampler.num_inference_workers,
                                     num_slots, cfg.sampler.num_splits, num_processes(cfg), cfg.system.native_rings)
        for slot in range(num_slots):  # dealt round-robin; the learner rebalances as it frees them
            channels.free_slots[slot % cfg.sampler.num_rollout_workers].push(slot)
        return WorkerContext(cfg, self.spec, bufs, control, None, channels, str(self.run_dir / "train.log"),
                             str(self.run_dir / "checkpoints"), 0,
                             None if self.resume_checkpoint is None else str(self.resume_checkpoint))

    def _setup_weights(self, ctx: WorkerContext) -> WorkerContext:
        """Publish the starting weights: the complete context, for the learner and any actor."""
        cfg = self.cfg
        model, version, base_env_steps = self._initial_model()
        weights = SharedWeights.allocate(self.alloc, model)
        weights.publish(model, version)
        mode = "serial debug mode, one process" if cfg.system.serial else \
            f"{cfg.sampler.num_inference_workers} inference worker(s)"
        if rollout_workers_act(cfg):
            from fastrl.models.numpy_policy import acting_backend

            mode += f", rollout workers act in {acting_backend(cfg, self.spec)}"
        self.say(f"fastrl: {cfg.env.id} ({self.spec.backend}), {cfg.sampler.num_rollout_workers} rollout workers x "
                 f"{cfg.sampler.num_envs_per_worker} envs in {cfg.sampler.num_splits} splits, {mode}, "
                 f"{cfg.model.precision} network, {cfg.system.learner_threads} learner thread(s), "
                 f"{ctx.bufs.num_slots} trajectory slots ({self.alloc.total_bytes / 2**20:.1f} MiB shared), "
                 f"run dir {self.run_dir}")
        return dataclasses.replace(ctx, weights=weights, base_env_steps=base_env_steps)

    def run(self) -> int:
        cfg = self.cfg
        removed = remove_stale_segments()
        if removed:
            self.log.info("removed %d shared-memory segments left by dead runs", len(removed))
        old_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self._learner_log = open(self.run_dir / "learner.jsonl", "a", buffering=1)
        self._metrics_log = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        serial = writer = None
        try:
            ctx = self._setup_buffers()
            spawned_at = time.monotonic()
            if not cfg.system.serial:
                self.supervisor = Supervisor(cfg, ctx, self.log, self.say)
            early = self.supervisor is not None and not rollout_workers_act(cfg)
            if early:  # they need no weights: let them create envs while this process loads torch
                self.supervisor.start_rollouts()
            ctx = self._setup_weights(ctx)
            base_env_steps, control, channels = ctx.base_env_steps, ctx.control, ctx.channels
            from tensorboardX import SummaryWriter  # imports torch when it is installed

            writer = SummaryWriter(str(self.run_dir))
            stats = RunStats(self.spec.frames_per_env_step, base_env_steps, start_time=spawned_at)
            if cfg.system.serial:
                from fastrl.runner.serial import SerialDriver

                serial = SerialDriver(ctx, self.log)
            else:
                self.supervisor.start_learner_and_inference(ctx)
                if not early:
                    self.supervisor.start_rollouts()
            last_report = time.monotonic()
            while self.stop_reason is None and self.failure is None:
                had_trained = stats.first_train_after_command_s is not None  # reports below may change it
                if serial is not None:
                    serial.advance()
                    self._handle_reports(channels, stats, 0.0)
                else:
                    self._handle_reports(channels, stats, 0.2)
                    self.failure = self.failure or self.supervisor.check()
                had_samples = stats.first_sample_s is not None
                stats.on_env_steps(base_env_steps + control.total_env_steps())
                if not had_samples and stats.first_sample_s is not None:
                    self.log.info("first trajectory slot full, %.1f s after the command started (%.1f s after "
                                  "spawning the workers)", stats.first_sample_after_command_s, stats.first_sample_s)
                if not had_trained and stats.first_train_after_command_s is not None:
                    self.log.info("first batch trained, %.1f s after the command started",
                                  stats.first_train_after_command_s)
                self.stop_reason = self.stop_reason or finished_reason(cfg, stats)
                if self.on_tick is not None:
                    self.on_tick(self, stats, control)
                if time.monotonic() - last_report >= cfg.run.report_interval_s:
                    last_report = time.monotonic()
                    self._report(stats, control, writer)
            self.say(f"stopping: {self.failure or self.stop_reason}")
            if serial is not None:
                serial.close()
            else:
                self.supervisor.shutdown()
            self._handle_reports(channels, stats, 0.05)
            stats.on_env_steps(base_env_steps + control.total_env_steps())
            summary = stats.summary()
            summary.update(stop_reason=self.stop_reason, failure=self.failure,
                           worker_restarts={} if self.supervisor is None else self.supervisor.restarts_total,
                           env_steps_lost_in_worker_faults=0 if self.supervisor is None else self.supervisor.lost_env_steps,
                           nonfinite_transitions_masked=int(control.nonfinite.array.sum()))
            write_json(self.run_dir / "summary.json", summary)
            self._report(stats, control, writer, echo=False)
            self.say(format_summary(summary, self.run_dir))
            return 1 if self.failure else 0
        finally:
            if self.supervisor is not None:
                self.supervisor.kill_all()
            if writer is not None:
                writer.close()
            self._learner_log.close()
            self._metrics_log.close()
            self.alloc.unlink_all()
            for s, h in old_handlers.items():
                signal.signal(s, h)

    def _report(self, stats: RunStats, control: SharedControl, writer, echo: bool = True) -> None:
        if echo:
            self.say(stats.console_line(self.cfg.run.train_for_env_steps))
        scalars = stats.scalars()
        scalars["health/nonfinite_transitions_masked"] = float(control.nonfinite.array.sum())
        if self.supervisor is not None:
            scalars["health/worker_restarts"] = float(sum(self.supervisor.restarts_total.values()))
        for key, value in scalars.items():
            writer.add_scalar(key, value, stats.env_steps)
        row = {"env_steps": stats.env_steps, "frames": stats.frames, "wall_s": round(stats.wall_s, 2), **scalars}
        self._metrics_log.write(json.dumps(row) + "\n")


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
