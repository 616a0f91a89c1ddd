"""Aggregates what the workers report into what the user sees: the console line, TensorBoard
scalars and the end-of-run summary. Env steps and frames are kept apart and labelled.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from fastrl.host import idle_share
from fastrl.workers.process import seconds_since_process_start

EPISODE_WINDOW = 100


class RunStats:
    def __init__(self, frames_per_env_step: int, start_env_steps: int, start_time: float | None = None):
        """`start_time` (time.monotonic) is when the first workers were spawned; default now."""
        self.frames_per_env_step = frames_per_env_step
        self.start_time = time.monotonic() if start_time is None else start_time
        self.start_env_steps = start_env_steps
        self.env_steps = start_env_steps
        self.scores: deque = deque(maxlen=EPISODE_WINDOW)
        self.lengths: deque = deque(maxlen=EPISODE_WINDOW)
        # (env steps when reported, return, length): what episodes.json keeps for a resume; twice
        # the window, as a resume drops those reported after its checkpoint (fastrl.rundir.episodes)
        self.recent_episodes: deque = deque(maxlen=2 * EPISODE_WINDOW)
        self.episodes = 0  # finished in this run, not counting those restored from before a resume
        self.learner: dict = {}
        self.rate_points: deque = deque()  # (monotonic time, env_steps), last ~60 s
        self.lag_min, self.lag_max, self.lag_sum, self.lag_batches = float("inf"), 0.0, 0.0, 0
        self.lag_hist = np.zeros(0, dtype=np.int64)  # samples trained per policy lag (versions behind)
        self.dropped_for_lag = 0
        self.first_sample_s: float | None = None  # after the runner's setup (shared memory allocated, workers started)
        self.first_sample_after_command_s: float | None = None  # includes the CLI's imports and setup
        self.first_train_after_command_s: float | None = None  # the learner's first batch

    # --- inputs
    def restore_episodes(self, episodes: list[tuple[int, float, int]]) -> None:
        """A resumed run's window starts with the games its earlier sittings finished (oldest first)."""
        for env_steps, score, length in episodes:
            self.scores.append(score)
            self.lengths.append(length)
            self.recent_episodes.append((env_steps, score, length))

    def on_report(self, msg: dict) -> None:
        if msg["kind"] == "episodes":
            self.scores.extend(msg["scores"])
            self.lengths.extend(msg["lengths"])
            self.episodes += len(msg["scores"])
            self.recent_episodes.extend((self.env_steps, s, n) for s, n in zip(msg["scores"], msg["lengths"]))
        elif msg["kind"] == "learner":
            self.learner = msg
            if self.first_train_after_command_s is None:
                self.first_train_after_command_s = seconds_since_process_start()
            if msg["valid_samples"]:
                self.lag_min = min(self.lag_min, msg["lag_min"])
                self.lag_max = max(self.lag_max, msg["lag_max"])
                self.lag_sum += msg["lag_mean"]
                self.lag_batches += 1
                self.add_lag_hist(msg.get("lag_hist", []))
            self.dropped_for_lag += msg["dropped_for_lag"]

    def add_lag_hist(self, counts: list) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        if counts.size > self.lag_hist.size:
            self.lag_hist = np.pad(self.lag_hist, (0, counts.size - self.lag_hist.size))
        self.lag_hist[:counts.size] += counts

    def on_env_steps(self, env_steps: int) -> None:
        now = time.monotonic()
        if self.first_sample_s is None and env_steps > self.start_env_steps:
            self.first_sample_s = now - self.start_time
            self.first_sample_after_command_s = seconds_since_process_start()
        self.env_steps = env_steps
        self.rate_points.append((now, env_steps))
        while self.rate_points and now - self.rate_points[0][0] > 61.0:
            self.rate_points.popleft()

    # --- derived
    @property
    def frames(self) -> int:
        return self.env_steps * self.frames_per_env_step

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.start_time

    def rate(self, window_s: float) -> float:
        """Env steps/s over the last `window_s` seconds (or since start if shorter)."""
        if len(self.rate_points) < 2:
            return 0.0
        now, latest = self.rate_points[-1]
        old_t, old_steps = next(((t, s) for t, s in self.rate_points if now - t <= window_s), self.rate_points[0])
        return (latest - old_steps) / (now - old_t) if now > old_t else 0.0

    @property
    def mean_score(self) -> float | None:
        return float(np.mean(self.scores)) if self.scores else None

    @property
    def learner_busy_fraction(self) -> float:
        busy, wait = self.learner.get("busy_s", 0.0), self.learner.get("wait_s", 0.0)
        return busy / (busy + wait) if busy + wait > 0 else 0.0

    @property
    def learner_wait_cores_idle_fraction(self) -> float | None:
        """Of the cores' time while the learner waited for data, the share they idled (the rest ran the
        samplers); None before it has waited a tick of the kernel's counters."""
        return idle_share(self.learner.get("wait_idle_core_s", 0.0), self.learner.get("wait_core_s", 0.0))

    def lag_quantile(self, q: float) -> int | None:
        return hist_quantile(self.lag_hist, q)

    @property
    def lag_mean(self) -> float:
        return self.lag_sum / self.lag_batches if self.lag_batches else 0.0

    # --- outputs
    def console_line(self, train_for_env_steps: int) -> str:
        pct = 100.0 * self.env_steps / train_for_env_steps
        bar_len = 20
        filled = min(bar_len, int(bar_len * self.env_steps / train_for_env_steps))
        score = f"{self.mean_score:8.2f}" if self.mean_score is not None else "     n/a"
        lag = (f"{self.learner.get('lag_min', 0):.0f}/{self.learner.get('lag_mean', 0):.1f}/"
               f"{self.learner.get('lag_max', 0):.0f}")
        fps = ""
        if self.frames_per_env_step > 1:
            fps = f" frames {self.frames:,} ({self.rate(10) * self.frames_per_env_step:,.0f}/s)"
        return (f"[{'#' * filled}{'.' * (bar_len - filled)}] {pct:5.1f}% env_steps {self.env_steps:,}{fps} "
                f"| env steps/s 10s {self.rate(10):,.0f} 60s {self.rate(60):,.0f} "
                f"| return(last {len(self.scores)}) {score} | lag min/mean/max {lag} "
                f"| learner busy {100 * self.learner_busy_fraction:.0f}%")

    def scalars(self) -> dict:
        out = {"perf/env_steps_per_s_10s": self.rate(10), "perf/env_steps_per_s_60s": self.rate(60),
               "perf/frames_per_s_10s": self.rate(10) * self.frames_per_env_step,
               "perf/learner_busy_fraction": self.learner_busy_fraction}
        wait_idle = self.learner_wait_cores_idle_fraction
        if wait_idle is not None:
            out["perf/cores_idle_while_learner_waits"] = wait_idle
        if self.scores:
            out["episode/return_mean"] = self.mean_score
            out["episode/length_mean"] = float(np.mean(self.lengths))
            out["episode/episodes_in_mean"] = float(len(self.scores))  # below EPISODE_WINDOW: not yet a full window
        for key in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm", "lr",
                    "lag_min", "lag_mean", "lag_max", "dropped_for_lag", "skipped_steps", "parallel_fraction",
                    "nonfinite_steps_skipped"):
            if key in self.learner:
                out[f"train/{key}"] = float(self.learner[key])
        if self.learner.get("samples"):
            out["train/valid_fraction"] = self.learner["valid_samples"] / self.learner["samples"]
        return out

    def summary(self) -> dict:
        run_env_steps = self.env_steps - self.start_env_steps
        wait_idle = self.learner_wait_cores_idle_fraction
        return {
            "env_steps": self.env_steps, "frames": self.frames, "frames_per_env_step": self.frames_per_env_step,
            "wall_s": round(self.wall_s, 2),
            "mean_env_steps_per_s": round(run_env_steps / self.wall_s, 1) if self.wall_s > 0 else 0.0,
            "env_steps_per_s_last_60s": round(self.rate(60), 1),
            "final_mean_return": self.mean_score, "episodes": self.episodes,
            "episodes_in_mean": len(self.scores),
            "policy_lag": {"min": None if self.lag_batches == 0 else self.lag_min, "mean": round(self.lag_mean, 2),
                           "p50": self.lag_quantile(0.5), "p95": self.lag_quantile(0.95), "max": self.lag_max},
            "samples_dropped_for_lag": self.dropped_for_lag,
            "learner_busy_fraction": round(self.learner_busy_fraction, 4),
            "cores_idle_while_learner_waits": None if wait_idle is None else round(wait_idle, 4),
            "policy_version": self.learner.get("policy_version", 0), "train_steps": self.learner.get("train_steps", 0),
            "nonfinite_steps_skipped": self.learner.get("nonfinite_steps_skipped", 0),
            "time_to_first_sample_s": None if self.first_sample_s is None else round(self.first_sample_s, 2),
            "first_sample_after_command_s": None if self.first_sample_after_command_s is None
            else round(self.first_sample_after_command_s, 2),
            "first_train_after_command_s": None if self.first_train_after_command_s is None
            else round(self.first_train_after_command_s, 2),
        }


def hist_quantile(counts: np.ndarray, q: float) -> int | None:
    """The smallest bin value v with at least a fraction q of the counted samples at or below v."""
    total = int(counts.sum())
    if total == 0:
        return None
    return int(np.searchsorted(np.cumsum(counts), q * total))
