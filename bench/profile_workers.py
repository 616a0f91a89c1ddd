"""Where each worker's CPU goes, per env step: py-spy samples of a live training run, by category.

Starts `fastrl train` on a preset, lets it warm up, then for `--seconds` samples every child
process with py-spy (Python stacks; samples asleep in a wait or inside envpool's C++ recv are
recognised by their frames and set aside) while reading each thread's CPU time from /proc. A
process's main-thread CPU is split over the remaining categories in proportion to their samples;
CPU of its other threads (envpool's C++ stepping threads, torch's intra-op pool) is reported as
its own row, because py-spy cannot see into them. Every figure is CPU microseconds per env step
of the whole run over the window, so rows add up to the CPU cost of one env step.

    pip install py-spy   # not a fastrl dependency; needs ptrace rights over the run's processes
    python bench/profile_workers.py --config configs/atari_pong.yaml --seconds 20 --json prof.json

Measure with nothing else running: the run's own speed sets the per-step figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import psutil

from fastrl.bench.measure import fastrl_children

# First match (over the whole stack, innermost frame last) wins, so nested work is listed before
# the code that calls it: publishing weights happens inside the train step, V-trace inside the loss.
CATEGORIES = [
    ("weight publish (learner)", ("._publish ", "SharedWeights.publish")),
    ("weight refresh (inference)", ("_refresh_weights",)),
    ("batch assembly: copy out of shm", ("Learner._assemble",)),
    ("backward", ("Tensor.backward", "backward (torch/autograd")),
    ("optimizer step", ("optim/", "Optimizer.")),
    ("grad-norm clip", ("clip_grad",)),
    ("V-trace", ("vtrace (",)),
    ("loss", ("appo_loss (",)),
    ("obs normaliser", ("normalizer.py",)),
    ("forward pass", ("ActorCritic.forward",)),
    ("action sampling", ("ActorCritic.sample",)),
    ("policy forward + action sampling (numpy or fastrl_ext)", ("NumpyPolicy.",)),
    ("acting: slot reads/writes, weight refresh", ("PolicyActor.",)),
    ("envpool send/recv: Python side (caller thread)", ("EnvpoolSplit.", "GymnasiumSplit.", "envpool/")),
    ("non-finite checks", ("_mask_nonfinite",)),
    ("trajectory writes + episode stats", ("RolloutWorker._record", "Recorder.")),
    ("ring traffic (push/pop/wake)", ("ipc/rings.py",)),
    ("heartbeat + counters", ("buffers/control.py",)),
    ("reports", ("put_report", "MsgRing")),
    ("obs gather + action scatter", ("InferenceWorker.step",)),
    ("request filtering", ("InferenceWorker._live",)),
]
OTHER = "other Python"
# py-spy cannot tell a thread asleep in FUTEX_WAIT (called through ctypes or fastrl_ext) from one
# that is running, so samples are taken with --idle and the waits are recognised by their frames.
WAITING = "(asleep waiting)"
WAIT_MARKERS = ("wait_any (", "Doorbell.wait", "sleep (", "time.sleep")
# Nor a thread blocked on envpool's semaphore inside its C++ recv: with --idle, and even without,
# py-spy puts most of a HalfCheetah rollout worker's samples there, while perf's on-CPU samples of
# the same thread find ~80% of its CPU in Python and numpy and ~20% in envpool, libc and the kernel.
# Those samples are set aside like the waits; the C++ call's own CPU (waking the env thread,
# building the output arrays) is then spread over the rows in proportion, which py-spy cannot avoid.
IN_ENVPOOL = "(inside envpool's C++ recv)"
# buckets kept out of the CPU split: the key their share of the window is reported under, and its wording
SET_ASIDE = {WAITING: ("main_thread_asleep_fraction", "asleep on its doorbell"),
             IN_ENVPOOL: ("main_thread_in_envpool_recv_fraction", "inside envpool's C++ recv")}


def _envpool_recv_leaves() -> tuple[str, ...]:
    """Leaf frames, as py-spy names them, of a main thread inside envpool's C++ recv."""
    import inspect

    from fastrl.envs.vector import _DirectCalls

    lines, first = inspect.getsourcelines(_DirectCalls.recv)
    at = [first + i for i, line in enumerate(lines) if "self.recv_raw()" in line]
    return tuple(f"_DirectCalls.recv (fastrl/envs/vector.py:{n})" for n in at)


ENVPOOL_RECV_LEAVES = _envpool_recv_leaves()
NATIVE_THREADS = {"rollout": "envpool C++ threads (env stepping)", "inference": "torch intra-op threads",
                  "learner": "torch intra-op threads"}


def classify(stack: str) -> str:
    leaf = stack.rsplit(";", 2)[-2:]  # the wait must be where the thread is now, not just on its stack
    if any(m in frame for frame in leaf for m in WAIT_MARKERS):
        return WAITING
    innermost = leaf[-1]
    if innermost in ENVPOOL_RECV_LEAVES or ("envpool/python/" in innermost and ".recv (" in innermost):
        return IN_ENVPOOL
    for name, needles in CATEGORIES:
        if any(n in stack for n in needles):
            return name
    return OTHER


def read_collapsed(path: Path) -> Counter:
    counts: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[classify(stack)] += int(n)
    return counts


def thread_cpu_s(proc: psutil.Process) -> tuple[float, float]:
    """(main thread, all other threads) CPU seconds so far."""
    main = other = 0.0
    for th in proc.threads():
        cpu = th.user_time + th.system_time
        if th.id == proc.pid:
            main += cpu
        else:
            other += cpu
    return main, other


def last_env_steps(metrics: Path) -> tuple[int, float]:
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    if not lines:
        return 0, 0.0
    row = json.loads(lines[-1])
    return int(row["env_steps"]), float(row["wall_s"])


def profile(args) -> dict:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        sys.exit("py-spy not found: pip install py-spy")
    work = Path(tempfile.mkdtemp(prefix="fastrl_profile_"))
    cmd = [sys.executable, "-m", "fastrl.cli", "train", "--config", args.config, "--name", "profile",
           "--runs-dir", str(work), "--set", "run.report_interval_s=1",
           "--set", f"run.train_for_seconds={args.warmup_s + 10 * args.seconds + 60}",
           "--set", "run.stop_at_mean_return=null", "--set", "run.train_for_env_steps=1000000000"]
    for override in args.set:
        cmd += ["--set", override]
    run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        root = psutil.Process(run.pid)
        time.sleep(args.warmup_s)
        children = fastrl_children(root)
        if "learner" not in children:
            raise SystemExit(f"run did not start its workers (found {sorted(children)})")
        metrics = work / "profile" / "metrics.jsonl"
        steps0, wall0 = last_env_steps(metrics)
        cpu0 = {name: thread_cpu_s(p) for name, p in children.items()}
        spies = {name: subprocess.Popen(
            [py_spy, "record", "--pid", str(p.pid), "--duration", str(args.seconds), "--rate", str(args.rate),
             "--format", "raw", "--nonblocking", "--idle", "-o", str(work / f"{name}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, p in children.items()}
        for spy in spies.values():
            spy.wait()
        cpu1 = {name: thread_cpu_s(p) for name, p in children.items()}
        time.sleep(1.5)  # the next metrics line covers the end of the window
        steps1, wall1 = last_env_steps(metrics)
    finally:
        os.killpg(run.pid, signal.SIGINT)
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
    env_steps = max(steps1 - steps0, 1)
    table: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    set_aside_shares: dict[str, dict[str, list]] = {key: defaultdict(list) for key, _ in SET_ASIDE.values()}
    for name in children:
        kind = name.split("-")[0]
        samples = read_collapsed(work / f"{name}.txt") if (work / f"{name}.txt").exists() else Counter()
        main_s = cpu1[name][0] - cpu0[name][0]
        other_s = cpu1[name][1] - cpu0[name][1]
        aside = {bucket: samples.pop(bucket, 0) for bucket in SET_ASIDE}
        total = sum(samples.values()) or 1
        for cat, n in samples.items():
            table[kind][cat] += main_s * n / total / env_steps * 1e6
        all_samples = max(sum(aside.values()) + total, 1)
        for bucket, (key, _) in SET_ASIDE.items():
            set_aside_shares[key][kind].append(aside[bucket] / all_samples)
        table[kind][NATIVE_THREADS[kind]] += other_s / env_steps * 1e6
    if args.keep:
        shutil.copytree(work, args.keep, dirs_exist_ok=True)  # the raw py-spy stacks, for a flame graph
    shutil.rmtree(work, ignore_errors=True)
    return {"config": args.config, "overrides": args.set, "window_s": wall1 - wall0, "env_steps": env_steps,
            "env_steps_per_s": env_steps / max(wall1 - wall0, 1e-9),
            "cpu_us_per_env_step": {k: dict(v) for k, v in table.items()},
            **{key: {k: sum(v) / len(v) for k, v in shares.items()} for key, shares in set_aside_shares.items()}}


def format_report(doc: dict) -> str:
    lines = [f"{doc['config']} {' '.join(doc['overrides'])}: {doc['env_steps']:,} env steps in "
             f"{doc['window_s']:.1f} s ({doc['env_steps_per_s']:,.0f}/s); CPU us per env step"]
    grand = 0.0
    for kind in ("rollout", "inference", "learner"):
        rows = doc["cpu_us_per_env_step"].get(kind, {})
        subtotal = sum(rows.values())
        grand += subtotal
        # the first bucket always (with "of the window"), the others where they hold samples
        shares = [(wording, doc[key].get(kind, 0.0)) for key, wording in SET_ASIDE.values()]
        where = ", ".join(f"{wording} {share:.0%}" + (" of the window" if i == 0 else "")
                          for i, (wording, share) in enumerate(shares) if i == 0 or share)
        lines.append(f"  {kind:<10} {subtotal:9.1f}   (main thread {where})")
        for cat, us in sorted(rows.items(), key=lambda kv: -kv[1]):
            if us >= 0.01:
                lines.append(f"      {cat:<38} {us:9.2f}  {100 * us / max(subtotal, 1e-9):5.1f}%")
    lines.append(f"  {'total':<10} {grand:9.1f}  (2 cores = {2e6 / max(grand, 1e-9):,.0f} env steps/s if nothing idled)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second per process")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--keep", help="copy the raw py-spy stacks (collapsed format) and the run here")
    args = parser.parse_args()
    doc = profile(args)
    print(format_report(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
