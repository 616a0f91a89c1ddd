"""Data parallelism inside the learner: one minibatch cut into pieces, each piece's forward and
backward on its own Python thread, the gradients summed before the one optimizer step.

Why not torch's own threads (system.learner_threads)? Those split every op, so the threads meet at a
barrier after each of the ~40 ops of a CNN's forward and backward; on 2 cores shared with rollout and
inference workers, a preempted thread stalls its partner at every one of them (Pong preset on the
AVX-512 EPYC: 2 threads trained 0.88x as fast as 1). Pieces meet once per minibatch. torch releases
the GIL inside its kernels and its autograd engine, so the threads run in parallel; each runs its
ops inline, on one torch thread (the learner's `torch.set_num_threads(1)`). Measured so far (Pong,
AVX2 EPYC, fp32): a tie with two OpenMP threads in the run, 0.87x alone; bench/README has the rounds.

The math is the unsharded minibatch's: `appo_loss`'s means are over the minibatch's valid samples,
so each piece's loss is weighted by its share of them, and advantages are normalised once over the
whole minibatch before it is cut (bench/README and tests/test_shards.py).

The pieces' price: a CNN's forward and backward cost ~4.5 CPU-ms per call whatever its rows (Pong's,
one thread, bf16, `bench/shards_microbench.py --rows-sweep`: 6.9 ms at 8 rows, 25.3 at 64; 4.5 ms
+ 343 µs per row by least squares; a third of it the hidden layer's three GEMMs, each touching its
3.2 MB weight or gradient whatever the rows: `--op-profile`), and each piece pays it. With
algo.minibatches_per_weights = k > 1 the same pool runs k whole minibatches at once instead, all at
the weights the group starts from, and their optimizer steps follow one another (APPOTrainer).
With system.learner_split=weight_grads the pool's threads share each minibatch by layer work instead
(fastrl.algo.split_backward, through `submit`), and `map` still cuts the batch's no-grad forward.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def even_cuts(n: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) bounds cutting range(n) into `parts` contiguous runs as even as they go; empty runs
    (n < parts) are left out."""
    cuts = [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]
    return [(lo, hi) for lo, hi in cuts if hi > lo]


def ran_here(fn: Callable[[], R]) -> Future:
    """fn() run now in the calling thread, as a done Future: an error is raised where the result is
    read, as from a pool thread."""
    done = Future()
    try:
        done.set_result(fn())
    except Exception as error:
        done.set_exception(error)
    return done


class ShardPool:
    """Runs a function over N items: item 0 in the calling thread, the others on N-1 threads kept
    for the trainer's life rather than started per minibatch."""

    def __init__(self, shards: int):
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self.shards = shards
        self._executor = (ThreadPoolExecutor(shards - 1, thread_name_prefix="fastrl-learner-shard")
                          if shards > 1 else None)

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """[fn(x) for x in items], in that order. Every thread has finished before this returns or
        raises: a piece still running could otherwise write into a buffer the caller reuses."""
        if self._executor is None or len(items) <= 1:
            return [fn(x) for x in items]
        futures = [self._executor.submit(fn, x) for x in items[1:]]
        try:
            first = fn(items[0])
        finally:
            rest = [f.exception() for f in futures]  # waits for each
        for error in rest:
            if error is not None:
                raise error
        return [first] + [f.result() for f in futures]

    def submit(self, fn: Callable[[], R]) -> Future:
        """fn() on one of the pool's threads (fastrl.algo.split_backward's weight gradients); in the
        calling thread, done when this returns, for a pool of one."""
        return self._executor.submit(fn) if self._executor is not None else ran_here(fn)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
