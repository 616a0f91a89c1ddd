"""Atari frames resized and stacked in the rollout worker by fastrl_ext, instead of inside envpool.

envpool shrinks each maxpooled 210x160 grayscale frame to 84x84 with OpenCV's INTER_AREA, whose generic
(non-integer scale) path is a scalar loop: ~10% of the machine's CPU in a live Pong sample stage, ~45 µs
an env step. Here envpool hands over the raw frame (img 210x160, a stack of 1) and
`fastrl_ext._atari_frames.push_frames` resizes it with the same weights and roundings, bit for bit, in
vectors (~7 µs with AVX-512), and keeps each env's stack as envpool would: the newest frame last, every
place filled with it after a new game (tests/test_atari_frames.py holds whole episodes to envpool's own
84x84 stacks). `env.atari_frames` picks.

envpool's stack starts over (every place the new frame) when a reset starts a new game: where its
elapsed_step is 0, or, with episodic_life, where the reset's no-ops ended the game and started another
(its lives then come back up). A reset after a lost life keeps the stack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastrl_ext import _atari_frames as _native  # None when fastrl_ext is not built

RAW_HEIGHT, RAW_WIDTH = 210, 160  # the Atari screen, what envpool returns at img 210x160


@dataclass(frozen=True)
class FrameLayout:
    """The stacks the rollout worker keeps: `stack` frames of height x width per env."""
    stack: int
    height: int
    width: int


def is_atari(spec) -> bool:
    """Whether an env spec is envpool's Atari: image frames with a frameskip (the spec's only Atari mark, so an
    Atari env made with frame_skip 1 keeps envpool's frames)."""
    return spec.backend == "envpool" and spec.frames_per_env_step > 1 and spec.is_image


def why_not_native(kwargs: dict) -> str | None:
    """Why these envpool kwargs keep the frames inside envpool, or None when fastrl_ext can take them."""
    if _native is None:
        return "fastrl_ext is not built"
    if not kwargs.get("gray_scale", True):
        return "RGB frames (gray_scale false)"
    if not kwargs.get("use_inter_area_resize", True):
        return "envpool's linear resize (use_inter_area_resize false)"
    height, width = int(kwargs.get("img_height", 84)), int(kwargs.get("img_width", 84))
    if height > RAW_HEIGHT or width > RAW_WIDTH or (height, width) == (RAW_HEIGHT, RAW_WIDTH):
        return f"no shrinking to do ({height}x{width} frames)"
    if RAW_HEIGHT % height == 0 and RAW_WIDTH % width == 0:
        # OpenCV then averages whole blocks by another path, with its own roundings
        return f"{height}x{width} frames divide the screen evenly (OpenCV's block-average path)"
    return None


def envpool_kwargs(env_cfg, spec) -> tuple[dict, FrameLayout | None]:
    """envpool.make's kwargs for this config, and the stacks fastrl_ext keeps (None: envpool keeps them).
    env.atari_frames: auto takes the frames where it can, fastrl insists (a ValueError saying why not),
    envpool never does."""
    kwargs = dict(env_cfg.kwargs)
    choice = env_cfg.atari_frames
    if choice == "envpool" or not is_atari(spec):
        if choice == "fastrl":
            raise ValueError(f"env.atari_frames=fastrl: {spec.env_id} is not an envpool Atari env")
        return kwargs, None
    reason = why_not_native(kwargs)
    if reason is not None:
        if choice == "fastrl":
            raise ValueError(f"env.atari_frames=fastrl: {reason}; use auto or envpool")
        return kwargs, None
    layout = FrameLayout(int(kwargs.get("stack_num", 4)), int(kwargs.get("img_height", 84)),
                         int(kwargs.get("img_width", 84)))
    kwargs.update(img_height=RAW_HEIGHT, img_width=RAW_WIDTH, stack_num=1)
    return kwargs, layout


class FrameStacks:
    """One group's envs' frame stacks, [N, stack, height, width], updated in place by each `push`.

    `first_id`: the group's first env id in its envpool (a shared envpool numbers every group's envs).
    The stacks are kept in env-id order; `push` returns them as they are when envpool's rows come in that
    order (sync mode, and a shared envpool's single thread), else a copy in the rows' order."""

    def __init__(self, num_envs: int, layout: FrameLayout, first_id: int = 0):
        self.stacks = np.zeros((num_envs, layout.stack, layout.height, layout.width), np.uint8)
        self.first_id = first_id
        self.was_done = np.zeros(num_envs, bool)
        self.lives = np.zeros(num_envs, np.int32)
        self.in_order = np.arange(num_envs, dtype=np.int64)

    def push(self, raw: np.ndarray, elapsed_step: np.ndarray, lives: np.ndarray, done: np.ndarray,
             env_id: np.ndarray) -> np.ndarray:
        """Each env's new raw frame ([N, 1, 210, 160] from envpool) onto its stack; the stacks in the rows' order,
        valid until the next push."""
        local = env_id - self.first_id
        ordered = np.array_equal(local, self.in_order)
        if not ordered:
            if local.min() < 0 or local.max() >= len(self.stacks):  # PooledGroup says why, had the stacks let it
                raise RuntimeError(f"frames of envs {env_id.min()}..{env_id.max()} came to the stacks of envs "
                                   f"{self.first_id}..{self.first_id + len(self.stacks) - 1}: the groups of a shared "
                                   "envpool must be reset and collected in the order they sent")
            order = np.argsort(local)
            raw, elapsed_step, lives, done = raw[order], elapsed_step[order], lives[order], done[order]
        new_game = (elapsed_step == 0) | (self.was_done & (lives > self.lives))
        _native.push_frames(raw, self.stacks, new_game)
        self.was_done[:] = done
        self.lives[:] = lives
        return self.stacks if ordered else self.stacks[local]
