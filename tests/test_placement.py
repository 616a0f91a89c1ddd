"""system.rollout_pinning (fastrl.runner.placement): which CPU each rollout worker is kept on, when
`auto` pins and releases, that threads really move, and a real run with its workers pinned."""

import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from fastrl.host import usable_cpus
from fastrl.runner.placement import (HOLD_S, LEARNER_WAIT_TO_PIN, WINDOW_S, RolloutPlacement, set_thread_affinity,
                                     why_not_auto, worker_cpus)
from helpers import ROOT, RunProcess

LOG = logging.getLogger("test")


def test_worker_i_goes_to_the_ith_cpu_wrapping_around():
    assert worker_cpus(2, [0, 1]) == [0, 1]
    assert worker_cpus(4, [2, 5]) == [2, 5, 2, 5]
    assert worker_cpus(1, [3, 4, 5]) == [3]


def test_auto_leaves_alone_workers_that_wait_for_inference_or_crowd_a_core():
    assert why_not_auto(2, 2, workers_act=True) is None
    assert why_not_auto(4, 2, workers_act=True) is None
    assert why_not_auto(1, 2, workers_act=True) is None
    assert "inference" in why_not_auto(2, 2, workers_act=False)
    assert "evenly" in why_not_auto(3, 2, workers_act=True)


class Learner:
    """The learner's cumulative wait (control.wait_s), advanced by hand."""

    def __init__(self):
        self.wait_s = 0.0


def _placement(mode: str, learner: Learner, pids: dict, applied: list, workers_act: bool = True, now: float = 0.0):
    def apply(pid, cpus):
        applied.append((pid, sorted(cpus)))
        return 1
    return RolloutPlacement(mode, len(pids), workers_act, [0, 1], lambda: learner.wait_s, lambda: dict(pids), LOG,
                            now, apply=apply)


def _advance(p: RolloutPlacement, learner: Learner, now: float, seconds: float, wait_share: float,
             step_s: float = 0.25) -> float:
    """Run the runner's loop for `seconds` while the learner waits `wait_share` of the time."""
    for _ in range(round(seconds / step_s)):
        now += step_s
        learner.wait_s += wait_share * step_s
        p.update(now)
    return now


def test_auto_pins_while_the_learner_waits_and_releases_when_it_trains():
    learner, applied = Learner(), []
    pids = {0: 100, 1: 101}
    p = _placement("auto", learner, pids, applied)
    now = _advance(p, learner, 0.0, 0.5, 0.1)
    assert not p.pinned and applied == [(100, [0, 1]), (101, [0, 1])]  # first sight: the full mask
    applied.clear()
    now = _advance(p, learner, now, WINDOW_S + 0.25, max(0.9, LEARNER_WAIT_TO_PIN))
    assert p.pinned and (100, [0]) in applied and (101, [1]) in applied
    pinned_at = p.changed_at
    now = _advance(p, learner, now, HOLD_S - 1.0, 0.0)  # training hard, but within the hold
    assert p.pinned
    now = _advance(p, learner, now, 2 * WINDOW_S + 0.5, 0.0)
    assert not p.pinned and (100, [0, 1]) in applied[-2:] and (101, [0, 1]) in applied[-2:]
    assert p.pinned_fraction() == pytest.approx((p.changed_at - pinned_at) / now, abs=0.01)
    # between the thresholds nothing changes
    now = _advance(p, learner, now, 3 * HOLD_S, 0.35)
    assert not p.pinned


def test_auto_with_inference_workers_never_moves_a_thread():
    learner, applied = Learner(), []
    p = _placement("auto", learner, {0: 100, 1: 101}, applied, workers_act=False)
    _advance(p, learner, 0.0, 3 * HOLD_S, 1.0)
    assert not p.pinned and applied == [] and p.pinned_fraction() == 0.0


def test_always_pins_from_the_start_and_pins_a_replacement_too():
    learner, applied = Learner(), []
    pids = {0: 100, 1: 101}
    p = _placement("always", learner, pids, applied)
    p.update(0.1)
    assert p.pinned and sorted(applied) == [(100, [0]), (101, [1])]
    applied.clear()
    pids[1] = 202  # worker 1 died and was replaced
    _advance(p, learner, 0.1, 0.5, 0.0, step_s=0.1)
    assert applied == [(202, [1])]
    now = _advance(p, learner, 0.6, 10.0, 0.0)
    assert p.pinned_fraction() == pytest.approx(1.0, abs=0.02)
    assert sum(1 for pid, _ in applied if pid == 100) == pytest.approx(now / WINDOW_S, abs=2)  # re-checked each window


def test_pinned_fraction_counts_the_time_pinned():
    learner, applied = Learner(), []
    p = _placement("auto", learner, {0: 100, 1: 101}, applied)
    now = _advance(p, learner, 0.0, 10.0, 1.0)   # pinned after the first window
    now = _advance(p, learner, now, 10.0, 0.0)   # released a hold and a window into this
    assert p.pinned_fraction() == pytest.approx((10.0 - WINDOW_S + HOLD_S) / 20.0, abs=0.1)


THREADS = ("import threading, time\n"
           "for _ in range(3): threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
           "print('ready', flush=True); time.sleep(30)\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread affinity through /proc")
def test_every_thread_of_a_process_moves():
    cpus = usable_cpus()
    child = subprocess.Popen([sys.executable, "-c", THREADS], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert set_thread_affinity(child.pid, {cpus[-1]}) == 4
        assert _masks(child.pid) == {frozenset({cpus[-1]})}
        assert set_thread_affinity(child.pid, set(cpus)) == 4
        assert _masks(child.pid) == {frozenset(cpus)}
    finally:
        child.kill()
        child.wait()
    assert set_thread_affinity(child.pid, set(cpus)) == 0  # gone


def _masks(pid: int) -> set[frozenset]:
    """The distinct CPU masks of a process's threads."""
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.integration
def test_a_run_keeps_each_rollout_worker_on_its_cpu(tmp_path):
    cpus = usable_cpus()
    run = RunProcess("--config", str(ROOT / "configs/cartpole.yaml"), "--set", "system.rollout_pinning=always",
                     "--set", "run.stop_at_mean_return=null", "--set", "run.train_for_env_steps=100000000",
                     "--set", "run.report_interval_s=1", runs_dir=tmp_path)
    # the rollout workers start once the learner has built the network: 100 games are theirs
    assert run.wait_for("return(last 100)", 60), run.output
    time.sleep(1.5)  # a window: the runner re-checks every thread once per window
    run.track_children()
    seen = {}
    for pid in list(run.children):
        try:
            title = psutil.Process(pid).cmdline()[0]
        except (psutil.Error, IndexError):
            continue
        if title.startswith("fastrl-rollout-"):
            seen[int(title.rsplit("-", 1)[1])] = _masks(pid)
    assert set(seen) == {0, 1}, run.output
    for index, masks in seen.items():
        assert masks == {frozenset({worker_cpus(2, cpus)[index]})}
    run.proc.send_signal(signal.SIGINT)  # seen: no need to wait for an end a fast box would reach too soon
    assert run.wait(60) == -signal.SIGINT, run.output
    assert run.summary()["rollout_pinned_fraction"] > 0.5
