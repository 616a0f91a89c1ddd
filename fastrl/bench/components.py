"""The infer and learn stages of `fastrl bench`: each part of the system alone, at the preset's
sizes, so the machine bound `C / (1/env + 1/infer + epochs/learn)` can be computed (the env stage,
whose spawned processes must not import torch, is fastrl.bench.env_stage).

- infer: the policy forward + action sampling at the batch an inference worker sees.
- learn: APPO training steps on a synthetic batch of the preset's size and epochs.

Per-core rates divide by the CPU seconds the stage consumed (psutil / process_time), so a stage
that used 1.6 cores is not credited as if it used one.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from fastrl.algo.appo import APPOTrainer
from fastrl.bench.measure import ComponentResult, StageProgress, spread, window_rates
from fastrl.config.checks import inference_batch_size, resolve_encoder, rollout_workers_act
from fastrl.config.hardware import resolve_learner_split
from fastrl.config.schema import Config
from fastrl.envs import EnvSpec
from fastrl.workers.learner import build_learner_model
from fastrl.workers.process import torch_process_settings


def random_obs(spec: EnvSpec, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    if np.issubdtype(spec.obs_dtype, np.integer):
        return torch.randint(0, 256, (*shape, *spec.obs_shape), dtype=torch.uint8, generator=gen)
    return torch.randn((*shape, *spec.obs_shape), generator=gen)


def _timed_loop(step: Callable[[], int], seconds: float, progress: StageProgress,
                label: str) -> tuple[list, int, float, float]:
    """Run `step` (returns items done) repeatedly after one warm-up call; points for window rates."""
    step()
    points = [(0.0, 0.0)]
    done = 0
    cpu0, t0 = time.process_time(), time.monotonic()
    last_progress = 0.0
    while True:
        done += step()
        now = time.monotonic() - t0
        points.append((now, float(done)))
        if now - last_progress >= 0.25:
            last_progress = now
            progress(min(1.0, now / seconds), f"{label} {done / now:,.0f}/s")
        if now >= seconds:
            break
    return points, done, time.process_time() - cpu0, points[-1][0]


def bench_infer(cfg: Config, spec: EnvSpec, seconds: float, progress: StageProgress) -> ComponentResult:
    """The policy forward + sampling as the preset runs it: torch in an inference worker, or in the
    rollout workers with sampler.acting_backend (numpy for small MLPs)."""
    from fastrl.models import ActorCritic
    from fastrl.models.numpy_policy import NumpyPolicy, acting_backend
    from fastrl.models.packed_cnn import direct_forward, packed_forward
    from fastrl.workers.acting import forward_and_draw, native_categorical_draw

    torch.set_num_threads(cfg.system.inference_threads)
    batch = inference_batch_size(cfg)
    model = ActorCritic(spec, cfg.model).eval().use_channels_last()  # as an inference worker's
    obs = random_obs(spec, (batch,), torch.Generator().manual_seed(0))
    backend = acting_backend(cfg, spec) if rollout_workers_act(cfg) else "torch"
    if backend == "torch":
        torch_process_settings(cfg.system)  # as a process acting with torch sets itself up
    if backend == "numpy":
        policy = NumpyPolicy.from_module(model, spec, cfg.model.activation, cfg.system.native_acting)
        obs_np, rng = obs.numpy(), np.random.default_rng(0)

        def step() -> int:
            policy.act(obs_np, rng)
            return batch
    else:
        model.for_inference()  # as a worker acting with torch holds it (bf16 layers; a no-op in fp32)
        # as an acting worker runs it between loads (TorchForward: packed once a version outlasts its first
        # forwards; this stage loads no new version); where packing is off or does not apply, eager, through
        # the network's calls without its modules where that applies (direct_forward)
        net = ((packed_forward(model, spec.obs_shape, batch) if cfg.system.packed_inference else None)
               or direct_forward(model, spec.obs_shape) or model)
        draw = native_categorical_draw(cfg, spec)  # as TorchForward.act_into draws, where it does
        targets = [(np.empty((batch, *spec.action_cell), np.int32),
                    np.empty(batch, np.float32), np.empty(batch, np.float32))]
        obs_np, rng = obs.numpy(), np.random.default_rng(0)

        def step() -> int:
            if draw is not None:
                forward_and_draw(net, obs_np, draw, rng, targets)
                return batch
            with torch.inference_mode():
                params, _ = net(obs)
                model.sample(params)
            return batch

    points, done, cpu_s, wall = _timed_loop(step, seconds, progress, "samples")
    return ComponentResult(spread(window_rates(points, max(1.0, seconds / 10))), done / max(cpu_s, 1e-9),
                           cpu_s / wall, wall, {"batch": batch, "backend": backend,
                                                "native_acting": backend == "numpy" and policy.native,
                                                "packed": backend == "torch" and net is not model,
                                                "native_draw": backend == "torch" and draw is not None,
                                                "torch_threads": cfg.system.inference_threads})


def synthetic_batch(cfg: Config, spec: EnvSpec, seed: int = 0) -> dict:
    """A learner batch of the preset's shape: [T(+1), B] with a few episode ends and reset steps."""
    gen = torch.Generator().manual_seed(seed)
    T = cfg.sampler.rollout_len
    B = cfg.algo.batch_size // T
    if spec.multi_discrete:
        actions = torch.stack([torch.randint(0, n, (T, B), dtype=torch.int32, generator=gen) for n in spec.action_nvec],
                              dim=-1)
    elif spec.discrete:
        actions = torch.randint(0, spec.num_actions, (T, B), dtype=torch.int32, generator=gen)
    else:
        actions = torch.randn((T, B, spec.num_actions), generator=gen)
    ends = torch.rand((T, B), generator=gen) < 0.01
    return {"obs": random_obs(spec, (T + 1, B), gen), "actions": actions,
            "log_probs": torch.full((T, B), -1.0), "values": torch.randn((T, B), generator=gen),
            "rewards": torch.randn((T, B), generator=gen), "terminated": ends,
            "truncated": torch.zeros((T, B), dtype=torch.bool), "valid": torch.ones((T, B), dtype=torch.bool),
            "policy_version": torch.zeros((T, B), dtype=torch.int64)}


def learner_on_synthetic_batch(cfg: Config, spec: EnvSpec) -> tuple[APPOTrainer, dict]:
    """The preset's trainer, set up in this process as the learner process sets itself up (torch
    threads, heap setting, seed), and the learn stage's synthetic batch; shared with bench/'s learner
    scripts so that they measure the same thing."""
    torch.set_num_threads(cfg.system.learner_threads)
    torch_process_settings(cfg.system)  # as the learner process sets itself up
    torch.manual_seed(cfg.run.seed)
    split = resolve_learner_split(cfg, resolve_encoder(cfg.model, spec), cfg.system.learner_shards)
    trainer = APPOTrainer(build_learner_model(spec, cfg), cfg.algo, cfg.sampler.max_policy_lag,
                          shards=cfg.system.learner_shards, split=split)
    return trainer, synthetic_batch(cfg, spec)


def bench_learn(cfg: Config, spec: EnvSpec, seconds: float, progress: StageProgress) -> ComponentResult:
    trainer, batch = learner_on_synthetic_batch(cfg, spec)
    shards = cfg.system.learner_shards
    passes = cfg.algo.batch_size * cfg.algo.num_epochs

    def step() -> int:
        batch["policy_version"].fill_(trainer.policy_version)  # on-policy: nothing masked for lag
        trainer.train(batch)
        return passes

    points, done, cpu_s, wall = _timed_loop(step, seconds, progress, "samples")
    per_core = done / max(cpu_s, 1e-9)
    detail = {"batch_size": cfg.algo.batch_size, "epochs": cfg.algo.num_epochs,
              "minibatches": cfg.algo.num_minibatches, "torch_threads": cfg.system.learner_threads,
              "shards": shards, "split": trainer.split, "note": "samples/s count every epoch's pass over the batch"}
    if cfg.system.learner_threads > 1 or shards > 1:
        # The bound needs the learner's cheapest CPU cost per sample. Alone, a multi-threaded learner
        # is billed for the time its threads spin at each barrier. In the real run the other
        # processes get that time back, so its per-core rate here made the bound too low: the
        # 2-thread Pong train stage ran at 113% of it. One thread pays no barriers (nor a shard's
        # wait for its slower partner).
        torch.set_num_threads(1)
        trainer.set_shards(1)
        _, done_1, cpu_s_1, _ = _timed_loop(step, max(2.0, seconds / 2), progress, "samples (1 thread)")
        torch.set_num_threads(cfg.system.learner_threads)
        per_core_1 = done_1 / max(cpu_s_1, 1e-9)
        detail["samples_per_core_s_at_configured_threads"] = round(per_core, 1)
        detail["samples_per_core_s_1_thread"] = round(per_core_1, 1)
        detail["per_core_note"] = "samples_per_core_s (used by the bound) is the better of the two"
        per_core = max(per_core, per_core_1)
    return ComponentResult(spread(window_rates(points, max(1.0, seconds / 10))), per_core, cpu_s / wall, wall,
                           detail)
