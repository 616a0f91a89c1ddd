"""A minibatch's loss and gradient through torch's autograd and through fastrl_ext's chain (algo.native_gradient).

    python bench/native_gradient_microbench.py [--rounds 5] [--seconds 1]
    python bench/native_gradient_microbench.py --learner configs/mujoco_halfcheetah.yaml [--rounds 8] [--seconds 3]

Without --learner: microseconds per call of the policy's log-prob and entropy with their gradient
(a weighted sum of both, backward) at the presets' minibatch rows, torch's formulas under autograd
(ActorCritic.log_prob and entropy) against fastrl_ext._policy_head's forward and backward, 1 thread;
then the clip's sum of squares (numpy's float64 copy and dot against _optim.sum_squares) and the
observation normaliser (ObsNormalizer's torch ops against _mlp.normalize) at HalfCheetah's sizes.
With --learner: the preset's learner trained on `fastrl bench`'s synthetic batch, the native chain
switched off (autograd through the same native layers, V-trace and loss) and on in alternate rounds;
CPU milliseconds per batch (this thread's) and the ratio autograd/native of each pair of rounds (> 1:
native is cheaper).
"""

from __future__ import annotations

import numpy as np
import torch

from fastrl.bench.measure import alternated_us_per_call, microbench_main, switched_learner_ab
from fastrl.config.schema import ModelConfig
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic
from fastrl.models.normalizer import ObsNormalizer
from fastrl_ext import _mlp, _optim, _policy_head

HEADS = {
    "CartPole, 2 logits": (EnvSpec("CartPole", "envpool", (4,), np.dtype(np.float32), True, 2), 512),
    "HalfCheetah, 6-d Gaussian": (EnvSpec("HalfCheetah", "envpool", (17,), np.dtype(np.float32), False, 6,
                                          (-1.0,) * 6, (1.0,) * 6), 256),
    # one categorical over Minesweeper's 100 cells (env.joint_actions), at the cartpole preset's rows
    "Minesweeper, 100 logits": (EnvSpec("Minesweeper", "envpool", (202,), np.dtype(np.float32), True, 100), 512),
}


def microbench(rounds: int, seconds: float) -> None:
    print(f"{'log-prob + entropy, fwd + bwd':<36}{'torch us':>10}{'native':>8}")
    for label, (spec, rows) in HEADS.items():
        torch.manual_seed(0)
        model = ActorCritic(spec, ModelConfig(native_mlp=False))
        params = torch.randn(rows, spec.num_actions, requires_grad=True)
        actions = (torch.randint(0, spec.num_actions, (rows,), dtype=torch.int32) if spec.discrete
                   else torch.randn(rows, spec.num_actions))
        g_lp, g_ent = torch.randn(rows), torch.randn(rows)

        def autograd() -> None:
            (model.log_prob(params, actions) * g_lp + model.entropy(params) * g_ent).sum().backward()

        log_std = None if spec.discrete else model.log_std.detach().numpy()
        arrays = (params.detach().numpy(), actions.numpy(), log_std)
        lp, ent = np.empty(rows, np.float32), np.empty(rows, np.float32)
        g_params = np.empty((rows, spec.num_actions), np.float32)
        g_log_std = None if spec.discrete else np.empty(spec.num_actions, np.float32)

        def native() -> None:
            _policy_head.forward(*arrays, lp, ent)
            _policy_head.backward(*arrays, g_lp.numpy(), g_ent.numpy(), g_params, g_log_std)

        us = alternated_us_per_call({"torch": autograd, "native": native}, rounds, seconds)
        print(f"{label + f' ({rows})':<36}{us['torch']:>10.1f}{us['native']:>8.1f}")
    _around_the_chain(rounds, seconds)


def _around_the_chain(rounds: int, seconds: float) -> None:
    """The chain's pieces beside the layers, at HalfCheetah's sizes (9,093 weights, 260 rows of 17
    features): the clip's float64 sum of squares and the observation normaliser, each against what it
    replaced."""
    grad = np.random.default_rng(0).standard_normal(9093).astype(np.float32)

    def numpy_sum() -> float:
        as64 = grad.astype(np.float64)
        return float(np.dot(as64, as64))

    us = alternated_us_per_call({"numpy": numpy_sum, "native": lambda: _optim.sum_squares(grad)}, rounds, seconds)
    print(f"{'sum of squares, 9,093 floats':<36}{us['numpy']:>10.1f}{us['native']:>8.1f}   (numpy: astype + dot)")
    torch.manual_seed(0)
    norm = ObsNormalizer((17,))
    norm.update(torch.randn(2048, 17) * 3)
    obs = torch.randn(260, 17) * 5
    out = np.empty((260, 17), np.float32)

    def native_normalize() -> None:
        std = np.sqrt(norm.var.numpy() + np.float32(norm.eps))
        _mlp.normalize(obs.numpy(), norm.mean.numpy(), std, float(norm.clip), out)

    us = alternated_us_per_call({"torch": lambda: norm(obs), "native": native_normalize}, rounds, seconds)
    print(f"{'observation normaliser, 260 x 17':<36}{us['torch']:>10.1f}{us['native']:>8.1f}")


def learner_ab(config: str, rounds: int, seconds: float) -> None:
    def choose(trainer):
        chain = trainer.native_gradient
        if chain is None:
            raise SystemExit(f"{config}: the learner cannot take the native chain (see fastrl.algo.native_gradient)")
        return trainer, "native_gradient", {"autograd": None, "native": chain}

    switched_learner_ab(config, [], choose, rounds, seconds, _mlp.ISA)


def main() -> None:
    microbench_main(__doc__.splitlines()[0], microbench, learner_ab)


if __name__ == "__main__":
    main()
