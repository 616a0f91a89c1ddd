"""Children spawned before the runner's setup (fastrl.runner.warm_start), and who builds the first
weights (fastrl.workers.first_weights): a warm child the runner never starts goes away, one that died
is spawned afresh, one whose pipe closes returns, and the CLI leaves no process behind when the run
fails after spawning them. That a warm worker runs a whole
run is checked by test_integration's short run (its log says "spawned warm")."""

import multiprocessing as mp
import os
import time

import psutil

from fastrl.cli import single_threaded_blas
from fastrl.config import load_config
from fastrl.runner.warm_start import WarmChildren, warm_children
from fastrl.workers.first_weights import INFERENCE, LEARNER, RUNNER, first_weights_builder
from fastrl.workers.process import warm_child_main
from helpers import ROOT, RunProcess

CARTPOLE = str(ROOT / "configs/cartpole.yaml")


def _cfg(*overrides: str):
    return load_config(CARTPOLE, list(overrides))


def test_warm_children_are_the_inference_workers_and_a_learner_that_builds_the_first_weights():
    assert warm_children(_cfg("sampler.num_inference_workers=2"), resuming=False) == [("inference", 0),
                                                                                      ("inference", 1)]
    assert warm_children(_cfg("sampler.num_inference_workers=2"), resuming=True) == [("inference", 0),
                                                                                     ("inference", 1)]
    # rollout workers that act wait for the learner's network; a resumed run's runner publishes its checkpoint's
    assert warm_children(_cfg("sampler.num_inference_workers=0"), resuming=False) == [("learner", 0)]
    assert warm_children(_cfg("sampler.num_inference_workers=0"), resuming=True) == []
    assert warm_children(_cfg("sampler.num_inference_workers=1", "system.serial=true"), resuming=False) == []
    assert warm_children(_cfg("sampler.num_inference_workers=0", "system.serial=true"), resuming=False) == []


def test_a_runner_that_has_torch_already_builds_the_weights_its_rollout_workers_act_with():
    """`fastrl bench`'s runner has timed the network: publishing the weights costs it nothing, while the
    learner would hold the first sample back by its import. Inference workers build theirs either way."""
    acting, inferring = _cfg("sampler.num_inference_workers=0"), _cfg("sampler.num_inference_workers=1")
    assert first_weights_builder(acting, resuming=False) == LEARNER
    assert first_weights_builder(acting, resuming=False, runner_has_torch=True) == RUNNER
    assert first_weights_builder(inferring, resuming=False, runner_has_torch=True) == INFERENCE
    assert first_weights_builder(inferring, resuming=True) == RUNNER


def test_warm_children_nobody_starts_are_stopped_at_close():
    warm = WarmChildren()
    warm.spawn(_cfg("sampler.num_inference_workers=2"))
    try:
        assert len(warm) == 2
        pids = {process.pid for process, _ in warm._waiting.values()}
        assert pids <= {c.pid for c in psutil.Process().children()}
    finally:
        started = time.monotonic()
        warm.close()
    assert time.monotonic() - started < 1.0  # terminated mid-import (torch takes seconds), not waited for
    assert len(warm) == 0
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def test_a_warm_child_that_died_is_not_handed_a_context():
    warm = WarmChildren()
    warm.spawn(_cfg("sampler.num_inference_workers=1"))
    try:
        (process, _), = warm._waiting.values()
        process.kill()
        process.join(5.0)
        # the supervisor spawns the worker the ordinary way when take() gives nothing
        assert warm.take("inference", 0, ("inference", 0, None, "no.such:loop")) is None
        assert warm.take("inference", 0, ()) is None  # taken once, whatever happened
        assert warm.take("rollout", 0, ()) is None
    finally:
        warm.close()


def test_a_warm_child_whose_runner_goes_away_returns_after_its_imports():
    spawn = mp.get_context("spawn")
    reader, writer = spawn.Pipe(duplex=False)
    process = spawn.Process(target=warm_child_main, args=("inference", 0, ("json",), reader), daemon=True)
    process.start()
    reader.close()
    writer.close()  # what the child sees when the runner exits without starting it
    process.join(30.0)
    assert process.exitcode == 0


def test_a_run_that_fails_after_spawning_them_leaves_no_process(tmp_path):
    # the config passes its checks (the warm workers are spawned), then the env probe fails
    run = RunProcess("--config", CARTPOLE, "--set", "sampler.num_inference_workers=1",
                     "--set", "env.id=NoSuchEnv-v0", runs_dir=tmp_path)
    assert run.wait(60) == 2, run.output
    assert "unknown env id 'NoSuchEnv-v0'" in run.output
    assert run.children, "no warm inference worker was spawned"
    assert run.leftover_children() == []


def test_blas_threads_default_to_one_and_a_users_setting_stays(monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    single_threaded_blas()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    single_threaded_blas()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"
