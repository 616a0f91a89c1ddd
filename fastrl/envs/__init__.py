"""Environments: resolving an env id to a backend, and stepping a split of envs."""  # noqa: E402

import warnings

# envpool declares float64 Box bounds that gymnasium then warns about on every env creation
warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")

from fastrl.envs.spec import EnvError, EnvSpec, resolve_env
from fastrl.envs.vector import Step, make_group, make_groups, make_split

__all__ = ["EnvError", "EnvSpec", "Step", "make_group", "make_groups", "make_split", "resolve_env"]
