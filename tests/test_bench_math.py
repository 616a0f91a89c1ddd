"""The benchmark's arithmetic: window rates, spreads, lag quantiles, the machine bound, the
bottleneck words and the tuner's moves. No timing is asserted anywhere."""

import math
import time

import numpy as np
import pytest

from fastrl.bench.measure import TreeSampler, core_shares, headline_rate, overall_rate, spread, window_rates
from fastrl.host import core_times
from fastrl.bench.report import bottleneck, cost_line, format_table, machine_bound, summarize
from fastrl.bench.tune import Knob, Trial
from fastrl.runner.stats import hist_quantile


def test_window_rates_of_a_steady_counter():
    points = [(t * 0.25, 1000.0 * t * 0.25) for t in range(41)]  # 10 s at 1000/s
    rates = window_rates(points, 2.0)
    assert len(rates) == 4 and all(math.isclose(r, 1000.0) for r in rates)  # from the first change at 0.25 s


def test_window_rates_never_divide_by_zero_and_skip_short_tails():
    points = [(0.0, 0.0), (0.0, 5.0), (1.5, 15.0), (3.1, 31.0), (3.5, 33.0)]
    assert window_rates(points, 3.0) == [26.0 / 3.1]  # opens at the first change; the 0.4 s tail is dropped
    assert window_rates([], 1.0) == [] and window_rates([(0.0, 1.0)], 1.0) == []
    assert window_rates([(0.0, 7.0), (1.0, 7.0), (5.0, 7.0)], 1.0) == []  # a counter that never moved


def test_a_measurement_shorter_than_one_window_is_one_window():
    points = [(0.0, 0.0), (0.1, 100.0), (0.5, 300.0), (0.9, 900.0), (0.99, 900.0)]
    assert window_rates(points, 1.0) == [pytest.approx(1000.0)]  # from the first change to the last
    assert window_rates([(0.0, 0.0), (0.5, 3.0)], 1.0) == []  # one change: no span to divide by


def test_window_rates_of_a_counter_that_jumps_a_batch_at_a_time():
    # the train stage: 1,024 env steps land at once every 2.1 s, the probe samples every 0.1 s
    points = [(k * 0.1, 1024.0 * int(k * 0.1 / 2.1)) for k in range(1, 301)]
    rates = window_rates(points, 2.0)
    assert len(rates) >= 10
    assert spread(rates).median == pytest.approx(1024 / 2.1, rel=0.06)
    assert min(rates) > 0  # no window falls between two batches


def test_overall_rate_spans_first_to_last_change_of_a_bursty_counter():
    # bursts of two 512-step slots every 4 s, as a learner-bound train stage frees them
    points = [(0.0, 0.0)]
    for k in range(1, 201):
        t = k * 0.1
        points.append((t, 1024.0 * int(t / 4.0) + 512.0 * (t % 4.0 >= 0.3) * (t >= 4.0)))
    edges = [p for prev, p in zip(points, points[1:]) if p[1] != prev[1]]
    expected = (edges[-1][1] - edges[0][1]) / (edges[-1][0] - edges[0][0])
    assert overall_rate(points) == pytest.approx(expected)
    assert overall_rate(points) == pytest.approx(256.0, rel=0.1)
    assert overall_rate([(0.0, 5.0), (1.0, 5.0)]) is None
    # the headline is the overall rate where a stage has one, the windows' median otherwise
    assert headline_rate(spread([1.0, 3.0], overall=2.5).as_dict()) == 2.5
    assert headline_rate(spread([1.0, 3.0]).as_dict()) == 2.0


def test_spread_is_median_and_range():
    s = spread([3.0, 1.0, 10.0, 2.0])
    assert (s.median, s.min, s.max, s.windows) == (2.5, 1.0, 10.0, 4)
    assert spread([]).windows == 0


def test_lag_quantiles_from_histogram():
    rng = np.random.default_rng(0)
    lags = rng.integers(0, 40, size=5000)
    hist = np.bincount(lags, minlength=256)
    for q in (0.5, 0.95):
        assert hist_quantile(hist, q) == int(np.quantile(lags, q, method="inverted_cdf"))
    assert hist_quantile(np.zeros(5, dtype=np.int64), 0.5) is None


def test_machine_bound_matches_hand_arithmetic():
    # design.md's Pong figures: env 266 us, infer 133 us, train 826 us per sample, 2 cores, 1 epoch
    env, infer, learn = 1e6 / 266, 1e6 / 133, 1e6 / 826
    assert machine_bound(2, env, infer, learn, 1) == pytest.approx(2 / (266e-6 + 133e-6 + 826e-6))
    assert machine_bound(2, env, infer, learn, 1) == pytest.approx(1632.65, rel=1e-3)
    # epochs multiply the learner's cost; no learner = the sampling bound
    assert machine_bound(2, env, infer, learn, 4) == pytest.approx(2 / (266e-6 + 133e-6 + 4 * 826e-6))
    assert machine_bound(1, 100.0, 100.0, None, 1) == pytest.approx(50.0)


def _system_stage(lb, ri, ib, cpu, trains=True):
    return {"learner_busy_fraction": lb, "learner_wait_fraction": 1 - lb, "rollout_idle_fraction": ri,
            "inference_busy_fraction": ib, "cpu_percent_total": cpu, "learner_trains": trains,
            "env_steps_per_s": {"median": 900.0, "min": 850.0, "max": 950.0, "windows": 6},
            "frames_per_s": {"median": 3600.0, "min": 3400.0, "max": 3800.0, "windows": 6},
            "inference_mean_batch": 32.0, "policy_lag": {"p50": 3, "p95": 9, "max": 14},
            "samples_dropped_for_lag": 0, "processes": [{"name": "fastrl-learner", "cpu_percent": 97.0,
                                                         "rss_mib": 400.0, "pss_mib": 300.0}],
            "peak_total_rss_mib": 900.0, "peak_total_pss_mib": 600.0, "time_to_first_sample_s": 4.0}


@pytest.mark.parametrize("lb,ri,ib,cpu,word", [
    (0.97, 0.41, 0.3, 195, "learner-bound"), (0.5, 0.05, 0.4, 150, "env-bound"),
    (0.5, 0.5, 0.95, 150, "inference-bound"), (0.5, 0.5, 0.5, 195, "CPU-bound"),
    (0.5, 0.5, 0.5, 100, "latency-bound")])
def test_bottleneck_words(lb, ri, ib, cpu, word):
    text = bottleneck(_system_stage(lb, ri, ib, cpu), cores=2)
    assert text.startswith(word) and f"rollout workers idle {ri:.0%}" in text


def test_a_learner_that_only_discards_is_never_the_bottleneck():
    assert bottleneck(_system_stage(0.99, 0.5, 0.95, 150, trains=False), 2).startswith("inference-bound")


def test_summarize_computes_bound_efficiency_and_table():
    result = {"config": "x.yaml", "env_id": "Pong-v5", "cores": 2, "frames_per_env_step": 4,
              "counts": {"epochs": 1}, "stages": {
                  "env": {"env_steps_per_s": {"median": 7000.0, "min": 1, "max": 1, "windows": 3},
                          "env_steps_per_core_s": 1e6 / 266},
                  "infer": {"samples_per_s": {"median": 7000.0, "min": 1, "max": 1, "windows": 3},
                            "samples_per_core_s": 1e6 / 133, "batch": 32},
                  "learn": {"samples_per_s": {"median": 1200.0, "min": 1, "max": 1, "windows": 3},
                            "samples_per_core_s": 1e6 / 826, "batch_size": 1024, "epochs": 1},
                  "train": _system_stage(0.97, 0.41, 0.3, 195)}}
    summarize(result)
    assert result["bound"]["train_env_steps_per_s"] == pytest.approx(1632.65, rel=1e-3)
    assert result["efficiency"]["train"] == pytest.approx(900.0 / result["bound"]["train_env_steps_per_s"], abs=1e-3)
    assert result["bottleneck"].startswith("learner-bound")
    table = format_table(result)
    assert "frames/s" in table and "3,600" in table and "p50/p95/max 3/9/14" in table
    assert "1 thread" not in table
    assert "cores idle" not in table  # no accounting of the learner's waits in this stage
    result["stages"]["train"]["learner_wait_cores_idle_fraction"] = 0.12
    assert "waiting 3% (the cores idle 12% of that time)" in format_table(result)


def _costed_result(processes: list, sample_processes: list) -> dict:
    """Pong-like stages (2 epochs) whose train and sample stages ran `processes` (name, CPU %)."""
    def stage(rate, procs, trains):
        return dict(_system_stage(0.9, 0.3, 0.5, sum(c for _, c in procs), trains),
                    env_steps_per_s={"median": rate, "min": 1, "max": 1, "windows": 3, "overall": rate},
                    processes=[{"name": f"fastrl-{n}", "cpu_percent": c, "rss_mib": 1.0, "pss_mib": 1.0}
                               for n, c in procs])
    return {"config": "x.yaml", "env_id": "Pong-v5", "cores": 2, "frames_per_env_step": 4,
            "counts": {"epochs": 2}, "stages": {
                "env": {"env_steps_per_s": {"median": 5000.0, "min": 1, "max": 1, "windows": 3},
                        "env_steps_per_core_s": 2500.0},
                "infer": {"samples_per_s": {"median": 7500.0, "min": 1, "max": 1, "windows": 3},
                          "samples_per_core_s": 7500.0, "batch": 32},
                "learn": {"samples_per_s": {"median": 3000.0, "min": 1, "max": 1, "windows": 3},
                          "samples_per_core_s": 2000.0, "batch_size": 1024, "epochs": 2},
                "train": stage(1000.0, processes, True), "sample": stage(3000.0, sample_processes, False)}}


def test_cpu_costs_split_the_efficiency_into_cost_ratio_and_cores_used():
    result = _costed_result([("rollout-0", 25.0), ("rollout-1", 25.0), ("inference-0", 23.0), ("learner", 120.0)],
                            [("rollout-0", 66.0), ("rollout-1", 66.0), ("inference-0", 55.0), ("learner", 0.3)])
    summarize(result)
    train = result["stages"]["train"]["cpu_costs"]
    # the bound charges 1/2500 s for the env, 1/7500 for the forward and 2 epochs / 2000 for the learner
    assert train["bound_ms"] == pytest.approx({"rollout": 0.4, "inference": 0.1333, "learner": 1.0}, abs=1e-4)
    assert train["run_ms"] == pytest.approx({"rollout": 0.5, "inference": 0.23, "learner": 1.2}, abs=1e-4)
    assert train["cores_used_fraction"] == pytest.approx(0.965)
    for name in ("train", "sample"):
        costs = result["stages"][name]["cpu_costs"]
        assert costs["cost_ratio"] * costs["cores_used_fraction"] == pytest.approx(result["efficiency"][name], abs=2e-3)
    assert result["stages"]["sample"]["cpu_costs"]["bound_ms"]["learner"] == 0.0
    line = next(x for x in format_table(result).splitlines() if "run / bound" in x and "learner 1,200 / 1,000" in x)
    assert "CPU µs per env step" in line
    assert "rollout workers 500 / 400" in line and "cores used 96%" in line and "= 76.7% of the bound" in line
    # a CartPole env step costs a few microseconds: still three digits of it
    small = cost_line({"run_ms": {"rollout": 0.003812, "learner": 0.000104},
                       "bound_ms": {"rollout": 0.003481, "learner": 0.0}, "cost_ratio": 0.8892, "cores_used_fraction": 0.96})
    assert "rollout workers 3.81 / 3.48, learner 0.104 / 0; all 3.92 / 3.48" in small


def test_cpu_costs_charge_rollout_workers_that_act_for_both_env_and_forward():
    result = _costed_result([("rollout-0", 50.0), ("rollout-1", 50.0), ("learner", 90.0)],
                            [("rollout-0", 95.0), ("rollout-1", 95.0)])
    summarize(result)
    costs = result["stages"]["train"]["cpu_costs"]
    assert set(costs["bound_ms"]) == {"rollout", "learner"}
    assert costs["bound_ms"]["rollout"] == pytest.approx(0.4 + 0.1333, abs=1e-4)
    assert costs["cost_ratio"] * costs["cores_used_fraction"] == pytest.approx(result["efficiency"]["train"], abs=2e-3)
    del result["stages"]["env"], result["stages"]["train"]["cpu_costs"]
    summarize(result)  # without the env stage there is no bound to compare with
    assert "cpu_costs" not in result["stages"]["train"]


def test_core_shares_split_the_cores_time_between_the_run_others_idle_and_stolen():
    start = {"busy_s": 100.0, "idle_s": 50.0, "stolen_s": 3.0}
    end = {"busy_s": 137.0, "idle_s": 51.0, "stolen_s": 5.0}  # 40 core-seconds: 37 busy, 1 idle, 2 stolen
    shares = core_shares(start, end, ours_cpu_s=35.0)
    assert shares == pytest.approx({"ours": 35 / 40, "other": 2 / 40, "idle": 1 / 40, "stolen": 2 / 40})
    assert sum(shares.values()) == pytest.approx(1.0)
    # process and core accounting round differently: ours never exceeds what the cores were busy
    assert core_shares(start, end, ours_cpu_s=37.4) == pytest.approx({"ours": 37 / 40, "other": 0.0, "idle": 1 / 40,
                                                                       "stolen": 2 / 40})
    assert core_shares(start, {"busy_s": 100.2, "idle_s": 50.1, "stolen_s": 3.0}, 0.1) is None  # too short to tell


def test_core_times_count_every_core_second_of_a_span():
    """Busy + idle + stolen over a span is the span times the cores, whatever ran meanwhile: a field
    read wrongly (or a CPU counted twice) breaks the sum."""
    sampler = TreeSampler()
    sampler.start()
    started = time.monotonic()
    deadline = started + 0.6
    while time.monotonic() < deadline:  # some busy time of our own
        pass
    time.sleep(0.6)
    sampler.stop()
    elapsed = time.monotonic() - started
    spent = sum(sampler.cores_end[k] - sampler.cores_start[k] for k in ("busy_s", "idle_s", "stolen_s"))
    assert spent == pytest.approx(elapsed * len(sampler.cpus), abs=0.1 * len(sampler.cpus))
    assert sampler.cores_end["busy_s"] - sampler.cores_start["busy_s"] >= 0.4  # our own loop, at least
    assert core_times(sampler.cpus)["busy_s"] >= sampler.cores_end["busy_s"]


def test_two_thread_learner_prints_both_per_core_rates():
    result = {"config": "x.yaml", "env_id": "Pong-v5", "cores": 2, "frames_per_env_step": 4,
              "counts": {"epochs": 2}, "stages": {
                  "learn": {"samples_per_s": {"median": 1114.0, "min": 1, "max": 1, "windows": 3},
                            "samples_per_core_s": 800.0, "batch_size": 1024, "epochs": 2, "torch_threads": 2,
                            "samples_per_core_s_at_configured_threads": 575.0,
                            "samples_per_core_s_1_thread": 800.0}}}
    summarize(result)
    line = next(x for x in format_table(result).splitlines() if "1 thread" in x)
    assert "2 threads / 1 thread" in line and "575 / 800" in line


def test_knob_moves_stay_in_range():
    k = Knob("sampler.num_envs_per_worker", "x2", 4, 64)
    assert (k.move(32, True), k.move(32, False), k.move(64, True), k.move(4, False)) == (64, 16, None, None)
    t = Knob("system.learner_threads", "+1", 1, 2)
    assert (t.move(1, True), t.move(1, False), t.move(2, True)) == (2, None, None)
    pool = Knob("sampler.env_pool", "toggle", choices=("per_group", "per_worker"))
    assert (pool.move("per_group", True), pool.move("per_worker", True), pool.move("per_group", False)) == \
        ("per_worker", "per_group", None)


def test_trial_rate_is_median_of_its_measurements_and_batch_changes_are_flagged():
    t = Trial({"algo.batch_size": 2048, "sampler.num_splits": 4}, [10.0, 30.0, 20.0])
    assert t.rate == 20.0 and t.changes_algorithm and t.label == "batch_size=2048, num_splits=4"
    assert Trial({}, [1.0]).label == "preset" and not Trial({}, [1.0]).changes_algorithm


def test_the_train_stage_counts_env_steps_trained_and_the_sample_stage_those_sampled():
    from types import SimpleNamespace

    from fastrl.bench.system import SystemProbe
    from fastrl.config import load_config

    # early in a run the samplers are still filling free slots: sampled runs ahead of trained
    stats = SimpleNamespace(env_steps=9_000, learner={"train_steps": 3})
    for discard, expected in ((False, 3 * 1024), (True, 9_000)):
        cfg = load_config(overrides=["algo.batch_size=1024", f"system.learner_discards_batches={discard}"])
        probe = SystemProbe(cfg, 1.0, 0.0, lambda *_: None, "stage")
        assert probe._count(stats) == expected
