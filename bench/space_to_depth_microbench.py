"""The Nature CNN's first conv strided (8x8 kernel, stride 4, 4 channels) against space-to-depth (2x2
kernel, stride 1, 64 channels on 4x4 tiles of the frames; model.first_conv, fastrl.models.space_to_depth):
forward and weight gradient by batch and dtype, 1 thread, ms per call, medians, alternated; then the
preset's learner training its synthetic batch with each, alternated rounds, CPU s per batch.

    python bench/space_to_depth_microbench.py [--batch 16 --batch 64] [--repeats 50]
    python bench/space_to_depth_microbench.py --learner configs/atari_pong.yaml [--rounds 9]

Both convs get channels-last input and weights, as the learner and the inference workers hold them; the
tiled weight is cut from the plain one in each call, as the model does. The tiled input's own cost (the
frames pass) is bench/frames_microbench.py's "bf16 4x4 tiles" row.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
import torch.nn.functional as F

from fastrl.models.space_to_depth import SpaceToDepthConv2d, conv_weight_and_stride

CL = torch.channels_last


def _ms(fn, repeats: int) -> list:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def conv_table(batches: list, repeats: int) -> None:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    print(f"first conv, 1 thread, ms per call, medians of {repeats} alternated calls")
    print(f"{'dtype':<6} {'batch':>5}  {'fwd strided':>11} {'fwd tiled':>9} {'ratio':>6}  "
          f"{'wgrad strided':>13} {'wgrad tiled':>11} {'ratio':>6}")
    for dtype in (torch.bfloat16, torch.float32):
        conv = SpaceToDepthConv2d(4, 32, 8, 4).to(dtype=dtype, memory_format=CL)
        for batch in batches:
            x = torch.rand(batch, 4, 84, 84).to(dtype).contiguous(memory_format=CL)
            tiled = F.pixel_unshuffle(x, 4).contiguous(memory_format=CL)
            grad_out = torch.randn(batch, 32, 20, 20).to(dtype).contiguous(memory_format=CL)
            bias = [32]

            def fwd_strided():
                F.conv2d(x, conv.weight, conv.bias, 4)

            def fwd_tiled():
                conv(tiled)

            def wgrad_strided():
                torch.ops.aten.convolution_backward(grad_out, x, conv.weight, bias, [4, 4], [0, 0], [1, 1], False,
                                                    [0, 0], 1, [False, True, True])

            def wgrad_tiled():
                weight, _ = conv_weight_and_stride(conv, conv.weight)
                torch.ops.aten.convolution_backward(grad_out, tiled, weight, bias, [1, 1], [0, 0], [1, 1], False,
                                                    [0, 0], 1, [False, True, True])

            times: dict = {f: [] for f in (fwd_strided, fwd_tiled, wgrad_strided, wgrad_tiled)}
            for fn in times:
                _ms(fn, 5)  # warm
            for _ in range(repeats):
                for fn in times:
                    times[fn] += _ms(fn, 1)
            m = [statistics.median(v) for v in times.values()]
            print(f"{str(dtype)[6:]:<6} {batch:>5}  {m[0]:11.3f} {m[1]:9.3f} {m[1] / m[0]:5.2f}x  "
                  f"{m[2]:13.3f} {m[3]:11.3f} {m[3] / m[2]:5.2f}x")


def learner_ab(config: str, rounds: int) -> None:
    from fastrl.bench.components import learner_on_synthetic_batch
    from fastrl.config import load_config
    from fastrl.config.hardware import resolve_auto
    from fastrl.envs import resolve_env

    base = resolve_auto(load_config(config, []))
    spec = resolve_env(base.env)
    setups = {}
    for first_conv in ("strided", "space_to_depth"):
        cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, first_conv=first_conv))
        setups[first_conv] = learner_on_synthetic_batch(cfg, spec)
    cpu_s: dict = {name: [] for name in setups}
    for round_ in range(rounds + 1):  # round 0 warms both up and is not counted
        for name, (trainer, batch) in setups.items():
            batch["policy_version"].fill_(trainer.policy_version)
            c0 = time.process_time()
            trainer.train(batch)
            if round_:
                cpu_s[name].append(time.process_time() - c0)
    ratios = [t / s for s, t in zip(cpu_s["strided"], cpu_s["space_to_depth"])]
    print(f"{config}: learner CPU s per batch ({base.model.precision}, {base.system.learner_shards} shard(s), "
          f"split {setups['strided'][0].split}), medians of {rounds} alternated rounds")
    for name, values in cpu_s.items():
        print(f"  first conv {name:<15} {statistics.median(values):.4f}")
    print(f"  space_to_depth / strided per round: {' '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, action="append", default=None)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--learner", metavar="CONFIG", help="A/B the preset's learner with each first conv")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if args.learner:
        learner_ab(args.learner, args.rounds)
    else:
        conv_table(args.batch or [1, 16, 32, 64], args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
