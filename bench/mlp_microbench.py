"""An MLP actor and critic through torch's layers and through fastrl_ext._mlp, alone and inside a learner step.

    python bench/mlp_microbench.py [--rounds 5] [--seconds 1]
    python bench/mlp_microbench.py --learner configs/mujoco_halfcheetah.yaml [--rounds 8] [--seconds 3]

Without --learner: microseconds per call of the presets' networks (CartPole: 4 -> 64 -> 64 -> 2 and
-> 1, tanh; HalfCheetah: 17 -> 64 -> 64 -> 6 and -> 1, tanh, observation normaliser) at their learner
minibatches' rows, forward with autograd recording, and forward + backward of a sum over both
outputs, 1 thread, `model.native_mlp` off and on in turn (the same weights).
With --learner: the preset's learner trained on `fastrl bench`'s synthetic batch through autograd
(algo.native_gradient off), its network's native layers switched off and on in alternate rounds; CPU
milliseconds per batch (this thread's) and the ratio torch/native of each pair of rounds (> 1: native is
cheaper).
"""

from __future__ import annotations

import numpy as np
import torch

from fastrl.bench.measure import alternated_us_per_call, microbench_main, switched_learner_ab
from fastrl.config.schema import ModelConfig
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic
from fastrl_ext import _mlp

NETS = {
    "CartPole minibatch": (EnvSpec("CartPole", "envpool", (4,), np.dtype(np.float32), True, 2), False, 512),
    "HalfCheetah minibatch": (EnvSpec("HalfCheetah", "envpool", (17,), np.dtype(np.float32), False, 6,
                                      (-1.0,) * 6, (1.0,) * 6), True, 260),
}


def microbench(rounds: int, seconds: float) -> None:
    print(f"fastrl_ext._mlp.ISA = {_mlp.ISA}")
    print(f"{'actor + critic':<28}{'fwd: torch us':>14}{'native':>8}{'fwd+bwd: torch':>16}{'native':>8}")
    for label, (spec, normalize, rows) in NETS.items():
        torch.manual_seed(0)
        native = ActorCritic(spec, ModelConfig(normalize_obs=normalize))
        reference = ActorCritic(spec, ModelConfig(normalize_obs=normalize, native_mlp=False))
        reference.load_state_dict(native.state_dict())
        obs = torch.randn(rows, *spec.obs_shape)

        def step(net):
            params, values = net(obs)
            (params.sum() + values.sum()).backward()

        forward = alternated_us_per_call({"torch": lambda: reference(obs), "native": lambda: native(obs)},
                                         rounds, seconds)
        both = alternated_us_per_call({"torch": lambda: step(reference), "native": lambda: step(native)},
                                      rounds, seconds)
        print(f"{label + f' ({rows})':<28}{forward['torch']:>14.1f}{forward['native']:>8.1f}"
              f"{both['torch']:>16.1f}{both['native']:>8.1f}")


def learner_ab(config: str, rounds: int, seconds: float) -> None:
    def choose(trainer):
        nets = trainer.net.native_nets
        if nets is None:
            raise SystemExit(f"{config}: the network has no native layers (model.native_mlp applies to fp32 MLPs "
                             "with shared_encoder false)")
        return trainer.net, "native_nets", {"torch": None, "native": nets}

    # under autograd both ways: the native gradient chain (algo.native_gradient) would run only with the layers
    switched_learner_ab(config, ["algo.native_gradient=false"], choose, rounds, seconds, _mlp.ISA)


def main() -> None:
    microbench_main(__doc__.splitlines()[0], microbench, learner_ab)


if __name__ == "__main__":
    main()
