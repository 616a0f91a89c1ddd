"""The acting forward with oneDNN-packed weights (fastrl.models.packed_cnn): the eager network's
outputs (bit for bit in bf16), the weights it packed until it is repacked, eager where it does not
apply, and an acting worker's forward that repacks after every weights load. And the direct forward
(the eager network's calls without its modules): its outputs bit for bit, in bf16 and fp32."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fastrl.buffers import SharedWeights, ShmAllocator
from fastrl.config.hardware import cpu_flags
from fastrl.config.loader import load_config
from fastrl.config.schema import ModelConfig
from fastrl.models import ActorCritic
from fastrl.models.packed_cnn import PackedForward, direct_forward, packed_forward
from fastrl.workers.acting import PACK_AFTER_FORWARDS, TorchForward
from helpers import HALFCHEETAH, PONG

CNN = {"encoder": "nature_cnn", "hidden_sizes": [512], "activation": "relu"}

pytestmark = pytest.mark.skipif(packed_forward(ActorCritic(PONG, ModelConfig(**CNN, precision="fp32")).for_inference(),
                                               PONG.obs_shape, 16) is None,
                                reason="this torch has no oneDNN pointwise ops")


# oneDNN runs bf16 convolutions only with AVX-512 (bw, vl, dq) or AVX-NE-CONVERT: elsewhere its weight
# reorder raises, packed_forward returns None, and a bf16 network acts eagerly (checked below either way).
# Decided from the CPU's flags, not by asking packed_forward, so that a packed_forward broken on a CPU
# that can pack bf16 fails these tests instead of skipping them.
_FLAGS = cpu_flags()
if _FLAGS is not None:
    BF16_PACKS = {"avx512bw", "avx512vl", "avx512dq"} <= _FLAGS or "avx_ne_convert" in _FLAGS
else:  # no /proc/cpuinfo flags to go by
    BF16_PACKS = packed_forward(ActorCritic(PONG, ModelConfig(**CNN, precision="bf16")).for_inference(),
                                PONG.obs_shape, 16) is not None
needs_bf16_packing = pytest.mark.skipif(not BF16_PACKS, reason="oneDNN has no packed bf16 convolution on this CPU "
                                        "(it needs AVX-512 or AVX-NE-CONVERT)")


def _obs(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *PONG.obs_shape), dtype=torch.uint8, generator=g)


def _net(precision, shared=True, seed=0, first_conv="strided"):
    torch.manual_seed(seed)
    return ActorCritic(PONG, ModelConfig(**CNN, shared_encoder=shared, precision=precision,
                                         first_conv=first_conv)).for_inference()


@needs_bf16_packing
@pytest.mark.parametrize("first_conv", ["strided", "space_to_depth"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "separate"])
@pytest.mark.parametrize("batch", [1, 7, 16, 33])
def test_bf16_packed_outputs_equal_the_eager_network_bit_for_bit(shared, batch, first_conv):
    net = _net("bf16", shared, first_conv=first_conv)
    packed = packed_forward(net, PONG.obs_shape, 16)
    assert isinstance(packed, PackedForward)
    obs = _obs(batch)
    with torch.inference_mode():
        (want_p, want_v), (got_p, got_v) = net(obs), packed(obs)
    assert got_p.dtype == torch.float32 and got_v.dtype == torch.float32
    assert got_p.shape == (batch, PONG.num_actions) and got_v.shape == (batch,)
    assert torch.equal(got_p, want_p) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("first_conv", ["strided", "space_to_depth"])
def test_fp32_packed_outputs_match_the_eager_network(first_conv):
    net = _net("fp32", first_conv=first_conv)
    packed = packed_forward(net, PONG.obs_shape, 32)
    assert packed is not None
    obs = _obs(20)
    with torch.inference_mode():
        for want, got in zip(net(obs), packed(obs)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_bf16_packing
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("first_conv", ["strided", "space_to_depth"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "separate"])
@pytest.mark.parametrize("batch", [1, 7, 16, 33])
def test_the_direct_forward_is_the_eager_network_bit_for_bit(precision, shared, batch, first_conv):
    net = _net(precision, shared, first_conv=first_conv)
    direct = direct_forward(net, PONG.obs_shape)
    assert isinstance(direct, PackedForward) and not direct.actor.pack
    obs = _obs(batch, seed=batch)
    with torch.inference_mode():
        for want, got in zip(net(obs), direct(obs)):
            assert got.dtype == want.dtype == torch.float32 and torch.equal(got, want)


@pytest.mark.parametrize("first_conv", ["strided", "space_to_depth"])
def test_new_weights_reach_the_direct_forward_its_tiled_first_conv_when_repacked(first_conv):
    net, other = _net("bf16", seed=0, first_conv=first_conv), _net("bf16", seed=1, first_conv=first_conv)
    direct = direct_forward(net, PONG.obs_shape)
    obs = _obs(8)
    with torch.inference_mode():
        net.load_state_dict(other.state_dict())
        want = other(obs)
        before_repack = direct(obs)
        direct.repack()
        after = direct(obs)
    # the layers' own weights are read at every call; only the first conv's tiles are cut at the repack
    assert torch.equal(before_repack[0], want[0]) == (first_conv == "strided")
    assert torch.equal(after[0], want[0]) and torch.equal(after[1], want[1])


def test_new_weights_reach_the_packed_layers_only_when_repacked():
    net, other = _net("bf16", seed=0), _net("bf16", seed=1)
    packed = packed_forward(net, PONG.obs_shape, 16)
    obs = _obs(8)
    with torch.inference_mode():
        before = packed(obs)
        net.load_state_dict(other.state_dict())  # what a weights load does to the layers' tensors
        want = other(obs)
        stale = packed(obs)  # the packed layers still hold the old weights (the heads read the new)
        packed.repack()
        after = packed(obs)
    assert not torch.equal(stale[0], want[0]) and not torch.equal(after[0], before[0])
    assert torch.equal(after[0], want[0]) and torch.equal(after[1], want[1])


@pytest.mark.parametrize("build", [lambda net: packed_forward(net, PONG.obs_shape, 16),
                                   lambda net: direct_forward(net, PONG.obs_shape)], ids=["packed", "direct"])
def test_eager_where_packing_does_not_apply(build):
    assert build(ActorCritic(HALFCHEETAH, ModelConfig()).eval()) is None  # an MLP
    training = _net("bf16").train()
    assert build(training) is None
    # fp32 layers in a bf16 network: the eager forward casts under autocast every call
    autocast_layers = ActorCritic(PONG, ModelConfig(**CNN, precision="bf16")).eval().use_channels_last()
    assert build(autocast_layers) is None
    plain_layout = ActorCritic(PONG, ModelConfig(**CNN, precision="fp32")).eval()
    assert build(plain_layout) is None


@pytest.mark.parametrize("packed_inference", [True, False])
def test_an_acting_forward_packs_each_version_that_outlasts_a_few_forwards(packed_inference):
    """TorchForward as an inference worker runs it: the first load casts the layers to bf16 and packs
    them; after each later load it acts eagerly for PACK_AFTER_FORWARDS forwards, then repacks. Every
    forward's values are those of the weights just loaded. On a CPU where oneDNN cannot pack bf16, the
    forward asked to pack acts eagerly throughout, with the same values."""
    packs = packed_inference and BF16_PACKS
    cfg = load_config("configs/atari_pong.yaml", [f"system.packed_inference={str(packed_inference).lower()}",
                                                   "model.precision=bf16"])
    alloc = ShmAllocator()
    try:
        learner_net = ActorCritic(PONG, cfg.model)  # fp32, as the learner publishes
        weights = SharedWeights.allocate(alloc, learner_net)
        weights.publish(learner_net, version=1)
        forward = TorchForward(SimpleNamespace(cfg=cfg, spec=PONG, weights=weights), seed=0)
        obs = _obs(16).numpy()
        for version in (1, 2, 3):
            if version > 1:
                with torch.no_grad():
                    for p in learner_net.parameters():
                        p.add_(0.05 * torch.randn_like(p))
                weights.publish(learner_net, version=version)
            assert forward.read(weights) == version
            assert forward.packed_current == (packs and version == 1)
            reference = ActorCritic(PONG, cfg.model)
            reference.load_state_dict(learner_net.state_dict())
            with torch.inference_mode():
                _, want = reference.for_inference()(torch.from_numpy(obs))
            for call in range(PACK_AFTER_FORWARDS + 2):
                _, _, values = forward(obs)
                np.testing.assert_array_equal(values, want.numpy())
                assert forward.packed_current == (packs and (version == 1 or call >= PACK_AFTER_FORWARDS))
        assert ("oneDNN-packed" in forward.kind) == packs
        # eagerly, it acted through the network's calls without its modules
        assert forward.direct is not None and "without the modules" in forward.kind
        if not packs:
            assert forward._net() is forward.direct
    finally:
        alloc.unlink_all()
