"""Total PSS of a running fastrl process tree over time: does memory grow during a long run?

    python bench/memory_watch.py --pid <runner pid> [--interval-s 30] [--json mem.json]

Samples the runner and all its children every --interval-s until the runner exits. PSS counts
each shared page once across the tree, so the shared trajectory slots are not counted once per
process. Each line gives the tree's total and each process's share, by its title
(learner, inference-0, rollout-1, ...; a replaced worker keeps its title).

At the end it judges the samples after the warm-up: the medians of the first and last fifth,
the least-squares slope in MiB per hour over all of them and over their second half, and the
largest rise between two samples and which process made it, leaving out the last samples if they
caught the run shutting down (a worker already gone). The second-half slope is there
because a one-off step (an allocator arena, a cache filled once) makes the whole-run slope read
as growth that stops; a leak rises in both halves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import psutil

from fastrl.bench.measure import fastrl_children

MiB = 2**20


def tree_pss_mib(root: psutil.Process) -> dict[str, float]:
    """PSS in MiB of the runner and each living child: fastrl's workers by title (fastrl_children), any
    other child (multiprocessing's resource tracker) by its name, the same label summed."""
    titled = fastrl_children(root)
    procs = [("runner", root), *titled.items()]
    titled_pids = {proc.pid for proc in titled.values()}
    for child in root.children(recursive=True):
        if child.pid not in titled_pids:
            try:
                procs.append((child.name(), child))
            except psutil.NoSuchProcess:
                continue
    by_label: dict[str, float] = {}
    for label, proc in procs:
        try:
            mem = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        by_label[label] = by_label.get(label, 0.0) + getattr(mem, "pss", mem.rss) / MiB
    return by_label


def slope_mib_per_hour(times_s: list[float], totals_mib: list[float]) -> float:
    if len(times_s) < 2:
        return 0.0
    return float(np.polyfit(np.asarray(times_s), np.asarray(totals_mib), 1)[0] * 3600)


def judge_growth(samples: list[tuple[float, dict[str, float]]], warmup_s: float) -> dict | None:
    """Summary of the samples taken at or after warmup_s, less the run's shutdown; None with fewer than 5.

    The shutdown: trailing samples that lack a process every sample of the first half had (a child seen
    only now and then, say a shell, sets no such bar). The watch samples until the runner exits, so its last
    sample can catch the workers already gone (stop 76's flat 30-minute run, 781 MiB throughout, read a
    second-half slope of -602 MiB/hour from one such sample). Left in, such a drop would pull the slope down
    and could hide a leak's rise."""
    judged = [(t, parts) for t, parts in samples if t >= warmup_s]
    steady = set.intersection(*(set(parts) for _, parts in judged[:max(1, len(judged) // 2)])) if judged else set()
    shutdown = 0
    while len(judged) > 1 and not steady <= set(judged[-1][1]):
        judged.pop()
        shutdown += 1
    if len(judged) < 5:
        return None
    times = [t for t, _ in judged]
    totals = [sum(parts.values()) for _, parts in judged]
    fifth = max(1, len(judged) // 5)
    half = len(judged) // 2
    rise_mib, rise_at = 0.0, 0
    for i in range(1, len(totals)):
        if totals[i] - totals[i - 1] > rise_mib:
            rise_mib, rise_at = totals[i] - totals[i - 1], i
    rise_by = None
    if rise_at:
        before, after = judged[rise_at - 1][1], judged[rise_at][1]
        rise_by = max(after, key=lambda label: after[label] - before.get(label, 0.0))
    labels = sorted({label for _, parts in judged for label in parts})
    return {
        "judged_s": times[-1] - times[0],
        "shutdown_samples_left_out": shutdown,
        "first_fifth_mib": statistics.median(totals[:fifth]),
        "last_fifth_mib": statistics.median(totals[-fifth:]),
        "peak_mib": max(totals),
        "slope_mib_per_hour": slope_mib_per_hour(times, totals),
        "second_half_slope_mib_per_hour": slope_mib_per_hour(times[half:], totals[half:]),
        "largest_rise_mib": rise_mib,
        "largest_rise_at_s": times[rise_at] if rise_at else None,
        "largest_rise_by": rise_by,
        "by_process_first_last_fifth_mib": {
            label: (statistics.median(parts.get(label, 0.0) for _, parts in judged[:fifth]),
                    statistics.median(parts.get(label, 0.0) for _, parts in judged[-fifth:]))
            for label in labels
        },
    }


def report(summary: dict) -> str:
    lines = [
        f"PSS over {summary['judged_s']:.0f} s after warm-up: first fifth {summary['first_fifth_mib']:.0f} MiB, "
        f"last fifth {summary['last_fifth_mib']:.0f} MiB, peak {summary['peak_mib']:.0f} MiB, "
        f"slope {summary['slope_mib_per_hour']:+.1f} MiB/hour "
        f"(second half {summary['second_half_slope_mib_per_hour']:+.1f})"
    ]
    if summary.get("shutdown_samples_left_out"):
        lines.append(f"left out: the last {summary['shutdown_samples_left_out']} sample(s), taken as the run shut down")
    if summary["largest_rise_by"] is not None:
        lines.append(f"largest rise between two samples: {summary['largest_rise_mib']:+.1f} MiB at "
                     f"{summary['largest_rise_at_s']:.0f} s, mostly {summary['largest_rise_by']}")
    for label, (first, last) in summary["by_process_first_last_fifth_mib"].items():
        lines.append(f"  {label:<20} first fifth {first:8.1f} MiB, last fifth {last:8.1f} MiB ({last - first:+.1f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=120.0, help="samples before this are not judged")
    parser.add_argument("--json")
    args = parser.parse_args()
    root = psutil.Process(args.pid)
    started = time.monotonic()
    samples: list[tuple[float, dict[str, float]]] = []  # (seconds since start, PSS MiB by process)
    while root.is_running() and root.status() != psutil.STATUS_ZOMBIE:
        try:
            parts = tree_pss_mib(root)
        except psutil.NoSuchProcess:
            break
        samples.append((time.monotonic() - started, parts))
        shares = ", ".join(f"{label} {mib:.1f}" for label, mib in sorted(parts.items()))
        print(f"{samples[-1][0]:8.0f} s  {sum(parts.values()):8.1f} MiB  ({shares})", flush=True)
        time.sleep(args.interval_s)
    summary = judge_growth(samples, args.warmup_s)
    if summary is None:
        print("too few samples after the warm-up to judge growth")
        return
    print(report(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, **summary}))


if __name__ == "__main__":
    main()
