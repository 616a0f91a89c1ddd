"""How a run decides it is finished, and how its summary line reports the return it stopped on."""

from pathlib import Path

from fastrl.config import load_config
from fastrl.runner.run_end import finished_reason, format_summary
from fastrl.runner.stats import EPISODE_WINDOW, RunStats


def _stats(scores) -> RunStats:
    stats = RunStats(frames_per_env_step=1, start_env_steps=0)
    stats.on_report({"kind": "episodes", "scores": list(scores), "lengths": [10] * len(scores)})
    stats.on_env_steps(1000)
    return stats


def test_stops_on_mean_return_only_over_a_full_window():
    cfg = load_config(None, ["run.stop_at_mean_return=475", "run.train_for_env_steps=10000"])
    assert finished_reason(cfg, _stats([500.0] * (EPISODE_WINDOW - 1))) is None  # 99 episodes: too few to judge
    reason = finished_reason(cfg, _stats([500.0] * EPISODE_WINDOW))
    assert "reached 475" in reason and "before this resume" not in reason  # games of this run, not restored ones
    assert finished_reason(cfg, _stats([474.0] * EPISODE_WINDOW)) is None


def test_budget_ends_the_run_before_the_return_is_reached():
    cfg = load_config(None, ["run.stop_at_mean_return=475", "run.train_for_env_steps=1000"])
    assert finished_reason(cfg, _stats([9.0] * EPISODE_WINDOW)) == "reached train_for_env_steps=1,000"


def test_summary_line_shows_the_return_that_stopped_the_run_when_late_episodes_moved_it():
    stats = _stats([480.0] * EPISODE_WINDOW)
    at_stop = stats.mean_score
    stats.on_report({"kind": "episodes", "scores": [20.0] * 10, "lengths": [10] * 10})  # reported during shutdown
    summary = dict(stats.summary(), mean_return_at_stop=at_stop)
    assert summary["final_mean_return"] == 434.0
    line = format_summary(summary, Path("runs/x"))
    assert "mean return 434.00 over the last 100 episodes (480.00 when the run stopped" in line
    same = dict(_stats([480.0] * EPISODE_WINDOW).summary(), mean_return_at_stop=480.0)
    assert "when the run stopped" not in format_summary(same, Path("runs/x"))
