"""Neural networks: the actor-critic and its observation normaliser (torch), and the same
actor-critic's acting forward in numpy (numpy_policy) for rollout workers that act themselves.

The torch classes load on first use, so that importing numpy_policy does not import torch.
"""

from __future__ import annotations

import importlib

_LAZY = {"ActorCritic": "fastrl.models.actor_critic", "seeded_model": "fastrl.models.actor_critic",
         "ObsNormalizer": "fastrl.models.normalizer"}

__all__ = ["ActorCritic", "ObsNormalizer", "seeded_model"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fastrl.models' has no attribute {name!r}")
