"""`fastrl bench --rounds N`: how rounds combine (medians of each round's own ratios, stage records
taken whole from their median round) and what the table says about them. No timing is asserted."""

import copy
import statistics

import pytest

from fastrl.bench.report import format_table, summarize
from fastrl.bench.rounds import combine_rounds


def _rate(value):
    return {"median": value, "min": value * 0.9, "max": value * 1.1, "windows": 5}


def _round(speed: float, train_rate: float) -> dict:
    """One summarized round on a host running at `speed` times its usual pace."""
    train = {"learner_busy_fraction": 0.97, "learner_wait_fraction": 0.03, "rollout_idle_fraction": 0.4,
             "inference_busy_fraction": 0.3, "cpu_percent_total": 195.0, "learner_trains": True,
             "env_steps_per_s": {**_rate(train_rate), "overall": train_rate}, "inference_mean_batch": 17.0,
             "policy_lag": {"p50": 3, "p95": 9, "max": 14}, "samples_dropped_for_lag": 0,
             "processes": [{"name": "fastrl-learner", "cpu_percent": 97.0, "rss_mib": 400.0, "pss_mib": 300.0}],
             "peak_total_rss_mib": 900.0, "peak_total_pss_mib": 600.0 + train_rate / 100,
             "time_to_first_sample_s": 2.0}
    result = {"config": "x.yaml", "env_id": "Pong-v5", "cores": 2, "frames_per_env_step": 4,
              "counts": {"epochs": 1}, "stages": {
                  "env": {"env_steps_per_s": _rate(7000.0 * speed), "env_steps_per_core_s": speed * 1e6 / 266},
                  "infer": {"samples_per_s": _rate(7000.0 * speed), "samples_per_core_s": speed * 1e6 / 133,
                            "batch": 32},
                  "learn": {"samples_per_s": _rate(1200.0 * speed), "samples_per_core_s": speed * 1e6 / 826,
                            "batch_size": 1024, "epochs": 1},
                  "train": train}}
    summarize(result)
    return result


def test_one_round_is_returned_as_it_is():
    one = _round(1.0, 900.0)
    assert combine_rounds([copy.deepcopy(one)]) == one


def test_efficiency_is_the_median_of_each_rounds_own_ratio():
    # the host slows by 20% in round 2 and speeds up by 10% in round 3: each round's train rate
    # moves with its own bound, which the median of ratios follows and the ratio of medians does not
    rounds = [_round(1.0, 900.0), _round(0.8, 800.0), _round(1.1, 1000.0)]
    ratios = [r["efficiency"]["train"] for r in rounds]
    combined = combine_rounds(copy.deepcopy(rounds))
    assert combined["efficiency"]["train"] == pytest.approx(statistics.median(ratios), abs=1e-3)
    bounds = [r["bound"]["train_env_steps_per_s"] for r in rounds]
    assert combined["bound"]["train_env_steps_per_s"] == pytest.approx(statistics.median(bounds), abs=0.1)
    ratio_of_medians = 900.0 / statistics.median(bounds)
    assert abs(combined["efficiency"]["train"] - ratio_of_medians) > 0.004
    assert [r["efficiency"]["train"] for r in combined["rounds"]] == ratios
    assert combined["rounds"][1]["rates"]["train"] == 800.0


def test_each_stage_record_comes_whole_from_its_median_round():
    rounds = [_round(1.1, 1000.0), _round(0.8, 800.0), _round(1.0, 900.0)]
    combined = combine_rounds(copy.deepcopy(rounds))
    assert combined["stage_rounds"] == {"env": 3, "infer": 3, "learn": 3, "train": 3}
    assert combined["stages"]["train"] == rounds[2]["stages"]["train"]  # its memory and lag too
    assert combined["stages"]["train"]["peak_total_pss_mib"] == 609.0
    assert combined["bottleneck"].startswith("learner-bound")
    # an even count takes the lower middle round, a real measurement rather than an average of two
    even = combine_rounds(copy.deepcopy(rounds[:2] + [_round(0.9, 850.0)] + rounds[2:]))
    assert even["stages"]["train"]["env_steps_per_s"]["overall"] == 850.0
    assert even["efficiency"]["train"] == pytest.approx(
        statistics.median(r["efficiency"]["train"] for r in even["rounds"]), abs=1e-3)


def test_rounds_without_a_system_stage_combine_the_sampling_bound_only():
    rounds = [_round(s, 900.0) for s in (1.0, 0.9, 1.2)]
    for r in rounds:
        for name in ("learn", "train"):
            del r["stages"][name]
        summarize(r)
    combined = combine_rounds(rounds)
    assert set(combined["bound"]) == {"cores", "formula", "sample_env_steps_per_s"}
    assert combined["efficiency"] == {} and combined["bottleneck"] is None


def test_the_table_names_rounds_and_each_rounds_ratio():
    rounds = [_round(1.0, 900.0), _round(0.8, 800.0), _round(1.1, 1000.0)]
    text = format_table(combine_rounds(rounds))
    assert "3 rounds" in text and "train round 1" in text
    efficiency = next(line for line in text.splitlines() if line.startswith("efficiency (train / bound)"))
    assert "median of 3 rounds' own ratios" in efficiency
    assert all(f"{r['efficiency']['train']:.0%}" in efficiency for r in rounds)
    assert "  round 2: env 5,600, infer 5,600, learn 960, train 800; train 61% of 1,306" in text
    assert "train (round 1): learner-bound" in text


def test_each_round_says_how_much_of_the_cores_the_hypervisor_stole():
    rounds = [_round(1.0, 900.0), _round(0.8, 800.0), _round(1.1, 1000.0)]
    for r, stolen in zip(rounds, (0.01, 0.12, 0.0)):
        r["stages"]["train"] = dict(r["stages"]["train"], core_shares={
            "ours": 0.95 - stolen, "other": 0.02, "idle": 0.03, "stolen": stolen})
    combined = combine_rounds(rounds)
    assert [r["stolen"] for r in combined["rounds"]] == [{"train": 0.01}, {"train": 0.12}, {"train": 0.0}]
    text = format_table(combined)
    assert "  round 2: env 5,600, infer 5,600, learn 960, train 800; train 61% of 1,306 (12% of the cores stolen)" in text
    # the median round's own record prints its cores' time, and only it
    assert "stolen by the hypervisor 1% (the rate is per wall second" in text
    assert "at most 1.01x" in text


def test_nothing_to_combine_is_an_error():
    with pytest.raises(ValueError):
        combine_rounds([])


def test_each_rounds_learner_wait_is_kept_and_its_median_reported():
    """Issue #5's line (the learner waiting < 5% of a learner-bound run) is judged on every round, not
    only on the round whose rate was the median."""
    rounds = [_round(1.0, 900.0), _round(0.8, 800.0), _round(1.1, 1000.0)]
    for r, wait in zip(rounds, (0.02, 0.09, 0.04)):
        r["stages"]["train"]["learner_wait_fraction"] = wait
    combined = combine_rounds(rounds)
    assert [r["learner_wait"] for r in combined["rounds"]] == [0.02, 0.09, 0.04]
    assert combined["learner_wait_median"] == 0.04
    text = format_table(combined)
    assert "; the learner waiting 9.0%" in text.splitlines()[[i for i, line in enumerate(text.splitlines())
                                                              if line.startswith("  round 2:")][0]]
    assert "the learner waited 4.0% of the train stage, the median of 3 rounds" in text
    sampling_only = [_round(s, 900.0) for s in (1.0, 0.9)]
    for r in sampling_only:
        del r["stages"]["train"]
        summarize(r)
    assert "learner_wait_median" not in combine_rounds(sampling_only)
