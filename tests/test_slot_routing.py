"""Which rollout worker a freed trajectory slot goes back to (fastrl.workers.learner.pick_free_ring)."""

from collections import Counter

from fastrl.workers.learner import pick_free_ring


def test_fewest_waiting_wins():
    assert pick_free_ring([2, 0, 1], last=-1) == 1
    assert pick_free_ring([0, 3, 3], last=0) == 0


def test_ties_go_round_robin_from_the_worker_after_the_last():
    assert pick_free_ring([0, 0, 0], last=-1) == 0
    assert pick_free_ring([0, 0, 0], last=0) == 1
    assert pick_free_ring([0, 0, 0], last=2) == 0
    assert pick_free_ring([1, 0, 1, 0], last=1) == 3


def test_one_slot_per_batch_is_shared_between_workers_that_pop_at_once():
    """The case that starved worker 1: every freed slot finds all rings empty."""
    last, got = -1, Counter()
    for _ in range(100):
        last = pick_free_ring([0, 0], last)
        got[last] += 1
    assert got == {0: 50, 1: 50}


def test_a_worker_that_hoards_gets_nothing_until_the_others_catch_up():
    waiting, last = [3, 0, 0], -1
    for _ in range(6):
        last = pick_free_ring(waiting, last)
        waiting[last] += 1
    assert waiting == [3, 3, 3]
