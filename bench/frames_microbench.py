"""uint8 frames to the Nature CNN's input: torch's three passes against fastrl_ext's one
(fastrl.models.frames), µs per frame, 1 thread, medians, alternated.

    python bench/frames_microbench.py [--shape 4x84x84] [--batch 16 --batch 64 --batch 528] [--repeats 30]

Batches: 16 is what a Pong inference worker typically gets, 64 a learner minibatch, 528 a learner
shard's share of the no-grad forward. Rows: bf16 channels-last (the learner in bf16), bf16 NCHW (an
inference worker in bf16), float32 channels-last (the learner in fp32, e.g. on an AVX2 host).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fastrl.models.frames import _native_into, frames_to_input_torch
from fastrl_ext import _frames

CASES = [("bf16 channels-last", torch.bfloat16, True), ("bf16 NCHW", torch.bfloat16, False),
         ("fp32 channels-last", torch.float32, True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="4x84x84", help="CxHxW of one frame stack")
    parser.add_argument("--batch", type=int, action="append", default=None)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    shape = tuple(int(v) for v in args.shape.split("x"))
    print(f"frames {args.shape}, 1 thread, fastrl_ext._frames as {_frames.ISA}; µs per frame, medians of {args.repeats}")
    print(f"{'batch':>6}  {'input':<20} {'torch':>8} {'fastrl_ext':>11} {'speed-up':>9}")
    for batch in args.batch or [16, 64, 528]:
        obs = torch.randint(0, 256, (batch, *shape), dtype=torch.uint8)
        for name, dtype, channels_last in CASES:
            times: dict[str, list] = {"torch": [], "native": []}
            for _ in range(args.repeats):
                for kind, fn in (("torch", frames_to_input_torch), ("native", _native_into)):
                    t0 = time.perf_counter()
                    fn(obs, dtype, channels_last)
                    times[kind].append((time.perf_counter() - t0) / batch * 1e6)
            t, n = statistics.median(times["torch"]), statistics.median(times["native"])
            print(f"{batch:>6}  {name:<20} {t:8.2f} {n:11.2f} {t / n:8.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
