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


def _attempt(runs_dir) -> tuple[bool, str]:
    run = RunProcess("--config", str(ROOT / "configs/cartpole.yaml"), "--set", "run.train_for_env_steps=500000",
                     "--set", "run.stop_at_mean_return=475", "--set", "run.seed=1",
                     *FOUR_EPOCHS, runs_dir=runs_dir)
    assert run.wait(400) == 0, run.output
    summary = run.summary()
    assert summary["episodes_in_mean"] == 100
    solved = (summary["stop_reason"].startswith("mean return of the last 100 episodes reached")
              # the value the stop saw: episodes reported while the workers shut down may still move the final mean
              and summary["mean_return_at_stop"] >= 475
              and summary["env_steps"] <= 500000 + 20000)  # stopped on the return, not on the budget
    return solved, run.output


def test_cartpole_reaches_475_within_500k_env_steps(tmp_path):
    """One retry: the processes' timing makes every run different even at one seed, and on 2026-12-03
    2 of 17 runs of this recipe were still under 475 at 500k (one at 351), the others needing 160k-265k.
    The breakages above fail every run, so they fail both attempts."""
    outputs = []
    for attempt in range(2):
        solved, output = _attempt(tmp_path / f"attempt{attempt}")
        if solved:
            return
        outputs.append(output)
    pytest.fail("CartPole did not reach 475 within 500k env steps in 2 runs:\n" + "\n---\n".join(outputs))
