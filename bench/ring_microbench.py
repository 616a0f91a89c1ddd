"""Microbenchmark of fastrl's rings: the C++ path (fastrl_ext) against the Python reference.

    python bench/ring_microbench.py [--seconds 2] [--json rings.json]

Measures, for each implementation (medians of --repeats runs):
- push+pop: one process pushes a 6-field request record and pops it back (ns per record),
  the pure per-call cost with nobody to wake;
- batch: push_many of 16 records, then pop_all (ns per record);
- ping-pong: a round trip to another process and back, each side asleep on its doorbell in
  between (us per round trip) -- the rollout <-> inference pattern;
- stream: another process pushes as fast as it can while this one pops (records/s).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from pathlib import Path

from fastrl.buffers import ShmAllocator
from fastrl.ipc import Doorbell, IntRing, wait_any

RECORD = (1, 0, 1, 12345, 17, 3)


def _ring(alloc, name, native, capacity=64, width=6):
    return IntRing.allocate(alloc, name, capacity, width, Doorbell.allocate(alloc, f"{name}.bell", native))


def push_pop_ns(ring, seconds: float) -> float:
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(1000):
            ring.push(RECORD)
            ring.pop_all()
        n += 1000
    return (time.perf_counter() - started) / n * 1e9


def batch_ns(ring, seconds: float) -> float:
    records = [RECORD] * 16
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(200):
            ring.push_many(records)
            ring.pop_all()
        n += 200 * 16
    return (time.perf_counter() - started) / n * 1e9


def _echo(requests, replies, seconds: float) -> None:
    deadline = time.monotonic() + seconds + 5
    while time.monotonic() < deadline:
        wait_any(requests.bell, [requests], 0.1)
        got = requests.pop_all()
        if got:
            if got[-1][0] < 0:
                return
            replies.push_many(got)


def ping_pong_us(alloc, native: bool, seconds: float) -> float:
    requests, replies = _ring(alloc, "req", native), _ring(alloc, "rep", native)
    p = mp.get_context("spawn").Process(target=_echo, args=(requests, replies, seconds))
    p.start()
    for _ in range(50):  # warm-up, and wait for the child to be running
        requests.push(RECORD)
        while not replies.pop_all():
            wait_any(replies.bell, [replies], 1.0)
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        requests.push(RECORD)
        while not replies.pop_all():
            wait_any(replies.bell, [replies], 1.0)
        n += 1
    elapsed = time.perf_counter() - started
    requests.push((-1, 0, 0, 0, 0, 0))
    p.join(10)
    return elapsed / n * 1e6


def _stream(ring, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        if len(ring) < ring.capacity:
            ring.push((i, 0, 0, 0, 0, 0))
            i += 1
    ring.push_many([(-1, 0, 0, 0, 0, 0)]) if len(ring) < ring.capacity else None


def stream_per_s(alloc, native: bool, seconds: float) -> float:
    ring = _ring(alloc, "stream", native, capacity=256)
    p = mp.get_context("spawn").Process(target=_stream, args=(ring, seconds + 1.0))
    p.start()
    while not len(ring):
        time.sleep(0.001)
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        wait_any(ring.bell, [ring], 0.1)
        n += len(ring.pop_all())
    elapsed = time.perf_counter() - started
    p.join(10)
    if p.is_alive():
        p.kill()
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    results: dict = {}
    alloc = ShmAllocator()
    try:
        for rep in range(args.repeats):  # alternate implementations so drift hits both alike
            for native in (False, True):
                name = "native" if native else "python"
                row = results.setdefault(name, {"push_pop_ns": [], "batch16_ns_per_record": [],
                                                "ping_pong_us": [], "stream_records_per_s": []})
                ring = _ring(alloc, f"{name}{rep}", native)
                row["push_pop_ns"].append(push_pop_ns(ring, args.seconds))
                row["batch16_ns_per_record"].append(batch_ns(ring, args.seconds))
                row["ping_pong_us"].append(ping_pong_us(alloc, native, args.seconds))
                row["stream_records_per_s"].append(stream_per_s(alloc, native, args.seconds))
                alloc.unlink_all()
                alloc = ShmAllocator()
    finally:
        alloc.unlink_all()
    medians = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in results.items()}
    print(f"{'':28}{'python':>14}{'native':>14}{'ratio':>8}")
    for key, unit in (("push_pop_ns", "ns/record"), ("batch16_ns_per_record", "ns/record"),
                      ("ping_pong_us", "us/round trip"), ("stream_records_per_s", "records/s")):
        py, nat = medians["python"][key], medians["native"][key]
        ratio = py / nat if key != "stream_records_per_s" else nat / py
        print(f"{key:<28}{py:>14,.1f}{nat:>14,.1f}{ratio:>7.1f}x  {unit}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
