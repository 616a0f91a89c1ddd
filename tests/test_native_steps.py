"""fastrl_ext._rollout.run_steps against the per-step path of RolloutWorker.pump it replaces (the send's
clip and cast, the native recorder's write_raw with reward scaling, NumpyPolicy.act_into), byte for
byte, on random envpool-like outputs with episode ends, reset steps, NaN/inf, shuffled env ids, Atari's
score fields and two double-buffered groups; and its refusals. tests/test_serial.py checks whole
training runs with and without it give the same losses."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fastrl_ext
from fastrl.algo.reward_scaling import ReturnScaler
from fastrl.config import load_config
from fastrl.envs.actions import EnvActions
from fastrl.envs.spec import EnvSpec
from fastrl.models import ActorCritic
from fastrl.models.numpy_policy import NumpyPolicy
from fastrl.workers.recording import NativeRecorder
from test_recording import RawSteps
from helpers import SMALL_DISCRETE as DISCRETE

pytestmark = pytest.mark.skipif(fastrl_ext._rollout is None, reason=f"fastrl_ext not built: {fastrl_ext.BUILD_ERROR}")

SLOTS, T, N = 3, 6, 5
# where envpool's _recv list holds obs, reward, done, trunc, env_id, score, game_over (any order works)
POSITIONS = (3, 0, 6, 1, 4, 2, 5)
CONTINUOUS = EnvSpec("Continuous-v0", "envpool", (3,), np.dtype(np.float32), False, 2, (-0.5, -1.0), (0.5, 1.0))
# one categorical over 3 x 4 combinations of two choices, the first starting at 1 (Minesweeper's joint mask, a
# gymnasium start): each action unravelled into 2 and offset on its way to the env
JOINT = EnvSpec("Joint-v0", "envpool", (3,), np.dtype(np.float32), True, 12, (1, 0), action_joint=(3, 4))
STARTS_AT_2 = EnvSpec("Start-v0", "envpool", (3,), np.dtype(np.float32), True, 3, (2,))  # Discrete(3, start=2)


class FakeEnv:
    """envpool's raw `_send` (keeps a copy of each action array it is handed) and `_recv` (RawSteps'
    outputs at POSITIONS of a list)."""

    def __init__(self, raw: RawSteps, action_dtype, per_action: int):
        self.raw = raw
        self.actions = np.zeros((N, per_action) if per_action > 1 else N, dtype=action_dtype)
        self.sent: list[np.ndarray] = []

    def send(self, args: list) -> None:
        assert args[2] is self.actions
        self.sent.append(self.actions.copy())

    def recv(self) -> list:
        out = [None] * 7
        for value, at in zip(self.raw(), POSITIONS):
            out[at] = value
        return out


def make_policy(spec: EnvSpec) -> NumpyPolicy:
    torch.manual_seed(0)
    model = ActorCritic(spec, load_config(None, []).model).eval()
    with torch.no_grad():  # heads far from their near-zero init, so that actions vary
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return NumpyPolicy.from_module(model, spec, "tanh", native=True)


class Side:
    """One copy of everything a rollout worker's steps touch."""

    def __init__(self, spec: EnvSpec, groups: int, scale: bool, atari: bool, nonfinite: float):
        A = 1 if spec.discrete else spec.num_actions
        env_width = len(spec.action_joint) or A  # what each env takes
        act_shape = (SLOTS, T, N) if spec.discrete else (SLOTS, T, N, A)

        def arr(shape, dtype):
            return SimpleNamespace(array=np.zeros(shape, dtype=dtype))

        self.bufs = SimpleNamespace(
            obs=arr((SLOTS, T + 1, N, *spec.obs_shape), np.float32), rewards=arr((SLOTS, T, N), np.float32),
            terminated=arr((SLOTS, T, N), bool), truncated=arr((SLOTS, T, N), bool), valid=arr((SLOTS, T, N), bool),
            actions=arr(act_shape, np.int32 if spec.discrete else np.float32),
            log_probs=arr((SLOTS, T, N), np.float32), values=arr((SLOTS, T, N), np.float32),
            policy_version=arr((SLOTS, T, N), np.int64))
        self.scaler = ReturnScaler((groups, N), 0.99) if scale else None
        self.nonfinite: list[int] = []
        self.recorder = NativeRecorder(self.bufs, groups, N, self.scaler, self.nonfinite.append)
        self.envs = [FakeEnv(RawSteps(N, spec.obs_shape, np.float64, atari=atari, shuffle=True, nonfinite=nonfinite,
                                      seed=10 + g), np.int32 if spec.discrete else np.float64, env_width)
                     for g in range(groups)]
        self.policy = make_policy(spec)
        self.rng = np.random.default_rng(7)
        self.to_env = EnvActions(spec)
        self.slot, self.t, self.sent, self.k = list(range(groups)), [0] * groups, [False] * groups, 0
        self.weights_header = np.array([5, 42, 0], dtype=np.int64)  # seq 5 published, version 42: what it acts with
        b = self.bufs
        b.obs.array[:, 0] = np.random.default_rng(3).normal(size=b.obs.array[:, 0].shape)
        for g in range(groups):  # what RolloutWorker.start leaves: first observations, first actions
            self.act(g)

    def act(self, g: int) -> None:
        b, slot, t = self.bufs, self.slot[g], self.t[g]
        assert self.policy.act_into(b.obs.array[slot, t], self.rng, b.actions.array[slot, t],
                                    b.log_probs.array[slot, t], b.values.array[slot, t])
        b.policy_version.array[slot, t] = 42

    def reference_steps(self, n: int) -> None:
        """RolloutWorker.pump's per-step path, n times."""
        G = len(self.envs)
        for _ in range(n):
            k = self.k
            for g in (k, (k + 1) % G):
                if not self.sent[g]:
                    self.envs[g].actions[...] = self.to_env(self.bufs.actions.array[self.slot[g], self.t[g]])
                    self.envs[g].send([None, None, self.envs[g].actions])
                    self.sent[g] = True
            self.sent[k] = False
            raw = self.envs[k].recv()
            self.recorder.write_raw(k, tuple(raw[at] for at in POSITIONS), self.slot[k], self.t[k])
            self.t[k] += 1
            self.act(k)
            self.k = (k + 1) % G

    def native_steps(self, n: int, **changes) -> tuple:
        index = POSITIONS if self.envs[0].raw.atari else POSITIONS[:5] + (-1, -1)
        groups = tuple((env.send, [None, None, env.actions], env.recv, env.actions, index,
                        *self.recorder.group_state[g], None if self.scaler is None else self.scaler.returns[g])
                       for g, env in enumerate(self.envs))
        b, s = self.bufs, self.scaler
        args = dict(groups=groups, slots=(b.obs.array, b.rewards.array, b.terminated.array, b.truncated.array,
                                          b.valid.array, b.actions.array, b.log_probs.array, b.values.array,
                                          b.policy_version.array),
                    slot_list=self.slot, t_list=self.t, sent_list=self.sent, k=self.k, n_steps=n,
                    plan=self.policy.plan, params=self.policy.block,
                    random=self.policy._random(n * N, self.rng), version=42, weights_seq=self.weights_header,
                    seen_seq=5, action_low=self.to_env.low, action_high=self.to_env.high,
                    action_start=self.to_env.start, joint=self.to_env.joint, moments=None if s is None else s.moments, gamma=0.99 if s else 0.0,
                    clip=s.clip if s else 0.0, eps=s.eps if s else 0.0,
                    finished_scores=np.zeros(n * N), finished_lengths=np.zeros(n * N, dtype=np.int64))
        args.update(changes)
        k, steps, finished, nonfinite = fastrl_ext._rollout.run_steps(*args.values())
        self.k, self.steps = k, steps
        self.recorder.finished_scores.extend(args["finished_scores"][:finished].tolist())
        self.recorder.finished_lengths.extend(args["finished_lengths"][:finished].tolist())
        if nonfinite:
            self.nonfinite.append(nonfinite)
        return k, finished, nonfinite

    def state(self) -> list:
        b, r = self.bufs, self.recorder
        arrays = [b.obs, b.rewards, b.terminated, b.truncated, b.valid, b.actions, b.log_probs, b.values,
                  b.policy_version]
        out = [a.array.tobytes() for a in arrays] + [r.was_reset.tobytes(), r.ep_score.tobytes(), r.ep_len.tobytes()]
        if self.scaler is not None:
            out += [self.scaler.returns.tobytes(), self.scaler.moments.tobytes()]
        sends = [[a.tobytes() for a in env.sent] for env in self.envs]
        # the worker adds the non-finite counts up: per step or per call is the same
        return out + [self.slot, self.t, self.sent, self.k, r.finished_scores, r.finished_lengths, sum(self.nonfinite),
                      sends]


def steps_to_boundary(side: Side) -> int:
    G = len(side.envs)
    return min((g - side.k) % G + G * (T - 1 - side.t[g]) for g in range(G))


@pytest.mark.parametrize("spec, groups, scale, atari, nonfinite", [
    (DISCRETE, 1, False, False, 0.0),    # CartPole's shape
    (DISCRETE, 2, False, True, 0.05),    # double buffering, Atari's score fields, NaN/inf
    (CONTINUOUS, 1, True, False, 0.0),   # HalfCheetah's shape: clipped float64 actions, scaled rewards
    (CONTINUOUS, 2, True, False, 0.05),
    (JOINT, 2, False, False, 0.0),
    (STARTS_AT_2, 1, False, False, 0.0),
], ids=["discrete", "discrete_2_groups_atari_nonfinite", "continuous_scaled", "continuous_2_groups_nonfinite",
        "joint_choices_with_starts", "discrete_starting_at_2"])
def test_native_steps_write_what_the_python_steps_write(spec, groups, scale, atari, nonfinite):
    ref, nat = Side(spec, groups, scale, atari, nonfinite), Side(spec, groups, scale, atari, nonfinite)
    assert ref.state() == nat.state()
    n = steps_to_boundary(ref)
    assert n == (T - 1) * groups  # every step of the first slots up to the first boundary
    ref.reference_steps(n)
    nat.native_steps(n)
    assert nat.steps == n and ref.t == nat.t and ref.k == nat.k and ref.sent == nat.sent
    assert ref.recorder.finished_scores, "the random episodes should have ended some games"
    assert ref.state() == nat.state()
    if nonfinite:
        assert sum(ref.nonfinite) > 0
    if spec.action_joint:  # every combination's index reached the env as its choices, offset by their starts
        sent = np.concatenate([a for env in nat.envs for a in env.sent])
        assert sent.shape[1] == 2 and set(sent[:, 0]) == {1, 2, 3} and set(sent[:, 1]) == {0, 1, 2, 3}


def test_a_step_at_a_slot_boundary_is_refused_before_anything_is_done():
    side = Side(DISCRETE, 1, False, False, 0.0)
    side.t[0] = T - 1  # the step that takes the next slot: Python's
    before = side.state()
    with pytest.raises(ValueError, match="slot boundary"):
        side.native_steps(1)
    assert side.state() == before


@pytest.mark.parametrize("change, error, match", [
    (dict(random=np.zeros(3, np.float32)), ValueError, "random"),
    (dict(finished_scores=np.zeros(2)), ValueError, "finished_scores"),
    (dict(k=5), ValueError, "k or n_steps"),
    (dict(groups=()), ValueError, "groups"),
    (dict(moments=np.zeros(3)), ValueError, "returns and moments"),
    (dict(version="x"), TypeError, "integer"),
    (dict(joint=np.array([3, 4], np.int64)), ValueError, "joint must be int32"),
    (dict(joint=np.array([3, 4], np.int32)), ValueError, "env_actions must hold N actions"),  # 2 per env
    (dict(action_start=np.zeros(2, np.int32)), ValueError, "action_start must be int32, one per choice"),
])
def test_bad_arguments_are_refused_before_anything_is_written(change, error, match):
    side = Side(DISCRETE, 1, False, False, 0.0)
    before = side.state()
    with pytest.raises(error, match=match):
        side.native_steps(2, **change)
    assert side.state() == before


def test_joint_and_starts_are_for_discrete_actions():
    side = Side(CONTINUOUS, 1, False, False, 0.0)
    before = copy.deepcopy(side.state())
    with pytest.raises(ValueError, match="joint is for one categorical"):
        side.native_steps(2, joint=np.array([1, 2], np.int32))
    with pytest.raises(ValueError, match="action_start is for int32 actions"):
        side.native_steps(2, action_start=np.zeros(2, np.int32))
    assert side.state() == before


def test_continuous_actions_need_their_bounds_as_float32():
    side = Side(CONTINUOUS, 1, False, False, 0.0)
    before = copy.deepcopy(side.state())
    with pytest.raises(ValueError, match="action_low"):
        side.native_steps(2, action_low=np.zeros(5, np.float32), action_high=np.ones(5, np.float32))
    assert side.state() == before


class PublishingEnv(FakeEnv):
    """Publishes new weights (bumps the header's sequence number) during its `after`-th recv."""

    def __init__(self, *args, header: np.ndarray, after: int):
        super().__init__(*args)
        self.header, self.after, self.calls = header, after, 0

    def recv(self) -> list:
        self.calls += 1
        if self.calls == self.after:
            self.header[0] += 1
        return super().recv()


def test_the_loop_stops_before_the_step_after_new_weights_are_published():
    """Every step acts with the weights the per-step path would have read, give or take the step in
    flight: the loop hands back to Python, which reads them, as soon as the learner has published."""
    ref, nat = Side(DISCRETE, 1, False, False, 0.0), Side(DISCRETE, 1, False, False, 0.0)
    env = nat.envs[0]
    nat.envs[0] = PublishingEnv(env.raw, env.actions.dtype, 1, header=nat.weights_header, after=3)
    nat.envs[0].actions = env.actions
    nat.native_steps(T - 1)
    assert nat.steps == 3 and nat.t == [3]
    ref.reference_steps(3)
    assert ref.state() == nat.state()
    with pytest.raises(ValueError, match="weights_seq"):
        nat.native_steps(1, weights_seq=np.zeros(3, np.float64))
