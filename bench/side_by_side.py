"""Two variants of a preset measured alternately by `fastrl bench`, so drift hits both alike.

    python bench/side_by_side.py --config configs/atari_pong.yaml \
        --before model.precision=fp32 --before system.native_rings=false --rounds 2 --seconds 20

`--before` overrides make the "before" variant; "after" is the preset as shipped (plus any
`--after` overrides). `--before-tree DIR` runs the before variant from another copy of the code
(say an older commit checked out there, with its fastrl_ext built), for a change no switch turns off;
it reads that copy's own preset at the same relative path, where there is one. Each round runs
`fastrl bench` on before, then after; the table shows the median over rounds of each stage's rate
(sample and train: over the whole measurement), and after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fastrl.bench.measure import headline_rate
from fastrl.bench.report import cpu_ms_per_env_step
from fastrl.bench.rounds import RATE_KEYS


def run_bench(config: str, overrides: list, seconds: float, stages: list, tree: str | None = None,
              rounds: int = 1) -> dict:
    """One `fastrl bench` run (of `rounds` rounds; every stage where `stages` is empty); from the code
    in `tree` (its own fastrl and fastrl_ext) when given. Also bench/targets.py's."""
    env = None
    if tree is not None:
        env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
        # the tree's own copy of the preset where it has one: its code may not know a newer preset's keys
        own = Path(tree) / config
        config = str(own.resolve() if not Path(config).is_absolute() and own.exists() else Path(config).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "fastrl.cli", "bench", "--config", config, "--seconds", str(seconds),
               "--rounds", str(rounds), "--json", str(out)]
        for o in overrides:
            cmd += ["--set", o]
        for s in stages:
            cmd += ["--stage", s]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tree, env=env)
        return json.loads(out.read_text())


def summary_row(doc: dict) -> dict:
    row = {name: headline_rate(st[RATE_KEYS[name]]) for name, st in doc["stages"].items() if name in RATE_KEYS}
    train = doc["stages"].get("train", {})
    bound, eff = doc.get("bound", {}), doc.get("efficiency", {})
    row.update({"train_bound": bound.get("train_env_steps_per_s"), "train_efficiency": eff.get("train"),
                "sample_bound": bound.get("sample_env_steps_per_s"), "sample_efficiency": eff.get("sample")})
    row["peak_pss_mib"] = train.get("peak_total_pss_mib")
    row["first_sample_s"] = train.get("time_to_first_sample_s")
    row["learner_wait"] = train.get("learner_wait_fraction")
    row["learner_parallel"] = train.get("learner_parallel_fraction")
    # a round the hypervisor took cores from reads slow for reasons outside the code
    for name in ("sample", "train"):
        shares = doc["stages"].get(name, {}).get("core_shares")
        if shares:
            row[f"{name}_cores_stolen"] = shares["stolen"]
    # what an env step trained cost the machine, whole tree and by role: steadier than the rate on a
    # host whose speed drifts between rounds, since a slower round is slower for every process alike
    if train.get("processes") and row.get("train"):
        per_step = cpu_ms_per_env_step(train)
        row["train_cpu_ms_per_env_step"] = sum(per_step.values())
        row.update({f"{role}_cpu_ms_per_env_step": v for role, v in per_step.items()})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--before", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--after", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--before-tree", metavar="DIR", help="run the before variant from the code in DIR")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--stage", action="append", default=[], help="stages to run (default: all)")
    parser.add_argument("--json")
    args = parser.parse_args()
    runs: dict[str, list] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, overrides, tree in (("before", args.before, args.before_tree), ("after", args.after, None)):
            runs[name].append(run_bench(args.config, overrides, args.seconds, args.stage, tree))
    rows = {name: [summary_row(d) for d in docs] for name, docs in runs.items()}
    keys = [k for k in rows["after"][0] if rows["after"][0][k] is not None]
    before = " ".join(([f"code in {args.before_tree}"] if args.before_tree else []) + args.before) or "preset"
    print(f"{args.config}: before = {before}; after = {' '.join(args.after) or 'preset'}; "
          f"{args.rounds} round(s) of {args.seconds} s stages")
    print(f"{'':34}{'before':>12}{'after':>12}{'after/before':>14}")
    medians = {}
    for key in keys:
        values = {n: [r[key] for r in rows[n] if r.get(key) is not None] for n in rows}
        if not values["before"] or not values["after"]:
            continue
        b, a = statistics.median(values["before"]), statistics.median(values["after"])
        medians[key] = {"before": b, "after": a}
        print(f"{key:<34}{b:>12,.3f}{a:>12,.3f}{a / b if b else float('nan'):>13.3f}x")
    # each round's after/before, for the keys that move most with the host's drift
    for key in ("train", "sample", "train_cpu_ms_per_env_step"):
        pairs = [(b.get(key), a.get(key)) for b, a in zip(rows["before"], rows["after"])]
        if pairs and all(b and a for b, a in pairs):
            print(f"{key + ' after/before per round':<48}" + " ".join(f"{a / b:.3f}" for b, a in pairs))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "medians": medians, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
