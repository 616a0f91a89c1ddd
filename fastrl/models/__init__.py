"""Neural networks: the actor-critic and its observation normaliser."""

from fastrl.models.actor_critic import ActorCritic
from fastrl.models.normalizer import ObsNormalizer

__all__ = ["ActorCritic", "ObsNormalizer"]
