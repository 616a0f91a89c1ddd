"""The runner (main process): allocates shared memory, spawns the workers, watches them,
reports progress, and stops everything in order.

Shutdown order: set the shared stop flag; the learner writes its final checkpoint; every child
is joined (then terminated, then killed if it will not go); every shared-memory segment is
unlinked. That runs on a normal end, on Ctrl-C / SIGTERM / SIGHUP, and when a child fails.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from fastrl.buffers import SharedControl, SharedWeights, ShmAllocator, TrajBuffers, remove_stale_segments
from fastrl.buffers.weights import state_layout
from fastrl.config.checks import envs_per_split, num_traj_buffers, rollout_workers_act
from fastrl.config.schema import Config
from fastrl.envs import EnvSpec
from fastrl.host import usable_cpus
from fastrl.ipc import Channels
from fastrl.ipc.channels import REPORT_POLL_S
from fastrl.rundir import load_checkpoint, write_json
from fastrl.rundir.episodes import EpisodesFileError, load_episodes_until, save_recent_episodes
from fastrl.rundir.records import JsonLinesRecord, ScalarEventsRecord
from fastrl.runner.placement import RolloutPlacement
from fastrl.runner.run_end import finished_reason, format_summary
from fastrl.runner.stats import EPISODE_WINDOW, RunStats
from fastrl.runner.supervisor import Supervisor
from fastrl.runner.warm_start import WarmChildren
from fastrl.workers.first_weights import LEARNER, RUNNER, acts_in_bf16, first_weights_builder
from fastrl.workers.process import WorkerContext, die_of_signal, heartbeat_index, num_processes, setup_logging

if TYPE_CHECKING:
    from fastrl.models import ActorCritic


class Runner:
    def __init__(self, cfg: Config, spec: EnvSpec, run_dir: Path, resume_checkpoint: Path | None = None,
                 echo: bool = True, on_tick: Callable[["Runner", RunStats, SharedControl], None] | None = None,
                 warm: WarmChildren | None = None):
        """`on_tick` is called from the monitoring loop (every ~0.2 s); `fastrl bench` measures through it.
        `warm`: workers spawned before this runner existed (fastrl.runner.warm_start); the supervisor
        starts them instead of spawning their first instances, and the runner releases any it did not."""
        self.cfg, self.spec, self.run_dir = cfg, spec, run_dir
        self.warm = warm
        self.resume_checkpoint = resume_checkpoint
        self.echo = echo
        self.on_tick = on_tick
        self.log = setup_logging(str(run_dir / "train.log"), "fastrl-runner", echo=False)
        self.stop_reason: str | None = None
        self.failure: str | None = None
        self.interrupts = 0
        self.stop_signal: int | None = None  # the first signal that asked the run to stop
        self.supervisor: Supervisor | None = None  # the child processes (None in serial mode)
        self.placement: RolloutPlacement | None = None  # the rollout workers' pinning (system.rollout_pinning)
        self.alloc = ShmAllocator()
        self.ctx: WorkerContext | None = None  # grows: the weights' data block joins it once the network exists
        self.events: ScalarEventsRecord | None = None  # TensorBoard's; made at the first sample
        self.learner_record: JsonLinesRecord | None = None  # learner.jsonl, made by run()
        self.metrics_record: JsonLinesRecord | None = None  # metrics.jsonl, made by run()

    def say(self, text: str) -> None:
        self.log.info(text)
        if self.echo:
            try:
                print(text, flush=True)
            except OSError:  # the terminal went away (EIO after a hang-up): train.log still gets every line
                self.echo = False

    # --- signals: the first asks for an orderly stop, the second leaves at once
    def _on_signal(self, signum, _frame) -> None:
        if signum == signal.SIGHUP:
            # never "the second": a hang-up can come twice (the kernel's to a session leader, and a
            # shell's to its jobs), and nobody is left at the terminal to be in a hurry
            self._stop_for(signum)
            return
        self.interrupts += 1
        if self.interrupts == 1:
            self._stop_for(signum)
            return
        if self.supervisor is not None:
            self.supervisor.kill_all()
        self.alloc.unlink_all()
        die_of_signal(signum)

    def _stop_for(self, signum: int) -> None:
        # kept even when the run is already stopping for its own reason (its end, a bench window):
        # the press still means "stop what started this run too" (a shell loop, fastrl tune's search)
        self.stop_signal = self.stop_signal or signum
        self.stop_reason = self.stop_reason or f"received {signal.Signals(signum).name}"

    @property
    def procs(self) -> dict:
        return {} if self.supervisor is None else self.supervisor.procs

    def _initial_model(self) -> tuple[ActorCritic, int, int]:
        from fastrl.models import seeded_model  # loads torch (~2 CPU-s): only when this process builds the network

        model = seeded_model(self.spec, self.cfg.model, self.cfg.run.seed)
        version = env_steps = 0
        if self.resume_checkpoint is not None:
            state = load_checkpoint(self.resume_checkpoint)
            model.load_state_dict(state["model"])
            version, env_steps = int(state["policy_version"]), int(state["env_steps"])
        return model, version, env_steps

    def _handle_reports(self, channels: Channels, stats: RunStats, timeout_s: float) -> None:
        for msg in channels.take_reports(timeout_s):
            if msg["kind"] == "error":
                reason = msg.get("reason")  # an error that says it all in one line, without a traceback
                self.say(f"ERROR: {msg['process']}: {reason}" if reason
                         else f"ERROR: {msg['process']} crashed:\n{msg['traceback']}")
                if self.supervisor is not None:
                    self.supervisor.note_error(msg["process"], msg["traceback"])
                if msg["process"] == "fastrl-learner" and self.failure is None:
                    last_line = (msg["traceback"].strip().splitlines() or ["(no traceback)"])[-1]
                    self.failure = f"fastrl-learner: {reason}" if reason else f"fastrl-learner crashed: {last_line}"
            elif msg["kind"] == "weights_layout":
                self._complete_weights(msg["layout"], msg["acting_bf16"])
            else:
                if msg["kind"] == "learner":
                    self._log_learner(msg)
                stats.on_report(msg)

    def _log_learner(self, msg: dict) -> None:
        """One line per trained batch in learner.jsonl: losses, counters (what the determinism test compares)."""
        row = {k: v for k, v in msg.items() if isinstance(v, (int, float)) and k != "kind"}
        self.learner_record.append(row)

    def _setup_buffers(self) -> WorkerContext:
        """Allocate the trajectory slots, the control block, the rings and the weights' header: all
        a rollout worker that does not act, or an inference worker, needs to start. The weights'
        data block comes later: it is sized by the network, and building that needs torch."""
        cfg = self.cfg
        num_slots = num_traj_buffers(cfg)
        bufs = TrajBuffers.allocate(self.alloc, self.spec, num_slots, cfg.sampler.rollout_len, envs_per_split(cfg))
        control = SharedControl.allocate(self.alloc, num_processes(cfg), cfg.sampler.num_rollout_workers,
                                         cfg.sampler.num_inference_workers, num_slots)
        channels = Channels.allocate(self.alloc, cfg.sampler.num_rollout_workers, cfg.sampler.num_inference_workers,
                                     num_slots, cfg.sampler.num_splits, num_processes(cfg), cfg.system.native_rings)
        for slot in range(num_slots):  # dealt round-robin; the learner rebalances as it frees them
            channels.free_slots[slot % cfg.sampler.num_rollout_workers].push(slot)
        return WorkerContext(cfg, self.spec, bufs, control, SharedWeights.reserve(self.alloc), channels,
                             str(self.run_dir / "train.log"), str(self.run_dir / "checkpoints"), 0,
                             None if self.resume_checkpoint is None else str(self.resume_checkpoint))

    def _publish_initial_weights(self, ctx: WorkerContext) -> WorkerContext:
        """The runner builds and publishes the starting weights (seeded init, or the resumed checkpoint's)."""
        model, version, base_env_steps = self._initial_model()
        weights = ctx.weights.complete(self.alloc, state_layout(model), acts_in_bf16(self.cfg, self.spec, model))
        self._log_weights_block(weights)
        weights.publish(model, version)
        return dataclasses.replace(ctx, weights=weights, base_env_steps=base_env_steps)

    def _complete_weights(self, layout: list, acting_bf16: bool) -> None:
        """Inference worker 0 or the learner built the network (WorkerContext.first_weights_by):
        allocate the data block it publishes into. Every process spawned from now on gets the
        complete handle; those spawned before attach it (SharedWeights.attach, attach_layout)."""
        if self.ctx.weights.is_complete:
            return  # a replacement inference worker asked again
        weights = self.ctx.weights.complete(self.alloc, layout, acting_bf16)
        self._log_weights_block(weights)
        self._set_ctx(dataclasses.replace(self.ctx, weights=weights))

    def _log_weights_block(self, weights: SharedWeights) -> None:
        self.log.info("weights: %d floats a version%s", weights.data.shape[0],
                      "; the actors load the learner's versions as bf16 from a block of their own (system.publish_bf16)"
                      if weights.has_acting_block else "")

    def _set_ctx(self, ctx: WorkerContext) -> None:
        """What every child spawned from now on gets, the supervisor's replacements included."""
        self.ctx = ctx
        if self.supervisor is not None:
            self.supervisor.ctx = ctx

    def _announce(self) -> None:
        cfg = self.cfg
        mode = "serial debug mode, one process" if cfg.system.serial else \
            f"{cfg.sampler.num_inference_workers} inference worker(s)"
        if rollout_workers_act(cfg):
            from fastrl.models.numpy_policy import acting_backend, native_kernel

            backend = acting_backend(cfg, self.spec)
            native = backend == "numpy" and native_kernel(cfg.system.native_acting)
            mode += f", rollout workers act in {backend}" + (" (fastrl_ext kernel)" if native else "")
        mask_note = self.spec.action_mask_note()
        if mask_note:
            mode += f", {mask_note}"
        shards = (f" x {cfg.system.learner_shards} shards ({cfg.system.learner_split})"
                  if cfg.system.learner_shards > 1 else "")
        self.say(f"fastrl: {cfg.env.id} ({self.spec.backend}), {cfg.sampler.num_rollout_workers} rollout workers x "
                 f"{cfg.sampler.num_envs_per_worker} envs in {cfg.sampler.num_splits} split(s), {mode}, "
                 f"{cfg.model.precision} network, {cfg.system.learner_threads} learner thread(s)"
                 f"{shards}, "
                 f"{self.ctx.bufs.num_slots} trajectory slots ({self.alloc.total_bytes / 2**20:.1f} MiB shared"
                 f"{'' if self.ctx.weights.is_complete else ' before the weights'}), run dir {self.run_dir}")

    def _start_processes(self) -> None:
        """Spawn what produces the first sample in the order that gets it soonest on a small box.

        On a fresh run a child that loads torch anyway builds the starting network
        (fastrl.workers.first_weights), inference worker 0 or else the learner, so this process
        loads none; the rollout workers start at once and make their envs meanwhile. Otherwise
        (a resumed run's checkpoint, or torch loaded here already) this process publishes them,
        and rollout workers that do not act are spawned before that and start making envs
        meanwhile. The learner of such a run waits for the first full slot (`_on_first_sample`)."""
        cfg, sup = self.cfg, self.supervisor
        builder = RUNNER if sup is None else first_weights_builder(cfg, self.resume_checkpoint is not None,
                                                                   runner_has_torch="torch" in sys.modules)
        self._set_ctx(dataclasses.replace(self.ctx, first_weights_by=builder))
        if builder != RUNNER:
            self._announce()
            if builder == LEARNER:
                sup.start_learner()
            sup.start_rollouts()
            sup.start_inference()
            return
        acting_here = rollout_workers_act(cfg)
        if sup is not None and not acting_here:
            sup.start_rollouts()
        self._set_ctx(self._publish_initial_weights(self.ctx))
        self._announce()
        if sup is not None:
            sup.start_inference()
            if acting_here:
                sup.start_rollouts()

    def _on_first_sample(self) -> None:
        """A learner that does not build the starting network starts only now: nothing is there to
        train before, and loading torch costs it ~2 CPU-s on cores the first sample needs (one that
        builds it is already running: `_start_processes`). The TensorBoard writer is made here too
        (its import is ~0.4 CPU-s even without torch, see fastrl.rundir.records)."""
        if self.supervisor is not None:
            self.supervisor.start_learner()
        self._events()

    def _events(self) -> ScalarEventsRecord:
        if self.events is None:
            self.events = ScalarEventsRecord(self.run_dir)
        return self.events

    def _record_error(self) -> str | None:
        """Why one of the run's records could not be written (a full disk), or None: the run stops
        in order then, rather than train on while what it learns can no longer be kept."""
        for record in (self.learner_record, self.metrics_record, self.events):
            if record is not None and record.error is not None:
                return record.error
        return None

    def _placement(self) -> RolloutPlacement | None:
        """The rollout workers' pinning (system.rollout_pinning), for a run with worker processes."""
        mode = self.cfg.system.rollout_pinning
        if mode == "never" or self.supervisor is None:
            return None
        wait_s = self.ctx.control.wait_s.array
        learner = heartbeat_index(self.cfg, "learner", 0)
        return RolloutPlacement(mode, self.cfg.sampler.num_rollout_workers, rollout_workers_act(self.cfg), usable_cpus(),
                                lambda: float(wait_s[learner]), self.supervisor.rollout_pids, self.log,
                                time.monotonic())

    def run(self) -> int:
        cfg = self.cfg
        removed = remove_stale_segments()
        if removed:
            self.log.info("removed %d shared-memory segments left by dead runs", len(removed))
        # SIGHUP too: a closed terminal or a dropped ssh session stops the run with a final checkpoint
        # and its summary, as Ctrl-C does, instead of killing it mid-batch
        old_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self.learner_record = JsonLinesRecord(self.run_dir / "learner.jsonl")
        self.metrics_record = JsonLinesRecord(self.run_dir / "metrics.jsonl")
        serial = None
        try:
            self.ctx = self._setup_buffers()
            spawned_at = time.monotonic()
            if not cfg.system.serial:
                self.supervisor = Supervisor(cfg, self.ctx, self.log, self.say, warm=self.warm)
            self._start_processes()
            self.placement = self._placement()
            base_env_steps, control, channels = self.ctx.base_env_steps, self.ctx.control, self.ctx.channels
            stats = RunStats(self.spec.frames_per_env_step, base_env_steps, start_time=spawned_at)
            if self.resume_checkpoint is not None:
                self._restore_episodes(stats, base_env_steps)
            if cfg.system.serial:
                from fastrl.runner.serial import SerialDriver

                serial = SerialDriver(self.ctx, self.log)
            last_report = time.monotonic()
            while self.stop_reason is None and self.failure is None:
                had_trained = stats.first_train_after_command_s is not None  # reports below may change it
                if serial is not None:
                    serial.advance()
                    self._handle_reports(channels, stats, 0.0)
                else:
                    self._handle_reports(channels, stats, REPORT_POLL_S)
                    self.failure = self.failure or self.supervisor.check()
                    if self.placement is not None:
                        self.placement.update(time.monotonic())
                had_samples = stats.first_sample_s is not None
                stats.on_env_steps(base_env_steps + control.total_env_steps())
                if not had_samples and stats.first_sample_s is not None:
                    self.log.info("first trajectory slot full, %.1f s after the command started (%.1f s after "
                                  "the runner's setup)", stats.first_sample_after_command_s, stats.first_sample_s)
                    self._on_first_sample()
                if not had_trained and stats.first_train_after_command_s is not None:
                    self.log.info("first batch trained, %.1f s after the command started",
                                  stats.first_train_after_command_s)
                self.stop_reason = self.stop_reason or finished_reason(cfg, stats)
                if self.on_tick is not None:
                    self.on_tick(self, stats, control)
                if time.monotonic() - last_report >= cfg.run.report_interval_s:
                    last_report = time.monotonic()
                    self._report(stats, control)
                self.failure = self.failure or self._record_error()
            self.say(f"stopping: {self.failure or self.stop_reason}")
            # what the stop check saw; episodes reported while the workers shut down still join the
            # final mean below, which can therefore differ from the value that ended the run
            mean_return_at_stop = stats.mean_score
            if serial is not None:
                serial.close()
            else:
                self.supervisor.shutdown()
            self._handle_reports(channels, stats, 0.05)
            stats.on_env_steps(base_env_steps + control.total_env_steps())
            summary = stats.summary()
            summary.update(stop_reason=self.stop_reason, failure=self.failure, mean_return_at_stop=mean_return_at_stop,
                           worker_restarts={} if self.supervisor is None else self.supervisor.restarts_total,
                           env_steps_lost_in_worker_faults=0 if self.supervisor is None else self.supervisor.lost_env_steps,
                           nonfinite_transitions_masked=int(control.nonfinite.array.sum()),
                           # this run's (not a resumed one's earlier) env steps, by rollout worker index
                           env_steps_by_rollout_worker=[int(n) for n in control.env_steps.array],
                           rollout_pinned_fraction=None if self.placement is None
                           else round(self.placement.pinned_fraction(), 3))
            try:
                write_json(self.run_dir / "summary.json", summary)
            except OSError as e:  # a full disk: the summary line below still says it all
                self.say(f"WARNING: could not write summary.json: {e}")
            self._report(stats, control, echo=False)
            self.say(format_summary(summary, self.run_dir))
            if self.failure:
                return 1
            # a stop the run did not reach by itself is no success: 128 + N, which the command
            # then makes true by dying of signal N (fastrl.cli.entry)
            return 0 if self.stop_signal is None else 128 + self.stop_signal
        finally:
            if self.warm is not None:
                self.warm.close()
            if self.supervisor is not None:
                self.supervisor.kill_all()
            for record in (self.events, self.learner_record, self.metrics_record):
                if record is not None:
                    record.close()
            self.alloc.unlink_all()
            for s, h in old_handlers.items():
                signal.signal(s, h)

    def _restore_episodes(self, stats: RunStats, checkpoint_env_steps: int) -> None:
        """The games finished before the resumed checkpoint open this run's mean-return window."""
        try:
            episodes = load_episodes_until(self.run_dir, checkpoint_env_steps, EPISODE_WINDOW)
        except EpisodesFileError as e:
            self.say(f"WARNING: {e}; the mean return starts again from this run's games")
            return
        stats.restore_episodes(episodes)
        self.log.info("resumed the mean return's window with %d games finished by env step %d",
                      len(episodes), checkpoint_env_steps)

    def _save_episodes(self, stats: RunStats) -> None:
        try:
            save_recent_episodes(self.run_dir, list(stats.recent_episodes))
        except OSError as e:
            # a full disk: metrics.jsonl's failed row stops the run and says so; a resume then
            # restores the games of the last file that was written
            self.log.warning("could not write %s: %s", self.run_dir / "episodes.json", e)

    def _report(self, stats: RunStats, control: SharedControl, echo: bool = True) -> None:
        if echo:
            self.say(stats.console_line(self.cfg.run.train_for_env_steps))
        scalars = stats.scalars()
        scalars["health/nonfinite_transitions_masked"] = float(control.nonfinite.array.sum())
        if self.supervisor is not None:
            scalars["health/worker_restarts"] = float(sum(self.supervisor.restarts_total.values()))
        self._events().add_scalars(scalars, stats.env_steps)
        row = {"env_steps": stats.env_steps, "frames": stats.frames, "wall_s": round(stats.wall_s, 2), **scalars}
        self.metrics_record.append(row)
        self._save_episodes(stats)

