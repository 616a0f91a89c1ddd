"""`fastrl eval runs/<name>`: load a checkpoint of a run and play whole episodes with it.

One env per episode, all stepped together, and each env's first episode is the one counted, so
short episodes are not over-represented. Scores are counted as training reports them: on Atari
the whole game's unclipped score, whatever episodic_life / reward_clip training used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from fastrl.config.hardware import native_bf16, with_precision
from fastrl.config.loader import config_from_dict
from fastrl.envs import make_split, resolve_env
from fastrl.envs.actions import EnvActions
from fastrl.models import ActorCritic
from fastrl.rundir import latest_checkpoint, validate_checkpoint


class EvalError(Exception):
    """Nothing to evaluate: a one-line reason."""


@dataclass
class EvalResult:
    checkpoint: str
    env_steps: int
    returns: list = field(default_factory=list)
    lengths: list = field(default_factory=list)
    frames: list = field(default_factory=list)  # of the first env's episode, when recording
    frames_channels_last: bool = False  # the recorded observations are [H, W, C]

    def text(self) -> str:
        r, n = np.asarray(self.returns), np.asarray(self.lengths)
        return (f"{len(r)} episodes of {self.checkpoint} (trained {self.env_steps:,} env steps): "
                f"return {r.mean():.2f} ± {r.std():.2f} (min {r.min():.2f}, max {r.max():.2f}), "
                f"length {n.mean():.0f} ± {n.std():.0f}")


def picture_of(obs: np.ndarray, spec) -> np.ndarray:
    """An observation as the video's uint8 picture: a uint8 frame as it is, another image rescaled to
    0-255 by the same scale the CNN reads it with (EnvSpec.image_scale)."""
    if obs.dtype == np.uint8:
        return obs.copy()
    return np.clip(obs * (255.0 * spec.image_scale), 0, 255).astype(np.uint8)


def load_policy(run_dir: Path, checkpoint: Path | None):
    config_path = run_dir / "config.json"
    if not config_path.exists():
        raise EvalError(f"{run_dir} is not a fastrl run directory (no config.json)")
    cfg = config_from_dict(json.loads(config_path.read_text()))
    if cfg.model.precision == "bf16" and not native_bf16("cpu"):
        # trained where bf16 is native, played where it is emulated (~8x slower per forward): the
        # weights are fp32 either way, so play in fp32
        cfg = with_precision(cfg, "fp32")
    ckpt = checkpoint or latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        raise EvalError(f"no checkpoint in {run_dir / 'checkpoints'}")
    spec = resolve_env(cfg.env)
    model = ActorCritic(spec, cfg.model).eval()
    state = validate_checkpoint(ckpt, model)  # weights_only, and it must fit this run's model
    return cfg, spec, model, ckpt, int(state["env_steps"])


def play(run_dir: Path, checkpoint: Path | None = None, episodes: int = 10, deterministic: bool = False,
         seed: int = 12345, record: bool = False, max_steps: int = 1_000_000,
         on_episode: Optional[Callable[[int, float, int], None]] = None) -> EvalResult:
    """on_episode(episodes finished so far, return, length) is called as each counted episode
    ends: an Atari game lasts minutes of play, so a caller can show progress."""
    cfg, spec, model, ckpt, env_steps = load_policy(run_dir, checkpoint)
    to_env = EnvActions(spec)
    torch.manual_seed(seed)
    env = make_split(cfg.env, spec, episodes, 1, seed)
    result = EvalResult(str(ckpt), env_steps, frames_channels_last=spec.obs_channels_last)
    score = np.zeros(episodes)
    length = np.zeros(episodes, dtype=np.int64)
    done = np.zeros(episodes, dtype=bool)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, dtype=np.int64)
    obs = env.reset().obs
    with torch.inference_mode():
        for _ in range(max_steps):
            if record and not done[0]:
                result.frames.append(picture_of(np.asarray(obs[0]), spec))
            params, _ = model(torch.from_numpy(np.asarray(obs)))
            actions = model.mode(params) if deterministic else model.sample(params)[0]
            actions = actions.numpy().astype(np.int32 if spec.discrete else np.float32)
            env.send(to_env(actions))
            step = env.recv()
            obs = step.obs
            score += np.where(done, 0.0, step.score)
            length += ~done
            finished = step.game_over & ~done
            returns[finished], lengths[finished] = score[finished], length[finished]
            if on_episode is not None:
                for k, i in enumerate(np.flatnonzero(finished), start=int(done.sum()) + 1):
                    on_episode(k, float(score[i]), int(length[i]))
            done |= finished
            if done.all():
                break
    env.close()
    if not done.any():
        raise EvalError(f"no episode ended within {max_steps:,} steps")
    result.returns, result.lengths = returns[done].tolist(), lengths[done].tolist()
    return result
