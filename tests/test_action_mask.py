"""An "action_mask" entry of a Dict observation (Jumanji's TSP, Snake, Knapsack, Connector; gymnasium's habit)
with one entry per logit: the policy gives forbidden actions exactly no probability, when it acts and when
the learner recomputes its log-probs. Before, the mask was only an input, and a TSP tour that revisited a
city ended in the env's penalty (mean return -28 after 1M env steps, against -10 with the mask)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrl.config.schema import Config, ModelConfig
from fastrl.envs.spec import _spec_from_spaces
from fastrl.models.actor_critic import ActorCritic


def masked_spec(act_space, mask_shape, before=3, joint_actions=True):
    obs = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(mask_shape),
                           "a_position": gym.spaces.Box(0.0, 1.0, (before,), np.float32),
                           "z_steps": gym.spaces.Discrete(9)})
    return _spec_from_spaces("Masked-v0", "gymnasium", obs, act_space, 1, joint_actions)


def test_a_mask_with_one_entry_per_logit_is_found_among_the_columns():
    spec = masked_spec(gym.spaces.Discrete(5), 5)
    # the Dict's key order: a_position (3 columns), then action_mask, then z_steps
    assert spec.action_mask == (3, 5)
    assert spec.action_mask_note() == "action_mask applied to the logits"
    # Connector: one mask row of 5 moves per agent, as many as the choices' logits together
    assert masked_spec(gym.spaces.Box(0, 4, (3,), np.int32), (3, 5)).action_mask == (3, 15)


def test_a_joint_mask_over_choices_drawn_one_by_one_stays_an_input_and_says_so():
    # Minesweeper's row and column under env.joint_actions=false (tests/test_joint_actions.py: true)
    spec = masked_spec(gym.spaces.Box(0, 9, (2,), np.int32), (10, 10), joint_actions=False)
    assert spec.action_mask == ()
    assert spec.action_mask_note() == ("action_mask of 100 entries read as an input only (the policy has 20 "
                                       "logits: a joint mask over its choices, applied under env.joint_actions=true)")
    plain = _spec_from_spaces("Plain-v0", "gymnasium", gym.spaces.Box(0.0, 1.0, (3,)), gym.spaces.Discrete(2), 1)
    assert plain.action_mask == () and plain.action_mask_note() is None


def observations(spec, allowed: torch.Tensor) -> torch.Tensor:
    """Flattened observations with `allowed` [B, n] in the mask's columns and random values elsewhere."""
    obs = torch.rand(allowed.shape[0], spec.obs_shape[0])
    first, count = spec.action_mask
    obs[:, first:first + count] = allowed.float()
    return obs


@pytest.mark.parametrize("native_mlp", [False, True], ids=["torch_layers", "native_layers"])
def test_forbidden_actions_get_no_probability_and_no_gradient(native_mlp):
    spec = masked_spec(gym.spaces.Discrete(4), 4)
    torch.manual_seed(0)
    model = ActorCritic(spec, ModelConfig(hidden_sizes=[16, 16], native_mlp=native_mlp))
    allowed = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1]] * 2000, dtype=torch.bool)
    obs = observations(spec, allowed)
    params, _ = model(obs)
    actions, log_probs = model.sample(params.detach())
    assert allowed[torch.arange(len(actions)), actions].all()
    assert torch.isfinite(log_probs).all()
    assert (log_probs[1::3] == 0).all()  # one allowed action: certain
    # the entropy is the allowed actions' alone: finite, 0 where one is allowed
    entropy = model.entropy(params)
    assert torch.isfinite(entropy).all() and entropy[1].abs() < 1e-6
    params.retain_grad()
    (model.log_prob(params, actions) + model.entropy(params)).sum().backward()
    assert (params.grad[~allowed] == 0).all() and params.grad[allowed].abs().sum() > 0


def test_each_choice_of_several_is_masked_by_its_own_row():
    spec = masked_spec(gym.spaces.MultiDiscrete([3, 3]), (2, 3))
    model = ActorCritic(spec, ModelConfig(hidden_sizes=[8]))
    allowed = torch.tensor([[1, 0, 0, 0, 1, 1]] * 3000, dtype=torch.bool)
    params, _ = model(observations(spec, allowed))
    actions, _ = model.sample(params)
    assert (actions[:, 0] == 0).all() and (actions[:, 1] > 0).all()
    assert set(actions[:, 1].tolist()) == {1, 2}


def test_fastrl_exts_draw_never_picks_what_the_mask_forbids():
    """An inference worker draws from the masked logits with fastrl_ext's sample_categorical: a forbidden
    action's cumulative weight does not grow, so no uniform (the largest float below 1 included) lands
    on it."""
    import fastrl_ext

    if fastrl_ext._acting is None:
        pytest.skip("fastrl_ext is not built")
    from fastrl.models.actor_critic import MASKED_LOGIT

    logits = np.array([[0.3, MASKED_LOGIT, 1.2, MASKED_LOGIT], [MASKED_LOGIT, MASKED_LOGIT, 0.0, MASKED_LOGIT]],
                      np.float32)
    uniforms = np.concatenate([np.random.default_rng(0).random(4998, dtype=np.float32),
                               [0.0, np.nextafter(np.float32(1), np.float32(0))]]).astype(np.float32)
    rows = np.tile(logits, (2500, 1))  # the two rows alternate
    actions, log_probs = np.empty(5000, np.int64), np.empty(5000, np.float32)
    fastrl_ext._acting.sample_categorical(rows, uniforms, actions, log_probs)
    assert set(actions[0::2].tolist()) == {0, 2} and set(actions[1::2].tolist()) == {2}
    assert np.isfinite(log_probs).all()


def test_numpy_acting_and_the_native_gradient_take_masked_policies():
    """Before, both stepped aside for a mask, and a masked env acted and learned in torch (~1.4x slower)."""
    from fastrl.algo.native_gradient import NativeGradient
    from fastrl.models.numpy_policy import acting_backend, unsupported_reason

    cfg = Config()
    spec = masked_spec(gym.spaces.Discrete(4), 4)
    assert unsupported_reason(cfg, spec) is None and acting_backend(cfg, spec) == "numpy"
    assert NativeGradient.supported(ActorCritic(spec, ModelConfig(hidden_sizes=[8])), cfg.algo, object())


class LargestUniform:
    """A numpy Generator whose uniforms are all the largest float32 below 1."""
    def random(self, shape, dtype):
        return np.full(shape, np.nextafter(np.float32(1), np.float32(0)), dtype=dtype)


@pytest.mark.parametrize("native", [False, True], ids=["numpy", "fastrl_ext"])
def test_numpy_and_native_acting_never_pick_what_the_mask_forbids(native):
    """NumpyPolicy.act in numpy and in fastrl_ext's kernel, the largest uniform below 1 included: the forbidden
    actions' logits are MASKED_LOGIT before the draw, so no cumulative weight grows on them."""
    import fastrl_ext

    from fastrl.models.numpy_policy import NumpyPolicy

    if native and fastrl_ext._acting is None:
        pytest.skip("fastrl_ext is not built")
    spec = masked_spec(gym.spaces.Discrete(4), 4)
    torch.manual_seed(0)
    policy = NumpyPolicy.from_module(ActorCritic(spec, ModelConfig(hidden_sizes=[16, 16])), spec, "tanh", native)
    assert policy.native == native
    allowed = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1], [0, 1, 1, 0]] * 1000, dtype=torch.bool)
    obs = observations(spec, allowed).numpy()

    for rng in (np.random.default_rng(1), LargestUniform()):
        actions, log_probs, _ = policy.act(obs, rng)
        assert allowed.numpy()[np.arange(len(actions)), actions].all()
        assert np.isfinite(log_probs).all() and (log_probs[1::3] == 0).all()
    assert set(actions[0::3].tolist()) == {2} and set(policy.act(obs, np.random.default_rng(2))[0][0::3]) == {0, 2}


@pytest.mark.parametrize("native", [False, True], ids=["numpy", "fastrl_ext"])
def test_each_of_several_choices_is_drawn_among_what_its_mask_row_allows(native):
    """Connector's layout: one mask row per choice, as many entries as the choices' logits together."""
    import fastrl_ext

    from fastrl.models.numpy_policy import NumpyPolicy

    if native and fastrl_ext._acting is None:
        pytest.skip("fastrl_ext is not built")
    spec = masked_spec(gym.spaces.MultiDiscrete([3, 3]), (2, 3))
    torch.manual_seed(0)
    policy = NumpyPolicy.from_module(ActorCritic(spec, ModelConfig(hidden_sizes=[16])), spec, "tanh", native)
    assert policy.native == native
    allowed = torch.tensor([[1, 0, 1, 0, 1, 0], [0, 0, 1, 1, 1, 1]] * 1000, dtype=torch.bool)
    obs = observations(spec, allowed).numpy()
    by_choice = allowed.numpy().reshape(-1, 2, 3)
    for rng in (np.random.default_rng(1), LargestUniform()):
        actions, log_probs, _ = policy.act(obs, rng)
        assert actions.shape == (2000, 2)
        assert by_choice[np.arange(2000)[:, None], np.arange(2)[None, :], actions].all()
        assert np.isfinite(log_probs).all()
    # a choice with one option left takes it; one with two takes either
    assert set(actions[0::2, 1].tolist()) == {1} and set(actions[1::2, 0].tolist()) == {2}
    assert set(policy.act(obs, np.random.default_rng(2))[0][0::2, 0].tolist()) == {0, 2}


def test_the_kernel_refuses_a_mask_outside_the_observation():
    import fastrl_ext

    from fastrl.models.numpy_policy import NumpyPolicy

    if fastrl_ext._acting is None:
        pytest.skip("fastrl_ext is not built")
    spec = masked_spec(gym.spaces.Discrete(4), 4)  # 8 observation columns, the mask in 3..6
    policy = NumpyPolicy.from_module(ActorCritic(spec, ModelConfig(hidden_sizes=[8])), spec, "tanh", native=True)
    obs = np.zeros((2, 8), np.float32)
    out = np.empty(2, np.int64), np.empty(2, np.float32), np.empty(2, np.float32)
    assert policy.plan[-1] == 3
    policy.act_into(obs, np.random.default_rng(0), *out)
    for column in (5, -2):  # past the last column, and not -1 (no mask)
        policy.plan[-1] = column
        with pytest.raises(ValueError, match="the action mask's columns lie outside the observation"):
            policy.act_into(obs, np.random.default_rng(0), *out)
