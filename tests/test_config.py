"""Presets load; every bad input is rejected before any process starts, with exit code 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from fastrl.cli import main
from fastrl.config import ConfigError, check_config, config_from_dict, config_to_dict, load_config

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_loads_and_checks(preset):
    cfg = load_config(preset)
    assert check_config(cfg) == []
    assert config_from_dict(config_to_dict(cfg)) == cfg  # config.json round-trips


def test_presets_include_the_documented_ones():
    expected = {"cartpole.yaml", "atari_pong.yaml", "atari_breakout.yaml", "mujoco_halfcheetah.yaml"}
    assert expected <= {p.name for p in PRESETS}


def test_overrides_are_typed():
    cfg = load_config(ROOT / "configs/cartpole.yaml", ["algo.lr=1e-4", "run.stop_at_mean_return=null",
                                                       "model.hidden_sizes=[32, 32]", "run.train_for_env_steps=1e6"])
    assert cfg.algo.lr == 1e-4 and cfg.run.stop_at_mean_return is None
    assert cfg.model.hidden_sizes == [32, 32] and cfg.run.train_for_env_steps == 1_000_000


def test_all_problems_reported_together():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.lrr=1", "algo.batch_size=big", "sampler.num_splits=true", "nosection.x=1"])
    text = str(e.value)
    assert len(e.value.problems) == 4
    assert "did you mean algo.lr" in text and "algo.batch_size" in text and "nosection" in text


def run_cli(capsys, *args, tmp_path):
    code = main(["train", "--runs-dir", str(tmp_path), *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args,expected", [
    (["--set", "algo.unknown_key=1"], "unknown key 'algo.unknown_key'"),
    (["--set", "algo.lr=fast"], "algo.lr: expected a float"),
    (["--set", "sampler.num_rollout_workers=1.5"], "expected an int"),
    (["--set", "sampler.num_envs_per_worker=30", "--set", "sampler.num_splits=4"], "does not divide"),
    (["--set", "algo.batch_size=64"], "smaller than one trajectory slot"),
    (["--set", "algo.batch_size=1536"], "must be a multiple of one trajectory slot"),
    (["--set", "sampler.num_rollout_workers=0"], "must be >= 1"),
    (["--set", "run.train_for_seconds=-5"], "run.train_for_seconds must be > 0"),
    (["--set", "system.rollout_nice=-5"], "system.rollout_nice must be in [0, 19]"),
    (["--set", "system.inference_nice=20"], "system.inference_nice must be in [0, 19]"),
    (["--set", "system.sampler_nice=5"], "split into system.rollout_nice and system.inference_nice"),
    (["--set", "algo.minibatch_unit=samples", "--set", "algo.num_minibatches=3"], "must divide algo.batch_size"),
    (["--set", "algo.minibatch_unit=steps"], "algo.minibatch_unit"),
    (["--set", "algo.vtrace_values=behaviour"], "algo.vtrace_values=behaviour replaces the batch's no-grad forward"),
    (["--set", "algo.vtrace_values=acting"], "algo.vtrace_values"),
    (["--set", "algo.minibatch_unit=samples", "--set", "algo.vtrace_values=behaviour", "--set", "algo.rho_bar=0.5"],
     "algo.vtrace_values=behaviour takes them as 1"),
    (["--set", "env.id=CartPol-v1"], "close matches: CartPole-v1"),
    (["--set", "env.id=NoSuchGame-v9"], "unknown env id 'NoSuchGame-v9'"),
    (["--set", "env.kwargs={no_such_arg: 1}"], "could not make env"),
    (["--set", "env.id=no_such_module:Env-v0"], "cannot import module 'no_such_module'"),
    (["--set", "model.encoder=nature_cnn"], "model.encoder=nature_cnn needs image observations of at least 36x36"),
    (["--set", "env.atari_frames=fastrl"], "env.atari_frames=fastrl: CartPole-v1 is not an envpool Atari env"),
])
def test_bad_input_exits_2_naming_the_problem(capsys, tmp_path, args, expected):
    code, err = run_cli(capsys, "--config", str(ROOT / "configs/cartpole.yaml"), *args, tmp_path=tmp_path)
    assert code == 2
    assert expected in err
    assert not any(tmp_path.iterdir())  # nothing written, nothing started


def test_unknown_key_in_yaml_file(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  lr: 0.1\n  epochs: 3\nsampler:\n  num_splits: two\n")
    code, err = run_cli(capsys, "--config", str(bad), tmp_path=tmp_path / "runs")
    assert code == 2 and "algo.epochs" in err and "sampler.num_splits" in err


def test_missing_config_file(capsys, tmp_path):
    code, err = run_cli(capsys, "--config", str(tmp_path / "nope.yaml"), tmp_path=tmp_path)
    assert code == 2 and "not found" in err


def test_existing_run_dir_is_refused(capsys, tmp_path):
    (tmp_path / "taken").mkdir()
    code, err = run_cli(capsys, "--config", str(ROOT / "configs/cartpole.yaml"), "--name", "taken", tmp_path=tmp_path)
    assert code == 2 and "already exists" in err


def test_exit_code_of_the_real_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fastrl", "train", "--runs-dir", str(tmp_path), "--set", "algo.nope=1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown key 'algo.nope'" in proc.stderr


def test_a_run_saved_before_sampler_nice_was_split_resumes_with_its_old_meaning():
    saved = config_to_dict(load_config(ROOT / "configs/atari_pong.yaml"))
    del saved["system"]["rollout_nice"], saved["system"]["inference_nice"]
    saved["system"]["sampler_nice"] = 10  # what config.json held before the split
    cfg = config_from_dict(saved)
    assert (cfg.system.rollout_nice, cfg.system.inference_nice) == (10, 10)
    assert "sampler_nice" in saved["system"]  # the caller's mapping is left as it was
    with pytest.raises(ConfigError, match="split into system.rollout_nice"):
        load_config(overrides=["system.sampler_nice=3"])


def test_a_run_saved_with_rollout_sched_batch_resumes_under_the_policy_it_meant():
    for old, policy in ((True, "batch"), (False, "normal")):
        saved = config_to_dict(load_config(ROOT / "configs/cartpole.yaml"))
        del saved["system"]["rollout_sched_policy"]
        saved["system"]["rollout_sched_batch"] = old  # what config.json held before the policy setting
        assert config_from_dict(saved).system.rollout_sched_policy == policy
    with pytest.raises(ConfigError, match="rollout_sched_policy replaced it"):
        load_config(overrides=["system.rollout_sched_batch=true"])
    with pytest.raises(ConfigError, match="rollout_sched_policy"):
        load_config(overrides=["system.rollout_sched_policy=fifo"])  # only the policies an unprivileged user may take


def test_native_paths_without_a_built_fastrl_ext_are_a_config_error(monkeypatch):
    """No compiler at install time: the run must say which switches fall back, not crash in a worker."""
    import fastrl_ext

    monkeypatch.setattr(fastrl_ext, "_rings", None)
    monkeypatch.setattr(fastrl_ext, "_vtrace", None)
    monkeypatch.setattr(fastrl_ext, "_appo_loss", None)
    monkeypatch.setattr(fastrl_ext, "BUILD_ERROR", "no module named _vtrace")
    cfg = load_config([str(Path(__file__).resolve().parent.parent / "configs/cartpole.yaml")])
    problems = " ".join(check_config(cfg))
    for switch in ("system.native_rings", "algo.native_vtrace", "algo.native_loss"):
        assert f"{switch}=false" in problems
    cfg.system.native_rings, cfg.algo.native_vtrace, cfg.algo.native_loss = False, False, False
    assert check_config(cfg) == []


def test_pinning_always_with_inference_workers_is_a_config_error():
    """A pinned worker waiting for an inference process's actions would idle its core; auto just leaves it alone."""
    preset = str(Path(__file__).resolve().parent.parent / "configs/cartpole.yaml")
    cfg = load_config([preset], ["system.rollout_pinning=always", "sampler.num_inference_workers=1"])
    assert any("system.rollout_pinning=always" in p and "num_inference_workers=0" in p for p in check_config(cfg))
    for ok in (["system.rollout_pinning=auto", "sampler.num_inference_workers=1"], ["system.rollout_pinning=always"]):
        assert check_config(load_config([preset], ok)) == []
