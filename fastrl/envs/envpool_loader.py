"""Importing envpool with only the env family a run needs.

`import envpool` runs `envpool.entry`, which registers all of the 17 env families it ships.
One of them, jumanji, imports matplotlib.pyplot to render, and the whole import costs ~1.2 CPU-s
on the 2-core box (~0.15 s without it). The runner and every rollout worker paid it at startup,
while they competed for the same two cores, before the first sample.

`load_envpool(env_id)` seeds `envpool.entry` with an empty module, imports the package, and then
imports the families' registration modules one at a time, in envpool's own order with the costly
ones last, until one registers `env_id`. An id that no family registers ends with every family
imported, so `list_all_envs()` is complete for the close-match hint. If envpool's layout is not
what this expects (no `entry.py` listing `envpool.<family>.registration` imports), or envpool was
already imported in the process, it is a plain `import envpool`.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path

# Registrations that import heavy Python libraries (jumanji: matplotlib.pyplot, ~0.6 CPU-s;
# playground: ~0.1 s); tried after every other family.
_COSTLY_LAST = ("envpool.mujoco.playground.registration", "envpool.jumanji.registration")
_PLACEHOLDER_DOC = "fastrl: registration of env families is done on demand by fastrl.envs.envpool_loader"


def _family_registrations() -> list[str] | None:
    """The registration modules `envpool.entry` would import, in its order, costly ones last."""
    spec = importlib.util.find_spec("envpool")
    if spec is None or not spec.submodule_search_locations:
        return None
    entry = Path(next(iter(spec.submodule_search_locations))) / "entry.py"
    try:
        text = entry.read_text()
    except OSError:
        return None
    names = re.findall(r"^import (envpool\.[\w.]+\.registration)\b", text, flags=re.MULTILINE)
    if not names:
        return None
    return [n for n in names if n not in _COSTLY_LAST] + [n for n in _COSTLY_LAST if n in names]


def _import_package_without_entry(registrations: list[str]) -> types.ModuleType:
    placeholder = types.ModuleType("envpool.entry", _PLACEHOLDER_DOC)
    placeholder.__fastrl_pending__ = list(registrations)  # registrations not imported yet
    sys.modules["envpool.entry"] = placeholder
    try:
        import envpool
    except BaseException:
        sys.modules.pop("envpool.entry", None)
        raise
    envpool.entry = placeholder
    return envpool


def load_envpool(env_id: str | None = None) -> types.ModuleType:
    """envpool, with at least the family that registers `env_id` (every family if None or unknown)."""
    if "envpool" not in sys.modules:
        registrations = _family_registrations()
        if registrations is None:
            import envpool

            return envpool
        envpool = _import_package_without_entry(registrations)
    else:
        envpool = sys.modules["envpool"]
    pending = getattr(sys.modules.get("envpool.entry"), "__fastrl_pending__", None)
    if not pending:
        return envpool  # imported in full (by us or by someone else)
    while pending and (env_id is None or env_id not in envpool.registration.registry.specs):
        importlib.import_module(pending.pop(0))
    return envpool
