"""Native steps: a rollout worker's env steps between two slot boundaries in one fastrl_ext._rollout call.

For a worker that acts itself with the native MLP kernel and records with the native recorder, each
env step of `RolloutWorker.pump` is three C++ calls (envpool's recv, record_step, act_mlp) held
together by ~20 Python calls, views and lookups. `NativeSteps.run` hands the steps up to the next
slot boundary to one C++ loop that does exactly what pump does on that path, step for step; pump
itself keeps the boundary step (taking the next slot, handing the full one over), the heartbeat,
the stop flag and the weight refresh: the loop returns as soon as the learner has published newer
weights, and pump reads them and takes the next step itself, so each step acts with the weights the
per-step path would have used. (Reading them only once per call, at most T steps, raised
HalfCheetah's mean policy lag from 64 to 84 versions, and its two runs read 4,362 and 1,669 at 2M
env steps against 5,707 for the per-step path.) The random numbers are drawn in one piece from the same
Generator, which gives the same stream: serial mode, where nothing is published during a call,
trains bit for bit as with `system.native_rollout_loop=false`.
"""

from __future__ import annotations

import numpy as np

MAX_STEPS = 256  # steps per call at most: the heartbeat and the stop flag are looked at between calls
# Random numbers are drawn before a call for the steps it may take; a call ends early when new weights
# arrive (HalfCheetah's learner publishes ~280 versions a second, every 1-2 of a worker's steps), so
# each call asks for at most twice the steps the last one took, and never fewer than this
MIN_STEPS = 4


def unavailable_reason(worker) -> str | None:
    """Why `worker` cannot run its steps natively, or None when it can."""
    import fastrl_ext

    from fastrl.workers.acting import NumpyForward
    from fastrl.workers.recording import NativeRecorder

    if not worker.ctx.cfg.system.native_rollout_loop:
        return "system.native_rollout_loop is false"
    if fastrl_ext._rollout is None:
        return "fastrl_ext is not built"
    actor = worker.actor
    if actor is None or not isinstance(actor.forward, NumpyForward) or actor.forward.policy._act_mlp is None:
        return "the worker does not act with the native kernel"
    if not isinstance(worker.recorder, NativeRecorder):
        return "the worker does not record natively"
    if worker.obs.dtype != np.float32:
        return "observations are not float32"
    if getattr(worker.envs[0], "raw_calls", lambda: None)() is None:
        # NativeSteps.run would find this out at its first call and leave every step to Python anyway
        return "the envs do not take envpool's direct calls (gymnasium, or an envpool layout not known here)"
    return None


class NativeSteps:
    def __init__(self, worker):
        import fastrl_ext

        self.run_steps = fastrl_ext._rollout.run_steps
        self.worker = worker
        w = worker
        b = w.ctx.bufs
        self.slots = (b.obs.array, b.rewards.array, b.terminated.array, b.truncated.array, b.valid.array,
                      b.actions.array, b.log_probs.array, b.values.array, b.policy_version.array)
        self.scaler = w.recorder.reward_scaler
        # [0]: the learner's publish sequence number. The float32 block's: numpy actors read float32, and a run
        # with them never has the bf16 acting block (fastrl.workers.first_weights.acts_in_bf16)
        self.weights_header = w.ctx.weights.header.array
        self.groups: tuple = ()
        self.disabled = False  # a group whose envpool layout the loop does not know: pump does every step
        self.last_steps = MAX_STEPS  # steps the last call took
        capacity = MAX_STEPS * w.num_envs
        self.finished_scores = np.empty(capacity, dtype=np.float64)
        self.finished_lengths = np.empty(capacity, dtype=np.int64)

    def _group(self, g: int, env) -> tuple | None:
        raw_calls = getattr(env, "raw_calls", lambda: None)()  # gymnasium splits have none
        if raw_calls is None:
            return None
        was_reset, ep_score, ep_len = self.worker.recorder.group_state[g]
        returns = self.scaler.returns[g] if self.scaler is not None else None
        return (*raw_calls, was_reset, ep_score, ep_len, returns)

    def steps_to_boundary(self) -> int:
        """How many steps, from group k on in turn, come before a group is collected at t = T - 1."""
        w = self.worker
        G, k, T = len(w.envs), w.k, w.T
        return min(MAX_STEPS, min((g - k) % G + G * (T - 1 - w.t[g]) for g in range(G)))

    def run(self) -> None:
        """The steps up to (not including) the next boundary step, if the groups allow it."""
        w = self.worker
        if self.disabled or w.recorder.unsupported is not None or min(w.slot[:len(w.envs)]) < 0:
            return
        if len(self.groups) != len(w.envs):  # groups built since the last call
            groups = tuple(self._group(g, env) for g, env in enumerate(w.envs))
            if any(g is None for g in groups):
                self.disabled = True
                return
            self.groups = groups
        n = min(self.steps_to_boundary(), max(MIN_STEPS, 2 * self.last_steps))
        if n <= 0:
            return
        actor = w.actor
        actor.refresh_weights()
        policy, scaler = actor.forward.policy, self.scaler
        random = policy._random(n * w.num_envs, actor.forward.rng)
        k, self.last_steps, finished, nonfinite = self.run_steps(
            self.groups, self.slots, w.slot, w.t, w.sent, w.k, n, policy.plan, policy.block, random, actor.version,
            self.weights_header, actor.seen_seq, w.env_actions.low, w.env_actions.high, w.env_actions.start,
            w.env_actions.joint, scaler.moments if scaler is not None else None,
            scaler.gamma if scaler is not None else 0.0, scaler.clip if scaler is not None else 0.0,
            scaler.eps if scaler is not None else 0.0, self.finished_scores, self.finished_lengths)
        w.k = k
        if finished:
            w.recorder.finished_scores.extend(self.finished_scores[:finished].tolist())
            w.recorder.finished_lengths.extend(self.finished_lengths[:finished].tolist())
        if nonfinite:
            w.recorder.count_nonfinite(nonfinite)
        w.control.inflight_steps.array[w.index] = sum(w.t) * w.num_envs
