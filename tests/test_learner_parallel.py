"""system.learner_serial_tail and learner_parallel_backlog: a learner whose shards run one minibatch in parallel only when asked
(APPOTrainer.parallel_when) trains as one shard does when told no, bit for bit, counts what ran
where, and the learner process asks whether enough of its next batch is already waiting."""

import math
from pathlib import Path

import pytest
import torch

from fastrl.algo.appo import APPOTrainer
from fastrl.bench.components import synthetic_batch
from fastrl.config import load_config
from fastrl.models import seeded_model
from fastrl.workers.learner import Learner
from helpers import TINY_FRAMES as FRAMES

ROOT = Path(__file__).resolve().parents[1]
# the learner's values: its batch forward is one of the things a sharded learner asks about
SMALL = ["algo.batch_size=256", "algo.num_minibatches=4", "algo.num_epochs=2", "model.precision=bf16",
         "algo.vtrace_values=learner"]


def _trainer(shards: int, split: str) -> APPOTrainer:
    cfg = load_config(str(ROOT / "configs/atari_pong.yaml"), SMALL)
    model = seeded_model(FRAMES, cfg.model, seed=3).to(memory_format=torch.channels_last)
    return APPOTrainer(model, cfg.algo, cfg.sampler.max_policy_lag, shards=shards, split=split)


def _batch() -> dict:
    batch = synthetic_batch(load_config(str(ROOT / "configs/atari_pong.yaml"), SMALL), FRAMES, seed=5)
    batch["log_probs"] = torch.randn(batch["log_probs"].shape, generator=torch.Generator().manual_seed(9)) * 0.3 - 0.7
    return batch


def _trained(trainer: APPOTrainer) -> tuple[list, dict]:
    stats = trainer.train({k: v.clone() for k, v in _batch().items()})
    return [p.detach().clone() for p in trainer.model.parameters()], stats


class _NoThreads:
    """A pool that fails if anything is handed to another thread."""
    shards = 2

    def map(self, fn, items):
        raise AssertionError("ran on the pool")

    def submit(self, fn):
        raise AssertionError("ran on the pool")


@pytest.mark.parametrize("split", ["rows", "weight_grads"])
def test_a_learner_told_no_runs_on_one_thread_as_one_shard_does(split):
    want, _ = _trained(_trainer(1, split))
    trainer = _trainer(2, split)
    trainer.pool.close()
    trainer.pool = _NoThreads()
    trainer.parallel_when = lambda minibatches_done: False
    got, stats = _trained(trainer)
    for p, q in zip(got, want):
        assert torch.equal(p, q)
    assert (trainer.minibatches_run, trainer.minibatches_parallel) == (8, 0)
    assert stats["parallel_fraction"] == 0.0 and stats["sgd_steps"] == 8


def test_weight_grads_switching_per_minibatch_keeps_one_threads_bits():
    """The no-grad forward asked first (told no: cut by rows it may round differently), then every other
    minibatch on both threads: the gradients are one thread's whichever way each minibatch ran."""
    want, _ = _trained(_trainer(1, "weight_grads"))
    trainer = _trainer(2, "weight_grads")
    asked = []

    def every_other_minibatch(minibatches_done: int) -> bool:
        asked.append(minibatches_done)
        return len(asked) > 1 and minibatches_done % 2 == 1

    trainer.parallel_when = every_other_minibatch
    got, stats = _trained(trainer)
    for p, q in zip(got, want):
        assert torch.equal(p, q)
    assert asked == [0, *range(8)]  # the batch's no-grad forward, then 8 minibatches
    assert (trainer.minibatches_run, trainer.minibatches_parallel) == (8, 4)
    assert stats["parallel_fraction"] == 0.5


def test_one_shard_counts_nothing_and_never_asks():
    trainer = _trainer(1, "rows")
    trainer.parallel_when = lambda minibatches_done: pytest.fail("asked with one shard")
    _, stats = _trained(trainer)
    assert (trainer.minibatches_run, trainer.minibatches_parallel) == (0, 0)
    assert "parallel_fraction" not in stats


class _Ring:
    def __init__(self, slots):
        self.slots = list(slots)

    def pop_all(self):
        out, self.slots = [(s,) for s in self.slots], []
        return out


def _learner(tail: float, backlog: float) -> Learner:
    learner = object.__new__(Learner)  # only the slot bookkeeping, no processes
    learner.slots_needed, learner.pending = 2, []
    learner.parallel_after_slots = math.ceil(backlog * learner.slots_needed)
    learner.parallel_until = (1 - tail) * 32  # 2 epochs x 16 minibatches
    learner.full_rings = [_Ring([]), _Ring([])]
    return learner


@pytest.mark.parametrize("backlog, slots", [(1.0, 2), (0.5, 1), (0.01, 1)])
def test_in_the_serial_tail_the_learner_goes_parallel_once_its_backlog_of_the_next_batch_is_full(backlog, slots):
    learner = _learner(tail=1.0, backlog=backlog)  # every minibatch in the tail
    assert learner.parallel_after_slots == slots
    assert not learner._parallel_now_ok(0)
    learner.full_rings[1].slots.append(7)
    assert learner._parallel_now_ok(1) == (slots == 1)
    assert learner.pending == [7]
    learner.full_rings[0].slots.append(3)
    assert learner._parallel_now_ok(2)
    assert learner.pending == ([7, 3] if slots == 2 else [7])  # enough already: the rings are not read
    learner.full_rings[1].slots.append(9)
    assert learner._parallel_now_ok(3) and len(learner.pending) == slots


def test_before_the_serial_tail_every_minibatch_runs_parallel_without_looking_at_the_rings():
    learner = _learner(tail=0.25, backlog=1.0)
    learner.full_rings[0].slots.append(5)
    for index in range(32):
        assert learner._parallel_now_ok(index) == (index < 24), index
    assert learner.pending == [5]  # read only once the tail began
    assert learner._parallel_now_ok(0)  # the next batch begins


@pytest.mark.parametrize("value", [-0.1, 1.5])
@pytest.mark.parametrize("key", ["learner_parallel_backlog", "learner_serial_tail"])
def test_shares_outside_0_to_1_are_refused(value, key):
    from fastrl.config.checks import check_config
    cfg = load_config(str(ROOT / "configs/atari_pong.yaml"), [f"system.{key}={value}"])
    assert any(f"system.{key} must be in [0, 1]" in p for p in check_config(cfg))
