#!/usr/bin/env python
"""Chaos runs, too long for the test suite: how fastrl survives faults, in figures.

1. Worker kills: one `fastrl train` run; every --every-s seconds a random rollout or inference
   worker gets SIGKILL. Per kill: time until the runner had replaced it (train.log), time until
   env steps/s was back to 90% of the 10 s before the kill, env steps/s before and after (each over
   a 10 s window: a learner-bound run moves its counter a batch at a time), env steps lost (the dead
   worker's in-flight rollout).
2. Whole-run kills: --resumes times, start or resume a run, SIGKILL the runner at a random moment
   (checkpoints every 2 s, so some kills land during a save), check its children exit by
   themselves within 2 s, then resume: the counters must continue from the newest checkpoint.
At the end: processes and /dev/shm entries left behind (expected 0).

    bench/chaos.py --config configs/cartpole.yaml --duration-s 600 --every-s 30 --resumes 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
FASTRL = [sys.executable, "-m", "fastrl", "train"]
WINDOW_S = 10.0  # the rates around a kill are each over this long: see window_rate


def titles(pid: int) -> dict[int, str]:
    """Live descendants of pid -> process title."""
    out = {}
    try:
        for child in psutil.Process(pid).children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    out[child.pid] = (child.cmdline() or [""])[0]
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass
    return out


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def counter_series(rows: list[dict]) -> list[tuple[float, int]]:
    """(seconds since the runner's first log line, env steps so far) from metrics.jsonl rows."""
    return [(r["wall_s"], r["env_steps"]) for r in rows]


def window_rate(counts: list[tuple[float, int]], start_s: float, end_s: float) -> float | None:
    """Env steps/s between the last rows at or before `start_s` and `end_s`. Over a window, not a
    median of 1 s rates: a learner-bound run (Pong) moves its counter a batch at a time, every 1-2 s,
    so most 1 s windows read 0 or a whole batch."""
    a = next((c for c in reversed(counts) if c[0] <= start_s), None)
    b = next((c for c in reversed(counts) if c[0] <= end_s), None)
    if a is None or b is None or b[0] <= a[0] or b[0] < end_s - 2.0:  # no row near the end: the run had ended
        return None
    return (b[1] - a[1]) / (b[0] - a[0])


def rates_around_kill(counts: list[tuple[float, int]], kill_s: float) -> tuple:
    """(env steps/s over the WINDOW_S before the kill, over the next WINDOW_S from WINDOW_S after it, seconds
    until recovered or None). Recovered: the first row after the kill from which the next WINDOW_S run at 90%
    of the rate before (a window looking forward: one looking back would still hold the steps before the kill)."""
    base = window_rate(counts, kill_s - WINDOW_S, kill_s)
    after = window_rate(counts, kill_s + WINDOW_S, kill_s + 2 * WINDOW_S)
    recovered = next((t - kill_s for t, _ in counts if t > kill_s + 0.5 and base and
                      (window_rate(counts, t, t + WINDOW_S) or 0) >= 0.9 * base), None)
    return base, after, recovered


def worker_kills(config: str, duration_s: float, every_s: float, runs_dir: Path, rng: random.Random) -> dict:
    name = "worker_kills"
    cmd = FASTRL + ["--config", config, "--runs-dir", str(runs_dir), "--name", name,
                    "--set", "run.train_for_env_steps=100000000000", "--set", "run.stop_at_mean_return=null",
                    "--set", f"run.train_for_seconds={duration_s}", "--set", "run.report_interval_s=1",
                    "--set", f"system.max_restarts_per_worker={int(duration_s / every_s) + 5}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    start = time.monotonic()
    kills = []  # (seconds since start, title)
    time.sleep(every_s)
    while proc.poll() is None and time.monotonic() - start < duration_s - every_s / 2:
        victims = {pid: t for pid, t in titles(proc.pid).items() if t.startswith(("fastrl-rollout", "fastrl-inference"))}
        if victims:
            pid = rng.choice(sorted(victims))
            os.kill(pid, signal.SIGKILL)
            kills.append((time.monotonic() - start, victims[pid], time.time()))
            print(f"  killed {victims[pid]} at {kills[-1][0]:.0f} s", flush=True)
        time.sleep(every_s)
    proc.wait(duration_s + 120)
    run_dir = runs_dir / name
    summary = json.loads((run_dir / "summary.json").read_text())
    log = (run_dir / "train.log").read_text().splitlines()
    replaced = []  # wall-clock times of "replaced it" lines, and env steps lost
    for line in log:
        m = re.match(r"(\S+ \S+),(\d+) fastrl-runner INFO WARNING: (\S+) .*lost its (\d+) in-flight|"
                     r"(\S+ \S+),(\d+) fastrl-runner INFO WARNING: (\S+) .*replaced it", line)
        if m:
            stamp, ms = (m.group(1), m.group(2)) if m.group(1) else (m.group(5), m.group(6))
            t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() + int(ms) / 1000
            replaced.append((t, m.group(3) or m.group(7), int(m.group(4)) if m.group(4) else None))
    rows = read_metrics(run_dir)
    counts = counter_series(rows)
    first = re.match(r"(\S+ \S+),(\d+)", log[0])
    launch_wall = datetime.strptime(first.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(first.group(2)) / 1000
    per_kill = []
    for k_s, title, k_wall in kills:
        rep = next((r for r in replaced if r[0] >= k_wall - 0.5 and r[1] == title), None)
        k_run = k_wall - launch_wall  # metrics.jsonl's wall_s counts from the runner's first log line
        base, after, recovered = rates_around_kill(counts, k_run)
        per_kill.append({"worker": title, "at_s": round(k_s, 1),
                         "replaced_after_s": None if rep is None else round(rep[0] - k_wall, 2),
                         "recovered_after_s": None if recovered is None else round(recovered, 1),
                         "env_steps_per_s_before": None if base is None else round(base),
                         "env_steps_per_s_after": None if after is None else round(after),
                         "env_steps_lost": None if rep is None else rep[2]})
    rec = [k["recovered_after_s"] for k in per_kill if k["recovered_after_s"] is not None]
    rep_t = [k["replaced_after_s"] for k in per_kill if k["replaced_after_s"] is not None]
    lost = [k["env_steps_lost"] for k in per_kill if k["env_steps_lost"] is not None]
    return {"kills": len(kills), "replaced": len(rep_t), "exit_code": proc.returncode,
            "failure": summary.get("failure"), "env_steps": summary["env_steps"],
            "replaced_after_s": {"median": statistics.median(rep_t) if rep_t else None, "max": max(rep_t, default=None)},
            "recovered_after_s": {"median": statistics.median(rec) if rec else None, "max": max(rec, default=None),
                                  "never": len(per_kill) - len(rec)},
            "env_steps_lost_per_kill": {"median": statistics.median(lost) if lost else None,
                                        "max": max(lost, default=None)},
            "per_kill": per_kill}


def whole_run_kills(config: str, resumes: int, runs_dir: Path, rng: random.Random) -> dict:
    """Success of a resume: the learner says it resumed from the newest checkpoint on disk at that
    checkpoint's policy version, and the run's counters (metrics.jsonl) continue from its env steps."""
    name = "run_kills"
    run_dir = runs_dir / name
    ckpt_dir = run_dir / "checkpoints"
    ok, problems, children_exit_s = 0, [], []
    for i in range(resumes + 1):
        args = ["--config", config, "--runs-dir", str(runs_dir), "--name", name,
                "--set", "run.train_for_env_steps=100000000000", "--set", "run.stop_at_mean_return=null",
                "--set", "run.save_every_s=2", "--set", "run.report_interval_s=1"]
        newest = sorted(ckpt_dir.glob("checkpoint_*.pt"))[-1] if ckpt_dir.is_dir() and i > 0 else None
        if i > 0:
            args.append("--resume")
        expect = torch.load(newest, weights_only=True) if newest else None
        log_lines = len((run_dir / "train.log").read_text().splitlines()) if (run_dir / "train.log").exists() else 0
        metric_rows = len(read_metrics(run_dir))
        proc = subprocess.Popen(FASTRL + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        if i == resumes:  # the last one resumes and stops cleanly
            time.sleep(12)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(60)
            if code != 0:
                problems.append(f"final run exited {code}")
        else:
            time.sleep(rng.uniform(6, 20))
            kids = titles(proc.pid)
            proc.kill()
            proc.wait(10)
            t0 = time.monotonic()
            while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                      for p in kids) and time.monotonic() - t0 < 10:
                time.sleep(0.05)
            children_exit_s.append(time.monotonic() - t0)
        if expect is None:
            continue
        new_log = "\n".join((run_dir / "train.log").read_text().splitlines()[log_lines:])
        m = re.search(r"resumed from (\S+) at policy version (\d+)", new_log)
        rows = read_metrics(run_dir)[metric_rows:]
        if m is None:
            problems.append(f"resume {i}: no 'resumed from' in the log (killed before the learner started?)")
        elif Path(m.group(1)).name != newest.name or int(m.group(2)) != int(expect["policy_version"]):
            problems.append(f"resume {i}: resumed from {m.group(1)} v{m.group(2)}, newest was {newest.name}")
        elif rows and rows[0]["env_steps"] < int(expect["env_steps"]):
            problems.append(f"resume {i}: env steps restarted at {rows[0]['env_steps']} < {expect['env_steps']}")
        else:
            ok += 1
    return {"resumes": resumes, "succeeded": ok, "problems": problems,
            "children_exit_after_runner_kill_s": {"median": round(statistics.median(children_exit_s), 2),
                                                  "max": round(max(children_exit_s), 2)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs/cartpole.yaml"))
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--every-s", type=float, default=30.0)
    parser.add_argument("--resumes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    shm_before = set(os.listdir("/dev/shm"))
    with tempfile.TemporaryDirectory(prefix="fastrl-chaos-") as tmp:
        runs = Path(tmp)
        print(f"worker kills: one run of {args.duration_s:g} s, a worker killed every {args.every_s:g} s", flush=True)
        wk = worker_kills(args.config, args.duration_s, args.every_s, runs, rng)
        print(f"whole-run kills: {args.resumes} kill -9 of the runner, each followed by --resume", flush=True)
        rk = whole_run_kills(args.config, args.resumes, runs, rng)
        time.sleep(2)
        leftover_procs = [p.pid for p in psutil.process_iter(["cmdline"])
                          if (p.info["cmdline"] or [""])[0].startswith("fastrl-")]
        # a dead run's segments are removed by the next start; the last run stopped cleanly
        leftover_shm = sorted(set(os.listdir("/dev/shm")) - shm_before)
    result = {"worker_kills": wk, "whole_run_kills": rk, "leftover_processes": len(leftover_procs),
              "leftover_dev_shm_entries": len(leftover_shm)}
    print(json.dumps(result, indent=2))
    w = wk
    print(f"\nworker kills: {w['kills']} kills, {w['replaced']} replaced; replaced after median "
          f"{w['replaced_after_s']['median']} s (max {w['replaced_after_s']['max']}); env steps/s back to 90% after "
          f"median {w['recovered_after_s']['median']} s (max {w['recovered_after_s']['max']}, never "
          f"{w['recovered_after_s']['never']}); env steps lost per kill median {w['env_steps_lost_per_kill']['median']} "
          f"(max {w['env_steps_lost_per_kill']['max']}); run exit code {w['exit_code']}")
    print(f"whole-run kills: {rk['succeeded']}/{rk['resumes']} resumes continued from the newest checkpoint; "
          f"children gone {rk['children_exit_after_runner_kill_s']['max']} s at most after the runner's kill -9")
    print(f"left behind: {len(leftover_procs)} processes, {len(leftover_shm)} /dev/shm entries")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if (w["exit_code"] == 0 and rk["succeeded"] == rk["resumes"] and not leftover_procs
                 and not leftover_shm) else 1


if __name__ == "__main__":
    sys.exit(main())
