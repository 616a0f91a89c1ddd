"""Run `fastrl train` several times and print the medians of what summary.json records.

Used for the figures quoted in issues and the README, e.g.
    .venv/bin/python bench/median_runs.py --runs 3 -- --config configs/cartpole.yaml
    .venv/bin/python bench/median_runs.py --runs 3 -- --config configs/atari_pong.yaml \
        --set run.train_for_seconds=75 --set run.train_for_env_steps=100000000
Everything after `--` is passed to `fastrl train`. Runs go to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEYS = ("wall_s", "env_steps", "mean_env_steps_per_s", "env_steps_per_s_last_60s", "final_mean_return",
        "time_to_first_sample_s", "first_sample_after_command_s", "first_train_after_command_s",
        "learner_busy_fraction")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    train_args = [a for a in args.train_args if a != "--"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            start = time.monotonic()
            cmd = [sys.executable, "-m", "fastrl", "train", "--runs-dir", tmp, "--name", f"run{i}", *train_args]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            command_s = time.monotonic() - start
            if proc.returncode != 0:
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
                return proc.returncode
            summary = json.loads((Path(tmp) / f"run{i}" / "summary.json").read_text())
            summary["command_wall_s"] = round(command_s, 1)
            rows.append(summary)
            print(f"run {i}: " + ", ".join(f"{k}={summary.get(k)}" for k in ("command_wall_s", *KEYS)), flush=True)
    print("median of", len(rows), "runs:")
    for key in ("command_wall_s", *KEYS):
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            print(f"  {key}: {statistics.median(values):,.2f} (min {min(values):,.2f}, max {max(values):,.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
