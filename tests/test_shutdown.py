"""What a stop waits for: what has something to save, and the learner, always (a stop leaves a
checkpoint). A worker that cannot see the stop flag yet (still starting, or inside one env-making
call) is killed at once; the real processes here stand in for children that ignore the flag."""

import logging
import multiprocessing as mp
import signal
import time
from types import SimpleNamespace

from fastrl.buffers import ShmAllocator
from fastrl.buffers.control import SharedControl
from fastrl.config import load_config
from fastrl.runner.supervisor import Child, Supervisor
from helpers import ROOT


def test_a_stop_kills_at_once_the_children_that_cannot_see_it(caplog):
    alloc = ShmAllocator()
    spawn = mp.get_context("spawn")
    try:
        # heartbeat slots: rollout workers 0 and 1, inference worker 0, the learner
        control = SharedControl.allocate(alloc, num_processes=4, num_rollout_workers=2, num_inference_workers=1,
                                         num_slots=4)
        supervisor = Supervisor(load_config(str(ROOT / "configs/cartpole.yaml"), []), SimpleNamespace(control=control),
                                logging.getLogger("test-shutdown"), print)

        def child(role: str, index: int, hb: int, lasts_s: float = 60.0) -> mp.Process:
            process = spawn.Process(target=time.sleep, args=(lasts_s,), daemon=True)  # never looks at the flag
            process.start()
            supervisor.children[f"fastrl-{role}-{index}"] = Child(role, index, process, time.time(), hb)
            return process

        making_envs = child("rollout", 0, 0)
        control.beat(0)
        control.making_envs_since.array[0] = time.time()
        stepping = child("rollout", 1, 1, lasts_s=1.0)  # has beaten, not making envs: waited for
        control.beat(1)
        starting_inference = child("inference", 0, 2)  # no heartbeat yet
        starting_learner = child("learner", 0, 3, lasts_s=1.0)  # no heartbeat yet either, and still waited for
        with caplog.at_level(logging.INFO, logger="test-shutdown"):
            started = time.monotonic()
            supervisor.shutdown()
        # waited for, the two killed would each have taken their join time (10 s), then a terminate
        assert time.monotonic() - started < 5.0
        assert [p.exitcode for p in (making_envs, starting_inference)] == [-signal.SIGKILL] * 2
        assert stepping.exitcode == 0 and starting_learner.exitcode == 0
        said = caplog.text
        assert "fastrl-rollout-0 was making envs at the stop" in said and "fastrl-rollout-1" not in said
        assert "fastrl-inference-0 was still starting at the stop" in said and "fastrl-learner" not in said
    finally:
        alloc.unlink_all()
