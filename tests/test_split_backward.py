"""fastrl.algo.split_backward: the CNN's weight gradients computed on a second thread are autograd's
bit for bit, errors on that thread surface, and system.learner_split resolves and is checked."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import fastrl.models.conv_relu as conv_relu_module
from fastrl.algo.appo import APPOTrainer
from fastrl.algo.split_backward import WeightGradLater, WeightGradThread
from fastrl.bench.components import synthetic_batch
from fastrl.config import load_config
from fastrl.config.hardware import resolve_auto, weight_grads_split_blockers
from fastrl.models import seeded_model
from fastrl.models.space_to_depth import SpaceToDepthConv2d
from helpers import TINY_CHEETAH as CHEETAH, TINY_FRAMES as FRAMES

ROOT = Path(__file__).resolve().parents[1]
AVX2 = {"fpu", "avx2", "fma"}
ZEN4 = AVX2 | {"avx512f", "avx512_bf16"}
SMALL = ["algo.batch_size=256", "algo.num_minibatches=4", "algo.num_epochs=2", "model.precision=bf16"]


def _trainer(shards: int, split: str, extra=(), spec=FRAMES, preset="configs/atari_pong.yaml"):
    cfg = load_config(str(ROOT / preset), [*SMALL, *extra])
    model = seeded_model(spec, cfg.model, seed=3)
    if spec.is_image:
        model.to(memory_format=torch.channels_last)
    return APPOTrainer(model, cfg.algo, cfg.sampler.max_policy_lag, shards=shards, split=split), cfg


def _loss(net, obs):
    params, values = net(obs)
    return params.logsumexp(-1).sum() + values.square().sum()


@pytest.mark.parametrize("first_conv", ["strided", "space_to_depth"])
@pytest.mark.parametrize("rows", [16, 13])
def test_weight_gradients_on_a_second_thread_are_autograds_bit_for_bit(monkeypatch, rows, first_conv):
    native_relu_calls = []
    if conv_relu_module._native is not None:  # each conv's ReLU gradient goes through fastrl_ext's kernel
        kernel = conv_relu_module._native.relu_backward
        monkeypatch.setattr(conv_relu_module, "_native", SimpleNamespace(
            relu_backward=lambda *args: native_relu_calls.append(1) or kernel(*args)))
    extra = [f"model.first_conv={first_conv}"]
    plain, _ = _trainer(1, "rows", extra)
    split, _ = _trainer(2, "weight_grads", extra)
    wrapped = [m for m in split.net.modules() if isinstance(m, WeightGradLater)]
    assert len(wrapped) == 4  # three convs and the hidden layer
    assert isinstance(wrapped[0].layer, SpaceToDepthConv2d) == (first_conv == "space_to_depth")
    obs = torch.randint(0, 256, (rows, *FRAMES.obs_shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    want = plain.bf16_copy.gradients(_loss(plain.net, obs))
    got = split.bf16_copy.gradients(_loss(split.net, obs))
    # each conv's ReLU, in both: the plain backward takes them natively too (conv_relu.conv_layer_relu_trained)
    assert len(native_relu_calls) == (0 if conv_relu_module._native is None else 6)
    assert len(got) == len(want) == len(split.bf16_copy.params)
    for g, w, p in zip(got, want, split.bf16_copy.params):
        assert g is not None and g.dtype == p.dtype and g.shape == p.shape
        assert torch.equal(g, w)
    with torch.no_grad():  # outside autograd the wrapped layers are the layers
        torch.testing.assert_close(split.net(obs)[0], plain.net(obs)[0], rtol=0, atol=0)


def test_a_trainer_splitting_by_weight_gradients_trains_like_one_thread():
    batch = synthetic_batch(load_config(str(ROOT / "configs/atari_pong.yaml"), SMALL), FRAMES, seed=5)
    batch["log_probs"] = torch.randn(batch["log_probs"].shape, generator=torch.Generator().manual_seed(9)) * 0.3 - 0.7
    results = []
    for shards, split in ((1, "rows"), (2, "weight_grads"), (1, "weight_grads")):
        trainer, _ = _trainer(shards, split)
        stats = trainer.train({k: v.clone() for k, v in batch.items()})
        results.append(([p.detach().clone() for p in trainer.model.parameters()], stats))
    for params, _ in results[1:]:
        for p, q in zip(params, results[0][0]):
            # the batch's no-grad forward is cut in two with 2 shards, which may round V-trace's inputs
            # differently; the minibatches' gradients themselves are bit for bit (above)
            torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-5)
    for p, q in zip(results[2][0], results[0][0]):  # one shard: the same ops in the same thread
        assert torch.equal(p, q)


def test_an_error_in_a_weight_gradient_surfaces_after_every_job_has_finished():
    executor = ThreadPoolExecutor(1)
    finished = []
    thread = WeightGradThread(executor.submit)
    weights = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]

    def job(k):
        def run():
            if k == 1:
                raise RuntimeError("boom")
            finished.append(k)
            return torch.ones(2), None
        return run
    for k, w in enumerate(weights):
        thread.later(w, None, job(k))
    x = torch.ones((), requires_grad=True)
    with pytest.raises(RuntimeError, match="boom"):
        thread.gradients(x * 2, [x])
    assert sorted(finished) == [0, 2]
    assert thread.gradients(x * 2, [x])[0].item() == 2.0  # nothing left pending from the failed call
    executor.shutdown()


def test_the_first_conv_computes_its_weight_gradient_in_place():
    submitted = []

    def submit(job):
        submitted.append(job)
        return ThreadPoolExecutor(1).submit(job)
    trainer, _ = _trainer(1, "rows")
    thread = WeightGradThread(submit)
    trainer.bf16_copy.split_weight_grads(thread)
    obs = torch.zeros((4, *FRAMES.obs_shape), dtype=torch.uint8)
    trainer.bf16_copy.gradients(_loss(trainer.net, obs))
    assert len(submitted) == 3  # convs 2 and 3 and the hidden layer; conv 1 has no input gradient to wait on


def test_learner_split_resolves_to_weight_grads_only_where_it_runs():
    pong = load_config(str(ROOT / "configs/atari_pong.yaml"))
    assert pong.system.learner_split == "auto"
    assert resolve_auto(pong, ZEN4, cores=2, encoder="nature_cnn").system.learner_split == "weight_grads"
    assert resolve_auto(pong, AVX2, cores=2, encoder="nature_cnn").system.learner_split == "rows"  # fp32
    assert resolve_auto(pong, ZEN4, cores=1, encoder="nature_cnn").system.learner_split == "rows"  # one shard
    k2 = load_config(str(ROOT / "configs/atari_pong.yaml"), ["algo.minibatches_per_weights=2"])
    assert resolve_auto(k2, ZEN4, cores=2, encoder="nature_cnn").system.learner_split == "rows"
    cheetah = load_config(str(ROOT / "configs/mujoco_halfcheetah.yaml"), ["model.precision=bf16"])
    assert resolve_auto(cheetah, ZEN4, cores=2, encoder="mlp").system.learner_split == "rows"
    explicit = resolve_auto(load_config(str(ROOT / "configs/atari_pong.yaml"),
                                        ["system.learner_split=weight_grads", "algo.minibatches_per_weights=2"]),
                            AVX2, cores=2, encoder="nature_cnn")
    blockers = weight_grads_split_blockers(explicit, "nature_cnn")
    assert any("bf16" in b for b in blockers) and any("minibatches_per_weights" in b for b in blockers)


def test_the_trainer_refuses_weight_grads_where_there_is_nothing_to_split():
    with pytest.raises(ValueError, match="Nature CNN"):
        _trainer(2, "weight_grads", extra=["algo.minibatch_unit=samples"], spec=CHEETAH,
                 preset="configs/mujoco_halfcheetah.yaml")
    with pytest.raises(ValueError, match="minibatches_per_weights"):
        _trainer(2, "weight_grads", extra=["algo.minibatches_per_weights=2"])
