"""The weight and bias gradients of Pong's three convs: oneDNN's convolution_backward against fastrl_ext's AMX
kernel (fastrl.models.conv_weight_grad), alone and inside the learner.

    python bench/conv_grad_microbench.py [--rounds 5] [--seconds 1]
    python bench/conv_grad_microbench.py --learner configs/atari_pong.yaml [--rounds 8] [--seconds 3]

Without --learner: µs per call at the preset's minibatch (64) and at 16, bf16, channels-last, 1 thread,
alternated; the first conv as the preset runs it on AMX, on 4x4 tiles of the frames (2x2 kernel over 64
channels at stride 1). Each call takes its input and gradient in turn from 8 copies (29 MB for the first
conv's inputs), so that it finds them out of cache as the learner's backward does. With --learner: the
preset's learner (its shards and split) with the kernel off and on in alternate rounds (model.native_conv_grad),
the process's CPU ms per batch and the ratio per pair of rounds.
"""

from __future__ import annotations

import itertools

import torch

from fastrl.bench.measure import alternated_us_per_call, microbench_main, switched_learner_ab
from fastrl.models.actor_critic import NatureCNN
from fastrl.models.conv_weight_grad import available, weight_and_bias_grad

# (name, input channels, input side, output channels, kernel, stride)
CONVS = (("conv1 on 4x4 tiles (64x21x21 -> 32)", 64, 21, 32, 2, 1),
         ("conv2 (32x20x20 -> 64)", 32, 20, 64, 4, 2),
         ("conv3 (64x9x9 -> 64)", 64, 9, 64, 3, 1))
COPIES = 8


def microbench(rounds: int, seconds: float) -> None:
    if not available():
        raise SystemExit("fastrl_ext's conv gradient needs a CPU with amx_bf16 (and the kernel's leave to use it)")
    torch.set_flush_denormal(True)  # as every torch process of a run sets it
    print(f"a conv's weight and bias gradients, bf16, channels-last, 1 thread, inputs cold; µs per call, medians of "
          f"{rounds} alternated rounds of {seconds} s")
    print(f"{'conv':<38} {'batch':>5} {'oneDNN':>8} {'native':>8} {'ratio':>6}")
    for batch in (64, 16):
        for name, c, side, oc, kernel, stride in CONVS:
            out_side = (side - kernel) // stride + 1
            gen = torch.Generator().manual_seed(oc + c)
            pairs = [(torch.randn(batch, c, side, side, generator=gen).bfloat16().contiguous(memory_format=torch.channels_last),
                      torch.randn(batch, oc, out_side, out_side, generator=gen).bfloat16()
                      .contiguous(memory_format=torch.channels_last)) for _ in range(COPIES)]
            weight = torch.randn(oc, c, kernel, kernel, generator=gen).bfloat16().contiguous(memory_format=torch.channels_last)
            turn = itertools.cycle(pairs)

            def call(native: bool) -> None:
                x, grad = next(turn)
                weight_and_bias_grad(grad, x, weight, True, (stride, stride), (0, 0), (1, 1), 1, native=native)
            us = alternated_us_per_call({"onednn": lambda: call(False), "native": lambda: call(True)}, rounds, seconds)
            print(f"{name:<38} {batch:5d} {us['onednn']:8.1f} {us['native']:8.1f} {us['native'] / us['onednn']:5.2f}x")


def learner_ab(config: str, rounds: int, seconds: float) -> None:
    def choose(trainer):
        encoders = [m for m in trainer.net.modules() if isinstance(m, NatureCNN)]  # the network that trains (a bf16 copy)
        if len(encoders) != 1:
            raise SystemExit("--learner switches one Nature CNN's convs: a preset with shared_encoder true")
        return encoders[0], "native_conv_grad", {"onednn": False, "native": True}
    switched_learner_ab(config, [], choose, rounds, seconds, "amx" if available() else "none", as_configured=True)


def main() -> None:
    microbench_main(__doc__.splitlines()[0], microbench, learner_ab)


if __name__ == "__main__":
    main()
