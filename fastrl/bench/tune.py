"""`fastrl tune`: hill-climbs the counts that decide throughput on this box, one knob at a time,
with short trials of the real training system.

Only speed settings move: rollout workers, envs per worker, splits, envpool threads and whether a
worker's splits share one envpool, inference workers, torch threads per process, and the batch size
(flagged: it changes the size of each update, so it is reported as an algorithm change). Learning
rate, clip, gamma and the rest are never touched. Pruning: a trial is cut at half time when it runs
below PRUNE_BELOW of the best so far, and a direction that did not help (x2 worse) is not extended
(x4 never tried). The search ends when the budget would not leave time to confirm, or after
max_trials trials (the preset's included). At the end the preset and the winner are measured again
alternately, so the comparison is side by side.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fastrl.bench.measure import headline_rate
from fastrl.host import available_cores
from fastrl.bench.report import Progress
from fastrl.bench.system import bench_system
from fastrl.config.checks import check_config
from fastrl.config.loader import parse_override, set_value
from fastrl.config.schema import Config
from fastrl.envs import EnvSpec

PRUNE_BELOW = 0.75  # a trial this far below the best at half time is not finished
MIN_GAIN = 0.05     # a change must beat the best by this much to be kept (2-core noise is ~5-10%)
CONFIRM_ROUNDS = 2  # extra alternating measurements of preset and winner


@dataclass(frozen=True)
class Knob:
    key: str                 # section.name
    step: str                # "x2": double / halve; "+1": add / subtract one; "toggle": the other of two `choices`
    lo: int = 0
    hi: int = 0
    changes_algorithm: bool = False
    choices: tuple = ()

    def get(self, cfg: Config) -> int | str:
        section, name = self.key.split(".")
        return getattr(getattr(cfg, section), name)

    def move(self, value: int | str, up: bool) -> int | str | None:
        """The next value in one direction, or None past the knob's range (a toggle moves up only)."""
        if self.step == "toggle":
            return next(c for c in self.choices if c != value) if up else None
        if self.step == "x2":
            nxt = value * 2 if up else value // 2
        else:
            nxt = value + 1 if up else value - 1
        return nxt if self.lo <= nxt <= self.hi and nxt != value else None


def knobs(cores: int) -> list[Knob]:
    """In order of how often they decided throughput in our measurements."""
    return [Knob("system.learner_threads", "+1", 1, cores),
            Knob("sampler.num_envs_per_worker", "x2", 4, 1024),
            Knob("sampler.num_rollout_workers", "+1", 1, 4 * cores),
            Knob("sampler.num_splits", "x2", 1, 8),
            Knob("sampler.num_inference_workers", "+1", 0, 2 * cores),
            Knob("system.inference_threads", "+1", 1, cores),
            Knob("sampler.env_pool", "toggle", choices=("per_group", "per_worker")),
            Knob("sampler.env_threads", "+1", 1, cores),
            Knob("algo.batch_size", "x2", 64, 65536, changes_algorithm=True)]


@dataclass
class Trial:
    changes: dict            # section.name -> value, relative to the preset
    rates: list[float]       # median env steps/s of each measurement of this configuration
    pruned: bool = False
    bottleneck: str = ""
    wall_s: float = 0.0
    phase: str = "search"

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def label(self) -> str:
        return ", ".join(f"{k.split('.')[1]}={v}" for k, v in self.changes.items()) or "preset"

    @property
    def changes_algorithm(self) -> bool:
        return "algo.batch_size" in self.changes


@dataclass
class Tuner:
    cfg: Config
    spec: EnvSpec
    config_paths: list
    overrides: list
    budget_s: float
    trial_s: float
    out_dir: Path
    progress: Progress
    max_trials: int | None = None  # search trials at most, the preset's included (None: the budget decides)
    trials: list[Trial] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.started = time.monotonic()
        self.cores = available_cores()
        self.measurements = 0
        self.baseline: Trial | None = None
        self.best: Trial | None = None

    # --- measuring
    def _config(self, changes: dict) -> Config:
        cfg = copy.deepcopy(self.cfg)
        problems: list[str] = []
        for key, value in changes.items():
            set_value(cfg, key, value, "tune", problems)
        return cfg

    def _left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def _expected_trial_s(self) -> float:
        full = [t.wall_s for t in self.trials if not t.pruned]
        return statistics.median(full) if full else self.trial_s * 1.5 + 10

    def _measure(self, changes: dict, prune: bool, phase: str) -> Trial:
        best_rate = self.best.rate if (prune and self.best) else None
        label = Trial(changes, []).label
        self.measurements += 1
        self.progress.begin(self.measurements, 0, f"{phase} trial: {label}")
        started = time.monotonic()
        out = bench_system(self._config(changes), self.spec, self.trial_s, self.progress, discard=False,
                           prune=None if best_rate is None else (lambda _e, rate: rate < PRUNE_BELOW * best_rate))
        rate = headline_rate(out["env_steps_per_s"])
        self.progress.end(f"{rate:,.0f} env steps/s" + (" (pruned)" if out["pruned"] else ""))
        return Trial(dict(changes), [rate], out["pruned"], out["bottleneck"] if "bottleneck" in out else "",
                     time.monotonic() - started, phase)

    # --- the search
    def _tried(self, changes: dict) -> bool:
        return any(t.changes == changes for t in self.trials)

    def _climb(self, knob: Knob) -> bool:
        """Try both directions from the best; keep going in a direction while it wins."""
        improved = False
        for up in (True, False):
            while True:
                value = knob.move(knob.get(self._config(self.best.changes)), up)
                if value is None:
                    break
                changes = {**self.best.changes, knob.key: value}
                if value == knob.get(self.cfg):
                    changes.pop(knob.key)
                if self._tried(changes):
                    break
                problems = check_config(self._config(changes))
                if problems:
                    self.skipped.append(f"{Trial(changes, []).label}: {problems[0]}")
                    break
                # keep time to confirm side by side: one round (preset and challenger) at least
                if self._left_s() < self._expected_trial_s() * 3 or len(self.trials) >= (self.max_trials or 1e9):
                    raise _BudgetSpent
                trial = self._measure(changes, prune=True, phase="search")
                self.trials.append(trial)
                if not trial.pruned and trial.rate > self.best.rate * (1 + MIN_GAIN):
                    self.best, improved = trial, True
                else:
                    break  # this direction is worse: do not extend it
        return improved

    def run(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.baseline = self._measure({}, prune=False, phase="search")
        self.trials.append(self.baseline)
        self.best = self.baseline
        try:
            for _ in range(3):  # passes over all knobs, until one pass changes nothing
                if not any([self._climb(k) for k in knobs(self.cores)]):
                    break
        except _BudgetSpent:
            pass
        self._confirm()

    def _confirm(self) -> None:
        """Measure the preset and the strongest challenger again, alternately, so noise and drift hit
        both alike; the challenger wins only if its median then beats the preset's by MIN_GAIN. When
        the preset led the search, the runner-up is the challenger (a lucky first measurement of the
        preset must not hide a real gain)."""
        others = [t for t in self.trials if t is not self.baseline and not t.pruned]
        if not others:
            return
        challenger = self.best if self.best is not self.baseline else max(others, key=lambda t: t.rate)
        for _ in range(CONFIRM_ROUNDS):
            for trial in (self.baseline, challenger):
                if self._left_s() < self._expected_trial_s():
                    break
                again = self._measure(trial.changes, prune=False, phase="confirm")
                trial.rates.append(again.rate)
        self.best = challenger if challenger.rate > self.baseline.rate * (1 + MIN_GAIN) else self.baseline

    # --- output
    def finish(self) -> str:
        if not self.trials:
            return "fastrl tune: no trial finished"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        ranked = sorted(self.trials, key=lambda t: (t.pruned, -t.rate))
        lines = [f"fastrl tune: {self.cfg.env.id}, {self.cores} cores, {len(self.trials)} trials of "
                 f"{self.trial_s:g} s in {time.monotonic() - self.started:.0f} s",
                 f"{'rank':>4}  {'env steps/s':>11}  {'runs':>4}  changes from the preset"]
        for i, t in enumerate(ranked, 1):
            note = " [pruned]" if t.pruned else ""
            note += " [changes the batch size: an algorithm change]" if t.changes_algorithm else ""
            lines.append(f"{i:>4}  {t.rate:>11,.0f}  {len(t.rates):>4}  {t.label}{note}")
        for s in self.skipped:
            lines.append(f"skipped (invalid): {s}")
        best, base = self.best or self.baseline, self.baseline
        gain = best.rate / base.rate - 1 if base.rate else 0.0
        lines.append(f"best: {best.label}: {best.rate:,.0f} env steps/s vs preset {base.rate:,.0f} "
                     f"({gain:+.0%}; medians of {len(best.rates)} and {len(base.rates)} measurements in this run)")
        confirmed = [t for t in self.trials if t is not base and len(t.rates) > 1]
        for t in confirmed:
            lines.append(f"side by side: {t.label} {t.rate:,.0f} (measurements {', '.join(f'{r:,.0f}' for r in t.rates)}) "
                         f"vs preset {base.rate:,.0f} ({', '.join(f'{r:,.0f}' for r in base.rates)})")
        overlay = self._write_overlay(best, base)
        chart = self._write_chart()
        (self.out_dir / "tune_results.json").write_text(json.dumps(
            {"env_id": self.cfg.env.id, "config": self.config_paths, "overrides": self.overrides,
             "cores": self.cores, "trial_s": self.trial_s, "budget_s": self.budget_s,
             "max_trials": self.max_trials,
             "best": {"changes": best.changes, "env_steps_per_s": best.rate, "measurements": best.rates},
             "preset": {"env_steps_per_s": base.rate, "measurements": base.rates},
             "trials": [{"changes": t.changes, "env_steps_per_s": t.rate, "measurements": t.rates,
                         "pruned": t.pruned, "phase": t.phase, "bottleneck": t.bottleneck,
                         "changes_algorithm": t.changes_algorithm} for t in self.trials],
             "skipped": self.skipped}, indent=2) + "\n")
        preset_args = " ".join(f"--config {p}" for p in self.config_paths)
        lines.append(f"wrote {overlay}, {chart} and {self.out_dir / 'tune_results.json'}")
        lines.append(f"use: fastrl train {preset_args} --config {overlay}")
        return "\n".join(lines)

    def _write_overlay(self, best: Trial, base: Trial) -> Path:
        # The search's own --set overrides go in too (env.id, say): every trial ran with them, and without
        # them the preset plus this file would train something that was never measured
        settings = dict(parse_override(text) for text in self.overrides)
        settings.update(best.changes)
        nested: dict = {}
        for key, value in settings.items():
            section, name = key.split(".", 1)
            nested.setdefault(section, {})[name] = value
        head = [f"# fastrl tune overlay for {' + '.join(map(str, self.config_paths)) or 'the defaults'} "
                f"on {self.cores} cores: {best.rate:,.0f} vs {base.rate:,.0f} env steps/s (medians, same run).",
                "# Layer it on the preset: fastrl train --config <preset> --config <this file>"]
        if self.overrides:
            given = ", ".join(" ".join(text.split()) for text in self.overrides)  # one comment line whatever was typed
            head.append(f"# It holds the search's --set overrides ({given}) and, over them, what the search changed.")
        if best.changes_algorithm:
            head.append(f"# NOTE: algo.batch_size changed from {self.cfg.algo.batch_size} to "
                        f"{best.changes['algo.batch_size']}: each update sees a different amount of data.")
        if not best.changes:
            head.append("# The preset was already the fastest.")
        body = yaml.safe_dump(nested, sort_keys=True) if nested else "{}\n"
        path = self.out_dir / "best_overlay.yaml"
        path.write_text("\n".join(head) + "\n" + body)
        return path

    def _write_chart(self) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = self.out_dir / "tune_chart.png"
        fig, ax = plt.subplots(figsize=(8, 0.35 * len(self.trials) + 1.5))
        labels = [f"{i}. {t.label}" for i, t in enumerate(self.trials, 1)]
        colors = ["tab:blue" if t is self.baseline else "tab:green" if t is self.best else
                  "lightgray" if t.pruned else "tab:orange" for t in self.trials]
        ax.barh(range(len(self.trials)), [t.rate for t in self.trials], color=colors)
        ax.set_yticks(range(len(self.trials)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("env steps/s (median; grey = pruned, blue = preset, green = best)")
        ax.set_title(f"fastrl tune: {self.cfg.env.id} on {self.cores} cores")
        fig.tight_layout()
        fig.savefig(path, dpi=80)
        plt.close(fig)
        return path


class _BudgetSpent(Exception):
    pass
