"""The child processes: rollout workers (envs), inference workers (policy forward), the learner."""
