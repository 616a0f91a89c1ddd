"""Several discrete choices in one action (MultiDiscrete, MultiBinary, an integer Box such as Jumanji's
Minesweeper row and column): one categorical per choice over its slice of the logits, the log-probs and
entropies summed. Before, these spaces were refused ("integer Box") or not supported at all."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrl.config.schema import Config, EnvConfig, ModelConfig
from fastrl.envs import EnvError, resolve_env
from fastrl.envs.spec import _spec_from_spaces
from fastrl.models.actor_critic import ActorCritic

OBS = gym.spaces.Box(0.0, 1.0, (5,), np.float32)


def spec_for(act_space):
    return _spec_from_spaces("Test-v0", "gymnasium", OBS, act_space, 1)


def test_each_kind_of_several_choices_gets_its_options_and_starts():
    spec = spec_for(gym.spaces.MultiDiscrete([3, 4], start=[1, -2]))
    assert (spec.discrete, spec.multi_discrete, spec.action_nvec, spec.action_low, spec.num_actions) == \
        (True, True, (3, 4), (1, -2), 7)
    spec = spec_for(gym.spaces.MultiBinary(3))
    assert (spec.action_nvec, spec.action_low, spec.num_actions) == ((2, 2, 2), (0, 0, 0), 6)
    spec = spec_for(gym.spaces.Box(0, 9, (2,), np.int32))
    assert (spec.action_nvec, spec.action_low, spec.num_actions) == ((10, 10), (0, 0), 20)
    # one Discrete stays one categorical; gymnasium's start is kept for the offset
    spec = spec_for(gym.spaces.Discrete(4, start=2))
    assert (spec.multi_discrete, spec.num_actions, spec.action_low) == (False, 4, (2,))
    assert spec_for(gym.spaces.Discrete(4)).action_low == ()


@pytest.mark.parametrize("space", [gym.spaces.MultiDiscrete([[2, 3], [2, 3]]), gym.spaces.MultiDiscrete([3, 1]),
                                   gym.spaces.MultiBinary((2, 2))], ids=["2-D", "one option", "2-D binary"])
def test_several_choices_fastrl_cannot_act_in_are_refused_by_name(space):
    with pytest.raises(EnvError, match="several discrete choices need a 1-D space with at least 2 options"):
        spec_for(space)


def test_jumanjis_minesweeper_is_a_row_and_a_column():
    """It acts with Box(0, 9, (2,), int32); before, refused as an integer Box (and before that, taken for a
    continuous action: every rollout worker died at its first step). Drawn one by one here; by default one
    categorical over the 100 cells (tests/test_joint_actions.py)."""
    spec = resolve_env(EnvConfig(id="Minesweeper-v0", joint_actions=False))
    assert (spec.action_nvec, spec.action_low) == ((10, 10), (0, 0))


def model_for(nvec, seed=0):
    torch.manual_seed(seed)
    spec = spec_for(gym.spaces.MultiDiscrete(nvec))
    return ActorCritic(spec, ModelConfig(hidden_sizes=[8], native_mlp=False))


def reference(params, actions, nvec):
    """torch.distributions, choice by choice, summed: the independent categoricals the policy means."""
    log_prob, entropy, offset = 0.0, 0.0, 0
    for i, n in enumerate(nvec):
        dist = torch.distributions.Categorical(logits=params[..., offset:offset + n])
        log_prob = log_prob + dist.log_prob(actions[..., i].long())
        entropy = entropy + dist.entropy()
        offset += n
    return log_prob, entropy


def test_log_prob_and_entropy_are_the_sum_over_choices_of_each_categoricals():
    nvec = (3, 5, 2)
    model = model_for(nvec)
    gen = torch.Generator().manual_seed(1)
    params = torch.randn(6, 4, sum(nvec), generator=gen) * 3  # [T, B, logits], as the learner asks
    actions = torch.stack([torch.randint(0, n, (6, 4), generator=gen) for n in nvec], -1).int()
    want_log_prob, want_entropy = reference(params, actions, nvec)
    torch.testing.assert_close(model.log_prob(params, actions), want_log_prob)
    torch.testing.assert_close(model.entropy(params), want_entropy)


def test_the_gradient_of_the_log_prob_matches_the_references():
    nvec = (4, 3)
    model = model_for(nvec)
    params = torch.randn(10, 7, requires_grad=True)
    actions = torch.stack([torch.randint(0, n, (10,)) for n in nvec], -1).int()
    (model.log_prob(params, actions) + 0.1 * model.entropy(params)).sum().backward()
    ours, params.grad = params.grad.clone(), None
    want_log_prob, want_entropy = reference(params, actions, nvec)
    (want_log_prob + 0.1 * want_entropy).sum().backward()
    torch.testing.assert_close(ours, params.grad)


def test_samples_follow_each_choices_softmax_and_carry_their_log_prob():
    nvec = (3, 2)
    model = model_for(nvec)
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5, -0.5]])
    params = logits.expand(20000, 5)
    torch.manual_seed(3)
    actions, log_probs = model.sample(params)
    assert actions.shape == (20000, 2)
    torch.testing.assert_close(log_probs, model.log_prob(params, actions))
    for i, (lo, hi) in enumerate([(0, 3), (3, 5)]):
        want = torch.softmax(logits[0, lo:hi], -1)
        freq = torch.bincount(actions[:, i], minlength=hi - lo).float() / 20000
        # 4 standard errors of a frequency of 20,000 draws
        assert (freq - want).abs().max() < 4 * math.sqrt(0.25 / 20000), (freq, want)
    # the choices are drawn independently: the joint frequency is the product of the two
    joint = ((actions[:, 0] == 0) & (actions[:, 1] == 0)).float().mean()
    assert abs(joint - torch.softmax(logits[0, :3], -1)[0] * torch.softmax(logits[0, 3:], -1)[0]) < 0.015
    torch.testing.assert_close(model.mode(logits), torch.tensor([[0, 0]]))


def test_the_native_paths_take_several_choices():
    """The numpy actor, fastrl_ext's acting kernel, its draw after a torch forward (an inference worker's) and the
    native gradient chain draw and differentiate several choices (tests/test_numpy_policy.py,
    test_categorical_draw.py and test_native_gradient.py hold them to torch and numpy); before, each stepped
    aside and the policy acted and learned in torch."""
    import fastrl_ext
    from fastrl.algo.native_gradient import NativeGradient
    from fastrl.models import native_mlp
    from fastrl.models.numpy_policy import acting_backend, unsupported_reason
    from fastrl.workers.acting import native_categorical_draw

    cfg = Config()
    spec, one = spec_for(gym.spaces.MultiDiscrete([3, 4])), spec_for(gym.spaces.Discrete(3))
    assert native_categorical_draw(cfg, spec) is not None and native_categorical_draw(cfg, one) is not None
    assert unsupported_reason(cfg, spec) is None and acting_backend(cfg, spec) == "numpy"
    # wherever the chain runs for one categorical: the extension built, its layers used on this CPU
    expected = native_mlp.pays() and fastrl_ext._policy_head is not None
    assert [NativeGradient.supported(ActorCritic(s, ModelConfig(hidden_sizes=[8])), cfg.algo, object())
            for s in (spec, one)] == [expected, expected]
