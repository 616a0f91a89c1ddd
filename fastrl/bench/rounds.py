"""`fastrl bench --rounds N`: the stages run N times in turn, and each efficiency quoted is the
median of the rounds' own ratios.

Why rounds: the efficiency divides the sample or train stage's rate by a bound computed from the
isolated stages, measured minutes earlier. On a host whose speed drifts 10-20% within minutes, one
round of the same Pong code read 68% and 84% a few hours apart (bench/README). Within a round the
stages run back to back, so each round's ratio compares rates measured close together; the median
of several such ratios is steadier than any one, and the spread shows how far to trust it.

The combined document keeps one round's document shape (`stages`, `bound`, `efficiency`,
`bottleneck`), so anything that reads a one-round result reads this too:
- `stages[name]` is the whole record of the round whose rate for that stage is the median (the
  lower median for an even N): a real measurement, with its processes, lag and memory;
- `bound` and `efficiency` are medians, over rounds, of each round's own figures;
- `rounds` lists every round's rates, bound and efficiency, and `stage_rounds` which round each
  `stages` entry came from.
"""

from __future__ import annotations

import statistics

from fastrl.bench.measure import headline_rate

RATE_KEYS = {"env": "env_steps_per_s", "infer": "samples_per_s", "learn": "samples_per_s",
             "sample": "env_steps_per_s", "train": "env_steps_per_s"}
BOUND_KEYS = ("sample_env_steps_per_s", "train_env_steps_per_s")


def stage_rate(name: str, stage: dict) -> float:
    """The figure a stage is quoted by (the same one the table's rate column shows)."""
    return headline_rate(stage[RATE_KEYS[name]])


def _median_round(rates: list[float]) -> int:
    """Index of the lower-median rate: a round that was measured, not an average of two."""
    target = statistics.median_low(rates)
    return rates.index(target)


def combine_rounds(rounds: list[dict]) -> dict:
    """One document from N summarized one-round documents (fastrl.bench.report.summarize each)."""
    if not rounds:
        raise ValueError("no rounds to combine")
    if len(rounds) == 1:
        return rounds[0]
    combined = {k: v for k, v in rounds[0].items() if k not in ("stages", "bound", "efficiency", "bottleneck")}
    stages, stage_rounds = {}, {}
    for name in rounds[0]["stages"]:
        rates = [stage_rate(name, r["stages"][name]) for r in rounds]
        index = _median_round(rates)
        stages[name], stage_rounds[name] = rounds[index]["stages"][name], index + 1
    bound = {"cores": rounds[0]["bound"]["cores"], "formula": rounds[0]["bound"]["formula"]}
    for key in BOUND_KEYS:
        if all(key in r["bound"] for r in rounds):
            bound[key] = round(statistics.median(r["bound"][key] for r in rounds), 1)
    efficiency = {}
    for stage in rounds[0]["efficiency"]:
        efficiency[stage] = round(statistics.median(r["efficiency"][stage] for r in rounds), 3)
    last = "train" if "train" in stages else "sample" if "sample" in stages else None
    combined.update(
        stages=stages, bound=bound, efficiency=efficiency,
        bottleneck=stages[last]["bottleneck"] if last else None,
        stage_rounds=stage_rounds,
        rounds=[{"rates": {name: round(stage_rate(name, st), 1) for name, st in r["stages"].items()},
                 "bound": {k: r["bound"][k] for k in BOUND_KEYS if k in r["bound"]},
                 "efficiency": dict(r["efficiency"]),
                 "stolen": {name: st["core_shares"]["stolen"] for name, st in r["stages"].items()
                            if st.get("core_shares")},
                 **_learner_wait(r)} for r in rounds])
    waits = [r["learner_wait"] for r in combined["rounds"] if "learner_wait" in r]
    if waits:  # issue #5's line is on every learner-bound run, not on the median-rate round alone
        combined["learner_wait_median"] = round(statistics.median(waits), 4)
    return combined


def _learner_wait(summarized_round: dict) -> dict:
    """{"learner_wait": the share of the train stage the learner waited for data}, where it trained."""
    train = summarized_round["stages"].get("train", {})
    return {"learner_wait": train["learner_wait_fraction"]} if train.get("learner_trains") else {}


def rounds_lines(result: dict) -> list[str]:
    """The table's lines for a result of several rounds: each round's rates and ratios."""
    rounds = result.get("rounds")
    if not rounds:
        return []
    n = len(rounds)
    lines = [f"{n} rounds, stages in turn; rates above are each stage's median round "
             f"({', '.join(f'{k} round {v}' for k, v in result['stage_rounds'].items())}), "
             "bound and efficiency the medians of the rounds' own figures:"]
    for i, r in enumerate(rounds, 1):
        rates = ", ".join(f"{name} {rate:,.0f}" for name, rate in r["rates"].items())
        stolen = r.get("stolen", {})
        ratios = "".join(f"; {stage} {value:.0%} of {r['bound'][key]:,.0f}"
                         + (f" ({stolen[stage]:.0%} of the cores stolen)" if stage in stolen else "")
                         for stage, value in r["efficiency"].items()
                         for key in [f"{stage}_env_steps_per_s"])
        wait = f"; the learner waiting {r['learner_wait']:.1%}" if "learner_wait" in r else ""
        lines.append(f"  round {i}: {rates}{ratios}{wait}")
    if "learner_wait_median" in result:
        lines.append(f"  the learner waited {result['learner_wait_median']:.1%} of the train stage, the median of "
                     f"{n} rounds")
    return lines
