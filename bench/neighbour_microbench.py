"""What a neighbouring process costs the Pong acting forward: CPU µs per batch-16 forward on CPU 0,
alone and beside each neighbour, pinned to CPU 1 (the other vCPU) or to CPU 0 itself at nice 19.

    python bench/neighbour_microbench.py [--beside KIND@CPU ...] [--gap-ms 2] [--seconds 4] [--rounds 2]

KIND is one of: matmul-bf16, matmul-fp32 (256 x 256 products in a loop: the vector units, little
memory traffic), spin (a Python loop), learner (a one-thread Pong learner on the learn stage's
synthetic batch), envpool (the env stage's rollout worker: 2 splits of 16 Pong envs, 1 thread, random
actions), stream (a 64 MiB read-modify-write loop). A neighbour on CPU 1 that slows the forward though it touches no shared memory (matmul, spin)
would mean the two vCPUs share a physical core; `--gap-ms 2` sleeps between forwards as an inference
worker waits between requests, so a neighbour on the same CPU gets in between them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

from fastrl.bench.components import learner_on_synthetic_batch
from fastrl.bench.env_stage import env_worker
from fastrl.workers.process import name_process_and_die_with_parent

PRESET = "configs/atari_pong.yaml"
KINDS = ("matmul-bf16", "matmul-fp32", "spin", "learner", "envpool", "stream")
DEFAULT_BESIDE = ["matmul-bf16@1", "spin@1", "learner@1", "envpool@1", "stream@1"]


def _neighbour_loop(kind: str) -> None:
    """Runs until killed (and dies with the bench: name_process_and_die_with_parent)."""
    from fastrl.config import load_config
    from fastrl.config.hardware import resolve_auto
    from fastrl.envs import resolve_env
    if kind.startswith("matmul"):
        dtype = torch.bfloat16 if kind == "matmul-bf16" else torch.float32
        a, b = torch.randn(256, 256).to(dtype), torch.randn(256, 256).to(dtype)
        while True:
            torch.mm(a, b)
    elif kind == "spin":
        x = 0
        while True:
            x += 1
    elif kind == "learner":
        cfg = resolve_auto(load_config(PRESET, ["system.learner_shards=1", "system.learner_threads=1"]))
        trainer, batch = learner_on_synthetic_batch(cfg, resolve_env(cfg.env))
        while True:
            batch["policy_version"].fill_(trainer.policy_version)  # on-policy: nothing masked for lag
            trainer.train(batch)
    elif kind == "envpool":
        cfg = load_config(PRESET)
        env_worker(cfg, resolve_env(cfg.env), 0, [0, 0])  # the env stage's rollout worker: 2 splits of 16
    elif kind == "stream":
        block = torch.empty(64 << 20, dtype=torch.uint8)
        while True:
            block.add_(1)


def start_neighbour(spec: str) -> subprocess.Popen:
    kind, cpu = spec.split("@")
    if kind not in KINDS or cpu not in ("0", "1"):
        raise SystemExit(f"--beside {spec}: expected KIND@0 or KIND@1, KIND one of {', '.join(KINDS)}")
    return subprocess.Popen([sys.executable, __file__, "--neighbour", spec])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beside", action="append", help=f"neighbours, one case each (default: {DEFAULT_BESIDE})")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="sleep between two forwards")
    parser.add_argument("--seconds", type=float, default=4.0, help="forwards timed per case and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--neighbour", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.neighbour:
        kind, cpu = args.neighbour.split("@")
        name_process_and_die_with_parent(f"neighbour-{kind}")
        os.sched_setaffinity(0, {int(cpu)})
        if cpu == "0":
            os.nice(19)  # below the forward, as the rollout workers run below the inference worker
        _neighbour_loop(kind)
        return
    if os.cpu_count() < 2 or not {0, 1} <= os.sched_getaffinity(0):
        raise SystemExit("needs CPUs 0 and 1")
    os.sched_setaffinity(0, {0})
    from fastrl.config import load_config
    from fastrl.envs import resolve_env
    from fastrl.models import seeded_model
    cfg = load_config(PRESET)
    spec = resolve_env(cfg.env)
    model = seeded_model(spec, cfg.model, 1).for_inference()
    obs = torch.randint(0, 256, (16, *spec.obs_shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))

    def forward_us() -> float:
        times, end = [], time.monotonic() + args.seconds
        with torch.inference_mode():
            while time.monotonic() < end:
                start = time.thread_time_ns()
                model(obs)
                times.append(time.thread_time_ns() - start)
                if args.gap_ms:
                    time.sleep(args.gap_ms / 1e3)
        return statistics.median(times) / 1e3

    forward_us()  # warm oneDNN's kernels
    cases = ["alone"] + (args.beside or DEFAULT_BESIDE)
    print(f"{PRESET}'s acting forward, batch 16, on CPU 0 ({model.actor_encoder.input_dtype}, "
          f"{args.gap_ms:g} ms between calls): median CPU µs per call")
    results = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case in cases:
            neighbour = None if case == "alone" else start_neighbour(case)
            try:
                time.sleep(1.5)  # the neighbour's imports and warm-up
                results[case].append(forward_us())
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
    alone = statistics.median(results["alone"])
    for case, values in results.items():
        print(f"{case:>16}: {' '.join(f'{v:7.0f}' for v in values)}   x{statistics.median(values) / alone:.3f} of alone")


if __name__ == "__main__":
    main()
