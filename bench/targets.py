"""Issue #5's targets on this box, in one command: each one measured, with its margin and whether it is met.

    .venv/bin/python bench/targets.py [--seconds 20] [--rounds 3] [--startup-runs 5] [--memory-minutes 30]
        [--out DIR]    # the folder it writes to, default runs/targets (git-ignored)
    .venv/bin/python bench/targets.py --judge DIR      # judge what an earlier call wrote there, run nothing

The targets were set on one host (an AVX-512 BF16 EPYC, 2 cores) and quoted from many sessions' figures;
this puts every check in one place, so that whoever is on such a host reads them all off one table, and
one on another host sees which hold there. What it runs, one thing at a time (nothing else may run
beside it, see bench/README.md):
- `fastrl bench --rounds R --seconds S --json` on the three presets: the train and sample stages' rates
  and their ratios to the machine bound (medians of the rounds' own ratios), the learner's wait for data
  (the median of the rounds), the train stage's peak PSS;
- `fastrl train` of each preset, --startup-runs times (a few batches), as bench/median_runs.py does:
  the median time from the command to the first sample, as summary.json records it;
- with --memory-minutes M, one Pong run of M minutes whose process tree's PSS bench/memory_watch.py
  samples every 30 s; the issue asks for no growth over 30 minutes.

How each target is read, where the issue leaves room:
- "learner waiting < 5% whenever the run is learner-bound": a preset is learner-bound when the bound's
  learner term (epochs / learn, per core) is at least the samplers' (1/env + 1/infer): the learner then
  needs at least half of the CPU an env step takes. Other presets are listed, not judged.
- "no growth": after memory_watch's 2-minute warm-up, the last fifth's median at most 1% above the
  first fifth's and the second half's slope under 10 MiB per hour (a leak rises in both halves; a
  one-off step reads flat in the second), over at least 25 minutes of samples.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fastrl.bench.rounds import stage_rate
from fastrl.config.hardware import BF16_CPU_FLAGS, cpu_flags

ROOT = Path(__file__).resolve().parent.parent  # the presets' paths are relative to it, and so are the commands
PRESETS = {"pong": "configs/atari_pong.yaml", "halfcheetah": "configs/mujoco_halfcheetah.yaml",
           "cartpole": "configs/cartpole.yaml"}
# a few batches of each preset: enough to record the first sample and end
STARTUP_ENV_STEPS = {"pong": 3000, "halfcheetah": 20000, "cartpole": 20000}
TRAIN_ENV_STEPS_PER_S = {"pong": 2400, "halfcheetah": 48000, "cartpole": 150000}
TRAIN_OF_BOUND = {"pong": 0.85, "halfcheetah": 0.70}  # none for CartPole
SAMPLE_OF_BOUND = 0.90
FIRST_SAMPLE_S = 5.0
PSS_MIB = 1.5 * 1024
LEARNER_WAIT = 0.05
GROWTH_FRACTION, GROWTH_SLOPE_MIB_PER_HOUR, GROWTH_MIN_JUDGED_S = 0.01, 10.0, 25 * 60
MEMORY_INTERVAL_S, MEMORY_WARMUP_S = 30.0, 120.0


def _row(target: str, preset: str, measured: float | None, op: str, needed: float, how: str) -> dict:
    if measured is None:
        met = None
    else:
        met = {">=": measured >= needed, "<": measured < needed, "<=": measured <= needed}[op]
    return {"target": target, "preset": preset, "measured": measured, "op": op, "needed": needed, "met": met,
            "how": how}


def learner_bound(doc: dict) -> bool | None:
    """Whether the bound charges the learner at least as much per env step as the samplers together;
    None when the env, infer or learn stage did not run."""
    stages = doc["stages"]
    if not all(k in stages for k in ("env", "infer", "learn")):
        return None
    samplers_s = 1 / stages["env"]["env_steps_per_core_s"] + 1 / stages["infer"]["samples_per_core_s"]
    learner_s = doc["counts"]["epochs"] / stages["learn"]["samples_per_core_s"]
    return learner_s >= samplers_s


def judge_bench(preset: str, doc: dict) -> list[dict]:
    """The targets one preset's `fastrl bench` document answers."""
    rows = []
    stages, eff = doc["stages"], doc.get("efficiency", {})
    train = stages.get("train")
    how = "fastrl bench, train stage, the median round"
    if preset in TRAIN_ENV_STEPS_PER_S:
        rows.append(_row("train, env steps/s", preset, train and stage_rate("train", train), ">=",
                         TRAIN_ENV_STEPS_PER_S[preset], how))
    if preset in TRAIN_OF_BOUND:
        rows.append(_row("train / machine bound", preset, eff.get("train"), ">=", TRAIN_OF_BOUND[preset],
                         "fastrl bench, the median of the rounds' own ratios"))
    rows.append(_row("sample / machine bound", preset, eff.get("sample"), ">=", SAMPLE_OF_BOUND,
                     "fastrl bench, the median of the rounds' own ratios"))
    wait = doc.get("learner_wait_median", train and train.get("learner_wait_fraction"))
    bound_by_learner = learner_bound(doc)
    if bound_by_learner:
        rows.append(_row("learner waiting for data (learner-bound)", preset, wait, "<", LEARNER_WAIT,
                         "fastrl bench, train stage, the median of the rounds"))
    elif wait is not None:
        why = "not learner-bound" if bound_by_learner is False else "no env/infer/learn stages to tell"
        rows.append({**_row("learner waiting for data", preset, wait, "<", LEARNER_WAIT, why), "met": None})
    if preset == "pong":
        rows.append(_row("peak PSS of the process tree, MiB", preset, train and train.get("peak_total_pss_mib"),
                         "<=", PSS_MIB, how))
    return rows


def judge_growth(summary: dict | None) -> dict:
    """memory_watch's judgement of a long Pong run, as the "no growth" target."""
    how = (f"bench/memory_watch.py: last fifth <= {GROWTH_FRACTION:.0%} above the first and the second half's "
           f"slope < {GROWTH_SLOPE_MIB_PER_HOUR:.0f} MiB/hour, over >= {GROWTH_MIN_JUDGED_S / 60:.0f} minutes")
    if not summary:  # not run (None), or too short to judge ({})
        return _row("no PSS growth over 30 minutes, growth %", "pong", None, "<=", 100 * GROWTH_FRACTION,
                    how + " (not judged: --memory-minutes 30)")
    growth = summary["last_fifth_mib"] / summary["first_fifth_mib"] - 1
    row = _row("no PSS growth over 30 minutes, growth %", "pong", round(100 * growth, 2), "<=",
               100 * GROWTH_FRACTION, how + f"; second-half slope {summary['second_half_slope_mib_per_hour']:+.1f} "
               f"MiB/hour over {summary['judged_s'] / 60:.0f} minutes")
    if row["met"]:
        row["met"] = (summary["second_half_slope_mib_per_hour"] < GROWTH_SLOPE_MIB_PER_HOUR
                      and summary["judged_s"] >= GROWTH_MIN_JUDGED_S)
    return row


def judge(bench_docs: dict[str, dict], first_samples_s: dict[str, list[float]], memory: dict | None) -> list[dict]:
    """Every target that what was measured answers, in the issue's order."""
    rows = []
    for preset, doc in bench_docs.items():
        rows += judge_bench(preset, doc)
    for preset, values in first_samples_s.items():
        rows.append(_row("first sample after the command, s", preset,
                         statistics.median(values) if values else None, "<", FIRST_SAMPLE_S,
                         f"fastrl train, the median of {len(values)} runs (summary.json)"))
    if memory is not None or "pong" in bench_docs:
        rows.append(judge_growth(memory))
    return rows


def format_rows(rows: list[dict]) -> str:
    def num(value):
        return "-" if value is None else f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"

    lines = [f"{'target':<44} {'preset':<12} {'measured':>10}  {'needed':<10} met"]
    for r in rows:
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        lines.append(f"{r['target']:<44} {r['preset']:<12} {num(r['measured']):>10}  "
                     f"{r['op'] + ' ' + num(r['needed']):<10} {met:<3}  ({r['how']})")
    return "\n".join(lines)


def vector_flags() -> str:
    """The CPU flags that decide the network's speed here (fp32 or bf16, AVX2 or AVX-512)."""
    flags = cpu_flags()
    if flags is None:
        return "unknown"
    return " ".join(f for f in ("avx2", "avx512f", *BF16_CPU_FLAGS) if f in flags) or "none of avx2/avx512"


def run_bench(out: Path, preset: str, seconds: float, rounds: int) -> dict:
    import side_by_side  # a sibling script: bench/ is first on sys.path when this runs as a script

    print(f"$ python -m fastrl bench --config {PRESETS[preset]} --seconds {seconds:g} --rounds {rounds}", flush=True)
    doc = side_by_side.run_bench(PRESETS[preset], [], seconds, [], rounds=rounds)
    (out / f"bench_{preset}.json").write_text(json.dumps(doc, indent=1))
    return doc


def run_startup(out: Path, preset: str, runs: int) -> list[float]:
    import median_runs  # a sibling script: bench/ is first on sys.path when this runs as a script
    args = ["--config", PRESETS[preset], "--set", f"run.train_for_env_steps={STARTUP_ENV_STEPS[preset]}"]
    values = []
    runs_dir = out / "startup_runs"
    for i in range(runs):
        summary = median_runs.run_once(args, str(runs_dir), f"{preset}_{i}", None)
        if summary is None:
            raise RuntimeError(f"fastrl train failed on {preset}")
        values.append(summary["first_sample_after_command_s"])
        print(f"  {preset} run {i}: first sample {values[-1]:.2f} s after the command", flush=True)
    return values


def run_memory(out: Path, minutes: float) -> dict:
    import memory_watch  # as above
    cmd = [sys.executable, "-m", "fastrl", "train", "--config", PRESETS["pong"], "--runs-dir", str(out / "memory_run"),
           "--name", "pong", "--set", f"run.train_for_seconds={minutes * 60:.0f}",
           "--set", "run.train_for_env_steps=1000000000000"]
    print("$ python", " ".join(cmd[1:]), flush=True)
    # its output to a file: a pipe nobody reads for 30 minutes would fill and stall the run
    log_path = out / "memory_run.txt"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        root, started, samples = psutil.Process(proc.pid), time.monotonic(), []
        while proc.poll() is None:
            try:
                samples.append((time.monotonic() - started, memory_watch.tree_pss_mib(root)))
            except psutil.NoSuchProcess:
                break
            time.sleep(MEMORY_INTERVAL_S)
    if proc.wait() != 0:
        raise RuntimeError(f"the memory run failed:\n{log_path.read_text()[-2000:]}")
    summary = memory_watch.judge_growth(samples, MEMORY_WARMUP_S)
    print("too few samples after the warm-up to judge growth" if summary is None else memory_watch.report(summary),
          flush=True)
    return summary or {}  # {}: run, but too short to judge


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="fastrl bench's measuring time per stage")
    parser.add_argument("--rounds", type=int, default=3, help="fastrl bench's rounds")
    parser.add_argument("--startup-runs", type=int, default=5, help="fastrl train runs per preset for the first sample")
    parser.add_argument("--memory-minutes", type=float, default=0.0, help="length of the Pong memory run (0: none)")
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS), help="only these presets")
    parser.add_argument("--out", default="runs/targets", help="folder for what is measured and targets.json "
                        "(runs/ is git-ignored)")
    parser.add_argument("--judge", metavar="DIR", help="judge what an earlier call wrote in DIR; run nothing")
    args = parser.parse_args()
    presets = args.preset or list(PRESETS)
    out = Path(args.judge or args.out).resolve()
    os.chdir(ROOT)
    if args.judge:
        measured = json.loads((out / "measured.json").read_text())
    else:
        out.mkdir(parents=True, exist_ok=True)
        measured = {"cpu_flags": vector_flags(), "bench": {}, "first_samples_s": {}, "memory": None}
        for preset in presets:
            measured["bench"][preset] = run_bench(out, preset, args.seconds, args.rounds)
        for preset in presets:
            measured["first_samples_s"][preset] = run_startup(out, preset, args.startup_runs)
        if args.memory_minutes > 0:
            measured["memory"] = run_memory(out, args.memory_minutes)
        (out / "measured.json").write_text(json.dumps(measured, indent=1))
    rows = judge(measured["bench"], measured["first_samples_s"], measured["memory"])
    print(f"issue #5's targets on this box (CPU flags: {measured['cpu_flags']}; the targets were set on an "
          "avx512_bf16 host)")
    print(format_rows(rows))
    (out / "targets.json").write_text(json.dumps({"cpu_flags": measured["cpu_flags"], "rows": rows}, indent=1))
    print(f"wrote {out / 'measured.json'} and {out / 'targets.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
