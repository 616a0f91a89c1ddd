"""The Nature CNN's convs with their ReLU in one oneDNN call (fastrl.models.conv_relu) against the conv then
torch's ReLU: each conv of Pong's network by batch and dtype, and the preset's acting forward, 1 thread,
µs per call, alternated; or the preset's learner with the fusion on and off, alternated rounds, CPU ms per
batch.

    python bench/conv_relu_microbench.py [--rounds 5] [--seconds 1]
    python bench/conv_relu_microbench.py --learner configs/atari_pong.yaml [--rounds 8] [--seconds 3]

Inputs and weights channels-last, as the learner and the inference workers hold them; the first conv both
strided and on 4x4 tiles (model.first_conv). The acting forward is the preset's network as an inference
worker runs it (ActorCritic.for_inference, under inference_mode). The learner is the preset's as `fastrl
bench` runs it (its shards and split), so its CPU is the process's, every thread's; "unfused" there is the
same code with the fused op turned off, as on a torch without it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fastrl.models.conv_relu as conv_relu_module
from fastrl.bench.measure import alternated_us_per_call, microbench_main, switched_learner_ab
from fastrl.models.conv_relu import conv_relu
from fastrl_ext import _frames

CL = torch.channels_last
# (name, input shape without the batch, out channels, kernel, stride)
CONVS = (("conv1 strided", (4, 84, 84), 32, 8, 4), ("conv1 tiled", (64, 21, 21), 32, 2, 1),
         ("conv2", (32, 20, 20), 64, 4, 2), ("conv3", (64, 9, 9), 64, 3, 1))


def _fused(on: bool) -> None:
    """The fused op on or off (as on a torch without it): the module's once-per-process check, set."""
    conv_relu_module._checked = on


def _require_fused() -> None:
    if not conv_relu_module._fused_agrees():
        raise SystemExit("torch's oneDNN fused conv op is missing or disagrees here: nothing to compare")


def microbench(rounds: int, seconds: float) -> None:
    torch.set_flush_denormal(True)  # as every torch process of a run sets it
    _require_fused()
    print(f"conv then ReLU against one fused call, 1 thread, µs per call, medians of {rounds} alternated rounds "
          f"of {seconds} s")
    print(f"{'dtype':<6} {'batch':>5}  {'layer':<14} {'unfused':>8} {'fused':>8} {'ratio':>6}")
    for dtype in (torch.bfloat16, torch.float32):
        for batch in (16, 64):
            for name, shape, out_channels, kernel, stride in CONVS:
                gen = torch.Generator().manual_seed(batch)
                x = torch.randn(batch, *shape, generator=gen).to(dtype).contiguous(memory_format=CL)
                w = (torch.randn(out_channels, shape[0], kernel, kernel, generator=gen) * 0.05).to(dtype).contiguous(
                    memory_format=CL)
                b = torch.zeros(out_channels, dtype=dtype)
                with torch.inference_mode():
                    us = alternated_us_per_call({
                        "unfused": lambda: F.relu(F.conv2d(x, w, b, stride)),
                        "fused": lambda: conv_relu(x, w, b, (stride, stride), (0, 0), (1, 1), 1),
                    }, rounds, seconds)
                print(f"{str(dtype)[6:]:<6} {batch:>5}  {name:<14} {us['unfused']:8.1f} {us['fused']:8.1f} "
                      f"{us['fused'] / us['unfused']:5.2f}x")
    _acting_forward(rounds, seconds)


def _acting_forward(rounds: int, seconds: float) -> None:
    from fastrl.config.hardware import resolve_auto
    from fastrl.config.loader import load_config
    from fastrl.envs.spec import resolve_env
    from fastrl.models import seeded_model

    cfg = resolve_auto(load_config("configs/atari_pong.yaml", []))
    spec = resolve_env(cfg.env)
    model = seeded_model(spec, cfg.model, cfg.run.seed).for_inference()
    for batch in (16, 32):
        obs = torch.randint(0, 256, (batch, *spec.obs_shape), dtype=torch.uint8)

        def forward(on: bool):
            _fused(on)
            with torch.inference_mode():
                model(obs)
        us = alternated_us_per_call({"unfused": lambda: forward(False), "fused": lambda: forward(True)},
                                    rounds, seconds)
        print(f"Pong's acting forward ({cfg.model.precision}, first conv {cfg.model.first_conv}), batch {batch}: "
              f"unfused {us['unfused']:.1f}, fused {us['fused']:.1f} µs ({us['fused'] / us['unfused']:.3f}x)")


def learner_ab(config: str, rounds: int, seconds: float) -> None:
    _require_fused()
    # off: as on a torch without the fused op (the module's once-per-process check, set)
    switched_learner_ab(config, [], lambda trainer: (conv_relu_module, "_checked", {"unfused": False, "fused": True}),
                        rounds, seconds, _frames.ISA, as_configured=True)


def main() -> None:
    microbench_main(__doc__.splitlines()[0], microbench, learner_ab)


if __name__ == "__main__":
    main()
