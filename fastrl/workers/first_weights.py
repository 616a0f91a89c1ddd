"""Who builds a run's starting network and publishes it as policy version 0, and the hand-over by
which a child that built it gets the weights' shared data block from the runner.

Building the network loads torch (~2 CPU-s on the 2-core boxes), so on a fresh run it is built by a
child that loads torch anyway, spawned warm (fastrl.runner.warm_start) so that its import overlaps
the runner's env probe and setup, and the runner itself loads no torch:
- with inference workers, inference worker 0; the rollout workers, which do not act, start at once;
- with rollout workers that act themselves, the learner. They make their envs meanwhile, then wait
  for the network's layout, which the runner writes beside the weights' header (a numpy actor has no
  model to read it from). The learner used to start only after the first sample, and then load
  torch: CartPole's first batch came ~2 s after its first sample.
A resumed run's weights come from its checkpoint, which the runner has loaded to check it, and a
serial run has no children: there the runner builds them. So does a runner that has torch loaded
already where the learner would (`fastrl bench`, which has timed the network): it publishes them at
once, and the rollout workers act as soon as they have made their envs, while the learner would
hold them back by its import (CartPole's train stage: first sample 0.55 s after the runner's setup,
2.18 s with the learner building them).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fastrl.buffers.weights import state_layout
from fastrl.config.checks import rollout_workers_act
from fastrl.config.schema import Config
from fastrl.ipc import put_report

if TYPE_CHECKING:
    import torch

    from fastrl.workers.process import WorkerContext

RUNNER, INFERENCE, LEARNER = "runner", "inference", "learner"
POLL_S = 0.005


def first_weights_builder(cfg: Config, resuming: bool, runner_has_torch: bool = False) -> str:
    """Which process builds and publishes the starting weights of a run of `cfg`."""
    if cfg.system.serial or resuming:
        return RUNNER
    if not rollout_workers_act(cfg):
        return INFERENCE
    return RUNNER if runner_has_torch else LEARNER


def acts_in_bf16(cfg: Config, spec, model) -> bool:
    """Whether every actor of a run of `cfg` holds `model` (the run's network) whole in bf16, so that the
    weights are published for them as bf16 (system.publish_bf16; fastrl.buffers.weights): a bf16 network
    whose state is all conv and linear layers, acting in torch on the CPU (not in numpy, which reads float32)."""
    from fastrl.models.numpy_policy import acting_backend

    if not (cfg.system.publish_bf16 and cfg.system.device == "cpu" and model.bf16 and model.state_all_in_layers()):
        return False
    return not (rollout_workers_act(cfg) and acting_backend(cfg, spec) == "numpy")


def hand_over_first_weights(ctx: WorkerContext, hb: int, model: torch.nn.Module, log) -> bool:
    """In the child that builds the starting network (heartbeat index `hb`): report `model`'s layout
    to the runner, wait for the data block it allocates, beating, and publish `model` as version 0
    unless a predecessor did (a replaced inference worker 0). False when the run stopped first."""
    weights, control = ctx.weights, ctx.control
    if not weights.attach(model):
        put_report(ctx.channels.reports[hb], {"kind": "weights_layout", "layout": state_layout(model),
                                              "acting_bf16": acts_in_bf16(ctx.cfg, ctx.spec, model)})
        while not weights.attach(model):
            control.beat(hb)
            if control.stop_requested:
                return False
            time.sleep(POLL_S)
    if not weights.is_published:
        weights.publish(model, version=0)
        log.info("published the starting weights (version 0, %d floats)", weights.data.shape[0])
    return True
