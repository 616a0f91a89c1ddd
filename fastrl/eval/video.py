"""Writes the frames of an evaluated episode as an animated GIF (Pillow, which matplotlib
already needs). Image observations are drawn from the observation itself, enlarged: an Atari
[C, H, W] stack's newest frame, an [H, W, 3] image in colour; vector observations have no
picture to draw."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class VideoError(Exception):
    pass


def observation_frame(obs: np.ndarray, scale: int = 3, channels_last: bool = False) -> np.ndarray:
    """A uint8 image observation -> its picture enlarged `scale` times: [H*scale, W*scale] grayscale of
    the newest frame of a [C, H, W] stack (or of an [H, W, C] one), [H*scale, W*scale, 3] for an
    [H, W, 3] colour image."""
    if channels_last:
        frame = obs if obs.shape[2] == 3 else obs[..., -1]
    else:
        frame = obs[-1]
    return frame.repeat(scale, axis=0).repeat(scale, axis=1)


def write_video(frames: list, path: Path, fps: int = 15, channels_last: bool = False) -> Path:
    """`channels_last`: the observations are [H, W, C] (EnvSpec.obs_channels_last), not [C, H, W]."""
    if path.suffix.lower() != ".gif":
        raise VideoError(f"{path}: only .gif can be written here (no video encoder such as ffmpeg is installed)")
    if not frames or np.asarray(frames[0]).ndim != 3:
        raise VideoError("this env's observations are not images; it has no picture to record")
    from PIL import Image

    images = [Image.fromarray(observation_frame(np.asarray(f), channels_last=channels_last)) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return path
