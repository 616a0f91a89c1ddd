"""Acting: the policy forward that turns observations in trajectory slots into actions there.

One object does it wherever the policy runs: in an inference worker process (batched over
every rollout worker's requests), or inside a rollout worker when `sampler.num_inference_workers`
is 0 (tiny models, where a forward costs less than the round trip to another process). It reads
observations in place, writes actions, log-probs, values and the acting policy's version back
into the same slot cells, and picks up weights the learner has published since the last call.

The forward itself runs in torch (the ActorCritic module), or for a rollout worker that acts with
a small MLP in numpy (fastrl.models.numpy_policy, sampler.acting_backend): then the worker never
imports torch.
"""

from __future__ import annotations

import time

import numpy as np

from fastrl.config.checks import inference_batch_size
from fastrl.workers.process import WorkerContext


# A repack costs about as much CPU as packed weights save over 3-4 forwards (bench/packed_microbench.py:
# at batch 16 a forward 2.73 -> 2.28 ms, a repack with the caches cold 1.4-1.7 ms), and in training a
# Pong inference worker loads a new version about every other forward. So each version runs eagerly
# for its first few forwards and is packed only if it is still current after them: a rent-or-buy
# rule that never loses more than one repack per version to eager, and in a sampling-only run (no new
# versions) acts packed from the first load on.
PACK_AFTER_FORWARDS = 3


def native_categorical_draw(cfg, spec):
    """fastrl_ext's `sample_categorical` where a torch policy's actions can be drawn by it (categorical, on the
    CPU, system.native_acting, the extension built), taking (logits, uniforms, actions, log_probs) and, for
    several choices, told their options; else None: torch's sample draws them."""
    if not (spec.discrete and cfg.system.device == "cpu" and cfg.system.native_acting):
        return None
    import fastrl_ext

    if fastrl_ext._acting is None:
        return None
    draw = fastrl_ext._acting.sample_categorical
    if not spec.multi_discrete:
        return draw
    choices = np.asarray(spec.action_nvec, dtype=np.int64)
    return lambda logits, uniforms, actions, log_probs: draw(logits, uniforms, actions, log_probs, choices)


def forward_and_draw(net, obs: np.ndarray, draw, rng: np.random.Generator, targets: list) -> None:
    """`net`'s forward on the CPU, then `draw` (native_categorical_draw's) written straight into each target's
    cells: (actions, log_probs, values) views taking consecutive rows of `obs`, in order. One function for
    TorchForward.act_into and fastrl bench's infer stage, so the stage times exactly what a worker runs."""
    import torch

    with torch.inference_mode():
        params, values = net(torch.from_numpy(obs))
    logits, values = np.ascontiguousarray(params.numpy()), values.numpy()
    # a uniform per action cell: [B], or [B, K] for K choices (the cells' shape says which)
    uniforms = rng.random((obs.shape[0], *targets[0][0].shape[1:]), dtype=np.float32)
    offset = 0
    for actions, log_probs, value_cells in targets:
        n = actions.shape[0]
        draw(logits[offset:offset + n], uniforms[offset:offset + n], actions, log_probs)
        value_cells[:] = values[offset:offset + n]
        offset += n


class TorchForward:
    def __init__(self, ctx: WorkerContext, seed: int):
        import torch

        from fastrl.models import seeded_model

        self.torch = torch
        self.device = torch.device(ctx.cfg.system.device)
        # the run's starting network, so that an inference worker that publishes it (see
        # fastrl.workers.inference) has it at hand; any other reader overwrites it with what it reads
        self.model = seeded_model(ctx.spec, ctx.cfg.model, ctx.cfg.run.seed).to(self.device).eval().use_channels_last()
        self.attached = False  # to the weights' data block, once it exists (SharedWeights.attach)
        self.staging = None  # on a GPU only: the block's host copy
        # a bf16 network's layers are cast once, at the first read: inference worker 0 of a fresh
        # run publishes this fp32 network as the starting weights before it reads any
        self.layers_cast = False
        # a CNN on the CPU acts through weights packed for oneDNN (fastrl.models.packed_cnn) once the
        # version it holds has served PACK_AFTER_FORWARDS forwards eagerly (see there)
        self.pack = ctx.cfg.system.packed_inference and self.device.type == "cpu"
        self.packed = None
        self.packed_current = False  # the packed layers hold the loaded version
        self.forwards_on_version = 0
        # "eagerly" is through the network's own calls without its module overhead where that applies
        # (a CNN on the CPU: packed_cnn.direct_forward, the same outputs bit for bit), else the network
        self.direct = None
        self.direct_checked = False
        self.obs_shape, self.batch_hint = ctx.spec.obs_shape, inference_batch_size(ctx.cfg)
        torch.manual_seed(seed)  # action sampling: reproducible in serial mode
        # categorical actions on the CPU are drawn by fastrl_ext straight into the slot cells (act_into):
        # torch's log_softmax, multinomial and gather cost ~30 us a call warm and ~120 in a Pong
        # inference worker, for 16 draws of 6 actions
        self.sample_categorical = native_categorical_draw(ctx.cfg, ctx.spec)
        self.rng = np.random.default_rng(seed)

    def read(self, weights) -> int | None:
        if not self.attached:
            if not weights.attach(self.model):
                return None
            self.attached = True
        if not self.layers_cast:
            self.model.hold_layer_weights_in_bf16()
            self.layers_cast = True
        if self.device.type == "cpu":
            version = weights.try_load(self.model)  # no staging copy: see SharedWeights.try_load
            if version is not None:
                self._loaded()
            return version
        # a GPU takes the block in one host-to-device copy, then casts tensor by tensor on the device
        if self.staging is None:
            self.staging = weights.new_staging()
        version = weights.try_read(self.staging)
        if version is not None:
            weights.load_into(self.model, self.staging.to(self.device))
        return version

    def _loaded(self) -> None:
        """New weights are in the model's tensors (on the CPU): the direct forward re-cuts what it holds,
        and a packed one is stale until its repack (at the first load: each built, or found not to apply)."""
        from fastrl.models.packed_cnn import direct_forward, packed_forward

        if not self.direct_checked:
            self.direct, self.direct_checked = direct_forward(self.model, self.obs_shape), True
        elif self.direct is not None:
            self.direct.repack()
        if not self.pack:
            return
        if self.packed is None:  # the first load: packed at once, or found not to apply
            self.packed = packed_forward(self.model, self.obs_shape, self.batch_hint)
            self.pack = self.packed_current = self.packed is not None
        else:
            self.packed_current, self.forwards_on_version = False, 0

    def _net(self):
        """The network for this forward: after a load, eager (direct where it applies) until the version
        has served PACK_AFTER_FORWARDS forwards, then packed (repacking it first)."""
        if self.packed_current:
            return self.packed
        eager = self.direct if self.direct is not None else self.model
        if not self.pack:  # packing off (the presets) or not applicable: nothing to count
            return eager
        self.forwards_on_version += 1
        if self.forwards_on_version <= PACK_AFTER_FORWARDS:
            return eager
        self.packed.repack()
        self.packed_current = True
        return self.packed

    @property
    def kind(self) -> str:
        """How the forward runs, for the worker's log."""
        eager = "torch's calls without the modules" if self.direct is not None else "eager torch"
        return f"{self.device.type}, " + (f"oneDNN-packed weights once a version has served {PACK_AFTER_FORWARDS} "
                                          f"forwards ({eager} before)" if self.pack else eager)

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        torch = self.torch
        net = self._net()
        with torch.inference_mode():
            params, values = net(torch.from_numpy(obs).to(self.device, non_blocking=True))
            actions, log_probs = self.model.sample(params)
        return actions.cpu().numpy(), log_probs.cpu().numpy(), values.cpu().numpy()

    def act_into(self, obs: np.ndarray, targets: list) -> bool:
        """The forward, then the native categorical draw written straight into each target's cells
        ((actions, log_probs, values) views taking consecutive rows of `obs`, in order); False, with
        nothing run, where only __call__ can (Gaussian actions, a GPU, the extension not built)."""
        if self.sample_categorical is None:
            return False
        forward_and_draw(self._net(), obs, self.sample_categorical, self.rng, targets)
        return True


class NumpyForward:
    def __init__(self, ctx: WorkerContext, seed: int):
        from fastrl.models.numpy_policy import NumpyPolicy

        self.policy = NumpyPolicy(ctx.weights.layout, ctx.spec, ctx.cfg.model.activation,
                                  native=ctx.cfg.system.native_acting)
        self.staging = np.empty(ctx.weights.data.shape[0], dtype=np.float32)
        self.rng = np.random.default_rng(seed)  # action sampling: reproducible in serial mode

    def read(self, weights) -> int | None:
        version = weights.try_read_array(self.staging)
        if version is not None:
            self.policy.load(self.staging)
        return version

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.policy.act(obs, self.rng)

    def act_into(self, obs: np.ndarray, targets: list) -> bool:
        """The forward, written straight into one group's slot cells where the native kernel can (see
        NumpyPolicy.act_into); False, with nothing drawn, for several groups or where only __call__ can."""
        if len(targets) != 1:
            return False
        return self.policy.act_into(obs, self.rng, *targets[0])


class PolicyActor:
    def __init__(self, ctx: WorkerContext, seed: int, backend: str = "torch"):
        """`backend`: "torch", or "numpy" for an MLP acting in a rollout worker (see numpy_policy)."""
        self.ctx = ctx
        self.forward = NumpyForward(ctx, seed) if backend == "numpy" else TorchForward(ctx, seed)
        self.seen_seq = -1
        self.version = -1
        b = ctx.bufs
        self.obs, self.actions, self.log_probs = b.obs.array, b.actions.array, b.log_probs.array
        self.values, self.policy_version = b.values.array, b.policy_version.array

    def refresh_weights(self) -> None:
        seq = int(self.ctx.weights.actors_header[0])  # 0: nothing published yet
        if seq == self.seen_seq or seq == 0:
            return
        version = self.forward.read(self.ctx.weights)
        if version is None:  # caught the learner mid-write; keep the current weights for this batch
            return
        self.seen_seq, self.version = seq, version

    def wait_for_first_weights(self, idle) -> None:
        """`idle()` beats the heartbeat and returns True when the run is stopping."""
        while self.version < 0:
            self.refresh_weights()
            if self.version < 0:
                if idle():
                    return
                time.sleep(0.01)

    def act(self, cells: list) -> int:
        """Fill actions, log-probs, values and versions at each (slot, t) in `cells`; returns samples."""
        self.refresh_weights()
        views = [self.obs[slot, t] for slot, t in cells]
        obs = views[0] if len(views) == 1 else np.concatenate(views)
        # written in place where the forward can: no intermediate arrays to copy back
        if self.forward.act_into(obs, [(self.actions[slot, t], self.log_probs[slot, t], self.values[slot, t])
                                       for slot, t in cells]):
            for slot, t in cells:
                self.policy_version[slot, t] = self.version
            return obs.shape[0]
        actions, log_probs, values = self.forward(obs)
        offset = 0
        for (slot, t), view in zip(cells, views):
            n = view.shape[0]
            self.actions[slot, t] = actions[offset:offset + n]
            self.log_probs[slot, t] = log_probs[offset:offset + n]
            self.values[slot, t] = values[offset:offset + n]
            self.policy_version[slot, t] = self.version
            offset += n
        return offset
