"""The learning test: the real system must solve CartPole-v1 within 500k env steps.

Checked by hand when this test was written, each breakage making it fail at 500k env steps:
a flipped policy-loss sign (mean return 9), a flipped sign of V-trace's rho (9), V-trace
bootstrapping through terminations (185). Subtler V-trace errors are caught by
tests/test_vtrace.py against the paper-notation reference.

It trains with the 4-epoch recipe those checks were made with (lr 1e-3, default slots), not the
preset's 1-epoch one: seed 1 of the preset, 8 runs, needed 217k-657k env steps (one over 500k),
where the 4-epoch recipe needed 174k-249k over seeds 1-10. Everything else (processes, envs, buffers) is the preset's."""

import pytest

from helpers import ROOT, RunProcess

pytestmark = pytest.mark.learning
FOUR_EPOCHS = ("--set", "algo.num_epochs=4", "--set", "algo.lr=0.001", "--set", "sampler.num_traj_buffers=0")


def test_cartpole_reaches_475_within_500k_env_steps(tmp_path):
    run = RunProcess("--config", str(ROOT / "configs/cartpole.yaml"), "--set", "run.train_for_env_steps=500000",
                     "--set", "run.stop_at_mean_return=475", "--set", "run.seed=1",
                     *FOUR_EPOCHS, runs_dir=tmp_path)
    assert run.wait(400) == 0, run.output
    summary = run.summary()
    assert summary["episodes_in_mean"] == 100
    assert summary["stop_reason"].startswith("mean return of the last 100 episodes reached"), run.output
    # the value the stop saw: episodes reported while the workers shut down may still move the final mean
    assert summary["mean_return_at_stop"] >= 475, run.output
    assert summary["env_steps"] <= 500000 + 20000, summary  # stopped on the return, not on the budget
