"""model.precision=auto: bf16 only where the CPU multiplies in bf16, and the choice is what the
run records; an explicit bf16 on a CPU that emulates it is warned about, not silently slow.
system.learner_shards=auto and system.learner_threads=auto follow the resolved precision (two shards
of one thread each in bf16, two OpenMP threads in fp32)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastrl.config import load_config
from fastrl.config.checks import check_config
from fastrl.config.loader import ConfigError

from fastrl.config.hardware import (cpu_flags, precision_warning, resolve_auto, resolve_first_conv,
                                    resolve_learner_shards, resolve_learner_threads, resolve_precision)

ROOT = Path(__file__).resolve().parents[1]
AVX2 = {"fpu", "sse4_2", "avx", "avx2", "fma"}
ZEN4 = AVX2 | {"avx512f", "avx512_bf16"}
SAPPHIRE_RAPIDS = AVX2 | {"avx512f", "amx_tile", "amx_bf16"}


def test_auto_picks_bf16_only_where_the_cpu_has_it():
    assert resolve_precision("auto", "cpu", AVX2) == "fp32"
    assert resolve_precision("auto", "cpu", ZEN4) == "bf16"
    assert resolve_precision("auto", "cpu", SAPPHIRE_RAPIDS) == "bf16"
    assert resolve_precision("fp32", "cpu", ZEN4) == "fp32"  # an explicit choice stays
    assert resolve_precision("bf16", "cpu", AVX2) == "bf16"


def test_auto_first_conv_is_space_to_depth_only_in_bf16_on_amx():
    assert resolve_first_conv("auto", "bf16", "cpu", SAPPHIRE_RAPIDS) == "space_to_depth"
    assert resolve_first_conv("auto", "fp32", "cpu", SAPPHIRE_RAPIDS) == "strided"
    assert resolve_first_conv("auto", "bf16", "cpu", ZEN4) == "strided"  # not measured there
    assert resolve_first_conv("auto", "bf16", "cuda", SAPPHIRE_RAPIDS) == "strided"
    assert resolve_first_conv("auto", "bf16", "cpu", set()) == "strided"
    assert resolve_first_conv("space_to_depth", "fp32", "cpu", AVX2) == "space_to_depth"  # explicit stays
    pong = load_config(str(ROOT / "configs" / "atari_pong.yaml"))
    assert pong.model.first_conv == "auto"
    assert resolve_auto(pong, SAPPHIRE_RAPIDS, cores=2).model.first_conv == "space_to_depth"
    assert resolve_auto(pong, ZEN4, cores=2).model.first_conv == "strided"


def test_the_atari_presets_resolve_per_machine_and_keep_everything_else():
    for preset in ("atari_pong.yaml", "atari_breakout.yaml"):
        cfg = load_config(str(ROOT / "configs" / preset))
        assert cfg.model.precision == "auto"
        assert cfg.system.learner_threads == "auto"
        on_avx2, on_zen4 = resolve_auto(cfg, AVX2, cores=2), resolve_auto(cfg, ZEN4, cores=2)
        assert on_avx2.model.precision == "fp32" and on_zen4.model.precision == "bf16"
        assert on_avx2.system.learner_threads == 2 and on_zen4.system.learner_threads == 1
        assert on_avx2.system.rollout_nice == cfg.system.rollout_nice
        assert on_avx2.algo == cfg.algo and on_avx2.model.encoder == cfg.model.encoder
    pong = load_config(str(ROOT / "configs" / "atari_pong.yaml"))
    assert pong.system.learner_shards == "auto"  # two shards of one thread in bf16, one in fp32
    assert resolve_auto(pong, ZEN4, cores=2).system.learner_shards == 2
    assert resolve_auto(pong, AVX2, cores=2).system.learner_shards == 1
    assert check_config(resolve_auto(pong, ZEN4, cores=2)) == []


def test_explicit_bf16_without_native_support_is_warned_about():
    bf16 = load_config(None, ["model.precision=bf16"])
    assert "12x slower" in precision_warning(bf16, AVX2)
    assert precision_warning(bf16, ZEN4) is None
    assert precision_warning(load_config(None, ["model.precision=auto"]), AVX2) is None


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") is None


def test_auto_learner_threads():
    assert resolve_learner_threads("auto", "fp32", "cpu", cores=2) == 2
    assert resolve_learner_threads("auto", "fp32", "cpu", cores=1) == 1
    assert resolve_learner_threads("auto", "fp32", "cpu", cores=64) == 2
    assert resolve_learner_threads("auto", "bf16", "cpu", cores=2) == 1
    assert resolve_learner_threads("auto", "fp32", "cuda", cores=2) == 1
    assert resolve_learner_threads(3, "bf16", "cpu", cores=2) == 3  # an explicit choice stays


def test_auto_learner_shards():
    assert resolve_learner_shards("auto", "bf16", "cpu", "samples", "auto", cores=2, flags=ZEN4) == 2
    assert resolve_learner_shards("auto", "bf16", "cpu", "samples", 1, cores=2, flags=ZEN4) == 2
    assert resolve_learner_shards("auto", "fp32", "cpu", "samples", "auto", cores=2, flags=ZEN4) == 1  # OpenMP's pair
    assert resolve_learner_shards("auto", "bf16", "cpu", "samples", "auto", cores=1, flags=ZEN4) == 1
    assert resolve_learner_shards("auto", "bf16", "cuda", "samples", "auto", cores=2, flags=ZEN4) == 1
    assert resolve_learner_shards("auto", "bf16", "cpu", "trajectories", "auto", cores=2, flags=ZEN4) == 1  # cannot cut
    assert resolve_learner_shards("auto", "bf16", "cpu", "samples", 2, cores=2, flags=ZEN4) == 1  # the user asked for OpenMP
    assert resolve_learner_shards(3, "fp32", "cpu", "trajectories", 2, cores=2, flags=ZEN4) == 3  # an explicit choice stays
    # on 2 AMX cores one shard: the run is CPU-bound as a whole and the second shard costs CPU (see there)
    assert resolve_learner_shards("auto", "bf16", "cpu", "samples", "auto", cores=2, flags=SAPPHIRE_RAPIDS) == 1
    assert resolve_learner_shards("auto", "bf16", "cpu", "samples", "auto", cores=4, flags=SAPPHIRE_RAPIDS) == 2
    assert resolve_learner_shards(2, "bf16", "cpu", "samples", "auto", cores=2, flags=SAPPHIRE_RAPIDS) == 2
    assert resolve_auto(load_config(None, ["model.precision=bf16", "system.learner_shards=auto"]), SAPPHIRE_RAPIDS,
                        cores=2).system.learner_shards == 1
    # whatever auto resolves to passes the checks that an explicit value must
    for overrides in ([], ["algo.minibatch_unit=trajectories"], ["system.learner_threads=2"]):
        cfg = load_config(None, ["model.precision=bf16", "system.learner_shards=auto", *overrides])
        assert check_config(cfg) == [] and check_config(resolve_auto(cfg, ZEN4, cores=2)) == []
    with pytest.raises(ConfigError, match="learner_shards"):
        load_config(None, ["system.learner_shards=many"])


def test_learner_threads_accepts_auto_or_a_positive_int():
    assert load_config(None, ["system.learner_threads=auto"]).system.learner_threads == "auto"
    assert check_config(load_config(None, ["system.learner_threads=auto"])) == []
    assert any("learner_threads must be >= 1" in p for p in check_config(load_config(None, ["system.learner_threads=0"])))
    with pytest.raises(ConfigError, match="learner_threads"):
        load_config(None, ["system.learner_threads=many"])
    assert resolve_learner_threads("auto", "fp32", "cpu", cores=2, shards=2) == 1  # each shard has its one


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs in this process's affinity mask")
def test_auto_counts_the_cores_the_run_may_use_not_the_machines():
    """A run pinned to one CPU (taskset -c 0) gets one learner thread and one shard, though the machine
    has two: a second would only contend with the samplers for that core."""
    probe = ("import os, sys; from fastrl.config import load_config; from fastrl.config.hardware import resolve_auto; "
             "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}) if sys.argv[1] == 'pinned' else None; "
             "zen4 = {'avx2', 'avx512f', 'avx512_bf16'}; avx2 = {'avx2'}; "
             "pong = load_config('configs/atari_pong.yaml', []); "
             "print(resolve_auto(pong, zen4).system.learner_shards, resolve_auto(pong, avx2).system.learner_threads)")
    runs = {how: subprocess.run([sys.executable, "-c", probe, how], cwd=ROOT, capture_output=True, text=True,
                                timeout=60) for how in ("pinned", "free")}
    assert all(r.returncode == 0 for r in runs.values()), {h: r.stderr[-2000:] for h, r in runs.items()}
    assert runs["pinned"].stdout.split() == ["1", "1"]
    assert runs["free"].stdout.split() == ["2", "2"]
