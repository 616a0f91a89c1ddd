"""Worker faults during real runs, injected with the packaged fastrl/Faulty-v0 env and kill -9:
the run notices, replaces the worker, keeps its counters consistent and finishes; a worker that
keeps dying, or a dead learner, stops the run cleanly with a message naming it."""

import json
import os
import signal
import time

import pytest

from helpers import ROOT, RunProcess

pytestmark = pytest.mark.integration
CARTPOLE = str(ROOT / "configs/cartpole.yaml")
# the shape SLOT describes: 2 groups of 16 envs per worker (the CartPole preset itself steps 1 group of 32)
SHORT = ["--set", "run.stop_at_mean_return=null", "--set", "run.report_interval_s=1", "--set", "sampler.num_splits=2"]
SLOT = 32 * 16  # rollout_len x envs per split
BATCH = 1024


def faulty(**kwargs) -> list[str]:
    return ["--set", "env.id=fastrl/Faulty-v0", "--set", f"env.kwargs={json.dumps(kwargs)}"]


def assert_clean(run: RunProcess) -> None:
    assert run.leftover_children() == [], "child processes outlived the run"
    assert run.leftover_segments() == [], "shared memory left in /dev/shm"


def assert_counters_consistent(summary: dict, num_slots: int = 9) -> None:
    """Nothing trained twice (trained <= delivered) and nothing lost but in-flight slots."""
    trained = summary["train_steps"] * BATCH
    assert trained <= summary["env_steps"]
    assert summary["env_steps"] - trained <= num_slots * SLOT


def test_env_exception_segfault_and_kill_are_survived(tmp_path):
    faults = tmp_path / "faults"
    run = RunProcess("--config", CARTPOLE, *SHORT, *faulty(crash_after=4000, segfault_after=9000, fault_dir=str(faults)),
                     "--set", "run.train_for_env_steps=200000", runs_dir=tmp_path)
    assert run.wait_for("replaced it", 90), run.output
    assert run.wait_for("killed by SIGSEGV", 90), run.output
    assert run.wait_for("return(last", 60), run.output
    os.kill(_wait_for_process(run, "fastrl-rollout-1"), signal.SIGKILL)
    assert run.wait(180) == 0, run.output
    out = run.output
    assert "exit code 1 (fastrl.envs.faults.InjectedFault: injected env crash" in out
    assert "killed by SIGSEGV" in out and "killed by SIGKILL" in out
    summary = run.summary()
    assert sum(summary["worker_restarts"].values()) >= 3 and summary["failure"] is None
    assert summary["env_steps"] >= 120000
    assert_counters_consistent(summary)
    assert_clean(run)


def _title(pid: int) -> str:
    """The process title set by setproctitle (the kernel's comm name keeps only 15 characters)."""
    import psutil

    try:
        return (psutil.Process(pid).cmdline() or [""])[0]
    except psutil.NoSuchProcess:
        return ""


def _wait_for_process(run: RunProcess, title: str, timeout_s: float = 30.0) -> int:
    """The pid of the run's live child with this title (a replacement takes a moment to name itself)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run.track_children()
        live = [p for p in run.children if _title(p) == title]
        if live:
            return live[-1]
        time.sleep(0.1)
    raise AssertionError(f"no {title} process; output:\n{run.output}")


def test_hung_env_is_detected_by_heartbeat_and_replaced(tmp_path):
    run = RunProcess("--config", CARTPOLE, *SHORT, *faulty(hang_after=3000, fault_dir=str(tmp_path / "f")),
                     "--set", "system.heartbeat_timeout_s=2", "--set", "run.train_for_env_steps=10000000",
                     # long enough for the hang (~1 s in), its 2 s of silence and the replacement, however
                     # fast the box: the healthy worker alone once reached a 150k-step end before that
                     "--set", "run.train_for_seconds=9", runs_dir=tmp_path)
    assert run.wait(150) == 0, run.output
    assert "sent no heartbeat" in run.output and "replaced it" in run.output
    assert_counters_consistent(run.summary())
    assert_clean(run)


def test_envs_slow_to_make_are_not_taken_for_a_hang(tmp_path):
    # 16 envs per group at 0.25 s each: every group takes 4 s to make in one call, twice the heartbeat
    # timeout (hundreds of Atari envs at idle priority took minutes, and were replaced as hung)
    run = RunProcess("--config", CARTPOLE, *SHORT, *faulty(make_delay_s=0.25), "--set", "system.heartbeat_timeout_s=2",
                     "--set", "run.train_for_env_steps=60000", runs_dir=tmp_path)
    assert run.wait(150) == 0, run.output
    assert "WARNING" not in run.output, run.output
    assert run.summary()["worker_restarts"] == {}
    log = (run.run_dir / "train.log").read_text()
    assert "built the other 1 group(s)" in log  # the mid-run make, after slots were handed over, was covered too
    assert_clean(run)


def test_a_make_past_its_own_limit_is_a_hang(tmp_path):
    run = RunProcess("--config", CARTPOLE, *SHORT, *faulty(make_delay_s=0.25), "--set", "system.env_make_timeout_s=1",
                     "--set", "system.max_restarts_per_worker=1", "--set", "run.train_for_env_steps=10000000",
                     runs_dir=tmp_path)
    assert run.wait(150) == 1, run.output
    assert "took more than 1 s to make its envs (hung)" in run.output
    assert_clean(run)


def test_a_stop_does_not_wait_for_envs_being_made(tmp_path):
    # a group of 16 envs at 5 s each: rollout worker 0 is inside one 80 s call when Ctrl-C comes, and
    # sees the stop flag only after it; it was waited for (10 s), then terminated. Worker 1 waits
    # for the run's first sample before making its envs, and stops as usual.
    run = RunProcess("--config", CARTPOLE, *SHORT, *faulty(make_delay_s=5), "--set", "run.train_for_env_steps=60000",
                     runs_dir=tmp_path)
    _wait_for_process(run, "fastrl-rollout-0")
    time.sleep(1.0)  # past its start, into the first env's make
    run.proc.send_signal(signal.SIGINT)
    pressed = time.monotonic()
    assert run.wait(60) == -signal.SIGINT, run.output
    log = (run.run_dir / "train.log").read_text()
    assert "fastrl-rollout-0 was making envs at the stop, which it cannot see until that is over: killed it" in log, log
    assert "fastrl-rollout-1 INFO stopped" in log and "did not stop in time" not in log, log
    assert time.monotonic() - pressed < 8.0, "the stop waited for the envs' make"  # 0.2 s measured; 12 s before
    assert_clean(run)


def test_a_pause_of_the_whole_run_is_not_taken_for_a_hang(tmp_path):
    # Ctrl-Z stops the terminal's whole foreground group, runner included, and `fg` continues it; a
    # laptop's suspend does much the same, with a wall clock that jumps on waking. Paused past the
    # heartbeat timeout, the workers were then replaced as hung (and the learner, had it been looked
    # at first, would have stopped the run).
    run = RunProcess("--config", CARTPOLE, *SHORT, "--set", "system.heartbeat_timeout_s=2",
                     "--set", "run.train_for_env_steps=100000000", runs_dir=tmp_path)
    assert run.wait_for("learner busy", 60) and run.wait_for("return(last", 60), run.output
    run.track_children()
    group = [run.proc.pid, *sorted(run.children)]
    for pid in group:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(5.0)  # 2.5 heartbeat timeouts
    for pid in group:
        os.kill(pid, signal.SIGCONT)
    time.sleep(3.0)  # checked for a while after it: past the heartbeat timeout again
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(30) == -signal.SIGINT, run.output
    assert "WARNING" not in run.output, run.output
    assert run.summary()["worker_restarts"] == {} and run.summary()["failure"] is None
    assert "the runner did not check on its children for" in (run.run_dir / "train.log").read_text()
    assert_clean(run)


def test_a_learner_batch_longer_than_the_heartbeat_timeout_is_not_a_hang(tmp_path):
    # 300 epochs over a batch of 8192: each batch takes a few seconds, past the 2 s timeout, and the
    # learner beat only between batches (a Pong batch of 16384 x 4 epochs took 38 s here, 8 would pass 60).
    # 20,000 env steps end the run after the first such batch (~4 s here); 30,000 waited for three.
    run = RunProcess("--config", CARTPOLE, *SHORT, "--set", "algo.batch_size=8192", "--set", "algo.num_epochs=300",
                     "--set", "sampler.num_traj_buffers=24", "--set", "system.heartbeat_timeout_s=2",
                     "--set", "run.train_for_env_steps=20000", runs_dir=tmp_path)
    assert run.wait(150) == 0, run.output
    assert "WARNING" not in run.output and run.summary()["failure"] is None, run.output
    busy_s = [json.loads(line)["busy_s"] for line in (run.run_dir / "learner.jsonl").read_text().splitlines()]
    assert busy_s and busy_s[0] > 2.0, busy_s  # the first batch alone outlasted the timeout
    assert_clean(run)


def test_a_worker_that_keeps_dying_stops_the_run(tmp_path):
    run = RunProcess("--config", CARTPOLE, *SHORT, *faulty(crash_after=2000),
                     "--set", "system.max_restarts_per_worker=1", "--set", "run.train_for_env_steps=10000000",
                     runs_dir=tmp_path)
    assert run.wait(150) == 1, run.output
    assert "already replaced 1 times" in run.output
    assert run.summary()["failure"]
    assert list((run.run_dir / "checkpoints").glob("checkpoint_*.pt"))
    assert_clean(run)


def test_a_dead_learner_stops_the_run_naming_it(tmp_path):
    run = RunProcess("--config", CARTPOLE, *SHORT, "--set", "run.train_for_env_steps=10000000", runs_dir=tmp_path)
    assert run.wait_for("learner busy", 60) and run.wait_for("return(last", 60), run.output
    os.kill(_wait_for_process(run, "fastrl-learner"), signal.SIGKILL)
    assert run.wait(60) == 1, run.output
    assert "stopping: fastrl-learner killed by SIGKILL" in run.output
    assert_clean(run)


def test_nonfinite_observations_and_rewards_are_masked(tmp_path):
    run = RunProcess("--config", CARTPOLE, *SHORT, *faulty(nan_every=101), "--set", "run.train_for_env_steps=40000",
                     runs_dir=tmp_path)
    assert run.wait(120) == 0, run.output
    summary = run.summary()
    assert summary["nonfinite_transitions_masked"] > 100
    assert summary["nonfinite_steps_skipped"] == 0 and summary["train_steps"] > 0
    last = json.loads((run.run_dir / "learner.jsonl").read_text().splitlines()[-1])
    assert all(v == v for v in last.values())  # no NaN reached the losses
    assert_clean(run)


def test_kill_9_of_the_whole_run_then_resume(tmp_path):
    first = RunProcess("--config", CARTPOLE, *SHORT, "--set", "run.train_for_env_steps=10000000",
                       "--set", "run.save_every_s=1", runs_dir=tmp_path)
    ckpts = first.run_dir / "checkpoints"
    deadline = time.monotonic() + 90
    while len(list(ckpts.glob("checkpoint_*.pt"))) < 2 and time.monotonic() < deadline:
        first.track_children()
        time.sleep(0.2)
    first.track_children()
    first.proc.kill()
    first.proc.wait(10)
    # Children notice a dead parent within a second or two; on a loaded CI box give them longer
    # rather than assert on a fixed sleep.
    deadline = time.monotonic() + 30
    while first.leftover_children() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.leftover_children() == [], "children outlived a kill -9 of the runner"
    while first.leftover_segments() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.leftover_segments() == [], "the killed run's janitor did not remove its segments"
    newest = sorted(ckpts.glob("checkpoint_*.pt"))[-1]
    import torch

    saved = torch.load(newest, weights_only=True)
    second = RunProcess("--resume", "--set", f"run.train_for_env_steps={saved['env_steps'] + 20000}",
                        runs_dir=tmp_path)
    assert second.wait(120) == 0, second.output
    s2 = second.summary()
    assert s2["env_steps"] >= saved["env_steps"] + 20000
    assert s2["train_steps"] > saved["train_steps"] and s2["policy_version"] > saved["policy_version"]
    assert_clean(second)


def test_nonfinite_training_stops_the_run_and_never_checkpoints_bad_weights(tmp_path):
    """An absurd learning rate overflows the weights; the losses turn NaN, every step is skipped,
    and after K in a row the run stops with a message; no checkpoint holds non-finite weights."""
    run = RunProcess("--config", CARTPOLE, *SHORT, "--set", "algo.lr=1e20", "--set", "algo.max_grad_norm=1e30",
                     "--set", "system.max_nonfinite_steps_in_row=4", "--set", "run.train_for_env_steps=10000000",
                     runs_dir=tmp_path)
    assert run.wait(120) == 1, run.output
    assert "optimizer steps in a row had a non-finite loss or gradient" in run.output
    import torch

    for ckpt in (run.run_dir / "checkpoints").glob("checkpoint_*.pt"):
        state = torch.load(ckpt, weights_only=True)
        assert all(torch.isfinite(v).all() for v in state["model"].values()), ckpt
    assert_clean(run)
