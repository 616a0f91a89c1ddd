"""uint8 frames to the Nature CNN's input: torch's three passes against fastrl_ext's one
(fastrl.models.frames), µs per frame, 1 thread, medians, alternated.

    python bench/frames_microbench.py [--shape 4x84x84] [--batch 16 --batch 64 --batch 528] [--repeats 30]
    python bench/frames_microbench.py --learner configs/atari_pong.yaml [--rounds 15]

Batches: 16 is what a Pong inference worker typically gets, 64 a learner minibatch, 528 a learner
shard's share of the no-grad forward. Rows: bf16 channels-last (the learner in bf16), bf16 NCHW (an
inference worker in bf16), float32 channels-last (the learner in fp32, e.g. on an AVX2 host), bf16 4x4
tiles (model.first_conv=space_to_depth; torch's reference adds a pixel_unshuffle).
With `--learner`, the preset's learner (as `fastrl bench`'s learn stage sets it up) trains its
synthetic batch with the frames made by torch or by fastrl_ext in alternate rounds: CPU s per batch,
and the ratio per pair of rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import fastrl.models.frames as frames_module
from fastrl.models.frames import _native_into, frames_to_input_torch
from fastrl.workers.process import keep_freed_heap
from fastrl_ext import _frames

CASES = [("bf16 channels-last", torch.bfloat16, True, 1), ("bf16 NCHW", torch.bfloat16, False, 1),
         ("fp32 channels-last", torch.float32, True, 1), ("bf16 4x4 tiles", torch.bfloat16, True, 4)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="4x84x84", help="CxHxW of one frame stack")
    parser.add_argument("--batch", type=int, action="append", default=None)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--learner", metavar="CONFIG", help="A/B the preset's learner on torch's and fastrl_ext's frames")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if args.learner:
        return learner_ab(args.learner, args.rounds)
    torch.set_num_threads(1)
    # as the learner and inference workers do: with glibc's defaults each batch's output lands in fresh pages,
    # and the page faults (~1.5-2 µs a frame at batch 16) would be timed as the kernel's
    keep_freed_heap(256)
    shape = tuple(int(v) for v in args.shape.split("x"))
    print(f"frames {args.shape}, 1 thread, fastrl_ext._frames as {_frames.ISA}; µs per frame, medians of {args.repeats}")
    print(f"{'batch':>6}  {'input':<20} {'torch':>8} {'fastrl_ext':>11} {'speed-up':>9}")
    for batch in args.batch or [16, 64, 528]:
        obs = torch.randint(0, 256, (batch, *shape), dtype=torch.uint8)
        for name, dtype, channels_last, block in CASES:
            times: dict[str, list] = {"torch": [], "native": []}
            for _ in range(args.repeats):
                for kind, fn in (("torch", frames_to_input_torch), ("native", _native_into)):
                    t0 = time.perf_counter()
                    fn(obs, dtype, channels_last, block=block)
                    times[kind].append((time.perf_counter() - t0) / batch * 1e6)
            t, n = statistics.median(times["torch"]), statistics.median(times["native"])
            print(f"{batch:>6}  {name:<20} {t:8.2f} {n:11.2f} {t / n:8.1f}x")
    return 0


def learner_ab(config: str, rounds: int) -> int:
    from fastrl.bench.components import learner_on_synthetic_batch
    from fastrl.config import load_config
    from fastrl.config.hardware import resolve_auto
    from fastrl.envs import resolve_env

    cfg = resolve_auto(load_config(config, []))
    trainer, batch = learner_on_synthetic_batch(cfg, resolve_env(cfg.env))
    native = frames_module._native
    cpu_s: dict[str, list] = {"torch": [], "fastrl_ext": []}
    try:
        for round_ in range(rounds + 1):  # round 0 warms both up and is not counted
            for name in cpu_s:
                frames_module._native = native if name == "fastrl_ext" else None
                batch["policy_version"].fill_(trainer.policy_version)
                c0 = time.process_time()
                trainer.train(batch)
                if round_:
                    cpu_s[name].append(time.process_time() - c0)
    finally:
        frames_module._native = native
    ratios = [n / t for t, n in zip(cpu_s["torch"], cpu_s["fastrl_ext"])]
    print(f"{config}: learner CPU s per batch ({cfg.model.precision}, {cfg.system.learner_shards} shard(s)), "
          f"medians of {rounds} alternated rounds")
    for name, values in cpu_s.items():
        print(f"  frames by {name:<11} {statistics.median(values):.4f}")
    print(f"  fastrl_ext / torch per round: {' '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
