"""`fastrl bench`: runs the chosen stages one after another (for `--rounds N`, N times over) and assembles
the result document."""

from __future__ import annotations

import platform
import time

import torch

from fastrl.bench.components import bench_infer, bench_learn
from fastrl.bench.env_stage import bench_env
from fastrl.host import available_cores
from fastrl.bench.report import SCHEMA_VERSION, STAGES, Progress, summarize
from fastrl.bench.rounds import combine_rounds, stage_rate
from fastrl.bench.system import bench_system
from fastrl.config.checks import envs_per_split
from fastrl.config.schema import Config
from fastrl.envs import EnvSpec


def counts(cfg: Config) -> dict:
    """The settings that decide throughput, as measured."""
    s = cfg.sampler
    return {"num_rollout_workers": s.num_rollout_workers, "num_envs_per_worker": s.num_envs_per_worker,
            "num_splits": s.num_splits, "envs_per_split": envs_per_split(cfg), "env_threads": s.env_threads,
            "env_pool": s.env_pool,
            "rollout_len": s.rollout_len, "num_inference_workers": s.num_inference_workers,
            "batch_size": cfg.algo.batch_size, "epochs": cfg.algo.num_epochs,
            "minibatches": cfg.algo.num_minibatches, "learner_threads": cfg.system.learner_threads,
            "learner_shards": cfg.system.learner_shards, "learner_split": cfg.system.learner_split,
            "inference_threads": cfg.system.inference_threads}


def run_bench(cfg: Config, spec: EnvSpec, config_path: str | None, overrides: list[str], seconds: float,
              stages: list[str], progress: Progress, rounds: int = 1) -> dict:
    """Run the chosen stages in order, `rounds` times over (fastrl.bench.rounds says how they combine)."""
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    header = {"schema_version": SCHEMA_VERSION, "config": config_path, "overrides": overrides,
              "env_id": cfg.env.id, "backend": spec.backend, "frames_per_env_step": spec.frames_per_env_step,
              "cores": available_cores(), "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
              "seconds_per_stage": seconds, "counts": counts(cfg)}
    ordered = [s for s in STAGES if s in stages]
    done = []
    for round_index in range(rounds):
        result = dict(header, stages={})
        for i, stage in enumerate(ordered, 1):
            label = stage if rounds == 1 else f"{stage} (round {round_index + 1}/{rounds})"
            progress.begin(round_index * len(ordered) + i, rounds * len(ordered), label)
            started = time.monotonic()
            out, text = _run_stage(stage, cfg, spec, seconds, progress)
            out["stage_wall_s"] = round(time.monotonic() - started, 1)
            result["stages"][stage] = out
            progress.end(text)
        summarize(result)
        done.append(result)
    return combine_rounds(done)


def _run_stage(stage: str, cfg: Config, spec: EnvSpec, seconds: float, progress: Progress) -> tuple[dict, str]:
    if stage == "env":
        out = bench_env(cfg, spec, seconds, progress).as_dict("env_steps")
    elif stage in ("infer", "learn"):
        bench = bench_infer if stage == "infer" else bench_learn
        out = bench(cfg, spec, seconds, progress).as_dict("samples")
    else:
        out = bench_system(cfg, spec, seconds, progress, discard=(stage == "sample"))
    unit = "samples/s" if stage in ("infer", "learn") else "env steps/s"
    return out, f"{stage_rate(stage, out):,.0f} {unit}"
