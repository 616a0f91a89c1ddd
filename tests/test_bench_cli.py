"""`fastrl bench` and `fastrl tune` end to end on CartPole, a few seconds per stage: the plumbing,
the JSON document and the files the tuner writes. Speeds are never asserted."""

import json

import pytest

from fastrl.bench.measure import headline_rate
from fastrl.config import load_config
from helpers import ROOT, RunProcess, modules_load_torch

pytestmark = pytest.mark.integration
CARTPOLE = str(ROOT / "configs/cartpole.yaml")


def test_bench_runs_every_stage_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    run = RunProcess("--config", CARTPOLE, "--seconds", "2", "--json", str(out), command="bench")
    assert run.wait(240) == 0, run.output
    result = json.loads(out.read_text())
    assert set(result["stages"]) == {"env", "infer", "learn", "sample", "train"}
    stages = result["stages"]
    for name, key in (("env", "env_steps"), ("infer", "samples"), ("learn", "samples")):
        st = stages[name]
        assert st["measured_s"] >= 2.0 and st[f"{key}_per_s"]["windows"] >= 1
        assert st[f"{key}_per_s"]["min"] <= st[f"{key}_per_s"]["median"] <= st[f"{key}_per_s"]["max"]
        assert st[f"{key}_per_core_s"] > 0
    for name in ("sample", "train"):
        st = stages[name]
        # the whole-measurement rate: in 2 s on a loaded box most 1 s windows can see no slot or batch finish
        assert st["measured_s"] >= 2.0 and headline_rate(st["env_steps_per_s"]) > 0
        # the CartPole preset acts in its rollout workers: no inference process
        assert {p["name"] for p in st["processes"]} >= {"fastrl-learner", "fastrl-rollout-0", "fastrl-rollout-1"}
        assert 0 <= st["learner_busy_fraction"] <= 1 and 0 <= st["rollout_idle_fraction"] <= 1
        assert st["peak_total_pss_mib"] > 0 and st["time_to_first_sample_s"] > 0
        assert st["time_to_first_batch_s"] is not None and st["time_to_first_batch_s"] > 0
        assert st["bottleneck"]
    assert stages["train"]["policy_lag"]["p50"] is not None
    assert stages["sample"]["learner_trains"] is False
    # the discarding learner waits nearly the whole sample stage: the cores' accounting over its waits is read
    assert 0 <= stages["sample"]["learner_wait_cores_idle_fraction"] <= 1
    bound = result["bound"]
    expected = result["cores"] / (1 / stages["env"]["env_steps_per_core_s"] + 1 / stages["infer"]["samples_per_core_s"]
                                  + result["counts"]["epochs"] / stages["learn"]["samples_per_core_s"])
    assert bound["train_env_steps_per_s"] == pytest.approx(expected, rel=1e-3)
    assert result["efficiency"]["train"] == pytest.approx(
        headline_rate(stages["train"]["env_steps_per_s"]) / bound["train_env_steps_per_s"], abs=2e-3)
    assert "machine bound (train)" in run.output and "bottleneck:" in run.output
    assert run.leftover_children() == [] and run.leftover_segments() == []


def test_the_env_stage_imports_no_torch():
    """Each round of the env stage spawns a process per rollout worker, which imports its module to run the
    envs: with torch among its imports each paid ~2 s before making them (the rollout workers import none)."""
    assert not modules_load_torch("fastrl.bench.env_stage")


def test_bench_single_stage(tmp_path):
    out = tmp_path / "bench.json"
    run = RunProcess("--config", CARTPOLE, "--seconds", "1", "--stage", "infer", "--json", str(out), command="bench")
    assert run.wait(60) == 0, run.output
    result = json.loads(out.read_text())
    assert list(result["stages"]) == ["infer"] and result["bound"] == {"cores": result["cores"],
                                                                       "formula": result["bound"]["formula"]}


def test_bench_rounds_run_the_stages_in_turn(tmp_path):
    out = tmp_path / "bench.json"
    run = RunProcess("--config", CARTPOLE, "--seconds", "1", "--stage", "env", "--stage", "infer",
                     "--rounds", "3", "--json", str(out), command="bench")
    assert run.wait(90) == 0, run.output
    result = json.loads(out.read_text())
    assert len(result["rounds"]) == 3 and set(result["stage_rounds"]) == {"env", "infer"}
    bounds = sorted(r["bound"]["sample_env_steps_per_s"] for r in result["rounds"])
    assert result["bound"]["sample_env_steps_per_s"] == pytest.approx(bounds[1], abs=0.1)
    env_rates = [r["rates"]["env"] for r in result["rounds"]]
    assert min(env_rates) > 0  # a 1 s stage is one window, not none (rounds of 0 made the checks below trivial)
    assert result["stages"]["env"]["env_steps_per_s"]["median"] == pytest.approx(sorted(env_rates)[1], abs=0.1)
    assert "(round 3/3)" in run.output and "  round 3: env " in run.output


def test_tune_writes_overlay_table_and_chart(tmp_path):
    out = tmp_path / "tune"
    # The tuner keeps 3 trials' time in hand before it starts another. On CI's cold first start one
    # 2 s trial took over 50/3 s, so a 50 s budget ended after the preset alone (stop 13's CI). The
    # budget stays as a guard; --max-trials ends the search (a whole 80 s budget made this the suite's
    # longest test, at 81 s; 3 trials of 2 s, each confirmed twice, still took 42 s).
    run = RunProcess("--config", CARTPOLE, "--set", "run.seed=7", "--budget-s", "80", "--trial-s", "1",
                     "--max-trials", "2", "--out", str(out), command="tune")
    assert run.wait(240) == 0, run.output
    assert "rank" in run.output and "best:" in run.output
    results = json.loads((out / "tune_results.json").read_text())
    assert len(results["trials"]) == 2 and results["trials"][0]["changes"] == {}
    tunable = ("sampler.", "system.learner_threads", "system.inference_threads", "algo.batch_size")
    for trial in results["trials"]:
        assert all(k.startswith(tunable) for k in trial["changes"]), trial  # never lr, clip, gamma...
    cfg = load_config([CARTPOLE, str(out / "best_overlay.yaml")])  # the overlay layers on the preset
    for key, value in results["best"]["changes"].items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == value
    assert cfg.algo.lr == load_config(CARTPOLE).algo.lr
    # what the trials ran with beyond the preset: before, the overlay dropped the search's --set (env.id=...)
    assert cfg.run.seed == 7
    assert (out / "tune_chart.png").read_bytes()[:4] == b"\x89PNG"
    assert run.leftover_children() == [] and run.leftover_segments() == []


def test_tune_refuses_a_search_of_no_trials():
    run = RunProcess("--config", CARTPOLE, "--max-trials", "0", command="tune")
    assert run.wait(60) == 2, run.output
    assert "--max-trials must be >= 1" in run.output


def test_learn_stage_with_two_threads_also_measures_one_for_the_bound():
    import torch

    from fastrl.bench.components import bench_learn
    from fastrl.envs import resolve_env

    cfg = load_config(CARTPOLE, ["system.learner_threads=2"])
    result = bench_learn(cfg, resolve_env(cfg.env), 1.0, lambda fraction, text: None).as_dict("samples")
    assert torch.get_num_threads() == 2  # the configured threads are back for whatever runs next
    two, one = result["samples_per_core_s_at_configured_threads"], result["samples_per_core_s_1_thread"]
    assert two > 0 and one > 0
    assert result["samples_per_core_s"] == pytest.approx(max(two, one), abs=0.1)
    assert result["torch_threads"] == 2


@pytest.mark.parametrize("inference_workers", [0, 1], ids=["kernel_in_rollout", "inference_worker_draw"])
def test_infer_stage_times_the_native_paths_for_several_choices(inference_workers):
    """The infer stage acts as the workers would for two choices of 3 and 4 options: in fastrl_ext's kernel in
    a rollout worker, or a torch forward and fastrl_ext's draw in an inference worker ([batch, 2] cells)."""
    from fastrl.bench.components import bench_infer
    from helpers import TWO_CHOICES

    cfg = load_config(CARTPOLE, [f"sampler.num_inference_workers={inference_workers}"])
    result = bench_infer(cfg, TWO_CHOICES, 0.5, lambda fraction, text: None).as_dict("samples")
    if inference_workers == 0:
        assert result["backend"] == "numpy" and result["native_acting"]
    else:
        assert result["backend"] == "torch" and result["native_draw"]
    assert result["samples_per_core_s"] > 0
