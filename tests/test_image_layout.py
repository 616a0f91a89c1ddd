"""Image observations in either order: envpool Atari's [C, H, W] and gymnasium's [H, W, C] (CarRacing,
most user envs). The layout is read off the spec once; the Nature CNN turns [H, W, C] into a view the
convs index as [C, H, W]. Before, an [H, W, C] image built a CNN with H input channels and failed."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrl.config.checks import encoder_problem, resolve_encoder
from fastrl.config.schema import ModelConfig
from fastrl.envs.spec import EnvSpec, _spec_from_spaces, stores_channels_last
from fastrl.eval.play import picture_of
from fastrl.eval.video import observation_frame
from fastrl.models import ActorCritic
from fastrl.models.packed_cnn import packed_forward

CNN = dict(encoder="nature_cnn", hidden_sizes=[64], activation="relu")


def _image_spec(shape, channels_last, env_id="Images-v0"):
    return EnvSpec(env_id, "gymnasium", shape, np.dtype(np.uint8), True, 3, obs_channels_last=channels_last)


@pytest.mark.parametrize("shape, channels_last", [
    ((4, 84, 84), False),   # envpool Atari's frame stack
    ((96, 96, 3), True),    # CarRacing
    ((84, 84, 4), True),    # a gymnasium frame-stack wrapper's
    ((64, 64, 1), True),
    ((3, 64, 64), False),
    ((7, 7, 3), True),      # MiniGrid's view
    ((17,), False), ((2, 5), False),
])
def test_which_observations_are_stored_channels_last(shape, channels_last):
    assert stores_channels_last(shape) == channels_last


def test_an_image_spec_gives_channels_height_width_in_either_order():
    assert _image_spec((96, 80, 3), True).image_chw == (3, 96, 80)
    assert _image_spec((4, 84, 80), False).image_chw == (4, 84, 80)


@pytest.mark.parametrize("channels_last_weights", [False, True], ids=["nchw_convs", "channels_last_convs"])
def test_an_hwc_network_computes_what_a_chw_one_does_on_the_transposed_images(channels_last_weights):
    """Same weights, the same images in the two orders: the same logits and values. A network that
    read [H, W, C] as [C, H, W] would not even build (40 input channels, a 3-pixel-wide image)."""
    chw = ActorCritic(_image_spec((3, 40, 36), False), ModelConfig(**CNN))
    hwc = ActorCritic(_image_spec((40, 36, 3), True), ModelConfig(**CNN))
    hwc.load_state_dict(chw.state_dict())
    if channels_last_weights:
        chw.use_channels_last()
        hwc.use_channels_last()
    images = torch.randint(0, 256, (5, 40, 36, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = chw(images.permute(0, 3, 1, 2).contiguous()), hwc(images)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_the_packed_acting_forward_takes_hwc_images():
    spec = _image_spec((40, 36, 3), True)
    model = ActorCritic(spec, ModelConfig(**CNN, precision="fp32")).for_inference()
    packed = packed_forward(model, spec.obs_shape, 8)
    if packed is None:
        pytest.skip("this torch has no oneDNN packed ops; the eager network acts")
    images = torch.randint(0, 256, (8, *spec.obs_shape), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        for w, g in zip(model(images), packed(images)):
            torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4)


def test_images_too_small_for_the_nature_cnn_go_to_an_mlp_or_are_refused():
    auto, cnn = ModelConfig(), ModelConfig(encoder="nature_cnn")
    minigrid, tiny_atari = _image_spec((7, 7, 3), True, "MiniGrid-Empty-5x5-v0"), _image_spec((4, 35, 84), False)
    assert resolve_encoder(auto, minigrid) == "mlp" and resolve_encoder(auto, tiny_atari) == "mlp"
    assert resolve_encoder(auto, _image_spec((36, 36, 3), True)) == "nature_cnn"
    assert "MiniGrid-Empty-5x5-v0 has images of (7, 7, 3)" in encoder_problem(cnn, minigrid)
    assert encoder_problem(cnn, _image_spec((4, 36, 36), False)) is None
    assert encoder_problem(auto, minigrid) is None
    ActorCritic(minigrid, auto)  # the MLP flattens the image: it builds


def test_a_gif_frame_is_the_colour_image_or_the_newest_frame_of_a_stack():
    rgb = np.zeros((4, 6, 3), np.uint8)
    rgb[..., 2] = 200
    frame = observation_frame(rgb, scale=2, channels_last=True)
    assert frame.shape == (8, 12, 3) and (frame[..., 2] == 200).all() and (frame[..., :2] == 0).all()
    stack_hwc = np.stack([np.full((4, 6), k, np.uint8) for k in range(4)], axis=-1)
    assert (observation_frame(stack_hwc, scale=2, channels_last=True) == 3).all()
    stack_chw = np.stack([np.full((4, 6), k, np.uint8) for k in range(4)])
    assert observation_frame(stack_chw, scale=3).shape == (12, 18)
    assert (observation_frame(stack_chw, scale=3) == 3).all()


@pytest.mark.parametrize("space, scale", [
    (gym.spaces.Box(0, 255, (40, 40, 3), np.uint8), 1 / 255),      # frames: as before
    (gym.spaces.Box(0.0, 1.0, (40, 40, 3), np.float32), 1.0),      # a float image already in [0, 1]
    (gym.spaces.Box(0.0, 255.0, (3, 40, 40), np.float32), 1 / 255),
    (gym.spaces.Box(-1, 8, (40, 40, 2), np.int32), 1 / 8),         # Minesweeper-like boards
    (gym.spaces.Box(-np.inf, np.inf, (40, 40, 3), np.float32), 1.0),
], ids=["uint8", "float01", "float255", "int", "unbounded"])
def test_an_images_scale_comes_from_its_box(space, scale):
    spec = _spec_from_spaces("Images-v0", "gymnasium", space, gym.spaces.Discrete(2), 1)
    assert spec.image_scale == pytest.approx(scale)


@pytest.mark.parametrize("packed", [False, True], ids=["eager", "packed"])
def test_a_float_image_in_0_1_reaches_the_convs_as_the_same_frame_in_uint8_does(packed):
    """Before, every image was divided by 255: a float image in [0, 1] reached the convs as at most 0.004,
    ~255 times weaker than the same picture as uint8 frames, and the policy barely moved."""
    frames = _image_spec((40, 36, 3), True)
    floats = _spec_from_spaces("Floats-v0", "gymnasium", gym.spaces.Box(0.0, 1.0, (40, 36, 3), np.float32),
                               gym.spaces.Discrete(3), 1)
    as_frames = ActorCritic(frames, ModelConfig(**CNN, precision="fp32")).for_inference()
    as_floats = ActorCritic(floats, ModelConfig(**CNN, precision="fp32")).for_inference()
    as_floats.load_state_dict(as_frames.state_dict())
    images = torch.randint(0, 256, (8, 40, 36, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    nets = (as_frames, as_floats)
    if packed:
        nets = tuple(packed_forward(net, (40, 36, 3), 8) for net in nets)
        if None in nets:
            pytest.skip("this torch has no oneDNN packed ops; the eager network acts")
    with torch.inference_mode():
        want, got = nets[0](images), nets[1](images.float() / 255)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_eval_draws_a_float_image_as_the_cnn_reads_it():
    spec = _spec_from_spaces("Floats-v0", "gymnasium", gym.spaces.Box(0.0, 1.0, (2, 2, 3), np.float32),
                             gym.spaces.Discrete(3), 1)
    picture = picture_of(np.array([[[0.0, 0.5, 1.0]] * 2] * 2, np.float32), spec)
    assert picture.dtype == np.uint8 and picture[0, 0].tolist() == [0, 127, 255]
