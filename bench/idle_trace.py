"""Why the cores idle during a `fastrl bench` stage: a kernel scheduler trace, classified.

    python bench/idle_trace.py --config configs/atari_pong.yaml [--set KEY=VALUE ...] [--stage sample]
                               [--seconds 30] [--delay-s 15] [--trace-s 8]

Runs one `fastrl bench` stage and, once it is measuring, records every context switch, wake-up and
migration on all CPUs for `--trace-s` seconds (`perf sched record -k CLOCK_MONOTONIC -a`: the
monotonic clock, because on these VMs the per-CPU scheduler clocks disagree by milliseconds and the
merged timeline is then nonsense). It replays the trace and splits each CPU's idle time by what
the rest of the machine held at that moment:
  - queued on another core: a thread was runnable in a busy core's run queue (it had been
    preempted there, or woken there) while this core idled, until a balancer or a wake-up moved it;
  - woken here, not yet running: a thread woken onto this core had not been switched in yet (an idle
    vCPU's wake-up latency);
  - nothing runnable: every thread slept (the pipeline's real waits).
For the idle time with a thread queued on another core it names the queued threads' processes, how they
got there (preempted on that core, or woken onto it while this one idled), and how long such stretches
last: stretches of milliseconds, up to the busy core's next scheduler tick (4 ms at HZ=250), point at the
kernel's periodic balancing, where a migration or a wake-up takes tens of microseconds. It also prints, per fastrl process, how
often its threads were switched out and their mean slice.
Needs `perf` and the right to trace the scheduler (root, or perf_event_paranoid <= -1).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from fastrl.bench.measure import fastrl_children

ROOT = Path(__file__).resolve().parent.parent
SWITCH = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch: prev_comm=(.*) prev_pid=(\d+) prev_prio=\d+ "
                    r"prev_state=(\S+) ==> next_comm=(.*) next_pid=(\d+)")
WAKING = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_waking: comm=.* pid=(\d+) prio=\d+ target_cpu=(\d+)")
MIGRATE = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_migrate_task: comm=.* pid=(\d+) prio=\d+ orig_cpu=(\d+) "
                     r"dest_cpu=(\d+)")
IDLE_KINDS = ("queued on another core", "woken here, not yet running", "nothing runnable")
LONG_STRETCH_S = 1e-3  # a quarter of a 250 Hz tick: far longer than a migration or a wake-up takes


def classify_idle(lines: list[str]) -> dict:
    """Replay `perf script -F cpu,time,event,trace` lines. Returns idle CPU-seconds by kind, the traced
    window, per thread id its comm, switch-outs and on-CPU seconds, and for the idle time "queued on
    another core": the CPU-seconds charged to each queued thread (shared equally when several were queued)
    by how it got into that queue ("preempted" or "woken"), and the lengths of the stretches."""
    current: dict[int, int] = {}  # cpu -> tid running (0: idle)
    queued: dict[int, int] = {}  # runnable tid -> cpu whose run queue holds it
    queued_how: dict[int, str] = {}  # runnable tid -> "preempted" or "woken"
    on_since: dict[int, float] = {}
    threads: dict[int, dict] = collections.defaultdict(lambda: {"comm": "", "switches": 0, "on_cpu_s": 0.0})
    idle_s = dict.fromkeys(IDLE_KINDS, 0.0)
    queued_idle: dict[tuple, float] = collections.defaultdict(float)  # (tid, how) -> idle CPU-s charged to it
    stretch_since: dict[int, float] = {}  # idle cpu -> when its current "queued on another core" stretch began
    stretches_s: list[float] = []
    first_t = last_t = None
    for line in lines:
        switch = SWITCH.search(line)
        waking = None if switch else WAKING.search(line)
        migrate = None if (switch or waking) else MIGRATE.search(line)
        event = switch or waking or migrate
        if event is None:
            continue
        t = float(event.group(2))
        if last_t is not None and current:
            for cpu, tid in current.items():
                if tid:
                    kind = None
                elif any(where == cpu for where in queued.values()):
                    kind = "woken here, not yet running"
                else:
                    kind = "queued on another core" if queued else "nothing runnable"
                if kind:
                    idle_s[kind] += t - last_t
                if kind == "queued on another core":
                    for waiting in queued:
                        queued_idle[(waiting, queued_how[waiting])] += (t - last_t) / len(queued)
                    stretch_since.setdefault(cpu, last_t)
                elif cpu in stretch_since:
                    stretches_s.append(last_t - stretch_since.pop(cpu))
        first_t = t if first_t is None else first_t
        last_t = t
        if switch:
            cpu, prev_comm, prev, state, next_comm, nxt = (int(switch.group(1)), switch.group(3), int(switch.group(4)),
                                                           switch.group(5), switch.group(6), int(switch.group(7)))
            if prev:
                threads[prev]["comm"] = prev_comm
                threads[prev]["switches"] += 1
                threads[prev]["on_cpu_s"] += t - on_since.pop(prev, t)
                if state.startswith("R"):
                    queued[prev] = cpu  # preempted: still runnable, in this core's queue
                    queued_how[prev] = "preempted"
                else:
                    queued.pop(prev, None)
            if nxt:
                threads[nxt]["comm"] = next_comm
                on_since[nxt] = t
            queued.pop(nxt, None)
            current[cpu] = nxt
        elif waking:
            tid = int(waking.group(3))
            if tid not in current.values():
                queued[tid] = int(waking.group(4))
                queued_how[tid] = "woken"
        else:
            tid = int(migrate.group(3))
            if tid in queued:
                queued[tid] = int(migrate.group(5))
    stretches_s.extend(last_t - since for since in stretch_since.values())  # still open when the trace ended
    window_s = (last_t - first_t) if first_t is not None else 0.0
    return {"window_s": window_s, "cpus": len(current), "idle_s": idle_s, "threads": dict(threads),
            "queued_idle_s": dict(queued_idle), "queued_stretches_s": sorted(stretches_s)}


def thread_groups(root: psutil.Process) -> dict[int, str]:
    """Thread id -> the title of the run's process that holds it, for every worker under `root`."""
    groups = {}
    for name, proc in fastrl_children(root).items():
        try:
            groups.update({thread.id: f"fastrl-{name}" for thread in proc.threads()})
        except psutil.Error:
            continue
    return groups


def report(result: dict, groups: dict[int, str]) -> str:
    idle_total = sum(result["idle_s"].values())
    window, cpus = result["window_s"], result["cpus"]
    lines = [f"traced {window:.2f} s on {cpus} CPUs: idle {idle_total:.3f} CPU-s "
             f"({idle_total / max(window * cpus, 1e-9):.1%} of the cores)"]
    for kind in IDLE_KINDS:
        share = result["idle_s"][kind] / idle_total if idle_total else 0.0
        lines.append(f"  {kind:28s} {result['idle_s'][kind]:.3f} CPU-s ({share:.0%} of the idle time)")
    queued_by: dict[str, dict] = collections.defaultdict(lambda: {"preempted": 0.0, "woken": 0.0})
    for (tid, how), seconds in result["queued_idle_s"].items():
        queued_by[groups.get(tid, "other processes")][how] += seconds
    if queued_by:
        lines.append("  queued on another core, by the queued thread's process: CPU-s while preempted there / "
                     "woken onto it")
        for name, how in sorted(queued_by.items(), key=lambda item: -sum(item[1].values())):
            lines.append(f"    {name:26s} {how['preempted']:.3f} / {how['woken']:.3f}")
    stretches = result["queued_stretches_s"]
    if stretches:
        def quantile(q: float) -> float:
            return stretches[min(len(stretches) - 1, int(q * len(stretches)))]

        long_s = sum(s for s in stretches if s >= LONG_STRETCH_S)
        lines.append(f"  its {len(stretches)} stretches: median {quantile(0.5) * 1e3:.2f} ms, p90 "
                     f"{quantile(0.9) * 1e3:.2f} ms, max {stretches[-1] * 1e3:.2f} ms; "
                     f"{long_s / max(sum(stretches), 1e-12):.0%} of that idle time in stretches of "
                     f"{LONG_STRETCH_S * 1e3:.0f} ms or more")
    per_group: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for tid, info in result["threads"].items():
        name = groups.get(tid)
        if name:
            per_group[name][0] += info["switches"]
            per_group[name][1] += info["on_cpu_s"]
    lines.append("per process (all its threads): switched out / on-CPU s / mean slice ms")
    for name, (switches, on_cpu_s) in sorted(per_group.items()):
        lines.append(f"  {name:24s} {switches:6d}  {on_cpu_s:6.2f}  {1e3 * on_cpu_s / max(switches, 1):.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/atari_pong.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--stage", default="sample", choices=("sample", "train"))
    parser.add_argument("--seconds", type=float, default=30.0, help="the bench stage's measuring time")
    parser.add_argument("--delay-s", type=float, default=15.0, help="from launching the bench to starting the trace")
    parser.add_argument("--trace-s", type=float, default=8.0)
    args = parser.parse_args()
    if args.delay_s + args.trace_s > args.seconds:
        parser.error("--delay-s + --trace-s must end before the stage's --seconds do")
    bench_cmd = [sys.executable, "-m", "fastrl", "bench", "--config", args.config, "--stage", args.stage,
                 "--seconds", str(args.seconds)] + [a for kv in args.set for a in ("--set", kv)]
    with tempfile.TemporaryDirectory(prefix="fastrl-idle-trace-") as tmp:
        data = Path(tmp) / "sched.data"
        bench = subprocess.Popen(bench_cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(args.delay_s)
            groups = thread_groups(psutil.Process(bench.pid))  # while the run's processes exist
            subprocess.run(["perf", "sched", "record", "-k", "CLOCK_MONOTONIC", "-a", "-o", str(data), "--",
                            "sleep", str(args.trace_s)], check=True, capture_output=True)
            out, _ = bench.communicate(timeout=args.seconds + 300)
        finally:
            if bench.poll() is None:
                bench.kill()
        script = subprocess.run(["perf", "script", "-i", str(data), "-F", "cpu,time,event,trace"], check=True,
                                capture_output=True, text=True).stdout.splitlines()
    print("\n".join(line for line in out.splitlines() if line.startswith(("sample", "train", "  the cores"))
                    and "[" not in line))
    print(report(classify_idle(script), groups))


if __name__ == "__main__":
    main()
