"""algo.native_gradient: a minibatch's APPO loss and gradient as a chain of fastrl_ext calls, against
torch's autograd through the same model (the reference).

- fastrl_ext._policy_head: categorical (one choice or several) and Gaussian log-probs and entropies, and the
  gradient of any weighted sum of them, against ActorCritic.log_prob / entropy under autograd;
- one trajectory or sample minibatch through the trainer: the loss, its statistics and every parameter's
  gradient against the autograd path, with off-policy ratios, episode ends, invalid samples, a value clip,
  an entropy bonus, advantage normalisation on and off;
- a whole train() pass (minibatches, clip, Adam) lands on the same weights;
- where it must step aside: the switch off, learner shards, bf16, groups of minibatches, a gradient
  detached from the flat buffer.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from fastrl.algo.appo import APPOTrainer
from fastrl.bench.components import synthetic_batch
from fastrl.config import load_config
from fastrl.config.schema import ModelConfig
from fastrl.envs import resolve_env
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic, native_mlp
from fastrl_ext import _policy_head
from fastrl.models.actor_critic import MASKED_LOGIT
from helpers import HALFCHEETAH as CHEETAH  # an MLP at HalfCheetah's shape

ROOT = Path(__file__).resolve().parents[1]
needs_native = pytest.mark.skipif(_policy_head is None or not native_mlp.pays(),
                                  reason="fastrl_ext not built, or its MLP layers not used on this CPU")
needs_head = pytest.mark.skipif(_policy_head is None, reason="fastrl_ext not built")


def _head_reference(spec: EnvSpec, params: torch.Tensor, actions: torch.Tensor, log_std: torch.Tensor | None):
    model = ActorCritic(spec, ModelConfig(native_mlp=False))
    if log_std is not None:
        model.log_std = torch.nn.Parameter(log_std)
    return model.log_prob(params, actions), model.entropy(params), model


@needs_head
@pytest.mark.parametrize("rows", [1, 5, 64, 257])
@pytest.mark.parametrize("kind,width,action_dtype", [
    ("categorical", 2, torch.int32), ("categorical", 7, torch.int64), ("gaussian", 1, torch.float32),
    ("gaussian", 6, torch.float32), ("choices", 7, torch.int32), ("choices", 10, torch.int64),
    # Minesweeper's 100 cells, and with a mask: logits at MASKED_LOGIT, whose softmax must be exactly 0
    ("categorical", 100, torch.int32), ("masked", 100, torch.int64)])
def test_policy_head_matches_autograd(rows, kind, width, action_dtype):
    gen = torch.Generator().manual_seed(rows * 10 + width)
    params = torch.randn(rows, width, generator=gen) * 2
    choices, log_std = None, None
    if kind in ("categorical", "masked"):
        spec = EnvSpec("Tiny-discrete", "envpool", (3,), np.dtype(np.float32), True, width)
        actions = torch.randint(0, width, (rows,), generator=gen)
        if kind == "masked":
            masked = torch.rand(rows, width, generator=gen) < 0.4
            masked[torch.arange(rows), actions] = False  # the acted action is one the mask allowed
            masked[0] = torch.arange(width) != 3  # a row with one action left: probability 1, entropy 0
            actions[0] = 3
            params[masked] = MASKED_LOGIT
        actions = actions.to(action_dtype)
    elif kind == "choices":  # several categoricals, each over its slice of the logits
        nvec = {7: (3, 4), 10: (2, 6, 2)}[width]
        spec = EnvSpec("Tiny-choices", "envpool", (3,), np.dtype(np.float32), True, width, (0,) * len(nvec),
                       action_nvec=nvec)
        actions = torch.stack([torch.randint(0, n, (rows,), generator=gen) for n in nvec], -1).to(action_dtype)
        choices = np.asarray(nvec, np.int64)
    else:
        spec = EnvSpec("Tiny-box", "envpool", (3,), np.dtype(np.float32), False, width, (-1.0,) * width,
                       (1.0,) * width)
        actions = torch.randn(rows, width, generator=gen)
        log_std = (torch.randn(width, generator=gen) * 0.5).requires_grad_()
    params.requires_grad_()
    lp_ref, ent_ref, model = _head_reference(spec, params, actions, log_std)
    g_lp, g_ent = torch.randn(rows, generator=gen), torch.randn(rows, generator=gen)
    (lp_ref * g_lp + ent_ref * g_ent).sum().backward()

    lp, ent = np.empty(rows, np.float32), np.empty(rows, np.float32)
    log_std_array = None if log_std is None else model.log_std.detach().numpy()
    _policy_head.forward(params.detach().numpy(), actions.numpy(), log_std_array, lp, ent, choices)
    np.testing.assert_allclose(lp, lp_ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ent_ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    g_params = np.full((rows, width), np.nan, np.float32)  # every element written
    g_log_std = None if log_std is None else np.full(width, np.nan, np.float32)
    _policy_head.backward(params.detach().numpy(), actions.numpy(), log_std_array, g_lp.numpy(), g_ent.numpy(),
                          g_params, g_log_std, choices)
    np.testing.assert_allclose(g_params, params.grad.numpy(), rtol=1e-5, atol=1e-5)
    if kind == "masked":  # no probability, so no gradient, on what the mask forbids
        assert (g_params[masked.numpy()] == 0.0).all()
    if log_std is not None:
        np.testing.assert_allclose(g_log_std, model.log_std.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_policy_head_rejects_what_it_cannot_read():
    params, lp, ent = np.zeros((4, 3), np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32)
    _policy_head.forward(params, np.array([0, 1, 2, 0], np.int32), None, lp, ent)
    with pytest.raises(IndexError, match="outside the logits"):
        _policy_head.forward(params, np.array([0, 1, 3, 0], np.int32), None, lp, ent)
    with pytest.raises(IndexError, match="outside the logits"):
        _policy_head.backward(params, np.array([0, -1, 2, 0], np.int64), None, lp, ent, np.zeros_like(params), None)
    with pytest.raises(TypeError, match="int32 or int64"):
        _policy_head.forward(params, np.zeros(4, np.float32), None, lp, ent)
    with pytest.raises(ValueError, match="3 actions for 4 rows"):
        _policy_head.forward(params, np.zeros(3, np.int32), None, lp, ent)
    with pytest.raises(ValueError, match="lp has 3 elements"):
        _policy_head.forward(params, np.zeros(4, np.int32), None, lp[:3], ent)
    with pytest.raises(ValueError, match="log_std has 2 elements"):
        _policy_head.forward(params, np.zeros((4, 3), np.float32), np.zeros(2, np.float32), lp, ent)
    with pytest.raises(ValueError, match="Gaussian actions"):
        _policy_head.forward(params, np.zeros((4, 2), np.float32), np.zeros(3, np.float32), lp, ent)
    with pytest.raises(ValueError, match="no g_log_std"):
        _policy_head.backward(params, np.zeros(4, np.int32), None, lp, ent, np.zeros_like(params),
                              np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="float32"):
        _policy_head.forward(params.astype(np.float64), np.zeros(4, np.int32), None, lp, ent)


@needs_native
def test_policy_head_rejects_choices_it_cannot_read():
    params, lp, ent = np.zeros((4, 7), np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32)
    choices, actions = np.array([3, 4], np.int64), np.array([[0, 3], [2, 0], [1, 1], [0, 2]], np.int32)
    _policy_head.forward(params, actions, None, lp, ent, choices)
    np.testing.assert_allclose(lp, -np.log(12.0), rtol=1e-6)  # uniform: 1/3 * 1/4
    np.testing.assert_allclose(ent, np.log(12.0), rtol=1e-6)
    # 3 is inside the row's 7 logits but outside the first choice's 3 options
    with pytest.raises(IndexError, match="outside the logits"):
        _policy_head.forward(params, np.array([[0, 3], [3, 0], [1, 1], [0, 2]], np.int32), None, lp, ent, choices)
    with pytest.raises(IndexError, match="outside the logits"):
        _policy_head.backward(params, np.array([[0, 4], [2, 0], [1, 1], [0, 2]], np.int64), None, lp, ent,
                              np.zeros_like(params), None, choices)
    with pytest.raises(ValueError, match="8 options for 7 logits"):
        _policy_head.forward(params, actions, None, lp, ent, np.array([3, 5], np.int64))
    with pytest.raises(ValueError, match="at least 2 options"):
        _policy_head.forward(params, actions, None, lp, ent, np.array([1, 6], np.int64))
    with pytest.raises(TypeError, match="choices must be int64"):
        _policy_head.forward(params, actions, None, lp, ent, np.array([3, 4], np.int32))
    with pytest.raises(ValueError, match="4 actions for 4 rows of 2 choices"):
        _policy_head.forward(params, actions[:, 0].copy(), None, lp, ent, choices)
    with pytest.raises(ValueError, match="Gaussian head has no choices"):
        _policy_head.forward(params, np.zeros((4, 7), np.float32), np.zeros(7, np.float32), lp, ent, choices)


def _trainers(preset: str, overrides: list[str]) -> tuple[list[APPOTrainer], dict]:
    """(native, autograd) trainers for `preset` with the same weights, and an off-policy batch with episode
    ends, truncations and invalid samples."""
    trainers = []
    for native in (True, False):
        cfg = load_config(str(ROOT / preset), [f"algo.native_gradient={str(native).lower()}", *overrides])
        spec = resolve_env(cfg.env)
        torch.manual_seed(0)
        model = ActorCritic(spec, cfg.model)
        if trainers:
            model.load_state_dict(trainers[0].model.state_dict())
        else:
            with torch.no_grad():  # biases and log-std away from their init, so that a wrong gradient shows
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.1)
            if model.normalizer is not None:
                model.normalizer.mean.normal_()
                model.normalizer.var.uniform_(0.5, 2.0)
        trainers.append(APPOTrainer(model, cfg.algo, cfg.sampler.max_policy_lag))
    assert trainers[0].native_gradient is not None and trainers[1].native_gradient is None
    gen = torch.Generator().manual_seed(7)
    batch = synthetic_batch(cfg, spec, seed=3)
    shape = batch["log_probs"].shape
    batch["log_probs"] = torch.randn(shape, generator=gen) * 0.3 - 2.0  # ratios on both sides of the clip
    batch["truncated"] = torch.rand(shape, generator=gen) < 0.03
    batch["terminated"] = (torch.rand(shape, generator=gen) < 0.05) & ~batch["truncated"]
    batch["valid"] = torch.rand(shape, generator=gen) > 0.1
    return trainers, batch


def _one_minibatch(trainer: APPOTrainer, batch: dict):
    """The first minibatch's loss output and the gradient it leaves, through the trainer's own dispatch."""
    batch = dict(batch, train_mask=batch["valid"].clone())
    mb, loss_fn = next(trainer._minibatches(batch))
    out = trainer._loss_and_gradient(mb, loss_fn)
    return out, {name: p.grad.clone() for name, p in trainer.model.named_parameters()}


@needs_native
@pytest.mark.parametrize("preset,overrides", [
    ("configs/mujoco_halfcheetah.yaml", []),
    ("configs/mujoco_halfcheetah.yaml", ["algo.minibatch_unit=samples", "algo.value_clip=0.2",
                                         "algo.entropy_coef=0.01", "algo.normalize_advantages=false"]),
    ("configs/cartpole.yaml", ["algo.entropy_coef=0.02"]),
    ("configs/cartpole.yaml", ["algo.minibatch_unit=samples", "algo.num_minibatches=4", "algo.value_clip=0.5"]),
    ("configs/cartpole.yaml", ["model.activation=relu", "model.hidden_sizes=[32]", "algo.vtrace_lambda=0.9"]),
    # an observed action mask (random observations: some rows allow nothing, some actions taken are forbidden)
    ("configs/cartpole.yaml", ["env.id=custom_env:FastrlTestMasked-v0", "algo.entropy_coef=0.02"]),
    # two discrete choices at once (a MultiDiscrete of 3 and 4 options)
    ("configs/cartpole.yaml", ["env.id=custom_env:FastrlTestTwoChoices-v0", "algo.entropy_coef=0.02"]),
])
def test_a_minibatch_loss_and_gradient_match_autograd(preset, overrides):
    (native, reference), batch = _trainers(preset, overrides)
    out, grads = _one_minibatch(native, batch)
    out_ref, grads_ref = _one_minibatch(reference, batch)
    for name, value, expected in zip(out._fields, out, out_ref):
        expected = float(expected.detach())
        assert abs(float(value) - expected) <= 1e-5 * max(1.0, abs(expected)), name
    for name, expected in grads_ref.items():
        assert expected.abs().max() > 0, name  # every parameter takes part, so the comparison means something
        torch.testing.assert_close(grads[name], expected, atol=1e-6, rtol=1e-4, msg=name)


@needs_native
def test_episode_flags_of_another_dtype_take_the_same_v_trace():
    """The chain calls fastrl_ext._vtrace straight on bool flags and float32 rewards; other dtypes go through
    fastrl.algo.vtrace's conversions, to the same loss and gradient."""
    (native, _), batch = _trainers("configs/mujoco_halfcheetah.yaml", [])
    native.generator.manual_seed(0)
    out, grads = _one_minibatch(native, batch)
    converted = dict(batch, terminated=batch["terminated"].to(torch.uint8), truncated=batch["truncated"].float(),
                     rewards=batch["rewards"].double())
    native.generator.manual_seed(0)  # the same minibatch again
    out_converted, grads_converted = _one_minibatch(native, converted)
    assert batch["terminated"].any() and batch["truncated"].any()
    for name, value, expected in zip(out._fields, out_converted, out):
        assert abs(float(value) - float(expected)) <= 1e-6 * max(1.0, abs(float(expected))), name
    for name, expected in grads.items():
        torch.testing.assert_close(grads_converted[name], expected, atol=1e-7, rtol=1e-5, msg=name)


@needs_native
@pytest.mark.parametrize("preset", ["configs/mujoco_halfcheetah.yaml", "configs/cartpole.yaml"])
def test_a_training_pass_lands_on_the_same_weights(preset):
    (native, reference), batch = _trainers(preset, ["algo.num_minibatches=4", "algo.num_epochs=2"])
    start = {k: v.clone() for k, v in reference.model.state_dict().items()}
    stats = [t.train(dict(batch)) for t in (native, reference)]
    for key in ("loss", "policy_loss", "value_loss", "approx_kl", "grad_norm", "clip_fraction"):
        assert abs(stats[0][key] - stats[1][key]) <= 1e-4 * max(1.0, abs(stats[1][key])), key
    assert stats[0]["sgd_steps"] == stats[1]["sgd_steps"] == 8
    for name, expected in reference.model.state_dict().items():
        torch.testing.assert_close(native.model.state_dict()[name], expected, atol=2e-5, rtol=1e-4, msg=name)
        if name.endswith("weight"):
            assert (expected - start[name]).abs().max() > 1e-4, name


@needs_native
def test_left_to_autograd_where_the_chain_does_not_apply():
    cheetah = "configs/mujoco_halfcheetah.yaml"
    for overrides in (["algo.native_gradient=false"], ["algo.native_loss=false"], ["algo.native_vtrace=false"],
                      ["model.native_mlp=false"], ["model.precision=bf16"], ["model.shared_encoder=true"],
                      ["algo.minibatches_per_weights=2", "algo.minibatch_unit=samples"]):
        cfg = load_config(str(ROOT / cheetah), overrides)
        trainer = APPOTrainer(ActorCritic(resolve_env(cfg.env), cfg.model), cfg.algo, cfg.sampler.max_policy_lag)
        assert trainer.native_gradient is None, overrides

    # learner shards share a minibatch through autograd: the chain steps aside while there are several
    cfg = load_config(str(ROOT / cheetah), ["algo.minibatch_unit=samples"])
    trainer = APPOTrainer(ActorCritic(resolve_env(cfg.env), cfg.model), cfg.algo, cfg.sampler.max_policy_lag,
                          shards=2)
    assert trainer.native_gradient is not None
    assert trainer._native_gradient_for(trainer._sample_minibatch_loss) is None
    trainer.set_shards(1)
    assert trainer._native_gradient_for(trainer._sample_minibatch_loss) is not None
    assert trainer._native_gradient_for(trainer._trajectory_minibatch_loss) is not None
    # a gradient no longer the flat buffer's view: the C++ writes would go nowhere the step reads
    trainer.trained_params[0].grad = torch.zeros_like(trainer.trained_params[0])
    assert not trainer.native_gradient.ready()
    assert trainer._native_gradient_for(trainer._sample_minibatch_loss) is None


@needs_native
def test_the_native_chain_runs_where_it_is_on():
    """The switch is honoured: with it on, a minibatch takes no autograd graph at all (its loss is a
    Python float, where the autograd path's is a tensor with a graph)."""
    (native, reference), batch = _trainers("configs/mujoco_halfcheetah.yaml", [])
    out, _ = _one_minibatch(native, batch)
    assert isinstance(out.loss, float)
    assert _one_minibatch(reference, batch)[0].loss.grad_fn is not None
    assert ActorCritic(CHEETAH, ModelConfig()).native_nets is not None
