"""bench/idle_trace.py's replay of a scheduler trace: which idle time is counted as which kind."""

import pytest

from helpers import load_bench_script


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
    it = load_bench_script("idle_trace")
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
    # the queued-elsewhere idle charged to the thread queued: 12, preempted on cpu 1, for 3 ms; 11, woken onto
    # cpu 1, for 1 ms; in two stretches of 3 and 1 ms
    assert result["queued_idle_s"] == pytest.approx({(12, "preempted"): 0.003, (11, "woken"): 0.001}, abs=1e-9)
    assert result["queued_stretches_s"] == pytest.approx([0.001, 0.003], abs=1e-9)
    text = it.report(result, {11: "fastrl-rollout-0", 12: "fastrl-rollout-1", 13: "fastrl-inference-0"})
    assert "fastrl-rollout-0" in text and "queued on another core" in text
    assert "fastrl-rollout-1           0.003 / 0.000" in text and "fastrl-rollout-0           0.000 / 0.001" in text
    assert "2 stretches: median 3.00 ms, p90 3.00 ms, max 3.00 ms" in text


def test_queued_idle_is_shared_between_threads_queued_together_and_a_stretch_open_at_the_end_counts():
    it = load_bench_script("idle_trace")
    lines = [
        _switch(0, 2.000, 0, "R", 21),
        _switch(1, 2.000, 0, "R", 22),
        _waking(0, 2.0001, 23, 0),        # 23 woken onto busy cpu 0
        _switch(1, 2.0002, 22, "S", 0),   # cpu 1 idles with 23 queued elsewhere: 0.2 ms alone ...
        _waking(0, 2.0004, 24, 0),        # ... then 24 joins it: 0.6 ms shared
        _switch(0, 2.0010, 21, "R", 23),  # 21 preempted, 23 runs: 24 and 21 queued for 0.5 ms more
        _switch(1, 2.0015, 0, "R", 24),   # the trace's last event: the stretch closes here
    ]
    result = it.classify_idle(lines)
    assert result["idle_s"]["queued on another core"] == pytest.approx(0.0013, abs=1e-9)
    assert result["queued_idle_s"] == pytest.approx({(23, "woken"): 0.0002 + 0.0003, (24, "woken"): 0.0003 + 0.00025,
                                                     (21, "preempted"): 0.00025}, abs=1e-9)
    assert result["queued_stretches_s"] == pytest.approx([0.0013], abs=1e-9)
    assert "100% of that idle time in stretches of 1 ms or more" in it.report(result, {})
