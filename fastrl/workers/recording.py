"""Recording: one env step of a group of envs, written into the group's trajectory slot.

A rollout worker's per-step bookkeeping: rewards, episode ends and the `valid` mask at step t,
the observation at t + 1, envpool's reset steps kept out of training, non-finite transitions
masked, rewards scaled (if configured), and each env's running score and length, handed over when
its game ends. Two implementations of one contract:

- PythonRecorder: numpy, the reference, and the path for gymnasium envs.
- NativeRecorder: fastrl_ext._record, one C++ call per env step for envpool splits that expose their
  raw outputs. On CartPole the reference costs ~25 numpy calls per step of 32 envs, about as much
  CPU as stepping the envs; tests/test_recording.py checks the two write the same bytes.
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from fastrl.algo.reward_scaling import ReturnScaler
from fastrl.envs import Step
from fastrl.envs.vector import step_from_raw

log = logging.getLogger(__name__)


class PythonRecorder:
    def __init__(self, bufs, num_groups: int, num_envs: int, reward_scaler: ReturnScaler | None,
                 count_nonfinite: Callable[[int], None]):
        """`bufs`: the trajectory buffers (obs, rewards, terminated, truncated, valid arrays);
        `count_nonfinite(n)` is told how many env steps were masked for NaN/inf."""
        self.obs, self.rewards = bufs.obs.array, bufs.rewards.array
        self.terminated, self.truncated, self.valid = bufs.terminated.array, bufs.truncated.array, bufs.valid.array
        self.num_envs = num_envs
        self.float_obs = np.issubdtype(self.obs.dtype, np.floating)
        self.reward_scaler = reward_scaler
        self.count_nonfinite = count_nonfinite
        # per group: the step just recorded ended an episode, so the next one is envpool's reset step
        self.was_reset = np.zeros((num_groups, num_envs), dtype=bool)
        self.ep_score = np.zeros((num_groups, num_envs), dtype=np.float64)
        self.ep_len = np.zeros((num_groups, num_envs), dtype=np.int64)
        self.finished_scores: list[float] = []
        self.finished_lengths: list[int] = []

    def take_finished(self) -> tuple[list[float], list[int]]:
        """Scores and lengths of the games that ended since the last call."""
        out = self.finished_scores, self.finished_lengths
        self.finished_scores, self.finished_lengths = [], []
        return out

    def record(self, group: int, env, slot: int, t: int) -> None:
        """Collect `env`'s step (its `recv`) into slot `slot` at step t, the observation at t + 1."""
        self.write(group, env.recv(), slot, t)

    def write(self, group: int, step: Step, slot: int, t: int) -> None:
        was_reset = self.was_reset[group]
        self.rewards[slot, t] = step.reward
        self.terminated[slot, t] = step.terminated
        self.truncated[slot, t] = step.truncated
        # envpool ignores the action of the step after an episode end: never train on it
        np.logical_not(was_reset, out=self.valid[slot, t])
        np.logical_or(step.terminated, step.truncated, out=was_reset)
        if not np.isfinite(step.reward).all() or (self.float_obs and not np.isfinite(step.obs).all()):
            self._mask_nonfinite(step, slot, t)
        self._scale_rewards(group, slot, t)
        ep_score, ep_len = self.ep_score[group], self.ep_len[group]
        ep_score += step.score
        ep_len += self.valid[slot, t]
        if step.game_over.any():
            done = np.flatnonzero(step.game_over)
            self.finished_scores.extend(ep_score[done].tolist())
            self.finished_lengths.extend(ep_len[done].tolist())
            ep_score[done] = 0.0
            ep_len[done] = 0
        self.obs[slot, t + 1] = step.obs

    def _scale_rewards(self, group: int, slot: int, t: int) -> None:
        """Rewards just written, divided by the running std of the return (if configured); needs the
        valid mask and the episode ends of this step."""
        if self.reward_scaler is not None:
            self.rewards[slot, t] = self.reward_scaler(group, self.rewards[slot, t], self.valid[slot, t],
                                                       self.was_reset[group])

    def _mask_nonfinite(self, step: Step, slot: int, t: int) -> None:
        """An env that emits NaN/inf must not poison training: zero the values, mask the transition."""
        reward_ok = np.isfinite(step.reward)
        obs_ok = np.isfinite(step.obs).reshape(self.num_envs, -1).all(axis=1) if self.float_obs else True
        bad = ~(reward_ok & obs_ok)
        self.valid[slot, t] &= ~bad
        self.rewards[slot, t][bad] = 0.0
        if self.float_obs:
            step.obs = np.nan_to_num(step.obs, nan=0.0, posinf=0.0, neginf=0.0)
        step.score = np.where(np.isfinite(step.score), step.score, 0.0)
        self.count_nonfinite(int(bad.sum()))


class NativeRecorder(PythonRecorder):
    """The same writes in one fastrl_ext._record call; for envs with `recv_raw` (EnvpoolSplit)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from fastrl_ext import _record

        self.record_step, self.scale_rewards = _record.record_step, _record.scale_rewards
        self.finished_score_out = np.empty(self.num_envs, dtype=np.float64)
        self.finished_length_out = np.empty(self.num_envs, dtype=np.int64)
        self.unsupported: str | None = None  # why the C++ refused this env's outputs, once it has
        # each group's rows as views made once, not per step
        self.group_state = [(self.was_reset[g], self.ep_score[g], self.ep_len[g]) for g in range(len(self.was_reset))]

    def record(self, group: int, env, slot: int, t: int) -> None:
        self.write_raw(group, env.recv_raw(), slot, t)

    def _scale_rewards(self, group: int, slot: int, t: int) -> None:
        """The reference's scaling in one C++ call on the scaler's own state (same bits)."""
        s = self.reward_scaler
        if s is not None:
            self.scale_rewards(s.returns[group], s.moments, self.rewards[slot, t], self.valid[slot, t],
                               self.was_reset[group], s.gamma, s.clip, s.eps)

    def write_raw(self, group: int, raw: tuple, slot: int, t: int) -> None:
        """`raw`: (obs, reward, done, trunc, env_id, score, game_over) as EnvpoolSplit.recv_raw gives it.
        Outputs the C++ does not take (a dtype or memory layout it was not written for; it checks them
        all before writing anything) go through the reference, which takes any."""
        if self.unsupported is not None:
            self.write(group, step_from_raw(*raw), slot, t)
            return
        try:
            finished, nonfinite = self.record_step(
                *raw, self.obs, self.rewards, self.terminated, self.truncated, self.valid, *self.group_state[group],
                self.finished_score_out, self.finished_length_out, slot, t)
        except (TypeError, ValueError) as err:
            self.unsupported = str(err)
            log.warning("recording this env's steps with the numpy reference: %s", err)
            self.write(group, step_from_raw(*raw), slot, t)
            return
        self._scale_rewards(group, slot, t)
        if finished:
            self.finished_scores.extend(self.finished_score_out[:finished].tolist())
            self.finished_lengths.extend(self.finished_length_out[:finished].tolist())
        if nonfinite:
            self.count_nonfinite(nonfinite)


def make_recorder(native: bool, env, *args, **kwargs) -> PythonRecorder:
    """NativeRecorder when asked for, built, and `env` gives raw envpool outputs; else the reference."""
    import fastrl_ext

    if native and hasattr(env, "recv_raw") and fastrl_ext._record is not None:
        return NativeRecorder(*args, **kwargs)
    return PythonRecorder(*args, **kwargs)
