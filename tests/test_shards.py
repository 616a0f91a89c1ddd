"""The learner's shards (system.learner_shards): a minibatch cut into pieces on threads must give the
unsharded minibatch's loss and gradient, and the pool must hand results back in order and never
return while a piece still runs."""

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fastrl.algo.appo import APPOTrainer
from fastrl.algo.shards import ShardPool
from fastrl.bench.components import synthetic_batch
from fastrl.config import check_config, load_config
from fastrl.envs.spec import EnvSpec
from fastrl.models import seeded_model
from helpers import assert_same_steps_up_to_rounding
from helpers import TINY_FRAMES as FRAMES  # the Nature CNN's channels-last convs, its non-flat parameters

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = EnvSpec("CartPole-v1", "envpool", (4,), np.dtype(np.float32), True, 2)


def test_pool_keeps_order_and_runs_pieces_on_other_threads():
    pool = ShardPool(3)
    seen = []
    assert pool.map(lambda x: (seen.append(threading.get_ident()), x * x)[1], [1, 2, 3, 4]) == [1, 4, 9, 16]
    assert len(set(seen)) > 1 and threading.get_ident() in seen
    assert ShardPool(1).map(lambda x: x + 1, [1, 2]) == [2, 3]
    pool.close()


def test_pool_waits_for_every_piece_before_raising():
    pool = ShardPool(2)
    finished = []

    def work(x):
        if x == 0:
            raise RuntimeError("piece 0 failed")
        time.sleep(0.2)
        finished.append(x)
        return x
    with pytest.raises(RuntimeError, match="piece 0 failed"):
        pool.map(work, [0, 1])
    assert finished == [1]  # the other piece ran to its end before map raised

    def other_fails(x):
        if x == 1:
            raise ValueError("piece 1 failed")
        return x
    with pytest.raises(ValueError, match="piece 1 failed"):
        pool.map(other_fails, [0, 1])
    pool.close()


def _trainer(spec, preset, shards, overrides=()):
    cfg = load_config(str(ROOT / preset), ["algo.minibatch_unit=samples", "model.precision=fp32", *overrides])
    model = seeded_model(spec, cfg.model, seed=3)
    if spec.is_image:
        model.to(memory_format=torch.channels_last)
    return APPOTrainer(model, cfg.algo, cfg.sampler.max_policy_lag, shards=shards), cfg


def _off_policy_batch(cfg, spec):
    batch = synthetic_batch(cfg, spec, seed=5)
    gen = torch.Generator().manual_seed(9)
    batch["log_probs"] = torch.randn(batch["log_probs"].shape, generator=gen) * 0.3 - 0.7  # ratios != 1
    # the invalid samples are not spread evenly, so the pieces hold different numbers of valid ones:
    # a piece mean weighted by piece size instead of by its valid count gives a different loss
    batch["valid"][:, :5] = False
    batch["valid"][3, :] = False
    batch["terminated"][7, ::3] = True
    return batch


def _first_minibatch_grads(trainer, batch):
    batch = dict(batch, train_mask=batch["valid"].bool())
    out = trainer._loss_and_gradient(*next(trainer._minibatches(batch)))
    return out, [p.grad.clone() for p in trainer.trained_params]


@pytest.mark.parametrize("spec,preset,overrides", [
    (CARTPOLE, "configs/cartpole.yaml", ["algo.batch_size=512", "algo.num_minibatches=4"]),
    (CARTPOLE, "configs/cartpole.yaml", ["algo.batch_size=512", "algo.num_minibatches=4", "algo.native_loss=false",
                                         "algo.normalize_advantages=false"]),
    (FRAMES, "configs/atari_pong.yaml", ["algo.batch_size=256", "algo.num_minibatches=4"]),
], ids=["mlp-native-loss", "mlp-torch-loss-raw-advantages", "cnn"])
@pytest.mark.parametrize("shards", [2, 3])
def test_sharded_minibatch_has_the_unsharded_loss_and_gradient(spec, preset, overrides, shards):
    results = []
    for n in (1, shards):
        trainer, cfg = _trainer(spec, preset, n, overrides)
        results.append(_first_minibatch_grads(trainer, _off_policy_batch(cfg, spec)))
    (whole, whole_grads), (pieces, piece_grads) = results
    for name in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        # one shard takes the native gradient chain, whose outputs are floats; shards take autograd
        a, b = (float(torch.as_tensor(getattr(out, name)).detach()) for out in (whole, pieces))
        assert abs(a - b) <= 1e-5 * max(1.0, abs(a)), (name, a, b)
    assert float(whole.clip_fraction) > 0  # off-policy enough that the clip is exercised
    for g_whole, g_pieces in zip(whole_grads, piece_grads):
        scale = float(g_whole.abs().max())
        assert scale > 0
        assert torch.allclose(g_whole, g_pieces, rtol=1e-4, atol=1e-5 * scale)


def test_sharded_batch_pass_gives_the_unsharded_targets_and_weights():
    """The chunked no-grad forward (V-trace's values) split over threads, then whole batches trained:
    the same targets, and after two epochs of optimizer steps the same weights within float noise."""
    out = []
    for n in (1, 2):
        trainer, cfg = _trainer(FRAMES, "configs/atari_pong.yaml", n,
                                ["algo.batch_size=256", "algo.num_minibatches=4", "algo.num_epochs=2"])
        batch = _off_policy_batch(cfg, FRAMES)
        with torch.no_grad():
            targets = trainer._flat_samples_with_targets(dict(batch, train_mask=batch["valid"].bool()))
        stats = trainer.train(batch)
        out.append((targets, stats, [p.detach().clone() for p in trainer.trained_params]))
    (t1, s1, w1), (t2, s2, w2) = out
    for key in ("vs", "pg_advantages"):
        assert torch.allclose(t1[key], t2[key], rtol=1e-5, atol=1e-5), key
    assert s1["sgd_steps"] == s2["sgd_steps"] == 8
    assert abs(s1["policy_loss"] - s2["policy_loss"]) <= 1e-4 * max(1.0, abs(s1["policy_loss"]))
    for a, b in zip(w1, w2):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5)


def test_shards_need_sample_minibatches_and_one_torch_thread_each():
    problems = check_config(load_config(str(ROOT / "configs/atari_pong.yaml"),
                                        ["system.learner_shards=2", "algo.minibatch_unit=trajectories"]))
    assert any("system.learner_shards" in p and "minibatch_unit" in p for p in problems)
    problems = check_config(load_config(str(ROOT / "configs/atari_pong.yaml"),
                                        ["system.learner_shards=2", "system.learner_threads=2"]))
    assert any("system.learner_shards" in p and "learner_threads" in p for p in problems)
    assert check_config(load_config(str(ROOT / "configs/atari_pong.yaml"), ["system.learner_shards=2"])) == []
    assert any("system.learner_shards" in p for p in check_config(
        load_config(str(ROOT / "configs/atari_pong.yaml"), ["system.learner_shards=0"])))


def _stale_pairs_reference(trainer, batch):
    """algo.minibatches_per_weights=2 written out on a trainer of groups of 1: both gradients of a
    pair at the weights the pair starts from, then a clip and an Adam step for each, in order."""
    batch = dict(batch, train_mask=batch["valid"].bool())
    minibatches = list(trainer._minibatches(batch, buffers=2 * trainer.cfg.num_epochs * trainer.cfg.num_minibatches))
    for first, second in zip(minibatches[0::2], minibatches[1::2]):
        grads = []
        for mb, loss in (first, second):
            trainer._loss_and_gradient(mb, loss)
            grads.append([p.grad.clone() for p in trainer.trained_params])
        for g in grads:
            for p, gp in zip(trainer.trained_params, g):
                p.grad.copy_(gp)
            torch.nn.utils.clip_grad_norm_(trainer.trained_params, trainer.cfg.max_grad_norm)
            trainer.optimizer.step()
    return [p.detach().clone() for p in trainer.trained_params]


@pytest.mark.parametrize("spec,preset,overrides", [
    (CARTPOLE, "configs/cartpole.yaml", ["algo.batch_size=512", "algo.num_minibatches=4", "algo.num_epochs=2"]),
    (FRAMES, "configs/atari_pong.yaml", ["algo.batch_size=256", "algo.num_minibatches=4", "algo.num_epochs=1"]),
], ids=["mlp-flat-params", "cnn"])
def test_minibatches_per_weights_takes_each_pairs_gradients_at_the_pairs_starting_weights(spec, preset, overrides):
    """Groups of 2 on 1 or 2 shards against the reference above; and against plain minibatch SGD,
    which they must not equal (a trainer that ignored the setting would pass the first checks)."""
    reference_trainer, cfg = _trainer(spec, preset, 1, overrides)
    batch = _off_policy_batch(cfg, spec)
    expected = _stale_pairs_reference(reference_trainer, batch)
    for shards in (1, 2):
        trainer, _ = _trainer(spec, preset, shards, [*overrides, "algo.minibatches_per_weights=2"])
        stats = trainer.train(batch)
        assert stats["sgd_steps"] == cfg.algo.num_epochs * cfg.algo.num_minibatches
        assert trainer.policy_version == stats["sgd_steps"]
        assert_same_steps_up_to_rounding(expected, trainer.trained_params, cfg.algo.lr, rtol=1e-4, atol=1e-6)
    plain, _ = _trainer(spec, preset, 1, overrides)
    plain.train(batch)
    moved = max(float((a - b.detach()).abs().max() / (b.detach() - c.detach()).abs().max().clamp_min(1e-12))
                for a, b, c in zip(expected, plain.trained_params, seeded_model(spec, cfg.model, seed=3).parameters()))
    assert moved > 1e-3  # stale pairs end measurably elsewhere than plain SGD


def test_minibatches_per_weights_must_be_positive():
    assert any("algo.minibatches_per_weights" in p for p in check_config(
        load_config(str(ROOT / "configs/atari_pong.yaml"), ["algo.minibatches_per_weights=0"])))
