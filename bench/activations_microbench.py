"""The learner's tanh three ways (torch, numpy, fastrl_ext._activations), alone and inside a learner step.

    python bench/activations_microbench.py [--rounds 5] [--seconds 1]
    python bench/activations_microbench.py --learner configs/cartpole.yaml [--rounds 8] [--seconds 3]

Without --learner: microseconds per call of tanh and of its gradient on float32 [rows, 64] tensors
(the rows of the presets' learner minibatches), 1 thread, each implementation timed in turn.
With --learner: the preset's network and optimizer trained on `fastrl bench`'s synthetic batch
(as bench/profile_learner.py), `fastrl.models.activations` routed to numpy or to fastrl_ext in
alternate rounds; CPU milliseconds per batch (this thread's, so other processes' load counts less
than in wall time) and the ratio numpy/native of each pair of rounds (> 1: native is cheaper).
"""

from __future__ import annotations

import numpy as np
import torch

import fastrl.models.activations as activations
from fastrl.bench.measure import alternated_us_per_call, microbench_main, switched_learner_ab
from fastrl_ext import _activations

ROWS = {"HalfCheetah minibatch": 256, "CartPole minibatch": 512, "528 rows": 528}


def microbench(rounds: int, seconds: float) -> None:
    print(f"fastrl_ext._activations.ISA = {_activations.ISA}")
    print(f"{'tanh of [rows, 64]':<26}{'torch us':>10}{'numpy us':>10}{'native us':>11}"
          f"{'grad: torch':>13}{'native':>8}")
    for label, rows in ROWS.items():
        gen = torch.Generator().manual_seed(0)
        x, grad = torch.randn(rows, 64, generator=gen), torch.randn(rows, 64, generator=gen)
        y, out = torch.tanh(x), torch.empty(rows, 64)
        xn, yn, gn, outn = x.numpy(), y.numpy(), grad.numpy(), out.numpy()
        forward = alternated_us_per_call({
            "torch": lambda: torch.tanh(x, out=out),
            "numpy": lambda: np.tanh(xn, out=outn),
            "native": lambda: _activations.tanh(xn, outn),
        }, rounds, seconds)
        backward = alternated_us_per_call({
            "torch": lambda: torch.ops.aten.tanh_backward(grad, y),
            "native": lambda: _activations.tanh_backward(gn, yn, outn),
        }, rounds, seconds)
        print(f"{label + f' ({rows})':<26}{forward['torch']:>10.1f}{forward['numpy']:>10.1f}"
              f"{forward['native']:>11.1f}{backward['torch']:>13.1f}{backward['native']:>8.1f}")


def learner_ab(config: str, rounds: int, seconds: float) -> None:
    # torch's layers: with model.native_mlp the MLP's tanh runs inside fastrl_ext._mlp, not through this module
    switched_learner_ab(config, ["model.native_mlp=false"],
                        lambda trainer: (activations, "_native", {"numpy": None, "native": _activations}),
                        rounds, seconds, _activations.ISA)


def main() -> None:
    microbench_main(__doc__.splitlines()[0], microbench, learner_ab)


if __name__ == "__main__":
    main()
