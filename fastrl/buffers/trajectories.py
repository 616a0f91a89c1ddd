"""The shared trajectory slots that rollout, inference and learner read and write in place.

A slot holds one rollout of one split: `rollout_len` steps of `envs_per_split` envs, laid out
[slot, t, env, ...] so that one inference request (one split at one step) is a contiguous
block, and obs has one extra step for the bootstrap observation. Who writes what:
- rollout worker: obs[t] (once, straight from the env), rewards, terminated, truncated, valid
- inference worker: actions, log_probs, values, policy_version (for the obs it just read)
- learner: reads whole slots, copies them out, then frees the slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastrl.buffers.shm import ShmAllocator, ShmArray
from fastrl.envs.spec import EnvSpec


@dataclass
class TrajBuffers:
    obs: ShmArray             # [N, T+1, E, *obs_shape]
    actions: ShmArray         # [N, T, E] int32 (discrete), [N, T, E, K] int32 (K choices: EnvSpec.action_nvec,
                              # each counted from 0) or [N, T, E, A] float32 (pre-clip Gaussian sample)
    log_probs: ShmArray       # [N, T, E] behaviour log pi(a|x)
    values: ShmArray          # [N, T, E] behaviour value, for value clipping
    rewards: ShmArray         # [N, T, E]
    terminated: ShmArray      # [N, T, E] bool
    truncated: ShmArray       # [N, T, E] bool
    valid: ShmArray           # [N, T, E] bool: False on envpool's reset steps
    policy_version: ShmArray  # [N, T, E] int64: learner version of the weights that acted

    @staticmethod
    def allocate(alloc: ShmAllocator, spec: EnvSpec, num_slots: int, rollout_len: int, envs_per_split: int):
        n, t, e = num_slots, rollout_len, envs_per_split
        return TrajBuffers(
            obs=alloc.array("obs", (n, t + 1, e, *spec.obs_shape), spec.obs_dtype),
            actions=alloc.array("actions", (n, t, e, *spec.action_cell), np.int32 if spec.discrete else np.float32),
            log_probs=alloc.array("log_probs", (n, t, e), np.float32),
            values=alloc.array("values", (n, t, e), np.float32),
            rewards=alloc.array("rewards", (n, t, e), np.float32),
            terminated=alloc.array("terminated", (n, t, e), np.bool_),
            truncated=alloc.array("truncated", (n, t, e), np.bool_),
            valid=alloc.array("valid", (n, t, e), np.bool_),
            policy_version=alloc.array("policy_version", (n, t, e), np.int64),
        )

    @property
    def num_slots(self) -> int:
        return self.obs.shape[0]

    @property
    def rollout_len(self) -> int:
        return self.rewards.shape[1]
