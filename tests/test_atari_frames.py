"""Atari frames shrunk and stacked by fastrl_ext (fastrl.envs.atari_frames): the area resize against a slow
reference written from the weights' definition, and whole runs of envpool's raw frames through the rollout
workers' groups against envpool's own 84x84 stacks, bit for bit."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fastrl.config.loader import load_config
from fastrl.envs import resolve_env
from fastrl.envs.atari_frames import FrameLayout, FrameStacks, envpool_kwargs, why_not_native
from fastrl.envs.vector import EnvpoolSplit, make_groups
from fastrl_ext import _atari_frames as native

pytestmark = pytest.mark.skipif(native is None, reason="fastrl_ext not built")


def area_weights(ssize: int, dsize: int) -> list[list[tuple[int, np.float32]]]:
    """For each destination pixel, its (source pixel, weight) in order: the destination cell covers
    [d * s, (d + 1) * s) in source units, s = 1 / (dsize / ssize); a whole source pixel weighs 1 / cell,
    a cut one the fraction covered / cell, cuts under 1e-3 dropped; the cell is cut short at the edge."""
    s = 1.0 / (dsize / ssize)
    table = []
    for d in range(dsize):
        start, end = d * s, d * s + s
        cell = min(s, ssize - start)
        first_whole, last_whole = math.ceil(start), min(math.floor(end), ssize - 1)
        first_whole = min(first_whole, last_whole)
        entries = []
        if first_whole - start > 1e-3:
            entries.append((first_whole - 1, np.float32((first_whole - start) / cell)))
        entries += [(x, np.float32(1.0 / cell)) for x in range(first_whole, last_whole)]
        if end - last_whole > 1e-3:
            entries.append((last_whole, np.float32(min(end - last_whole, 1.0, cell) / cell)))
        table.append(entries)
    return table


def reference_resize(frame: np.ndarray, h: int, w: int) -> np.ndarray:
    """One frame, float32 throughout: each source row summed across (entries in order, each product rounded
    before its add), then those sums down the same way, rounded to the nearest integer (ties to even)."""
    x_table, y_table = area_weights(frame.shape[1], w), area_weights(frame.shape[0], h)
    rows = np.zeros((frame.shape[0], w), np.float32)
    for d, entries in enumerate(x_table):
        acc = np.zeros(frame.shape[0], np.float32)
        for k, (src, weight) in enumerate(entries):
            product = frame[:, src].astype(np.float32) * weight
            acc = product if k == 0 else acc + product
        rows[:, d] = acc
    out = np.zeros((h, w), np.uint8)
    for d, entries in enumerate(y_table):
        acc = np.zeros(w, np.float32)
        for k, (src, weight) in enumerate(entries):
            product = np.float32(weight) * rows[src]
            acc = product if k == 0 else acc + product
        out[d] = np.clip(np.rint(acc), 0, 255).astype(np.uint8)
    return out


# the presets' 84x84; unequal scales; one axis kept (scale 1); a row narrower than the AVX-512 pass's two
# vectors (its gather); sizes whose 16-pixel groups read past 32 source columns (gather again)
SIZES = [((210, 160), (84, 84)), ((210, 160), (110, 84)), ((210, 160), (84, 160)), ((20, 30), (7, 9)),
         ((64, 150), (30, 40)), ((33, 47), (33, 20))]


@pytest.mark.parametrize("src_size, dst_size", SIZES)
def test_area_resize_matches_reference(src_size, dst_size):
    rng = np.random.default_rng(sum(src_size) + sum(dst_size))
    frames = rng.integers(0, 256, (3, *src_size), dtype=np.uint8)
    frames[1] = 255  # the largest sums: rounding must not carry them past 255
    frames[2, ::2] = 0  # sharp edges between rows
    out = np.zeros((3, *dst_size), np.uint8)
    native.area_resize(frames, out)
    for i in range(3):
        np.testing.assert_array_equal(out[i], reference_resize(frames[i], *dst_size), err_msg=f"frame {i}")
    assert (out[1] == 255).all()


def test_push_frames_matches_reference_stacks():
    rng = np.random.default_rng(0)
    stacks = rng.integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    before = stacks.copy()
    raw = rng.integers(0, 256, (3, 1, 210, 160), dtype=np.uint8)
    native.push_frames(raw, stacks, np.array([False, True, False]))
    for i in (0, 2):  # the older frames move down one place, the new one last
        np.testing.assert_array_equal(stacks[i, :3], before[i, 1:])
        np.testing.assert_array_equal(stacks[i, 3], reference_resize(raw[i, 0], 84, 84))
    for k in range(4):  # a new game: the new frame in every place
        np.testing.assert_array_equal(stacks[1, k], reference_resize(raw[1, 0], 84, 84))


def test_bad_arguments_are_refused_with_a_message():
    frames = np.zeros((2, 210, 160), np.uint8)
    with pytest.raises(ValueError, match="shrink only"):
        native.area_resize(frames, np.zeros((2, 220, 84), np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        native.area_resize(frames.astype(np.float32), np.zeros((2, 84, 84), np.uint8))
    with pytest.raises(TypeError, match="N as src's"):
        native.area_resize(frames, np.zeros((3, 84, 84), np.uint8))
    with pytest.raises(TypeError, match="full must be bool"):
        native.push_frames(frames, np.zeros((2, 4, 84, 84), np.uint8), np.zeros(2, np.int32))
    with pytest.raises(TypeError, match="writable"):
        stacks = np.zeros((2, 4, 84, 84), np.uint8)
        stacks.flags.writeable = False
        native.push_frames(frames, stacks, np.zeros(2, bool))


def test_rows_out_of_env_order_get_their_own_envs_stacks():
    layout = FrameLayout(4, 84, 84)
    rng = np.random.default_rng(3)
    in_order, shuffled = FrameStacks(3, layout, first_id=5), FrameStacks(3, layout, first_id=5)
    ids = np.array([5, 6, 7], np.int32)
    for step in range(3):
        raw = rng.integers(0, 256, (3, 1, 210, 160), dtype=np.uint8)
        elapsed, lives, done = np.array([step, 0, step]), np.array([3, 3, 2]), np.zeros(3, bool)
        expected = in_order.push(raw, elapsed, lives, done, ids).copy()
        order = np.array([2, 0, 1])
        got = shuffled.push(raw[order], elapsed[order], lives[order], done[order], ids[order])
        np.testing.assert_array_equal(got, expected[order])
    with pytest.raises(RuntimeError, match="collected in the order they sent"):
        shuffled.push(raw, elapsed, lives, done, np.array([7, 8, 5], np.int32))  # env 8 is another group's


@pytest.fixture(scope="module")
def breakout():
    cfg = load_config("configs/atari_pong.yaml", ["env.id=Breakout-v5", "sampler.num_envs_per_worker=8"])
    return cfg, resolve_env(cfg.env)


def with_frames(cfg, choice: str):
    return dataclasses.replace(cfg.env, atari_frames=choice)


def step_both(envpool_groups, fastrl_groups, steps: int, seed: int) -> tuple[int, int]:
    """Steps both sets of groups with the same random actions; every output equal at every step. Returns the
    games that ended and the episodes cut by the time limit (resets that start the stacks over)."""
    rng = np.random.default_rng(seed)
    for a, b in zip(envpool_groups, fastrl_groups):
        np.testing.assert_array_equal(a.reset().obs, b.reset().obs)
    games = truncated = 0
    for t in range(steps):
        for a, b in zip(envpool_groups, fastrl_groups):
            actions = rng.integers(0, 4, a.num_envs).astype(np.int32)
            a.send(actions)
            b.send(actions)
            want, got = a.recv_raw(), b.recv_raw()
            assert got[0].shape == want[0].shape
            np.testing.assert_array_equal(got[0], want[0], err_msg=f"step {t}")
            for u, v in zip(want[1:], got[1:]):
                np.testing.assert_array_equal(u, v)
            games += int(want[6].sum())
            truncated += int(want[3].sum())
    return games, truncated


@pytest.mark.parametrize("env_pool", ["per_worker", "per_group"])
def test_groups_frames_are_envpools_own_through_lost_lives_and_new_games(breakout, env_pool):
    """Breakout with episodic_life: resets after a lost life keep the stack, new games start it over."""
    cfg, spec = breakout
    sampler = dataclasses.replace(cfg.sampler, env_pool=env_pool)
    envpool_groups = make_groups(with_frames(cfg, "envpool"), spec, sampler, 11)
    fastrl_groups = make_groups(with_frames(cfg, "fastrl"), spec, sampler, 11)
    try:
        assert all(g._frames is None for g in envpool_groups)
        assert all(g._frames is not None and g.direct for g in fastrl_groups)
        assert step_both(envpool_groups, fastrl_groups, 260, seed=2)[0] >= 2
    finally:
        for g in (*envpool_groups, *fastrl_groups):
            g.close()


def test_time_limits_restart_the_stacks_as_envpools_do():
    """Pong cut at 40 env steps: each truncation's reset is a new game (elapsed_step 0)."""
    cfg = load_config("configs/atari_pong.yaml", ["sampler.num_envs_per_worker=8",
                                                   "env.kwargs={episodic_life: true, max_episode_steps: 40}"])
    spec = resolve_env(cfg.env)
    envpool_groups = make_groups(with_frames(cfg, "envpool"), spec, cfg.sampler, 5)
    fastrl_groups = make_groups(with_frames(cfg, "fastrl"), spec, cfg.sampler, 5)
    try:
        assert step_both(envpool_groups, fastrl_groups, 90, seed=0)[1] >= 8  # every env cut twice
    finally:
        for g in (*envpool_groups, *fastrl_groups):
            g.close()


def test_envpools_own_through_its_public_calls_too(breakout):
    """Without the direct calls (envpool's Python wrapper): the stacks come from its info dict."""
    cfg, spec = breakout
    a = EnvpoolSplit(with_frames(cfg, "envpool"), spec, 3, 1, seed=4, direct=False)
    b = EnvpoolSplit(with_frames(cfg, "fastrl"), spec, 3, 1, seed=4, direct=False)
    try:
        assert not b.direct and b._frames is not None
        step_both([a], [b], 200, seed=5)
    finally:
        a.close()
        b.close()


def test_which_envs_and_settings_fastrl_takes(breakout):
    cfg, spec = breakout
    kwargs, layout = envpool_kwargs(with_frames(cfg, "auto"), spec)
    assert layout == FrameLayout(4, 84, 84)
    assert (kwargs["img_height"], kwargs["img_width"], kwargs["stack_num"]) == (210, 160, 1)
    assert kwargs["episodic_life"] is True  # the preset's own kwargs pass through
    assert envpool_kwargs(with_frames(cfg, "envpool"), spec) == (dict(cfg.env.kwargs), None)
    for kwargs, reason in [({"gray_scale": False}, "RGB"), ({"use_inter_area_resize": False}, "linear"),
                           ({"img_height": 105, "img_width": 80}, "evenly"), ({"img_height": 210, "img_width": 160},
                                                                               "no shrinking")]:
        assert reason in why_not_native(kwargs)
        env_cfg = dataclasses.replace(cfg.env, kwargs=kwargs, atari_frames="auto")
        assert envpool_kwargs(env_cfg, spec)[1] is None
        with pytest.raises(ValueError, match=reason):
            envpool_kwargs(dataclasses.replace(env_cfg, atari_frames="fastrl"), spec)
    cartpole = load_config(None, ["env.id=CartPole-v1", "env.atari_frames=fastrl"])
    with pytest.raises(ValueError, match="not an envpool Atari env"):
        envpool_kwargs(cartpole.env, resolve_env(cartpole.env))


def test_the_saved_config_records_who_keeps_the_frames():
    from fastrl.cli import _load
    from helpers import ROOT

    resolved, _ = _load(str(ROOT / "configs/atari_pong.yaml"), [])
    assert resolved.env.atari_frames == "fastrl"
    resolved, _ = _load(str(ROOT / "configs/atari_pong.yaml"), ["env.kwargs={gray_scale: false}"])
    assert resolved.env.atari_frames == "envpool"
    resolved, _ = _load(str(ROOT / "configs/cartpole.yaml"), [])
    assert resolved.env.atari_frames == "envpool"
