"""Run `fastrl train` several times and print the medians of what summary.json records.

Used for the figures quoted in issues and the README, e.g.
    .venv/bin/python bench/median_runs.py --runs 3 -- --config configs/cartpole.yaml
    .venv/bin/python bench/median_runs.py --runs 3 -- --config configs/atari_pong.yaml \
        --set run.train_for_seconds=75 --set run.train_for_env_steps=100000000
Everything after `--` is passed to `fastrl train`. Runs go to a temporary directory.
`--before-tree DIR` alternates runs of the code in DIR (a `git worktree` of an earlier commit, its
fastrl_ext built or copied in) with runs of this tree, and prints the medians of each, e.g.
    .venv/bin/python bench/median_runs.py --runs 7 --before-tree /tmp/old -- --config configs/cartpole.yaml \
        --set run.train_for_env_steps=100000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEYS = ("wall_s", "env_steps", "mean_env_steps_per_s", "env_steps_per_s_last_60s", "final_mean_return",
        "time_to_first_sample_s", "first_sample_after_command_s", "first_train_after_command_s",
        "learner_busy_fraction")


def run_once(train_args: list[str], runs_dir: str, name: str, tree: str | None) -> dict | None:
    """One `fastrl train` (of the code in `tree`, or this one); its summary.json, with the command's wall time."""
    start = time.monotonic()
    cmd = [sys.executable, "-m", "fastrl", "train", "--runs-dir", runs_dir, "--name", name, *train_args]
    env = None if tree is None else dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
    command_s = time.monotonic() - start
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        return None
    summary = json.loads((Path(runs_dir) / name / "summary.json").read_text())
    summary["command_wall_s"] = round(command_s, 2)
    return summary


def print_medians(label: str, rows: list[dict]) -> None:
    print(f"{label}median of", len(rows), "runs:")
    for key in ("command_wall_s", *KEYS):
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            print(f"  {key}: {statistics.median(values):,.2f} (min {min(values):,.2f}, max {max(values):,.2f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before-tree", metavar="DIR", help="alternate runs of the code in DIR with this tree's")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    train_args = [a for a in args.train_args if a != "--"]
    variants = {"": None} if args.before_tree is None else {"before: ": args.before_tree, "after: ": None}
    rows: dict[str, list[dict]] = {label: [] for label in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for label, tree in variants.items():  # alternated: a slow spell of the box hits both alike
                summary = run_once(train_args, tmp, f"run{i}{label.strip(': ')}", tree)
                if summary is None:
                    return 1
                rows[label].append(summary)
                print(f"{label}run {i}: " + ", ".join(f"{k}={summary.get(k)}" for k in ("command_wall_s", *KEYS)),
                      flush=True)
    for label, variant_rows in rows.items():
        print_medians(label, variant_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
