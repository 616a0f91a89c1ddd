"""The ReLU's gradient after each of Pong's convs: torch's threshold_backward against fastrl_ext's
(fastrl.models.conv_relu.relu_backward), alone and inside the learner.

    python bench/relu_backward_microbench.py [--rounds 5] [--seconds 1]
    python bench/relu_backward_microbench.py --learner configs/atari_pong.yaml [--rounds 8] [--seconds 3]

Without --learner: µs per call on each conv's bf16 output at batch 64, 1 thread, alternated, the ReLU's
outputs taken in turn from 16 copies (26 MB for the first conv's), so that each call finds its output out of
cache as the learner's backward does, long after the forward wrote it; the gradient is channels-last like
the output, except the third conv's, which comes back through the flatten in NCHW order, as in the learner.
With --learner: the preset's learner (its shards and split) with the kernel off and on in alternate rounds,
the process's CPU ms per batch and the ratio per pair of rounds.
"""

from __future__ import annotations

import itertools

import torch

import fastrl.models.conv_relu as conv_relu_module
from fastrl.bench.measure import alternated_us_per_call, microbench_main, switched_learner_ab
from fastrl.models.conv_relu import relu_backward
from fastrl_ext import _activations

# (name, the conv's output shape at batch 64, the gradient's layout)
OUTPUTS = (("conv1 (32x20x20)", (64, 32, 20, 20), torch.channels_last),
           ("conv2 (64x9x9)", (64, 64, 9, 9), torch.channels_last),
           ("conv3 (64x7x7), NCHW grad", (64, 64, 7, 7), torch.contiguous_format))
COPIES = 16


def _native(on: bool) -> None:
    conv_relu_module.native_relu_backward = on


def microbench(rounds: int, seconds: float) -> None:
    if conv_relu_module._native is None:
        raise SystemExit("fastrl_ext is not built: nothing to compare")
    torch.set_flush_denormal(True)  # as every torch process of a run sets it
    print(f"the ReLU's gradient, bf16, batch 64, 1 thread, the ReLU's output cold; fastrl_ext ISA "
          f"{_activations.ISA}; µs per call, medians of {rounds} alternated rounds of {seconds} s")
    print(f"{'output':<28} {'torch':>8} {'native':>8} {'ratio':>6}")
    for name, shape, grad_layout in OUTPUTS:
        gen = torch.Generator().manual_seed(shape[1])
        outs = [torch.relu(torch.randn(shape, generator=gen)).bfloat16().contiguous(memory_format=torch.channels_last)
                for _ in range(COPIES)]
        grad = torch.randn(shape, generator=gen).bfloat16().contiguous(memory_format=grad_layout)
        turn = itertools.cycle(outs)

        def call(on: bool) -> None:
            _native(on)
            relu_backward(grad, next(turn))
        try:
            us = alternated_us_per_call({"torch": lambda: call(False), "native": lambda: call(True)}, rounds, seconds)
        finally:
            _native(True)
        print(f"{name:<28} {us['torch']:8.1f} {us['native']:8.1f} {us['native'] / us['torch']:5.2f}x")


def learner_ab(config: str, rounds: int, seconds: float) -> None:
    switched_learner_ab(config, [], lambda trainer: (conv_relu_module, "native_relu_backward",
                                                     {"torch": False, "native": True}),
                        rounds, seconds, _activations.ISA, as_configured=True)


def main() -> None:
    microbench_main(__doc__.splitlines()[0], microbench, learner_ab)


if __name__ == "__main__":
    main()
