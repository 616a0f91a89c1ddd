"""bench/chaos.py's rates around a kill, on counters that move a batch at a time as a learner-bound run's do."""

from helpers import load_bench_script


chaos = load_bench_script("chaos")


def _bursty(until_s: float, batch: int, every_s: float, pause=(None, None)) -> list:
    """Rows every second; the counter jumps by `batch` every `every_s` seconds, except within `pause`."""
    counts, steps, next_batch = [], 0, every_s
    for t in range(int(until_s) + 1):
        while next_batch <= t:
            if not (pause[0] is not None and pause[0] <= next_batch < pause[1]):
                steps += batch
            next_batch += every_s
        counts.append((float(t), steps))
    return counts


def test_a_batch_every_three_seconds_reads_a_third_of_a_batch_per_second_not_zero():
    # most 1 s windows of this counter read 0: their median, which this script quoted before, read 0 before
    # the kill, and the kill then counted as never recovered
    counts = _bursty(60, 1024, 3.0)
    base, after, recovered = chaos.rates_around_kill(counts, 30.0)
    assert 1024 / 3 * 0.75 <= base <= 1024 / 3 * 1.25 and 1024 / 3 * 0.75 <= after <= 1024 / 3 * 1.25
    assert recovered is not None and recovered <= 3.0


def test_a_pause_after_the_kill_delays_recovery_by_about_its_length():
    counts = _bursty(70, 1000, 1.0, pause=(30.5, 36.0))  # no batch from the kill at 30 s until 36 s
    base, after, recovered = chaos.rates_around_kill(counts, 30.0)
    assert base == 1000.0 and after == 1000.0
    assert 3.0 <= recovered <= 6.0  # 90% of the rate is back once a window holds 9 of its 10 batches


def test_a_run_that_never_gets_back_is_reported_as_such():
    slow = [(float(t), 1000 * t if t <= 30 else 30_000 + 500 * (t - 30)) for t in range(61)]
    base, after, recovered = chaos.rates_around_kill(slow, 30.0)
    assert base == 1000.0 and after == 500.0 and recovered is None


def test_no_rows_after_the_run_ended():
    counts = _bursty(35, 1000, 1.0)  # the run ends 5 s after the kill: no window 10-20 s after it
    base, after, recovered = chaos.rates_around_kill(counts, 30.0)
    assert base == 1000.0 and after is None and recovered is None
