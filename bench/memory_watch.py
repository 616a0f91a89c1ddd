"""Total PSS of a running fastrl process tree over time: does memory grow during a long run?

    python bench/memory_watch.py --pid <runner pid> [--interval-s 30] [--json mem.json]

Samples the runner and all its children every --interval-s until the runner exits, then prints
the median PSS of the first and last fifth of the samples (after a warm-up) and the least-squares
slope in MiB per hour. PSS counts each shared page once across the tree, so the shared trajectory
slots are not counted once per process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import psutil


def tree_pss_bytes(root: psutil.Process) -> int:
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            mem = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += getattr(mem, "pss", mem.rss)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=120.0, help="samples before this are not judged")
    parser.add_argument("--json")
    args = parser.parse_args()
    root = psutil.Process(args.pid)
    started = time.monotonic()
    samples: list[tuple[float, float]] = []  # (seconds since start, PSS MiB)
    while root.is_running() and root.status() != psutil.STATUS_ZOMBIE:
        try:
            samples.append((time.monotonic() - started, tree_pss_bytes(root) / 2**20))
        except psutil.NoSuchProcess:
            break
        print(f"{samples[-1][0]:8.0f} s  {samples[-1][1]:8.1f} MiB", flush=True)
        time.sleep(args.interval_s)
    judged = [s for s in samples if s[0] >= args.warmup_s]
    if len(judged) < 5:
        print("too few samples after the warm-up to judge growth")
        return
    fifth = max(1, len(judged) // 5)
    first = statistics.median(m for _, m in judged[:fifth])
    last = statistics.median(m for _, m in judged[-fifth:])
    t, m = np.array([s[0] for s in judged]), np.array([s[1] for s in judged])
    slope_per_h = float(np.polyfit(t, m, 1)[0] * 3600)
    print(f"PSS over {judged[-1][0] - judged[0][0]:.0f} s after warm-up: first fifth {first:.0f} MiB, "
          f"last fifth {last:.0f} MiB, peak {m.max():.0f} MiB, slope {slope_per_h:+.1f} MiB/hour")
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, "first_fifth_mib": first, "last_fifth_mib": last,
                                               "peak_mib": float(m.max()), "slope_mib_per_hour": slope_per_h}))


if __name__ == "__main__":
    main()
