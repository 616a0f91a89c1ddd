"""bench/idle_trace.py's replay of a scheduler trace: which idle time is counted as which kind."""

import importlib.util

import pytest

from helpers import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("idle_trace", ROOT / "bench" / "idle_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _switch(cpu, t, prev, state, nxt):
    names = {0: "swapper/%d" % cpu}
    return (f"[{cpu:03d}]  {t:.6f}:       sched:sched_switch: prev_comm={names.get(prev, f'fastrl-t{prev}')} "
            f"prev_pid={prev} prev_prio=139 prev_state={state} ==> next_comm={names.get(nxt, f'fastrl-t{nxt}')} "
            f"next_pid={nxt} next_prio=139")


def _waking(cpu, t, tid, target):
    return f"[{cpu:03d}]  {t:.6f}:       sched:sched_waking: comm=fastrl-t{tid} pid={tid} prio=139 target_cpu={target:03d}"


def _migrate(cpu, t, tid, orig, dest):
    return (f"[{cpu:03d}]  {t:.6f}: sched:sched_migrate_task: comm=fastrl-t{tid} pid={tid} prio=139 "
            f"orig_cpu={orig} dest_cpu={dest}")


def test_idle_time_is_split_by_what_the_other_core_holds():
    it = _load()
    lines = [
        _switch(0, 1.000, 0, "R", 11),   # cpu 0 runs thread 11
        _switch(1, 1.000, 0, "R", 12),   # cpu 1 runs thread 12
        _waking(1, 1.001, 13, 1),        # 13 woken onto cpu 1 ...
        _switch(1, 1.001, 12, "R", 13),  # ... preempts 12, which stays runnable in cpu 1's queue
        _switch(0, 1.002, 11, "S", 0),   # cpu 0 idles while 12 waits on cpu 1: 3 ms "queued on another core"
        _migrate(0, 1.005, 12, 1, 0),    # the balancer pulls 12
        _switch(0, 1.005, 0, "R", 12),
        _switch(0, 1.006, 12, "S", 0),   # cpu 0 idles, nothing queued: 1 ms "nothing runnable"
        _waking(1, 1.007, 11, 0),        # 11 woken onto idle cpu 0: 0.5 ms "woken here, not yet running"
        _switch(0, 1.0075, 0, "R", 11),
        _switch(0, 1.0080, 11, "S", 0),  # cpu 0 idles with nothing runnable for 2 ms ...
        _switch(1, 1.0090, 13, "S", 0),  # ... and cpu 1 for 1 ms ...
        "[001]  1.010000: sched:sched_stat_runtime: comm=x pid=5 runtime=1 [ns]",  # not an event it replays
        _waking(1, 1.010, 11, 1),        # ... until 11 wakes onto cpu 1: for 1 ms cpu 0 sees it queued there
        _switch(1, 1.011, 0, "R", 11),
    ]
    result = it.classify_idle(lines)
    idle = result["idle_s"]
    assert idle["queued on another core"] == pytest.approx(0.003 + 0.001, abs=1e-9)
    assert idle["woken here, not yet running"] == pytest.approx(0.0005 + 0.001, abs=1e-9)
    assert idle["nothing runnable"] == pytest.approx(0.001 + 0.002 + 0.001, abs=1e-9)
    assert result["window_s"] == pytest.approx(0.011) and result["cpus"] == 2
    # switch-outs and on-CPU time per thread: 12 ran 1-1.001 and 1.005-1.006
    assert result["threads"][12]["switches"] == 2
    assert result["threads"][12]["on_cpu_s"] == pytest.approx(0.002)
    text = it.report(result, {11: "fastrl-rollout-0", 12: "fastrl-rollout-0", 13: "fastrl-inference-0"})
    assert "fastrl-rollout-0" in text and "queued on another core" in text
