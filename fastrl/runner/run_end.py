"""How a run decides it has reached one of its configured ends, and the summary line it prints
when it stops."""

from __future__ import annotations

from pathlib import Path

from fastrl.config.schema import Config
from fastrl.runner.stats import RunStats


def finished_reason(cfg: Config, stats: RunStats) -> str | None:
    """Why the run has reached one of its configured ends, or None while it should go on."""
    run = cfg.run
    if stats.env_steps >= run.train_for_env_steps:
        return f"reached train_for_env_steps={run.train_for_env_steps:,}"
    if run.train_for_seconds is not None and stats.wall_s >= run.train_for_seconds:
        return f"reached train_for_seconds={run.train_for_seconds:g}"
    full_window = len(stats.scores) == stats.scores.maxlen
    if run.stop_at_mean_return is not None and full_window and stats.mean_score >= run.stop_at_mean_return:
        reason = f"mean return of the last {len(stats.scores)} episodes reached {run.stop_at_mean_return}"
        if stats.episodes == 0:  # a resume's restored window: no game of this sitting in it
            reason += (" before this resume (to train on, --set run.stop_at_mean_return=null or a higher "
                       "return)")
        return reason
    return None


def format_summary(summary: dict, run_dir: Path) -> str:
    ret = summary["final_mean_return"]
    ret_text = "n/a" if ret is None else f"{ret:.2f} over the last {summary['episodes_in_mean']} episodes"
    at_stop = summary.get("mean_return_at_stop")
    if ret is not None and at_stop is not None and round(at_stop, 2) != round(ret, 2):
        ret_text += f" ({at_stop:.2f} when the run stopped; episodes reported during shutdown joined it)"
    frames = ""
    if summary["frames_per_env_step"] > 1:
        frames = f" ({summary['frames']:,} frames)"
    lag = summary["policy_lag"]
    return (f"summary: {summary['env_steps']:,} env steps{frames} in {summary['wall_s']:.1f} s "
            f"({summary['mean_env_steps_per_s']:,.0f} env steps/s); mean return {ret_text}; "
            f"policy lag min/mean/max {lag['min']}/{lag['mean']}/{lag['max']}; "
            f"learner busy {100 * summary['learner_busy_fraction']:.0f}%; saved in {run_dir}")
