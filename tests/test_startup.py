"""What the fast start rests on: any process can build the run's starting network and get the
same weights, and a sampler that lowers its priority once ready lowers all of its threads. Also
the other process-wide settings a child makes at start: glibc keeping freed memory for reuse, and
denormal floats flushed to zero."""

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
import os, sys, threading
from fastrl.workers.process import lower_priority

started, done = threading.Event(), threading.Event()
thread = threading.Thread(target=lambda: (started.set(), done.wait()))
thread.start()
started.wait()
base = os.getpriority(os.PRIO_PROCESS, 0)
lower_priority(3, sys.argv[1])
later = threading.Thread(target=done.wait)  # created afterwards, as a rollout worker's later env groups are
later.start()
tids = [int(t) for t in os.listdir("/proc/self/task")]
policies = {os.sched_getscheduler(t) for t in tids}
names = {os.SCHED_OTHER: "normal", os.SCHED_BATCH: "batch", os.SCHED_IDLE: "idle"}
print(len(tids), sorted({os.getpriority(os.PRIO_PROCESS, t) - base for t in tids}),
      names[policies.pop()] if len(policies) == 1 else "mixed")
done.set()
"""


def test_lower_priority_reaches_threads_that_already_exist():
    """os.nice() would change the calling thread only; envpool's threads exist when a rollout worker lowers its priority."""
    for policy in ("normal", "batch", "idle"):
        out = subprocess.run([sys.executable, "-c", LOWER_PRIORITY_IN_A_CHILD, policy], capture_output=True, text=True,
                             cwd=ROOT, timeout=60, check=True).stdout.split()
        # every thread, the one made before the call and the one made after, 3 nicer and under the policy
        assert int(out[0]) >= 3 and out[1] == "[3]" and out[2] == policy, out


HEAP_REUSE_IN_A_CHILD = """
import resource, sys
import numpy as np
from fastrl.workers.process import keep_freed_heap
took = keep_freed_heap(int(sys.argv[1]))
def cycle():  # what a learner's minibatch does: allocate and touch ~20 MiB of tensors, free them all
    blocks = [np.ones(1 << 18) for _ in range(10)]
    del blocks
for _ in range(3):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    cycle()
print(int(took), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def test_kept_heap_is_reused_without_page_faults():
    """system.heap_keep_mib: with glibc's defaults each cycle of freed and reallocated megabytes
    faults its pages in again (~5,000 per 20 MiB here); kept, the same memory is reused."""
    def run(keep_mib):
        out = subprocess.run([sys.executable, "-c", HEAP_REUSE_IN_A_CHILD, str(keep_mib)], capture_output=True,
                             text=True, cwd=ROOT, timeout=60, check=True).stdout.split()
        return int(out[0]), float(out[1])
    took_default, faults_default = run(0)
    took_kept, faults_kept = run(256)
    assert not took_default and took_kept
    assert faults_default > 1000 and faults_kept < faults_default / 10, (faults_default, faults_kept)


FLUSH_IN_A_CHILD = """
import threading
from concurrent.futures import ThreadPoolExecutor
import torch
from fastrl.workers.process import flush_denormals

torch.set_num_threads(2)  # in child_main's order: the thread counts first, then the flush
torch.set_num_interop_threads(1)
DENORMAL = torch.tensor([1e-39], dtype=torch.float32)
def flushed():
    return (DENORMAL * 1.0).item() == 0.0
def in_new_thread():
    out = []
    thread = threading.Thread(target=lambda: out.append(flushed()))
    thread.start()
    thread.join()
    return out[0]
def in_torch_threads():  # an op over enough elements that torch's two OpenMP threads share it
    return torch.full((1 << 16,), 1e-39).mul(1.0).sum().item() == 0.0
print(flushed(), flush_denormals(True), flushed(), in_new_thread(), in_torch_threads(),
      ThreadPoolExecutor(1).submit(flushed).result(), flush_denormals(False), flushed())
"""


def test_flushed_denormals_reach_threads_started_later_and_can_be_undone():
    """system.flush_denormals: set where a process loads torch, before it starts a thread, it holds in
    the learner's shard threads and torch's OpenMP threads too (they inherit the SSE control register);
    the call reports the setting it found, which serial mode uses to give the runner's back."""
    out = subprocess.run([sys.executable, "-c", FLUSH_IN_A_CHILD], capture_output=True, text=True, cwd=ROOT,
                         timeout=60, check=True).stdout.split()
    assert out == ["False", "False", "True", "True", "True", "True", "True", "False"], out
