"""The Nature CNN's first conv strided (8x8 kernel, stride 4, 4 channels) against space-to-depth (2x2
kernel, stride 1, 64 channels on 4x4 tiles of the frames; model.first_conv, fastrl.models.space_to_depth):
forward and weight gradient by batch and dtype, 1 thread, ms per call, alternated; or the preset's learner
with each, alternated rounds, CPU ms per batch.

    python bench/space_to_depth_microbench.py [--rounds 5] [--seconds 1]
    python bench/space_to_depth_microbench.py --learner configs/atari_pong.yaml [--rounds 8] [--seconds 3]

Both convs get channels-last input and weights, as the learner and the inference workers hold them; the
tiled weight is cut from the plain one in each call, as the model does. The tiled input's own cost (the
frames pass) is bench/frames_microbench.py's "bf16 4x4 tiles" row. The learner is the preset's as `fastrl
bench` runs it (its shards and split), so its CPU is the process's, every thread's.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F

from fastrl.bench.measure import alternated_learner_cpu_ms, alternated_us_per_call, microbench_main
from fastrl.bench.report import learner_ab_lines, learner_setup
from fastrl.models.space_to_depth import SpaceToDepthConv2d, conv_weight_and_stride
from fastrl_ext import _frames

CL = torch.channels_last
BATCHES = (1, 16, 32, 64)


def microbench(rounds: int, seconds: float) -> None:
    torch.set_flush_denormal(True)  # as every torch process of a run sets it
    print(f"first conv, 1 thread, ms per call, medians of {rounds} alternated rounds of {seconds} s")
    print(f"{'dtype':<6} {'batch':>5}  {'fwd strided':>11} {'fwd tiled':>9} {'ratio':>6}  "
          f"{'wgrad strided':>13} {'wgrad tiled':>11} {'ratio':>6}")
    for dtype in (torch.bfloat16, torch.float32):
        conv = SpaceToDepthConv2d(4, 32, 8, 4).to(dtype=dtype, memory_format=CL)
        for batch in BATCHES:
            x = torch.rand(batch, 4, 84, 84).to(dtype).contiguous(memory_format=CL)
            tiled = F.pixel_unshuffle(x, 4).contiguous(memory_format=CL)
            grad_out = torch.randn(batch, 32, 20, 20).to(dtype).contiguous(memory_format=CL)

            def wgrad(inputs, weight, stride):
                torch.ops.aten.convolution_backward(grad_out, inputs, weight, [32], stride, [0, 0], [1, 1], False,
                                                    [0, 0], 1, [False, True, True])

            us = alternated_us_per_call({
                "fwd strided": lambda: F.conv2d(x, conv.weight, conv.bias, 4),
                "fwd tiled": lambda: conv(tiled),
                "wgrad strided": lambda: wgrad(x, conv.weight, [4, 4]),
                "wgrad tiled": lambda: wgrad(tiled, conv_weight_and_stride(conv, conv.weight)[0], [1, 1]),
            }, rounds, seconds)
            ms = [v / 1e3 for v in us.values()]
            print(f"{str(dtype)[6:]:<6} {batch:>5}  {ms[0]:11.3f} {ms[1]:9.3f} {ms[1] / ms[0]:5.2f}x  "
                  f"{ms[2]:13.3f} {ms[3]:11.3f} {ms[3] / ms[2]:5.2f}x")


def learner_ab(config: str, rounds: int, seconds: float) -> None:
    # imported here: the conv table needs none of the learner's machinery
    from fastrl.bench.components import learner_on_synthetic_batch
    from fastrl.config.hardware import resolve_auto
    from fastrl.config.loader import load_config
    from fastrl.envs.spec import resolve_env

    base = resolve_auto(load_config(config, []))
    spec = resolve_env(base.env)
    learners = {}
    for first_conv in ("strided", "space_to_depth"):  # one network each: the conv is the network's structure
        cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, first_conv=first_conv))
        learners[first_conv] = (*learner_on_synthetic_batch(cfg, spec), None)
    spent = alternated_learner_cpu_ms(learners, rounds, seconds, clock=time.process_time)
    print("\n".join(learner_ab_lines(config, _frames.ISA, spent, "strided", "space_to_depth",
                                      learner_setup(base, learners["strided"][0]))))


def main() -> None:
    microbench_main(__doc__.splitlines()[0], microbench, learner_ab)


if __name__ == "__main__":
    main()
