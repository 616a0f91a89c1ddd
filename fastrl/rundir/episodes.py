"""The run's most recent whole episodes, kept in episodes.json so that a resumed run's mean return
goes on over the same last 100 games instead of restarting from none.

Without it, the first minutes after a `--resume` reported the mean of the few games finished
since (a spike or a dip on the curve), `fastrl plot --reach` could count a resumed run as having
reached a return on one lucky game, and `run.stop_at_mean_return` waited for 100 new games.

Each episode carries the env steps the runner had counted when its report arrived. A resume
keeps only those at or before its checkpoint's env steps: the games after it belong to a
stretch of training the resumed run does not continue. The file holds twice the window, so that
the games between the last checkpoint and the last report do not leave the window short.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastrl.rundir.layout import write_json

FILE_NAME = "episodes.json"


class EpisodesFileError(Exception):
    """episodes.json that cannot be read back: one line saying why."""


def save_recent_episodes(run_dir: Path, episodes: list[tuple[int, float, int]]) -> None:
    """`episodes`: (env steps when reported, return, length) of the most recent, oldest first."""
    write_json(run_dir / FILE_NAME, {
        "env_steps": [int(e[0]) for e in episodes],
        "return": [float(e[1]) for e in episodes],
        "length": [int(e[2]) for e in episodes],
    }, indent=None)


def load_episodes_until(run_dir: Path, env_steps: int, limit: int) -> list[tuple[int, float, int]]:
    """The last `limit` saved episodes reported at or before `env_steps`, oldest first; none for a
    run that saved none (an older fastrl's). EpisodesFileError for a file that is not one."""
    path = run_dir / FILE_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise EpisodesFileError(f"could not read {path}: {e}") from None
    try:
        steps, returns, lengths = data["env_steps"], data["return"], data["length"]
        if not len(steps) == len(returns) == len(lengths):
            raise ValueError("its lists differ in length")
        episodes = [(int(s), float(r), int(n)) for s, r, n in zip(steps, returns, lengths)]
    except (KeyError, TypeError, ValueError) as e:
        raise EpisodesFileError(f"{path} is not a fastrl episodes file: {e!r}") from None
    kept = [e for e in episodes if e[0] <= env_steps]
    return kept[-limit:] if limit > 0 else []
