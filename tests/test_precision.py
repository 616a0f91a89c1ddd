"""model.precision=bf16: the layers run in bf16 under autocast, everything the loss sees is fp32,
and the outputs stay close to the fp32 network with the same weights."""

import pytest
import torch

from fastrl.config.schema import ModelConfig
from fastrl.models import ActorCritic, actor_critic
from helpers import HALFCHEETAH as CHEETAH, PONG
from test_linear import bf16_ulps


def _pair(spec, **model):
    torch.manual_seed(0)
    fp32 = ActorCritic(spec, ModelConfig(**model))
    bf16 = ActorCritic(spec, ModelConfig(precision="bf16", **model))
    bf16.load_state_dict(fp32.state_dict())
    return fp32, bf16


def _obs(spec, n=32):
    g = torch.Generator().manual_seed(1)
    if spec.is_image:
        return torch.randint(0, 256, (n, *spec.obs_shape), dtype=torch.uint8, generator=g)
    return torch.randn((n, *spec.obs_shape), generator=g)


@pytest.mark.parametrize("spec, model", [(PONG, {"encoder": "nature_cnn", "hidden_sizes": [512],
                                                 "activation": "relu", "shared_encoder": True}),
                                         (CHEETAH, {"normalize_obs": True})], ids=["cnn", "mlp"])
def test_bf16_outputs_are_fp32_and_close_to_the_fp32_network(spec, model):
    fp32, bf16 = _pair(spec, **model)
    obs = _obs(spec)
    p32, v32 = fp32(obs)
    p16, v16 = bf16(obs)
    assert p16.dtype == torch.float32 and v16.dtype == torch.float32
    assert not torch.equal(p16, p32)  # bf16 really ran
    scale = p32.abs().max() + v32.abs().max()
    assert (p16 - p32).abs().max() < 0.05 * scale and (v16 - v32).abs().max() < 0.05 * scale


def test_bf16_gradients_reach_fp32_weights_and_agree_in_direction():
    fp32, bf16 = _pair(PONG, encoder="nature_cnn", hidden_sizes=[512], activation="relu", shared_encoder=True)
    obs = _obs(PONG, 64)
    grads = []
    for net in (fp32, bf16):
        params, values = net(obs)
        (torch.log_softmax(params, -1)[:, 0].mean() + values.pow(2).mean()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    assert all(p.dtype == torch.float32 for p in bf16.parameters())
    cosine = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert cosine > 0.99


def test_channels_last_bf16_input_is_the_same_conversion_as_the_plain_layout():
    """The learner's CNN runs channels-last and converts bf16 frames in two steps (cast, then
    relayout); the network's outputs must equal those of the same weights in the plain layout."""
    _, bf16 = _pair(PONG, encoder="nature_cnn", hidden_sizes=[512], activation="relu", shared_encoder=True)
    channels_last = ActorCritic(PONG, ModelConfig(precision="bf16", encoder="nature_cnn", hidden_sizes=[512],
                                                  activation="relu", shared_encoder=True))
    channels_last.load_state_dict(bf16.state_dict())
    channels_last.to(memory_format=torch.channels_last)
    obs = _obs(PONG, 16)
    with torch.no_grad():
        (p_plain, v_plain), (p_cl, v_cl) = bf16(obs), channels_last(obs)
    scale = p_plain.abs().max() + v_plain.abs().max()
    # the same bf16 inputs; only the convolution's summation order may differ between layouts
    assert (p_cl - p_plain).abs().max() < 0.01 * scale and (v_cl - v_plain).abs().max() < 0.01 * scale


@pytest.mark.parametrize("spec, model", [(PONG, {"encoder": "nature_cnn", "hidden_sizes": [512],
                                                 "activation": "relu", "shared_encoder": True}),
                                         (CHEETAH, {"normalize_obs": True, "shared_encoder": False})],
                         ids=["cnn", "mlp"])
def test_layer_weights_held_in_bf16_give_exactly_the_autocast_outputs(spec, model):
    """An inference worker keeps its bf16 layers' weights in bf16 instead of letting autocast cast
    them at every forward: the same roundings, so the same outputs to the bit, and what is loaded
    into them later (fp32 published weights) is rounded the same way."""
    _, autocast = _pair(spec, **model)
    held = ActorCritic(spec, ModelConfig(precision="bf16", **model))
    held.load_state_dict(autocast.state_dict())
    held.hold_layer_weights_in_bf16()
    layer_dtypes = {p.dtype for m in held.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
                    for p in m.parameters()}
    assert layer_dtypes == {torch.bfloat16}
    if not spec.discrete:
        assert held.log_std.dtype == torch.float32 and held.normalizer.mean.dtype == torch.float32
    obs = _obs(spec)
    with torch.inference_mode():
        for a, b in zip(autocast(obs), held(obs)):
            assert b.dtype == torch.float32 and torch.equal(a, b)
    # new fp32 weights arrive: copied into the bf16 layers, they give autocast's outputs again
    with torch.no_grad():
        for p in autocast.parameters():
            p.add_(torch.randn_like(p) * 0.01)
        for src, dst in zip(autocast.state_dict().values(), held.state_dict().values()):
            dst.copy_(src)
    with torch.inference_mode():
        for a, b in zip(autocast(obs), held(obs)):
            assert torch.equal(a, b)


def test_an_fp32_model_keeps_fp32_layers():
    fp32, _ = _pair(CHEETAH, normalize_obs=True)
    fp32.hold_layer_weights_in_bf16()
    assert all(p.dtype == torch.float32 for p in fp32.parameters())


def test_channels_last_is_for_the_cnn_only_and_keeps_its_outputs():
    """Learner and inference workers both lay a CNN's weights out channels-last (use_channels_last)."""
    cnn = {"encoder": "nature_cnn", "hidden_sizes": [64], "activation": "relu", "shared_encoder": True}
    fp32, bf16 = _pair(PONG, **cnn)
    obs = _obs(PONG, 4)
    with torch.no_grad():
        before = fp32(obs)
        assert fp32.use_channels_last() is fp32
        after = fp32(obs)
    convs = [m for m in fp32.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in convs)
    for a, b in zip(before, after):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    mlp, _ = _pair(CHEETAH, normalize_obs=True)
    weights = [p.data_ptr() for p in mlp.parameters()]
    mlp.use_channels_last()
    assert [p.data_ptr() for p in mlp.parameters()] == weights


@pytest.mark.parametrize("shared", [True, False])
def test_a_bf16_networks_heads_are_fp32_products_of_bf16_values(monkeypatch, shared):
    """The heads after a bf16 CNN run as fastrl.models.linear.bf16_linear_in_fp32 (one call each), their
    outputs within a bf16 place of autocast's own head calls; an fp32 network's heads are its layers'."""
    calls = []
    real = actor_critic.bf16_linear_in_fp32
    monkeypatch.setattr(actor_critic, "bf16_linear_in_fp32", lambda *a: calls.append(1) or real(*a))
    fp32, bf16 = _pair(PONG, encoder="nature_cnn", hidden_sizes=[64], activation="relu", shared_encoder=shared)
    h = torch.randn(16, 64).bfloat16()
    h_v = h if shared else torch.randn(16, 64).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        params, values = bf16.heads(h, h_v)
        want = bf16.policy_head(h), bf16.value_head(h_v).squeeze(-1)
    assert len(calls) == 2
    for got, expected in zip((params, values), want):
        assert got.dtype == expected.dtype == torch.bfloat16 and got.shape == expected.shape
        assert bf16_ulps(got, expected).max() <= 1.0
    params, values = fp32.heads(h.float(), h_v.float())
    assert len(calls) == 2 and torch.equal(params, fp32.policy_head(h.float()))
