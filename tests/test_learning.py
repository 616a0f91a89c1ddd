"""The learning test: the real system must solve CartPole-v1 within 500k env steps.

Checked by hand when this test was written, each breakage making it fail at 500k env steps:
a flipped policy-loss sign (mean return 9), a flipped sign of V-trace's rho (9), V-trace
bootstrapping through terminations (185). Subtler V-trace errors are caught by
tests/test_vtrace.py against the paper-notation reference."""

import pytest

from helpers import ROOT, RunProcess

pytestmark = pytest.mark.learning


def test_cartpole_reaches_475_within_500k_env_steps(tmp_path):
    run = RunProcess("--config", str(ROOT / "configs/cartpole.yaml"), "--set", "run.train_for_env_steps=500000",
                     "--set", "run.stop_at_mean_return=475", "--set", "run.seed=1", runs_dir=tmp_path)
    assert run.wait(400) == 0, run.output
    summary = run.summary()
    assert summary["episodes_in_mean"] == 100
    assert summary["final_mean_return"] >= 475, run.output
    assert summary["env_steps"] <= 500000 + 20000, summary  # stopped on the return, not on the budget
