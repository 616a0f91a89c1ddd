"""Serial debug mode: every component in one process through the same classes; a fixed seed
gives bit-identical losses."""

import json

import pytest

from helpers import ROOT, RunProcess

pytestmark = pytest.mark.integration


def _start(tmp_path, name, *overrides, preset="cartpole") -> RunProcess:
    return RunProcess("--config", str(ROOT / f"configs/{preset}.yaml"), "--set", "system.serial=true",
                      "--set", "run.train_for_env_steps=15000", "--set", "run.stop_at_mean_return=null", *overrides,
                      runs_dir=tmp_path, name=name)


def _losses(run: RunProcess) -> list[tuple]:
    assert run.wait(120) == 0, run.output
    assert "serial debug mode" in run.output and run.child_names() == set()
    rows = [json.loads(line) for line in (run.run_dir / "learner.jsonl").read_text().splitlines()]
    return [(r["train_steps"], r["policy_version"], r["loss"], r["policy_loss"], r["value_loss"], r["entropy"])
            for r in rows]


# Each test's two runs go side by side, one per core: a serial run is one process whose losses do not
# depend on timing (what these tests check), and one after the other they cost ~8 s a test.
@pytest.mark.parametrize("variant", ["inference_worker", "in_rollout", "in_rollout_torch", "learner_shards",
                                     "shared_envpool"])
def test_serial_mode_is_bit_reproducible(tmp_path, variant):
    overrides = ("--set", f"sampler.num_inference_workers={1 if variant == 'inference_worker' else 0}")
    if variant == "in_rollout_torch":
        overrides += ("--set", "sampler.acting_backend=torch")
    if variant == "shared_envpool":  # one envpool per worker, its two groups collected through pump each step
        overrides = ("--set", "sampler.num_inference_workers=1", "--set", "sampler.num_splits=2",
                     "--set", "sampler.env_pool=per_worker")
    if variant == "learner_shards":  # the pieces' gradients are summed in a fixed order, whichever thread ends first
        overrides += ("--set", "system.learner_shards=2", "--set", "algo.minibatch_unit=samples",
                      "--set", "algo.num_minibatches=4")
    runs = _start(tmp_path, "a", *overrides), _start(tmp_path, "b", *overrides)
    a, b = (_losses(run) for run in runs)
    assert len(a) >= 10 and a == b  # exact float equality, every batch
    runs[0].assert_stopped_at_env_step_target()  # one process: no hand-overs race


@pytest.mark.parametrize("preset, overrides", [
    ("cartpole", ()),
    ("cartpole", ("--set", "sampler.num_splits=2")),  # double buffering
    # the native loop calls the shared envpool's recv itself
    ("cartpole", ("--set", "sampler.num_splits=2", "--set", "sampler.env_pool=per_worker")),
    ("mujoco_halfcheetah", ("--set", "run.train_for_env_steps=30000")),  # clipped float64 actions, scaled rewards
    # a Dict observation flattened by the split, its action mask applied by the kernel the loop acts with
    ("cartpole", ("--set", "env.id=Knapsack-v1")),
    # several discrete choices (two agents' moves), [T, N, 2] actions and two uniforms per env step, masked
    ("cartpole", ("--set", "env.id=LevelBasedForaging-v0")),
    # one categorical over a row and a column's 100 cells, each action unravelled into the two on its way
    ("cartpole", ("--set", "env.id=Minesweeper-v0")),
], ids=["cartpole", "cartpole_2_splits", "cartpole_shared_envpool", "halfcheetah", "knapsack_masked",
        "foraging_choices", "minesweeper_joint"])
def test_native_rollout_steps_train_bit_for_bit_as_the_python_steps(tmp_path, preset, overrides):
    """fastrl_ext._rollout runs the steps between slot boundaries; pump every step (its reference)."""
    runs = (_start(tmp_path, "native", *overrides, preset=preset),
            _start(tmp_path, "python", *overrides, "--set", "system.native_rollout_loop=false", preset=preset))
    native, python = (_losses(run) for run in runs)
    assert len(native) >= 10 and native == python
