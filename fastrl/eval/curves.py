"""`fastrl plot runs/<a> [runs/<b> ...]`: mean return (last 100 episodes) against env steps and
against wall time, one line per run, from each run's metrics.jsonl. A resumed run continues its
line: its wall clock restarts at each resume, so each segment is shifted to follow the last.

`--at` and `--reach` also print the comparison as a table (`return_table`), so that figures quoted
from several runs come from a command rather than from reading the chart: the mean return at
env-step marks, and the env steps and minutes each run took to first reach a return. A return is
reached only by a mean over a full window of games: the first reports of a run are means of a few,
and one lucky game must not count. (Runs recorded before metrics.jsonl said how many games each
mean covers count every report.)"""

from __future__ import annotations

import json
from pathlib import Path

from fastrl.runner.stats import EPISODE_WINDOW


class PlotError(Exception):
    pass


def load_curve(run_dir: Path) -> dict:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise PlotError(f"{run_dir}: no metrics.jsonl (not a fastrl run directory, or written by an older fastrl)")
    steps, wall, ret, games = [], [], [], []
    offset = last_wall = 0.0
    lines = path.read_text().splitlines(keepends=True)
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not line.endswith("\n"):
                break  # a row being written as we read (the run is going), or cut by a crash
            raise PlotError(f"{path}, line {number}: not a JSON row ({line.strip()[:60]!r})") from None
        if row["wall_s"] < last_wall:  # a resume restarted the clock
            offset += last_wall
        last_wall = row["wall_s"]
        if "episode/return_mean" in row:
            steps.append(row["env_steps"])
            wall.append(offset + row["wall_s"])
            ret.append(row["episode/return_mean"])
            games.append(row.get("episode/episodes_in_mean"))
    if not ret:
        raise PlotError(f"{run_dir}: no finished episodes recorded yet")
    frames_per_step = 1
    if steps and "frames" in row and row["env_steps"]:
        frames_per_step = max(1, round(row["frames"] / row["env_steps"]))
    return {"name": run_dir.name, "env_steps": steps, "wall_s": wall, "return": ret, "episodes_in_mean": games,
            "frames_per_env_step": frames_per_step}


def return_at(curve: dict, env_steps: int) -> float | None:
    """The mean return in the first report at or past `env_steps` (None if the run stopped short).
    The first at or past, not the nearest: a run's value at a mark is then what it had by then."""
    for steps, ret in zip(curve["env_steps"], curve["return"]):
        if steps >= env_steps:
            return ret
    return None


def first_reach(curve: dict, target: float) -> tuple[int, float] | None:
    """(env steps, wall seconds) of the first report whose mean return over a full window of games
    is at least `target`, or None."""
    for steps, wall, ret, games in zip(curve["env_steps"], curve["wall_s"], curve["return"],
                                       curve["episodes_in_mean"]):
        if ret >= target and (games is None or games >= EPISODE_WINDOW):
            return steps, wall
    return None


def return_table(curves: list[dict], marks: list[int], reach: list[float]) -> str:
    """A Markdown table, one row per run: the mean return at each env-step mark, then the env steps
    (and minutes) to first reach each return in `reach`; blank where the run did not get there."""
    head = ["run"] + [f"{m:,}" for m in marks] + [f"to {r:+g}" for r in reach]
    rows = []
    for c in curves:
        row = [c["name"]]
        for m in marks:
            ret = return_at(c, m)
            row.append("" if ret is None else f"{ret:+.1f}")
        for r in reach:
            hit = first_reach(c, r)
            row.append("" if hit is None else f"{hit[0]:,} ({hit[1] / 60:.0f} min)")
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def plot_curves(curves: list[dict], out: Path, title: str | None = None) -> Path:
    """The chart of `load_curve`'s curves, written to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_steps, ax_wall) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for c in curves:
        ax_steps.plot(c["env_steps"], c["return"], label=c["name"])
        ax_wall.plot([w / 60 for w in c["wall_s"]], c["return"], label=c["name"])
    fpe = curves[0]["frames_per_env_step"]
    ax_steps.set_xlabel("env steps" + (f" (x{fpe} = frames)" if fpe > 1 else ""))
    ax_wall.set_xlabel("wall time (minutes)")
    ax_steps.set_ylabel("mean return, last 100 episodes")
    for ax in (ax_steps, ax_wall):
        ax.grid(alpha=0.3)
    ax_wall.legend(fontsize=8, loc="lower right")
    fig.suptitle(title or ", ".join(c["name"] for c in curves), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
