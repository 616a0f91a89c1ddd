"""Writes the frames of an evaluated episode as an animated GIF (Pillow, which matplotlib
already needs). Image observations (Atari) are drawn from the observation itself, the newest
frame of the stack, enlarged; vector observations have no picture to draw."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class VideoError(Exception):
    pass


def observation_frame(obs: np.ndarray, scale: int = 3) -> np.ndarray:
    """[C, H, W] uint8 frame stack -> [H*scale, W*scale] grayscale image of the newest frame."""
    frame = obs[-1] if obs.ndim == 3 else obs
    return np.kron(frame, np.ones((scale, scale), dtype=frame.dtype))


def write_video(frames: list, path: Path, fps: int = 15) -> Path:
    if path.suffix.lower() != ".gif":
        raise VideoError(f"{path}: only .gif can be written here (no video encoder such as ffmpeg is installed)")
    if not frames or np.asarray(frames[0]).ndim != 3:
        raise VideoError("this env's observations are not images; it has no picture to record")
    from PIL import Image

    images = [Image.fromarray(observation_frame(np.asarray(f))) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return path
