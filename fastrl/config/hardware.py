"""What this machine can do, for the settings that say `auto`.

bf16 only pays where the hardware multiplies in bf16: on an EPYC with AVX-512 BF16 the Nature CNN
trains ~1.6x faster than in fp32, but on an AVX2-only EPYC torch emulates it and the same training
step is ~12x slower (980 vs 11,472 us per sample, 1 thread, batch 64;
bench/precision_microbench.py). A preset that hard-wired bf16 crawls on such a machine, hence
`model.precision: auto`; and how the learner should use the second core follows from it
(`system.learner_shards: auto`, `system.learner_threads: auto`): in fp32 two OpenMP threads, in bf16
two shards of one thread each (fastrl/algo/shards.py).

Reads /proc/cpuinfo rather than asking torch, so that resolving a config does not import torch
(the rollout workers are spawned before the runner loads it). The cores counted are those this
run can use (fastrl.host.available_cores: its affinity mask and cgroup CPU quota), not the
machine's: under `taskset -c 0` or `docker --cpus=1` a second learner thread or shard only
contends with the samplers for the one core.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fastrl.config.schema import Config
from fastrl.host import available_cores

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The first CPU's feature flags, or None where /proc/cpuinfo does not list them."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def native_bf16(device: str, flags: set[str] | None = None) -> bool:
    """True where bf16 matmuls and convs run in hardware on `device` ("cpu" or "cuda")."""
    if device == "cuda":
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    flags = cpu_flags() if flags is None else flags
    if flags is not None:
        return any(f in flags for f in BF16_CPU_FLAGS)
    import torch  # no /proc (not Linux): ask torch, which checks CPUID itself

    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(probe and probe())


def has_amx(flags: set[str] | None = None) -> bool:
    """Whether the CPU has AMX's bf16 tiles (`flags`: cpu_flags(), read here when None)."""
    flags = cpu_flags() if flags is None else flags
    return flags is not None and "amx_bf16" in flags


def resolve_precision(precision: str, device: str, flags: set[str] | None = None) -> str:
    """`auto` becomes bf16 where the device has native bf16, else fp32; fp32 and bf16 stay."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device, flags) else "fp32"


def resolve_first_conv(first_conv: str, precision: str, device: str, flags: set[str] | None = None) -> str:
    """`auto` (see ModelConfig.first_conv) for a network that runs in `precision` (resolved): space_to_depth
    where it was measured faster, bf16 on an AMX CPU; strided elsewhere."""
    if first_conv != "auto":
        return first_conv
    return "space_to_depth" if device == "cpu" and precision == "bf16" and has_amx(flags) else "strided"


def with_precision(cfg: Config, precision: str) -> Config:
    """A copy of cfg whose network runs in `precision`."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, precision=precision))


def resolve_learner_shards(learner_shards: int | str, precision: str, device: str, minibatch_unit: str,
                           learner_threads: int | str, cores: int | None = None, flags: set[str] | None = None) -> int:
    """`auto` (see SystemConfig.learner_shards): 2 for a bf16 network on a CPU with 2+ cores whose
    minibatches are single samples, unless learner_threads asks for OpenMP threads, or the CPU has AMX
    and only 2 cores; else 1.

    Why not on 2 AMX cores: there the learner's kernels are fast enough that a Pong run keeps both cores
    busy whichever way the learner runs, so only the CPU an env step costs decides its speed, and the
    second shard costs the learner ~14% more CPU per sample (the threads' meetings, activations handed
    between cores) than it saves in wall time."""
    if learner_shards != "auto":
        return int(learner_shards)
    cores = cores if cores is not None else available_cores()
    shardable = minibatch_unit == "samples" and learner_threads in ("auto", 1)
    if not (device == "cpu" and precision == "bf16" and cores >= 2 and shardable):
        return 1
    return 1 if has_amx(flags) and cores <= 2 else 2


def resolve_learner_threads(learner_threads: int | str, precision: str, device: str,
                            cores: int | None = None, shards: int = 1) -> int:
    """`auto` (see SystemConfig.learner_threads) for a network that runs in `precision` (resolved)."""
    if learner_threads != "auto":
        return int(learner_threads)
    if device != "cpu" or precision == "bf16" or shards > 1:
        return 1
    return max(1, min(2, cores if cores is not None else available_cores()))


def weight_grads_split_blockers(cfg: Config, encoder: str) -> list[str]:
    """Why system.learner_split=weight_grads cannot run with this (precision-resolved) config and
    `encoder` (resolved, or `auto` when the env is not known); empty when it can."""
    blockers = []
    if cfg.system.device != "cpu" or cfg.model.precision != "bf16":
        blockers.append(f"model.precision bf16 on the CPU (got {cfg.model.precision} on {cfg.system.device})")
    if encoder != "nature_cnn":
        blockers.append(f"the Nature CNN encoder (got model.encoder {encoder})")
    if cfg.algo.minibatches_per_weights != 1:
        blockers.append(f"algo.minibatches_per_weights 1 (got {cfg.algo.minibatches_per_weights})")
    if cfg.algo.minibatch_unit != "samples":
        blockers.append(f"algo.minibatch_unit samples (got {cfg.algo.minibatch_unit})")
    return blockers


def resolve_learner_split(cfg: Config, encoder: str, shards: int) -> str:
    """`auto` (see SystemConfig.learner_split): weight_grads where it can run and there are 2+ shards."""
    if cfg.system.learner_split != "auto":
        return cfg.system.learner_split
    return "weight_grads" if shards > 1 and not weight_grads_split_blockers(cfg, encoder) else "rows"


def resolve_auto(cfg: Config, flags: set[str] | None = None, cores: int | None = None,
                 encoder: str | None = None) -> Config:
    """The config with every hardware-dependent `auto` replaced by what this machine runs, so that
    the saved config.json records what actually ran. `encoder`: model.encoder resolved for the env
    (fastrl.config.checks.resolve_encoder), where the caller knows it."""
    cfg = with_precision(cfg, resolve_precision(cfg.model.precision, cfg.system.device, flags))
    first_conv = resolve_first_conv(cfg.model.first_conv, cfg.model.precision, cfg.system.device, flags)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, first_conv=first_conv))
    sysc = cfg.system
    shards = resolve_learner_shards(sysc.learner_shards, cfg.model.precision, sysc.device, cfg.algo.minibatch_unit,
                                    sysc.learner_threads, cores, flags)
    threads = resolve_learner_threads(sysc.learner_threads, cfg.model.precision, sysc.device, cores, shards)
    split = resolve_learner_split(cfg, encoder or cfg.model.encoder, shards)
    return dataclasses.replace(cfg, system=dataclasses.replace(sysc, learner_threads=threads, learner_shards=shards,
                                                               learner_split=split))


def precision_warning(cfg: Config, flags: set[str] | None = None) -> str | None:
    """One line when bf16 was asked for explicitly on hardware that only emulates it."""
    if cfg.model.precision == "bf16" and not native_bf16(cfg.system.device, flags):
        return ("model.precision=bf16 on a device without native bf16 (CPU flags avx512_bf16 or amx_bf16): "
                "torch emulates it, about 12x slower than fp32 on an AVX2 CPU; model.precision=auto picks for you")
    return None
