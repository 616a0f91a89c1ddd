"""A resumed run's mean return goes on over the games its earlier sittings finished (episodes.json),
up to its checkpoint's env steps, instead of restarting from none."""

import json

import pytest

from fastrl.config import load_config
from fastrl.rundir.episodes import FILE_NAME, EpisodesFileError, load_episodes_until, save_recent_episodes
from fastrl.runner.run_end import finished_reason
from fastrl.runner.stats import EPISODE_WINDOW, RunStats


def _played(stats: RunStats, env_steps: int, scores: list[float]) -> None:
    stats.on_env_steps(env_steps)
    stats.on_report({"kind": "episodes", "scores": scores, "lengths": [int(s) + 1 for s in scores]})


def test_episodes_are_tagged_with_the_env_steps_counted_when_reported():
    stats = RunStats(frames_per_env_step=1, start_env_steps=0)
    _played(stats, 1000, [1.0, 2.0])
    _played(stats, 2500, [3.0])
    assert list(stats.recent_episodes) == [(1000, 1.0, 2), (1000, 2.0, 3), (2500, 3.0, 4)]


def test_the_file_keeps_twice_the_window_and_a_resume_takes_the_last_window_before_its_checkpoint(tmp_path):
    stats = RunStats(frames_per_env_step=1, start_env_steps=0)
    for i in range(3 * EPISODE_WINDOW):  # one game per report, env steps 10, 20, ...
        _played(stats, 10 * (i + 1), [float(i)])
    save_recent_episodes(tmp_path, list(stats.recent_episodes))
    saved = json.loads((tmp_path / FILE_NAME).read_text())
    assert len(saved["return"]) == 2 * EPISODE_WINDOW and saved["return"][-1] == 3 * EPISODE_WINDOW - 1
    # the checkpoint was written at game 250's report: the 50 games after it are not this stretch's
    checkpoint_env_steps = 10 * 250
    restored = load_episodes_until(tmp_path, checkpoint_env_steps, EPISODE_WINDOW)
    assert [r for _, r, _ in restored] == [float(i) for i in range(150, 250)]
    assert load_episodes_until(tmp_path, 10 * 120, EPISODE_WINDOW)[0] == (1010, 100.0, 101)  # fewer saved than asked


def test_a_resumed_window_reports_and_stops_as_the_run_before_it_would_have():
    cfg = load_config(None, ["run.stop_at_mean_return=475", "run.train_for_env_steps=100000"])
    stats = RunStats(frames_per_env_step=1, start_env_steps=50_000)
    stats.restore_episodes([(40_000 + i, 480.0, 480) for i in range(EPISODE_WINDOW)])
    assert stats.mean_score == 480.0 and stats.episodes == 0  # none played in this sitting yet
    # a resumed run that had already reached its return says so, and how to train on
    assert finished_reason(cfg, stats).endswith("reached 475.0 before this resume (to train on, --set "
                                                "run.stop_at_mean_return=null or a higher return)")
    _played(stats, 51_000, [0.0] * 10)  # this sitting's games push the oldest out
    assert stats.mean_score == pytest.approx(480.0 * 0.9)
    assert list(stats.recent_episodes)[-1] == (51_000, 0.0, 1) and len(stats.recent_episodes) == 110
    assert "return(last 100)" in stats.console_line(100_000)


def test_a_run_without_the_file_restores_nothing_and_a_broken_one_is_one_line(tmp_path):
    assert load_episodes_until(tmp_path, 10**9, EPISODE_WINDOW) == []  # saved by an older fastrl
    path = tmp_path / FILE_NAME
    for text, says in [('{"env_steps": [1, 2', "could not read"),
                       ('{"env_steps": [1], "return": [1.0]}', "not a fastrl episodes file"),
                       ('{"env_steps": [1, 2], "return": [1.0], "length": [3]}', "differ in length"),
                       ('[1, 2]', "not a fastrl episodes file")]:
        path.write_text(text)
        with pytest.raises(EpisodesFileError, match=says):
            load_episodes_until(tmp_path, 10**9, EPISODE_WINDOW)
