"""Cross-field checks: settings that are each well-typed but impossible together.

Run before any process starts, so that a bad run fails in a second with every reason listed.
"""

from __future__ import annotations

import fastrl_ext
from fastrl.config.schema import Config


def envs_per_split(cfg: Config) -> int:
    return cfg.sampler.num_envs_per_worker // cfg.sampler.num_splits


def samples_per_slot(cfg: Config) -> int:
    """Env steps held by one trajectory slot: one split's envs for one rollout."""
    return cfg.sampler.rollout_len * envs_per_split(cfg)


# The Nature CNN's convs (8x8 stride 4, 4x4 stride 2, 3x3 stride 1) leave no pixel of a smaller side
NATURE_CNN_MIN_SIDE = 36


def nature_cnn_fits(spec) -> bool:
    return spec.is_image and min(spec.image_chw[1:]) >= NATURE_CNN_MIN_SIDE


def resolve_encoder(model_cfg, spec) -> str:
    """model.encoder with auto resolved: the Nature CNN for image observations it can take, else an MLP
    (MiniGrid's 7x7 views, say, are flattened)."""
    if model_cfg.encoder != "auto":
        return model_cfg.encoder
    return "nature_cnn" if nature_cnn_fits(spec) else "mlp"


def encoder_problem(model_cfg, spec) -> str | None:
    """Why model.encoder cannot take this env's observations, or None."""
    if model_cfg.encoder == "nature_cnn" and not nature_cnn_fits(spec):
        what = f"images of {spec.obs_shape}" if spec.is_image else f"observations of shape {spec.obs_shape}"
        return (f"model.encoder=nature_cnn needs image observations of at least {NATURE_CNN_MIN_SIDE}x"
                f"{NATURE_CNN_MIN_SIDE}; {spec.env_id} has {what} (use auto or mlp)")
    return None


def rollout_workers_act(cfg: Config) -> bool:
    """No inference processes: each rollout worker runs the policy itself (and only then needs torch)."""
    return cfg.sampler.num_inference_workers == 0


def inference_batch_size(cfg: Config) -> int:
    """What an inference worker typically gets at best: one pending split from each rollout worker it
    serves (the infer stage's batch, and what an acting network's packing is tuned for)."""
    if rollout_workers_act(cfg):
        return envs_per_split(cfg)  # each rollout worker acts on one split at a time
    per_worker = -(-cfg.sampler.num_rollout_workers // cfg.sampler.num_inference_workers)
    return envs_per_split(cfg) * per_worker


def slots_per_batch(cfg: Config) -> int:
    return cfg.algo.batch_size // samples_per_slot(cfg)


def num_traj_buffers(cfg: Config) -> int:
    """Slots in flight (one per split) plus room for two batches waiting for the learner."""
    if cfg.sampler.num_traj_buffers > 0:
        return cfg.sampler.num_traj_buffers
    in_flight = cfg.sampler.num_rollout_workers * cfg.sampler.num_splits
    return in_flight + 2 * max(1, slots_per_batch(cfg)) + 1


def check_config(cfg: Config) -> list[str]:
    problems: list[str] = []
    s, a, sysc, r = cfg.sampler, cfg.algo, cfg.system, cfg.run

    positive = {
        "sampler.num_rollout_workers": s.num_rollout_workers, "sampler.num_envs_per_worker": s.num_envs_per_worker,
        "sampler.num_splits": s.num_splits, "sampler.env_threads": s.env_threads,
        "sampler.rollout_len": s.rollout_len,
        "algo.batch_size": a.batch_size, "algo.num_epochs": a.num_epochs, "algo.num_minibatches": a.num_minibatches,
        "algo.minibatches_per_weights": a.minibatches_per_weights, "algo.publish_every_steps": a.publish_every_steps,
        "system.inference_threads": sysc.inference_threads,
        "run.train_for_env_steps": r.train_for_env_steps, "run.keep_checkpoints": r.keep_checkpoints,
    }
    for key in ("learner_threads", "learner_shards"):
        if getattr(sysc, key) != "auto":
            positive[f"system.{key}"] = getattr(sysc, key)
    for key, value in positive.items():
        if value < 1:
            problems.append(f"{key} must be >= 1, got {value}")
    if a.vtrace_values == "behaviour" and a.minibatch_unit != "samples":
        problems.append("algo.vtrace_values=behaviour replaces the batch's no-grad forward of "
                        "algo.minibatch_unit=samples; trajectory minibatches take their values from their own "
                        f"forward: got algo.minibatch_unit={a.minibatch_unit}")
    if a.vtrace_values == "behaviour" and (a.rho_bar != 1.0 or a.c_bar != 1.0):
        problems.append(f"algo.rho_bar={a.rho_bar} and algo.c_bar={a.c_bar} truncate importance ratios, and "
                        "algo.vtrace_values=behaviour takes them as 1: leave both at 1 or use the learner's values")
    if sysc.learner_shards != "auto" and sysc.learner_shards > 1:  # auto picks 1 where these would fail
        if a.minibatch_unit != "samples":
            problems.append(f"system.learner_shards={sysc.learner_shards} cuts minibatches of single samples: it needs "
                            f"algo.minibatch_unit=samples, got {a.minibatch_unit}")
        if sysc.learner_threads not in ("auto", 1):
            problems.append(f"system.learner_shards={sysc.learner_shards} runs each shard on one torch thread: set "
                            f"system.learner_threads to 1 or auto, got {sysc.learner_threads}")
    for key, value in {"algo.lr": a.lr, "algo.clip_ratio": a.clip_ratio, "algo.max_grad_norm": a.max_grad_norm,
                       "algo.adam_eps": a.adam_eps, "algo.rho_bar": a.rho_bar, "algo.c_bar": a.c_bar,
                       "run.report_interval_s": r.report_interval_s, "run.save_every_s": r.save_every_s,
                       "system.heartbeat_timeout_s": sysc.heartbeat_timeout_s,
                       "system.env_make_timeout_s": sysc.env_make_timeout_s}.items():
        if not value > 0:
            problems.append(f"{key} must be > 0, got {value}")
    for key, value in {"algo.gamma": a.gamma, "algo.vtrace_lambda": a.vtrace_lambda,
                       "system.learner_parallel_backlog": sysc.learner_parallel_backlog,
                       "system.learner_serial_tail": sysc.learner_serial_tail}.items():
        if not 0.0 <= value <= 1.0:
            problems.append(f"{key} must be in [0, 1], got {value}")
    for key in ("rollout_nice", "inference_nice"):
        if not 0 <= getattr(sysc, key) <= 19:
            problems.append(f"system.{key} must be in [0, 19] (a process may only lower its own priority), "
                            f"got {getattr(sysc, key)}")
    for key, value in {"algo.value_coef": a.value_coef, "algo.entropy_coef": a.entropy_coef,
                       "sampler.num_inference_workers": s.num_inference_workers,
                       "system.heap_keep_mib": sysc.heap_keep_mib}.items():
        if value < 0:
            problems.append(f"{key} must be >= 0, got {value}")
    if r.train_for_seconds is not None and r.train_for_seconds <= 0:
        problems.append(f"run.train_for_seconds must be > 0 or null, got {r.train_for_seconds}")
    if s.env_pool == "per_worker" and s.env_threads != 1:
        problems.append(f"sampler.env_pool=per_worker steps a worker's groups in one envpool on one thread, so that "
                        f"each group gets its own envs back in the order it sent them: set sampler.env_threads=1 "
                        f"(got {s.env_threads}), or env_pool=per_group")
    if sysc.rollout_pinning == "always" and not rollout_workers_act(cfg):
        problems.append(f"system.rollout_pinning=always keeps each rollout worker on one core, whose time it would "
                        f"idle waiting for an inference process's actions: set sampler.num_inference_workers=0, "
                        f"or rollout_pinning to auto or never (got num_inference_workers={s.num_inference_workers})")
    if sysc.native_rings and fastrl_ext._rings is None:
        problems.append(f"system.native_rings=true but fastrl_ext is not built ({fastrl_ext.BUILD_ERROR}): "
                        "reinstall with a C++ compiler (pip install -e .), or set system.native_rings=false")
    if a.native_vtrace and fastrl_ext._vtrace is None:
        problems.append(f"algo.native_vtrace=true but fastrl_ext is not built ({fastrl_ext.BUILD_ERROR}): "
                        "reinstall with a C++ compiler (pip install -e .), or set algo.native_vtrace=false")
    if a.native_loss and fastrl_ext._appo_loss is None:
        problems.append(f"algo.native_loss=true but fastrl_ext is not built ({fastrl_ext.BUILD_ERROR}): "
                        "reinstall with a C++ compiler (pip install -e .), or set algo.native_loss=false")
    if cfg.model.native_mlp and fastrl_ext._mlp is None:
        problems.append(f"model.native_mlp=true but fastrl_ext is not built ({fastrl_ext.BUILD_ERROR}): "
                        "reinstall with a C++ compiler (pip install -e .), or set model.native_mlp=false")
    if a.native_gradient and fastrl_ext._policy_head is None:
        problems.append(f"algo.native_gradient=true but fastrl_ext is not built ({fastrl_ext.BUILD_ERROR}): "
                        "reinstall with a C++ compiler (pip install -e .), or set algo.native_gradient=false")
    if a.lr_decay_env_steps is not None:
        if a.lr_schedule != "linear":
            problems.append(f"algo.lr_decay_env_steps={a.lr_decay_env_steps} only applies to algo.lr_schedule=linear, "
                            f"got {a.lr_schedule!r}: set lr_schedule=linear or lr_decay_env_steps=null")
        elif a.lr_decay_env_steps < 1:
            problems.append(f"algo.lr_decay_env_steps must be >= 1 or null, got {a.lr_decay_env_steps}")
    if a.value_clip is not None and a.value_clip <= 0:
        problems.append(f"algo.value_clip must be > 0 or null, got {a.value_clip}")
    if s.max_policy_lag < 0:
        problems.append(f"sampler.max_policy_lag must be >= 0, got {s.max_policy_lag}")
    if problems:  # the divisibility checks below assume positive counts
        return problems

    if s.num_envs_per_worker % s.num_splits:
        problems.append(f"sampler.num_envs_per_worker={s.num_envs_per_worker} does not divide into "
                        f"sampler.num_splits={s.num_splits} equal splits")
        return problems
    slot = samples_per_slot(cfg)
    if a.batch_size < slot:
        problems.append(f"algo.batch_size={a.batch_size} is smaller than one trajectory slot "
                        f"(rollout_len {s.rollout_len} x {envs_per_split(cfg)} envs per split = {slot})")
    elif a.batch_size % slot:
        problems.append(f"algo.batch_size={a.batch_size} must be a multiple of one trajectory slot "
                        f"(rollout_len {s.rollout_len} x {envs_per_split(cfg)} envs per split = {slot})")
    else:
        trajectories = a.batch_size // s.rollout_len
        if a.minibatch_unit == "trajectories" and trajectories % a.num_minibatches:
            problems.append(f"algo.num_minibatches={a.num_minibatches} must divide the {trajectories} "
                            f"trajectories of a batch (algo.minibatch_unit=trajectories)")
        if a.minibatch_unit == "samples" and a.batch_size % a.num_minibatches:
            problems.append(f"algo.num_minibatches={a.num_minibatches} must divide algo.batch_size={a.batch_size} "
                            f"(algo.minibatch_unit=samples)")
    if s.num_inference_workers > s.num_rollout_workers:
        problems.append(f"sampler.num_inference_workers={s.num_inference_workers} exceeds "
                        f"sampler.num_rollout_workers={s.num_rollout_workers}; the extra ones would idle")
    if s.num_traj_buffers > 0 and not problems:
        needed = s.num_rollout_workers * s.num_splits + slots_per_batch(cfg)
        if s.num_traj_buffers < needed:
            problems.append(f"sampler.num_traj_buffers={s.num_traj_buffers} is too few: need at least {needed} "
                            f"(one per split in flight plus one batch)")
    if sysc.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            problems.append("system.device=cuda but torch sees no CUDA device")
    return problems
