"""The numpy acting forward against ActorCritic: same outputs from the same published weights."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

from fastrl.buffers import ShmAllocator, SharedWeights
from fastrl.config import load_config
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic
from fastrl.models.numpy_policy import NumpyPolicy, acting_backend, unsupported_reason
from helpers import ROOT, modules_load_torch
from helpers import SMALL_DISCRETE as DISCRETE
from helpers import MASKED_DISCRETE as MASKED
from helpers import MASKED_CHOICES, TWO_CHOICES
from helpers import HALFCHEETAH as CONTINUOUS  # an MLP at HalfCheetah's shape
from helpers import PONG as IMAGE  # frame stacks: the Nature CNN


def _config(*overrides: str):
    return load_config(None, list(overrides))


def _model_and_policy(spec: EnvSpec, *overrides: str, seed: int = 0):
    """An ActorCritic with every parameter and statistic randomised (heads included, so the
    outputs are far from their near-zero initialisation), and a NumpyPolicy that read it the way a
    rollout worker does: published through SharedWeights, copied out with try_read_array."""
    model, layout, flat, cfg = _published(spec, *overrides, seed=seed)
    policy = NumpyPolicy(layout, spec, cfg.model.activation)
    policy.load(flat)
    return model, policy


def _published(spec: EnvSpec, *overrides: str, seed: int = 0):
    """(model, layout, flat weights as a worker copies them, config) for _model_and_policy."""
    cfg = _config(*overrides)
    torch.manual_seed(seed)
    model = ActorCritic(spec, cfg.model).eval()
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name == "normalizer.var":
                t.copy_(torch.rand_like(t) * 4 + 0.1)
            elif name == "normalizer.count":
                t.fill_(1000.0)
            else:
                t.copy_(torch.randn_like(t) * (0.5 if name.endswith("weight") else 0.3))
    alloc = ShmAllocator()
    try:
        weights = SharedWeights.allocate(alloc, model)
        weights.publish(model, version=3)
        staging = np.empty(weights.data.shape[0], dtype=np.float32)
        assert weights.try_read_array(staging) == 3
    finally:
        alloc.unlink_all()
    return model, weights.layout, staging, cfg


VARIANTS = [
    (DISCRETE, ["model.activation=tanh", "model.shared_encoder=false"]),
    (DISCRETE, ["model.activation=relu", "model.shared_encoder=true", "model.hidden_sizes=[32, 16, 8]"]),
    (CONTINUOUS, ["model.activation=tanh", "model.shared_encoder=false", "model.normalize_obs=true"]),
    (CONTINUOUS, ["model.activation=relu", "model.shared_encoder=true", "model.init_log_std=-0.5"]),
    # the mask read from the observation as it came, not as the normaliser leaves it
    (MASKED, ["model.activation=tanh", "model.shared_encoder=false", "model.normalize_obs=true"]),
    # several choices: one categorical per slice of the logits, with and without a mask over them all
    (TWO_CHOICES, ["model.activation=relu", "model.shared_encoder=false"]),
    (MASKED_CHOICES, ["model.activation=tanh", "model.shared_encoder=true", "model.normalize_obs=true"]),
]
VARIANT_IDS = ["cat-tanh-separate", "cat-relu-shared-3layers", "gauss-tanh-normalized", "gauss-relu-shared",
               "cat-masked-normalized", "choices-relu", "choices-masked-shared"]


@pytest.mark.parametrize("spec, overrides", VARIANTS, ids=VARIANT_IDS)
def test_forward_and_log_probs_match_actor_critic(spec, overrides):
    model, policy = _model_and_policy(spec, *overrides)
    obs = (np.random.default_rng(1).standard_normal((37, *spec.obs_shape)) * 3).astype(np.float32)
    with torch.no_grad():
        params_ref, values_ref = model(torch.from_numpy(obs))
    params, values = policy.forward(obs)
    assert params.dtype == np.float32 and values.shape == (37,)
    np.testing.assert_allclose(params, params_ref.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values, values_ref.numpy(), rtol=1e-4, atol=1e-5)
    assert np.abs(values).max() > 0.1  # not a trivially zero comparison

    actions, log_probs = policy.sample(params, np.random.default_rng(2))
    with torch.no_grad():
        log_probs_ref = model.log_prob(params_ref, torch.as_tensor(actions))
    np.testing.assert_allclose(log_probs, log_probs_ref.numpy(), rtol=1e-4, atol=1e-5)


def test_categorical_samples_follow_the_softmax():
    model, policy = _model_and_policy(DISCRETE, "model.activation=tanh")
    params = np.array([[2.0, 0.5, -1.0]], dtype=np.float32).repeat(40_000, axis=0)
    actions, log_probs = policy.sample(params, np.random.default_rng(3))
    probs = np.exp(params[0] - params[0].max())
    probs /= probs.sum()
    freq = np.bincount(actions, minlength=3) / len(actions)
    np.testing.assert_allclose(freq, probs, atol=0.01)  # 5 sigma of a 40k-sample frequency is ~0.012
    np.testing.assert_allclose(log_probs, np.log(probs)[actions], rtol=1e-5)


def test_several_choices_are_drawn_each_from_its_softmax_independently():
    _, policy = _model_and_policy(TWO_CHOICES, "model.activation=tanh")
    logits = np.array([[2.0, 0.5, -1.0, 0.0, 1.0, -0.5, 0.3]], dtype=np.float32)
    actions, log_probs = policy.sample(logits.repeat(40_000, axis=0), np.random.default_rng(3))
    assert actions.shape == (40_000, 2)
    probs = []
    for c, (lo, hi) in enumerate([(0, 3), (3, 7)]):
        p = np.exp(logits[0, lo:hi] - logits[0, lo:hi].max())
        probs.append(p / p.sum())
        freq = np.bincount(actions[:, c], minlength=hi - lo) / len(actions)
        np.testing.assert_allclose(freq, probs[c], atol=0.01)  # 5 sigma of a 40k-sample frequency is ~0.012
    np.testing.assert_allclose(log_probs, np.log(probs[0])[actions[:, 0]] + np.log(probs[1])[actions[:, 1]],
                               rtol=1e-5)
    # independent: each joint frequency is the product of the two
    joint = np.bincount(actions[:, 0] * 4 + actions[:, 1], minlength=12) / len(actions)
    np.testing.assert_allclose(joint, np.outer(probs[0], probs[1]).reshape(-1), atol=0.01)


def test_gaussian_samples_have_the_policys_mean_and_std():
    model, policy = _model_and_policy(CONTINUOUS, "model.init_log_std=-0.5")
    mean = np.linspace(-1, 1, 6, dtype=np.float32)[None].repeat(40_000, axis=0)
    actions, _ = policy.sample(mean, np.random.default_rng(4))
    std = model.log_std.detach().exp().numpy()
    np.testing.assert_allclose(actions.mean(0), mean[0], atol=5 * std.max() / np.sqrt(40_000))
    np.testing.assert_allclose(actions.std(0), std, rtol=0.02)


def test_which_models_act_in_numpy():
    cfg = _config("sampler.num_inference_workers=0")
    assert unsupported_reason(cfg, DISCRETE) is None and acting_backend(cfg, DISCRETE) == "numpy"
    assert "nature_cnn" in unsupported_reason(cfg, IMAGE) and acting_backend(cfg, IMAGE) == "torch"
    bf16 = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, precision="bf16"))
    assert "bf16" in unsupported_reason(bf16, DISCRETE) and acting_backend(bf16, DISCRETE) == "torch"
    forced = _config("sampler.acting_backend=torch")
    assert acting_backend(forced, DISCRETE) == "torch"


def test_an_impossible_numpy_backend_is_a_config_error():
    out = subprocess.run([sys.executable, "-m", "fastrl", "train", "--config", "configs/atari_pong.yaml",
                          "--set", "sampler.num_inference_workers=0", "--set", "sampler.acting_backend=numpy"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "sampler.acting_backend=numpy: model.encoder resolves to nature_cnn" in out.stdout + out.stderr


def test_importing_the_numpy_policy_does_not_import_torch():
    assert not modules_load_torch("fastrl.models.numpy_policy", "fastrl.workers.acting")


# --- fastrl_ext._acting (system.native_acting): held to the numpy reference above

needs_native = pytest.mark.skipif(__import__("fastrl_ext")._acting is None, reason="fastrl_ext not built")

NATIVE_VARIANTS = VARIANTS + [
    # 80 and 17 wide: a register chunk of 64, a chunk of 16 and single outputs, and a 17-wide observation
    (CONTINUOUS, ["model.activation=tanh", "model.shared_encoder=false", "model.hidden_sizes=[80, 17]"]),
]


def _native_twin(policy: NumpyPolicy) -> NumpyPolicy:
    twin = NumpyPolicy(policy.layout, policy.spec, policy.activation, native=True)
    twin.p = policy.p
    twin.plan, twin.block = twin.pack_native()
    return twin


@needs_native
@pytest.mark.parametrize("spec, overrides", NATIVE_VARIANTS)
def test_native_load_gathers_what_pack_native_packs(spec, overrides):
    """A native policy's load (one gather from the flat weights, then the derived values) leaves the
    plan and block that pack_native builds from the unpacked `p`, to the byte, and `p` unpacked late."""
    _, layout, flat, cfg = _published(spec, *overrides)
    native = NumpyPolicy(layout, spec, cfg.model.activation, native=True)
    for scale in (1.0, 0.5):  # a second load reuses the block
        native.load(flat * scale)
        reference = NumpyPolicy(layout, spec, cfg.model.activation)
        reference.load(flat * scale)
        plan, block = reference.pack_native()
        assert native.plan.tobytes() == plan.tobytes() and native.block.tobytes() == block.tobytes()
        assert native.p.keys() == reference.p.keys()
        assert all(native.p[k].tobytes() == reference.p[k].tobytes() for k in reference.p)


@needs_native
@pytest.mark.parametrize("spec, overrides", NATIVE_VARIANTS, ids=VARIANT_IDS + ["gauss-tanh-80-17"])
def test_native_act_matches_the_numpy_reference(spec, overrides):
    _, policy = _model_and_policy(spec, *overrides)
    native = _native_twin(policy)
    assert native.native and not policy.native
    # x3: pre-activations from ~0 (tanh's series branch) to saturation
    obs = (np.random.default_rng(1).standard_normal((61, *spec.obs_shape)) * 3).astype(np.float32)
    for seed in range(3):
        ref = policy.act(obs, np.random.default_rng(seed))
        got = native.act(obs, np.random.default_rng(seed))
        for name, r, g in zip(("actions", "log_probs", "values"), ref, got):
            assert g.dtype == r.dtype and g.shape == r.shape, name
            if spec.discrete and name == "actions":
                np.testing.assert_array_equal(g, r)  # the same uniforms pick the same actions
            else:
                np.testing.assert_allclose(g, r, rtol=1e-5, atol=2e-5, err_msg=name)
    assert np.abs(ref[2]).max() > 0.1 and len(set(ref[0].reshape(-1).tolist())) > 1  # not trivially equal


@needs_native
@pytest.mark.parametrize("spec, overrides", [
    # a 100-wide layer: whole chunks of outputs for every vector width, then outputs left over; a 37-wide one
    (DISCRETE, ["model.hidden_sizes=[100, 37]", "model.shared_encoder=false"]),
    (CONTINUOUS, ["model.hidden_sizes=[64, 64]", "model.activation=relu", "model.normalize_obs=true"]),
], ids=["cat-100-37", "gauss-relu-64-64"])
def test_native_act_matches_itself_row_by_row_in_blocks_of_rows(spec, overrides):
    """The kernel takes its wide layers 4 rows at a time (each chunk of W loaded once for the 4); a row's
    results are the same float32 sums in the same order as alone, bit for bit, whichever rows share its
    block: 7 rows are one block and 3 rows alone, each of which is checked against a call of its own."""
    _, policy = _model_and_policy(spec, *overrides)
    native = _native_twin(policy)
    rng = np.random.default_rng(5)
    obs = (rng.standard_normal((7, *spec.obs_shape)) * 3).astype(np.float32)
    random = native._random(7, rng)

    def act(rows):
        out = (np.empty(len(rows), np.int64) if spec.discrete else np.empty((len(rows), spec.num_actions), np.float32),
               np.empty(len(rows), np.float32), np.empty(len(rows), np.float32))
        native._act_mlp(native.plan, native.block, np.ascontiguousarray(obs[rows]),
                        np.ascontiguousarray(random[rows].reshape(len(rows), -1) if not spec.discrete
                                             else random[rows, 0]), *out)
        return out

    together = act(list(range(7)))
    for i in range(7):
        for name, batch, alone in zip(("actions", "log_probs", "values"), together, act([i])):
            np.testing.assert_array_equal(batch[i], alone[0], err_msg=f"{name} of row {i}")
    assert len(set(together[2].tolist())) == 7  # the rows differ


def _gaussian_through_tanh(bias: np.ndarray) -> NumpyPolicy:
    """mean_j = tanh(x + bias_j): one observation feature, one tanh layer as wide as `bias`, an
    identity head, and a std of e^-40, so each action is one tanh value."""
    n = bias.size
    spec = EnvSpec("Grid-v0", "envpool", (1,), np.dtype(np.float32), False, n, (-1.0,) * n, (1.0,) * n)
    tensors = {"actor_encoder.0.weight": np.ones((n, 1)), "actor_encoder.0.bias": bias,
               "critic_encoder.0.weight": np.ones((n, 1)), "critic_encoder.0.bias": bias,
               "policy_head.weight": np.eye(n), "policy_head.bias": np.zeros(n),
               "value_head.weight": np.ones((1, n)), "value_head.bias": np.zeros(1), "log_std": np.full(n, -40.0)}
    layout, offset = [], 0
    for name, t in tensors.items():
        layout.append((name, t.shape, offset))
        offset += t.size
    policy = NumpyPolicy(layout, spec, "tanh", native=True)
    policy.load(np.concatenate([np.asarray(t, np.float32).reshape(-1) for t in tensors.values()]))
    return policy


@needs_native
def test_native_tanh_is_accurate_over_its_whole_range():
    bias = np.linspace(-10, 10, 64, dtype=np.float32)
    policy = _gaussian_through_tanh(bias)
    x = np.concatenate([np.linspace(-0.16, 0.16, 4001), np.linspace(-1.0, 1.0, 4001)]).astype(np.float32)
    actions, _, values = policy.act(x[:, None], np.random.default_rng(0))
    expected = np.tanh(x[:, None] + bias[None, :])
    assert np.abs(actions - expected).max() < 3e-7
    near_zero = np.abs(x[:, None] + bias[None, :]) < 0.2  # the series branch, held to relative accuracy
    assert near_zero.sum() > 100
    rel = np.abs(actions - expected)[near_zero] / np.maximum(np.abs(expected[near_zero]), 1e-30)
    assert rel.max() < 1e-6
    np.testing.assert_allclose(values, expected.sum(1), atol=2e-5)


@needs_native
def test_native_act_refuses_bad_inputs_before_writing():
    import fastrl_ext

    _, policy = _model_and_policy(DISCRETE, "model.activation=tanh")
    native = _native_twin(policy)
    act = fastrl_ext._acting.act_mlp
    obs = np.zeros((5, 4), np.float32)
    outs = lambda: (np.full(5, -7, np.int64), np.full(5, -7, np.float32), np.full(5, -7, np.float32))  # noqa: E731
    u = np.full((5, 1), 0.5, np.float32)
    a, lp, v = outs()
    act(native.plan, native.block, obs, u, a, lp, v)
    assert (a != -7).all() and (v != -7).all()
    bad_calls = {
        TypeError: [(native.plan, native.block, obs.astype(np.float64), u),        # obs not float32
                    (native.plan.astype(np.int32), native.block, obs, u)],          # plan not int64
        ValueError: [(native.plan, native.block, np.zeros((5, 3), np.float32), u),  # obs width
                     (native.plan, native.block[:-10], obs, u),                     # a layer beyond params
                     (native.plan[:-1], native.block, obs, u),                      # truncated plan
                     (native.plan, native.block, obs, u[:4])],                      # too few uniforms
    }
    for error, calls in bad_calls.items():
        for args in calls:
            a, lp, v = outs()
            with pytest.raises(error):
                act(*args, a, lp, v)
            assert (a == -7).all() and (lp == -7).all() and (v == -7).all()


@needs_native
def test_native_act_refuses_choices_that_do_not_fit_the_head():
    """The plan's choices (its last entries) must add up to the head's logits, each of at least 2 options, and
    the uniforms and actions must be one per choice."""
    import fastrl_ext

    _, policy = _model_and_policy(TWO_CHOICES, "model.activation=tanh")
    native = _native_twin(policy)
    act = fastrl_ext._acting.act_mlp
    assert native.plan[7] == 2 and native.plan[-2:].tolist() == [3, 4]
    obs, u = np.zeros((5, 6), np.float32), np.full((5, 2), 0.5, np.float32)
    outs = lambda: (np.full((5, 2), -7, np.int64), np.full(5, -7, np.float32), np.full(5, -7, np.float32))  # noqa: E731
    a, lp, v = outs()
    act(native.plan, native.block, obs, u, a, lp, v)
    assert (a != -7).all() and (lp != -7).all()
    calls = [(([3, 5], u, None), "do not add up"), (([1, 6], u, None), "at least 2 options"),
             (([9, -2], u, None), "at least 2 options"),
             (([3, 4], u[:, :1].copy(), None), "random must be"),              # one uniform per row
             (([3, 4], u, np.full(5, -7, np.int64)), "actions must be")]       # one action per row
    for (choices, uniforms, actions), message in calls:
        plan = native.plan.copy()
        plan[-2:] = choices
        a, lp, v = outs()
        with pytest.raises(ValueError, match=message):
            act(plan, native.block, obs, uniforms, a if actions is None else actions, lp, v)
        assert (a == -7).all() and (lp == -7).all() and (v == -7).all()


@needs_native
@pytest.mark.parametrize("options", [(64,), (65,), (100,), (3, 64), (100, 3)],
                         ids=["64", "65", "100", "choices-3-64", "choices-100-3"])
def test_a_choice_of_more_than_64_options_is_drawn_by_the_kernel_as_in_numpy(options):
    """fastrl_ext's draw keeps 64 cumulative sums on the stack and counts past them in a second pass, the same
    additions in the same order: the same actions as numpy from the same uniforms at any width. Before, the
    kernel refused a Discrete(100) policy at its first step."""
    from fastrl.workers.acting import native_categorical_draw

    nvec = options if len(options) > 1 else ()
    spec = EnvSpec("Wide-v0", "envpool", (4,), np.dtype(np.float32), True, sum(options), (0,) * len(nvec),
                   action_nvec=nvec)
    _, policy = _model_and_policy(spec, "model.activation=tanh")
    native = _native_twin(policy)
    assert native_categorical_draw(_config(), spec) is not None
    obs = (np.random.default_rng(1).standard_normal((400, 4)) * 3).astype(np.float32)
    ref = policy.act(obs, np.random.default_rng(5))
    got = native.act(obs, np.random.default_rng(5))
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=2e-5)
    assert (ref[0] < np.asarray(options)).all()
    assert (ref[0].reshape(400, -1)[:, 0] >= 64).any() == (options[0] > 64)  # draws past the kept sums happen


def test_native_acting_off_or_unbuilt_uses_the_numpy_reference():
    _, policy = _model_and_policy(DISCRETE, "model.activation=tanh")
    assert not policy.native and policy.plan is None
    obs = np.ones((3, 4), np.float64)  # not float32: even a native policy hands it to numpy
    if __import__("fastrl_ext")._acting is not None:
        a, lp, v = _native_twin(policy).act(obs, np.random.default_rng(0))
        ra, rlp, rv = policy.act(obs, np.random.default_rng(0))
        np.testing.assert_array_equal(a, ra)
        np.testing.assert_array_equal(v, rv)


@needs_native
@pytest.mark.parametrize("spec, overrides", [NATIVE_VARIANTS[i] for i in (0, 2, 4, 6, 7)],
                         ids=["cat", "gauss-normalized", "cat-masked", "choices-masked", "gauss-80-17"])
def test_acting_into_slot_cells_writes_what_act_returns(spec, overrides):
    """A rollout worker's forward writes straight into its slot's cells (categorical actions int32
    there): the same values as `act`, from the same draws; and nothing drawn when it cannot."""
    _, policy = _model_and_policy(spec, *overrides)
    native = _native_twin(policy)
    obs = (np.random.default_rng(1).standard_normal((32, *spec.obs_shape)) * 3).astype(np.float32)
    ref = native.act(obs, np.random.default_rng(9))
    cells = (np.zeros((32, *spec.action_cell), np.int32 if spec.discrete else np.float32),
             np.zeros(32, np.float32), np.zeros(32, np.float32))
    assert native.act_into(obs, np.random.default_rng(9), *cells)
    for r, g in zip(ref, cells):
        np.testing.assert_array_equal(g, r.astype(g.dtype))
    rng = np.random.default_rng(9)
    assert not policy.act_into(obs, rng, *cells)                           # the numpy reference: act only
    assert not native.act_into(obs.astype(np.float64), rng, *cells)        # not float32: act only
    assert rng.random() == np.random.default_rng(9).random()               # and nothing drawn meanwhile
