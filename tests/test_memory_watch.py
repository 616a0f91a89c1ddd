"""bench/memory_watch.py's judgement of a long run's PSS: a one-off step is not a leak, a leak is one,
and the process that made the largest rise is named."""

import os
import subprocess
import sys

import psutil
import pytest

from helpers import load_bench_script


memory_watch = load_bench_script("memory_watch")


def _samples(learner_mib, every_s=20.0, until_s=1800.0):
    """Samples of a tree whose learner follows learner_mib(t) and whose other processes stay flat."""
    out, t = [], 0.0
    while t <= until_s:
        out.append((t, {"runner": 35.0, "inference-0": 250.0, "rollout-0": 100.0, "learner": learner_mib(t)}))
        t += every_s
    return out


def test_a_one_off_step_reads_flat_in_the_second_half_and_is_named():
    summary = memory_watch.judge_growth(_samples(lambda t: 440.0 + (14.5 if t >= 500 else 0.0)), warmup_s=120)
    assert summary["slope_mib_per_hour"] > 10  # the whole-run fit is fooled by the step...
    assert summary["second_half_slope_mib_per_hour"] == pytest.approx(0.0, abs=1e-6)  # ...the second half is not
    assert summary["largest_rise_mib"] == pytest.approx(14.5)
    assert summary["largest_rise_at_s"] == 500
    assert summary["largest_rise_by"] == "learner"
    first, last = summary["by_process_first_last_fifth_mib"]["learner"]
    assert last - first == pytest.approx(14.5)
    assert summary["by_process_first_last_fifth_mib"]["rollout-0"] == (100.0, 100.0)
    assert summary["peak_mib"] == pytest.approx(35 + 250 + 100 + 454.5)


def test_a_steady_leak_rises_in_both_halves():
    summary = memory_watch.judge_growth(_samples(lambda t: 440.0 + 0.01 * t), warmup_s=120)
    assert summary["slope_mib_per_hour"] == pytest.approx(36.0)
    assert summary["second_half_slope_mib_per_hour"] == pytest.approx(36.0)
    assert summary["last_fifth_mib"] > summary["first_fifth_mib"] + 10
    assert "second half +36.0" in memory_watch.report(summary)


def _shutting_down(samples):
    """samples, then the run's last one caught with only the runner and the inference worker left."""
    t = samples[-1][0] + 20.0
    return [*samples, (t, {"runner": 35.0, "inference-0": 120.0})]


def test_the_last_samples_of_a_run_shutting_down_are_left_out():
    summary = memory_watch.judge_growth(_shutting_down(_samples(lambda t: 440.0)), warmup_s=120)
    assert summary["shutdown_samples_left_out"] == 1
    assert summary["second_half_slope_mib_per_hour"] == pytest.approx(0.0, abs=1e-6)
    assert summary["judged_s"] == pytest.approx(1800 - 120)
    # a leak still reads as one with its shutdown sample (which, kept, would pull the slope below 0)
    leak = memory_watch.judge_growth(_shutting_down(_samples(lambda t: 440.0 + 0.01 * t)), warmup_s=120)
    assert leak["second_half_slope_mib_per_hour"] == pytest.approx(36.0)
    assert memory_watch.judge_growth(_samples(lambda t: 440.0), warmup_s=120)["shutdown_samples_left_out"] == 0
    # a child seen only in the first judged sample (a shell, say) is not a worker the run lost
    transient = _samples(lambda t: 440.0)
    first_judged = next(i for i, (t, _) in enumerate(transient) if t >= 120)
    transient[first_judged][1]["sh"] = 0.4
    assert memory_watch.judge_growth(transient, warmup_s=120)["shutdown_samples_left_out"] == 0


def test_too_few_samples_after_the_warm_up_are_not_judged():
    assert memory_watch.judge_growth(_samples(lambda t: 440.0, until_s=190), warmup_s=120) is None  # 4 samples: 120-180 s


def test_a_live_tree_is_sampled_by_title():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        parts = memory_watch.tree_pss_mib(psutil.Process(os.getpid()))
    finally:
        child.kill()
        child.wait()
    assert parts["runner"] > 1.0
    assert sum(mib for label, mib in parts.items() if label != "runner") > 0.0
