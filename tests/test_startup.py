"""What the fast start rests on: any process can build the run's starting network and get the
same weights, and a sampler that lowers its priority once ready lowers all of its threads."""

import subprocess
import sys

import torch

from fastrl.config import load_config
from fastrl.envs import resolve_env
from fastrl.models import seeded_model
from helpers import ROOT


def _flat(model) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in model.state_dict().values()])


def test_seeded_model_is_the_same_whatever_the_thread_count_and_leaves_the_caller_alone():
    cfg = load_config(str(ROOT / "configs/atari_pong.yaml"))  # orthogonal init of the CNN and its 3136x512 layer
    spec = resolve_env(cfg.env)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        torch.manual_seed(123)
        expected_draw = torch.rand(3)
        torch.manual_seed(123)
        two = seeded_model(spec, cfg.model, seed=5)
        assert torch.get_num_threads() == 2
        assert torch.equal(torch.rand(3), expected_draw)  # the caller's RNG did not move
        torch.set_num_threads(1)
        one = seeded_model(spec, cfg.model, seed=5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(_flat(one), _flat(two))
    assert not torch.equal(_flat(one), _flat(seeded_model(spec, cfg.model, seed=6)))


LOWER_PRIORITY_IN_A_CHILD = """
import os, threading
from fastrl.workers.process import lower_priority

started, done = threading.Event(), threading.Event()
thread = threading.Thread(target=lambda: (started.set(), done.wait()))
thread.start()
started.wait()
base = os.getpriority(os.PRIO_PROCESS, 0)
lower_priority(3)
tids = [int(t) for t in os.listdir("/proc/self/task")]
print(len(tids), sorted({os.getpriority(os.PRIO_PROCESS, t) - base for t in tids}))
done.set()
"""


def test_lower_priority_reaches_threads_that_already_exist():
    """os.nice() would change the calling thread only; envpool's threads exist when a rollout worker lowers its priority."""
    out = subprocess.run([sys.executable, "-c", LOWER_PRIORITY_IN_A_CHILD], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, check=True).stdout.split(maxsplit=1)
    assert int(out[0]) >= 2 and out[1].strip() == "[3]", out
