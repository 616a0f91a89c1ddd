"""bench/targets.py's judgement of issue #5's targets from what `fastrl bench`, `fastrl train` and
memory_watch measured: each figure is read from where the bench puts it, a miss reads as one, and the
learner's wait is judged only where the bound says the run is learner-bound."""

import pytest

from helpers import load_bench_script

targets = load_bench_script("targets")


def _doc(train_rate=2500.0, train_eff=0.9, sample_eff=0.95, wait=0.02, learn_per_core=1000.0, epochs=2,
         pss_mib=800.0):
    """A `fastrl bench --rounds 3` document with the fields the judgement reads (Pong's shape:
    env 1,500 and infer 2,400 per core, so with 2 epochs of 1,000 samples/s the learner dominates)."""
    return {
        "counts": {"epochs": epochs},
        "stages": {
            "env": {"env_steps_per_core_s": 1500.0},
            "infer": {"samples_per_core_s": 2400.0},
            "learn": {"samples_per_core_s": learn_per_core},
            "sample": {"env_steps_per_s": {"median": 1900.0, "overall": 1850.0}},
            "train": {"env_steps_per_s": {"median": train_rate - 50, "overall": train_rate},
                      "learner_wait_fraction": 0.5, "peak_total_pss_mib": pss_mib},
        },
        "efficiency": {"train": train_eff, "sample": sample_eff},
        "learner_wait_median": wait,
    }


def _by_target(rows):
    return {(r["target"], r["preset"]): r for r in rows}


def test_a_pong_run_that_meets_every_target_reads_met_throughout():
    rows = targets.judge({"pong": _doc()}, {"pong": [4.0, 4.5, 6.0]}, None)
    by = _by_target(rows)
    assert by[("train, env steps/s", "pong")]["measured"] == 2500.0  # the overall rate, as the bench quotes it
    assert by[("first sample after the command, s", "pong")]["measured"] == 4.5  # the median of the runs
    judged = [r for r in rows if r["met"] is not None]
    assert {r["target"] for r in judged} == {
        "train, env steps/s", "train / machine bound", "sample / machine bound",
        "learner waiting for data (learner-bound)", "peak PSS of the process tree, MiB",
        "first sample after the command, s"}
    assert all(r["met"] for r in judged)
    growth = by[("no PSS growth over 30 minutes, growth %", "pong")]
    assert growth["met"] is None and "not judged" in growth["how"]


@pytest.mark.parametrize("change, target", [
    ({"train_rate": 1245.0}, "train, env steps/s"),
    ({"train_eff": 0.84}, "train / machine bound"),
    ({"sample_eff": 0.88}, "sample / machine bound"),
    ({"wait": 0.05}, "learner waiting for data (learner-bound)"),
    ({"pss_mib": 1537.0}, "peak PSS of the process tree, MiB"),
])
def test_each_miss_reads_as_one_and_only_that_one(change, target):
    rows = targets.judge({"pong": _doc(**change)}, {}, None)
    assert [r["target"] for r in rows if r["met"] is False] == [target]
    assert "NO" in targets.format_rows(rows)


def test_the_learners_wait_is_not_judged_where_the_samplers_cost_more():
    # one epoch at 5,000 samples/s: 0.2 ms against the samplers' 0.67 + 0.42 ms per env step
    rows = targets.judge({"cartpole": _doc(learn_per_core=5000.0, epochs=1, wait=0.3)}, {}, None)
    wait = _by_target(rows)[("learner waiting for data", "cartpole")]
    assert wait["met"] is None and wait["how"] == "not learner-bound" and wait["measured"] == 0.3
    assert targets.learner_bound(_doc()) is True


def test_the_presets_get_their_own_rate_lines():
    by = _by_target(targets.judge({"halfcheetah": _doc(train_rate=47000.0), "cartpole": _doc(train_rate=160000.0)},
                                  {}, None))
    assert by[("train, env steps/s", "halfcheetah")]["met"] is False  # >= 48,000
    assert by[("train / machine bound", "halfcheetah")]["needed"] == 0.70
    assert by[("train, env steps/s", "cartpole")]["met"] is True  # >= 150,000
    assert ("train / machine bound", "cartpole") not in by  # the issue sets none for CartPole
    assert ("no PSS growth over 30 minutes, growth %", "pong") not in by  # no Pong measured, no watch


def _watch(first, last, second_half_slope, judged_s=1700.0):
    return {"first_fifth_mib": first, "last_fifth_mib": last, "second_half_slope_mib_per_hour": second_half_slope,
            "judged_s": judged_s}


@pytest.mark.parametrize("summary, met", [
    (_watch(898.0, 898.0, -0.2), True),              # stop 37's 30 minutes
    (_watch(898.0, 912.0, 0.0), False),              # 1.6% above the first fifth
    (_watch(898.0, 900.0, 25.0), False),             # still rising in the second half
    (_watch(898.0, 898.0, 0.0, judged_s=600), False),  # too short a watch to say
])
def test_memory_growth_needs_a_flat_end_over_a_long_enough_watch(summary, met):
    row = targets.judge({}, {}, summary)[-1]
    assert row["target"] == "no PSS growth over 30 minutes, growth %" and row["met"] is met


def test_a_watch_too_short_to_judge_is_listed_as_not_judged():
    rows = targets.judge({}, {}, {})  # run_memory's answer when memory_watch had too few samples
    assert len(rows) == 1 and rows[0]["met"] is None and "not judged" in rows[0]["how"]
    assert targets.judge({}, {}, None) == []  # no watch asked for, no Pong measured
