"""bench/profile_workers.py's sorting of py-spy stacks: where a sample's CPU is counted."""

from helpers import load_bench_script


PUMP = "RolloutWorker.run (fastrl/workers/rollout.py:316);RolloutWorker.pump (fastrl/workers/rollout.py:303)"


def test_inside_envpool_recv_is_set_aside_but_its_python_side_is_cpu():
    pw = load_bench_script("profile_workers")
    # found from the source, so a refactor of _DirectCalls.recv cannot silently void the rule
    assert len(pw.ENVPOOL_RECV_LEAVES) == 1
    blocked = f"{PUMP};EnvpoolSplit.recv (fastrl/envs/vector.py:118);{pw.ENVPOOL_RECV_LEAVES[0]}"
    assert pw.classify(blocked) == pw.IN_ENVPOOL
    line = int(pw.ENVPOOL_RECV_LEAVES[0].rsplit(":", 1)[1].rstrip(")"))
    after_the_call = f"{PUMP};EnvpoolSplit.recv (fastrl/envs/vector.py:118);_DirectCalls.recv (fastrl/envs/vector.py:{line + 2})"
    assert pw.classify(after_the_call) == "envpool send/recv: Python side (caller thread)"
    wrapper = f"{PUMP};EnvpoolSplit.recv (fastrl/envs/vector.py:120);EnvPoolMixin.recv (envpool/python/envpool.py:151)"
    assert pw.classify(wrapper) == pw.IN_ENVPOOL


def test_waits_and_work_are_told_apart():
    pw = load_bench_script("profile_workers")
    assert pw.classify(f"{PUMP};RolloutWorker._take_free_slot (fastrl/workers/rollout.py:200);"
                       "wait_any (fastrl/ipc/doorbell.py:40)") == pw.WAITING
    assert pw.classify(f"{PUMP};RolloutWorker._record (fastrl/workers/rollout.py:247)") == \
        "trajectory writes + episode stats"
