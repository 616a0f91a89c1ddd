"""The rollout worker's per-step writes: the numpy reference against what an env step must leave in
its slot, and fastrl_ext._record against the reference, byte for byte, on random steps with
episode ends, reset steps, NaN/inf, shuffled env ids, Atari's score fields and reward scaling."""

from types import SimpleNamespace

import numpy as np
import pytest

import fastrl_ext
from fastrl.algo.reward_scaling import ReturnScaler
from fastrl.envs.vector import step_from_raw
from fastrl.workers.recording import NativeRecorder, PythonRecorder, make_recorder

native_only = pytest.mark.skipif(fastrl_ext._record is None, reason=f"fastrl_ext not built: {fastrl_ext.BUILD_ERROR}")

SLOTS, T, GROUPS = 3, 5, 2


def make_bufs(num_envs, obs_shape, obs_dtype):
    def arr(shape, dtype):
        return SimpleNamespace(array=np.zeros(shape, dtype=dtype))

    return SimpleNamespace(obs=arr((SLOTS, T + 1, num_envs, *obs_shape), obs_dtype),
                           rewards=arr((SLOTS, T, num_envs), np.float32),
                           terminated=arr((SLOTS, T, num_envs), bool), truncated=arr((SLOTS, T, num_envs), bool),
                           valid=arr((SLOTS, T, num_envs), bool))


def make(cls, num_envs, obs_shape=(3,), obs_dtype=np.float32, scale=False):
    counted = []
    scaler = ReturnScaler((GROUPS, num_envs), 0.99) if scale else None
    rec = cls(make_bufs(num_envs, obs_shape, obs_dtype), GROUPS, num_envs, scaler, counted.append)
    return rec, counted


class RawSteps:
    """Random envpool-like outputs: (obs, reward, done, trunc, env_id, score, game_over)."""

    def __init__(self, num_envs, obs_shape, src_dtype, atari=False, shuffle=False, nonfinite=0.0, seed=0):
        self.rng = np.random.default_rng(seed)
        self.n, self.shape, self.dtype = num_envs, obs_shape, np.dtype(src_dtype)
        self.atari, self.shuffle, self.nonfinite = atari, shuffle, nonfinite

    def __call__(self):
        rng, n = self.rng, self.n
        if self.dtype.kind == "u":
            obs = rng.integers(0, 256, size=(n, *self.shape), dtype=self.dtype)
        else:
            obs = rng.normal(size=(n, *self.shape)).astype(self.dtype)
        reward = rng.normal(size=n).astype(np.float32)
        if self.nonfinite:
            for arr in (reward, obs.reshape(n, -1)[:, 0]) if self.dtype.kind == "f" else (reward,):
                hit = rng.random(n) < self.nonfinite
                arr[hit] = rng.choice([np.nan, np.inf, -np.inf], size=int(hit.sum()))
        done = rng.random(n) < 0.25
        trunc = done & (rng.random(n) < 0.3)
        env_id = rng.permutation(n).astype(np.int32) if self.shuffle else np.arange(n, dtype=np.int32)
        score = game_over = None
        if self.atari:
            score = (reward * 3).astype(np.float32)
            game_over = (done & (rng.random(n) < 0.5)).astype(np.int32)
        return obs, reward, done, trunc, env_id, score, game_over


def copy_raw(raw):
    return tuple(None if a is None else a.copy() for a in raw)


def state_of(rec):
    arrays = [rec.obs, rec.rewards, rec.terminated, rec.truncated, rec.valid, rec.was_reset, rec.ep_score, rec.ep_len]
    return [a.copy() for a in arrays]


# --- the reference against the semantics, on a hand-made episode
def test_reference_writes_an_episode_end_and_its_reset_step():
    rec, _ = make(PythonRecorder, num_envs=2, obs_shape=(1,))
    ids, none = np.arange(2, dtype=np.int32), None

    def raw(obs, reward, done, trunc=(False, False)):
        return (np.array(obs, np.float32).reshape(2, 1), np.array(reward, np.float32), np.array(done),
                np.array(trunc), ids, none, none)

    rec.write(0, step_from_raw(*raw([1, 2], [1.0, 0.5], [False, False])), slot=1, t=0)
    rec.write(0, step_from_raw(*raw([3, 4], [2.0, 0.5], [True, False], [False, False])), slot=1, t=1)
    rec.write(0, step_from_raw(*raw([5, 6], [0.0, 0.5], [False, True], [False, True])), slot=1, t=2)
    assert rec.rewards[1, :3].tolist() == [[1.0, 0.5], [2.0, 0.5], [0.0, 0.5]]
    assert rec.terminated[1, :3].tolist() == [[False, False], [True, False], [False, False]]
    assert rec.truncated[1, :3].tolist() == [[False, False], [False, False], [False, True]]
    # env 0's step after its end is envpool's reset step: its action was ignored, never train on it
    assert rec.valid[1, :3].tolist() == [[True, True], [True, True], [False, True]]
    assert rec.obs[1, 1:4, :, 0].tolist() == [[1, 2], [3, 4], [5, 6]]
    scores, lengths = rec.take_finished()
    assert scores == [3.0, 1.5] and lengths == [2, 3]  # env 0 at t=1, then env 1 (time limit) at t=2
    assert rec.take_finished() == ([], [])
    assert rec.ep_score[0].tolist() == [0.0, 0.0] and rec.was_reset[0].tolist() == [False, True]


def test_reference_masks_nonfinite_transitions():
    rec, counted = make(PythonRecorder, num_envs=3, obs_shape=(2,))
    obs = np.array([[1, np.nan], [2, 3], [4, 5]], np.float32)
    reward = np.array([1.0, np.inf, 2.0], np.float32)
    no = np.zeros(3, bool)
    rec.write(1, step_from_raw(obs, reward, no, no, np.arange(3, dtype=np.int32)), slot=0, t=0)
    assert rec.valid[0, 0].tolist() == [False, False, True]
    assert rec.rewards[0, 0].tolist() == [0.0, 0.0, 2.0]
    assert rec.obs[0, 1].tolist() == [[1, 0], [2, 3], [4, 5]]
    assert rec.ep_score[1].tolist() == [1.0, 0.0, 2.0] and rec.ep_len[1].tolist() == [0, 0, 1]
    assert counted == [2]


def test_step_from_raw_puts_rows_in_env_id_order():
    env_id = np.array([2, 0, 1], np.int32)
    obs = np.array([[20], [0], [10]], np.uint8)
    reward = np.array([2, 0, 1], np.float32)
    done, trunc = np.array([True, False, False]), np.array([False, False, False])
    step = step_from_raw(obs, reward, done, trunc, env_id, reward * 10, np.array([1, 0, 0], np.int32))
    assert step.obs[:, 0].tolist() == [0, 10, 20] and step.reward.tolist() == [0, 1, 2]
    assert step.terminated.tolist() == [False, False, True] and step.game_over.tolist() == [False, False, True]
    assert step.score.tolist() == [0, 10, 20]


# --- native against the reference
CASES = {
    "cartpole": dict(obs_shape=(4,), src=np.float32, dst=np.float32),
    "halfcheetah (float64 obs, reward scaling)": dict(obs_shape=(17,), src=np.float64, dst=np.float32, scale=True),
    "atari (uint8 frames, whole-game scores)": dict(obs_shape=(4, 6, 6), src=np.uint8, dst=np.uint8, atari=True),
    "nan and inf": dict(obs_shape=(3,), src=np.float32, dst=np.float32, nonfinite=0.1),
    "nan and inf, float64 obs, scaling": dict(obs_shape=(3,), src=np.float64, dst=np.float32, nonfinite=0.1,
                                             scale=True),
    "shuffled env ids": dict(obs_shape=(2, 2), src=np.float32, dst=np.float32, shuffle=True, atari=True),
}


@native_only
@pytest.mark.parametrize("case", list(CASES))
def test_native_writes_the_same_bytes_as_the_reference(case):
    c = dict(CASES[case])
    n = 7
    steps = RawSteps(n, c["obs_shape"], c["src"], atari=c.get("atari", False), shuffle=c.get("shuffle", False),
                     nonfinite=c.get("nonfinite", 0.0), seed=hash(case) % 1000)
    py, py_counted = make(PythonRecorder, n, c["obs_shape"], c["dst"], scale=c.get("scale", False))
    nat, nat_counted = make(NativeRecorder, n, c["obs_shape"], c["dst"], scale=c.get("scale", False))
    for i in range(60):
        group, slot, t = i % GROUPS, (i // (GROUPS * T)) % SLOTS, (i // GROUPS) % T
        raw = steps()
        py.write(group, step_from_raw(*copy_raw(raw)), slot, t)
        nat.write_raw(group, copy_raw(raw), slot, t)
        for a, b in zip(state_of(py), state_of(nat)):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"step {i}"
        assert py.take_finished() == nat.take_finished()
    assert py_counted == nat_counted
    if c.get("nonfinite"):
        assert sum(nat_counted) > 0
    if c.get("scale"):
        assert py.reward_scaler.var == nat.reward_scaler.var and py.reward_scaler.count > 60


def call_native(rec, raw, slot, t, group=0):
    """fastrl_ext._record.record_step itself, as NativeRecorder calls it."""
    return rec.record_step(*raw, rec.obs, rec.rewards, rec.terminated, rec.truncated, rec.valid,
                           *rec.group_state[group], rec.finished_score_out, rec.finished_length_out, slot, t)


@native_only
def test_native_rejects_bad_inputs_before_writing():
    n = 4
    rec, _ = make(NativeRecorder, n, (3,), np.float32)
    before = state_of(rec)
    good = RawSteps(n, (3,), np.float32)()

    def changed(index, value):
        raw = list(good)
        raw[index] = value
        return tuple(raw)
    with pytest.raises(ValueError, match="permutation"):
        call_native(rec, changed(4, np.array([0, 1, 1, 3], np.int32)), 0, 0)
    with pytest.raises(TypeError, match="reward"):
        call_native(rec, changed(1, good[1].astype(np.float64)), 0, 0)
    with pytest.raises(ValueError, match="out of range"):
        call_native(rec, good, SLOTS, 0)
    with pytest.raises(ValueError, match="out of range"):
        call_native(rec, good, 0, T)
    with pytest.raises(ValueError, match="obs_src"):
        call_native(rec, changed(0, np.zeros((n, 5), np.float32)), 0, 0)
    with pytest.raises(TypeError, match="both None"):
        call_native(rec, changed(5, good[1]), 0, 0)
    with pytest.raises(TypeError, match="C-contiguous"):
        call_native(rec, changed(0, np.asfortranarray(good[0])), 0, 0)
    half, _ = make(NativeRecorder, n, (3,), np.float16)
    with pytest.raises(TypeError, match="not supported"):
        call_native(half, changed(0, good[0].astype(np.float16)), 0, 0)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, state_of(rec)))


@native_only
def test_outputs_the_native_path_does_not_take_go_through_the_reference(caplog):
    """A layout the C++ refuses (here a non-contiguous observation array) is recorded by the numpy
    reference, the same bytes, with one warning, not a crashed rollout worker."""
    n = 6
    steps = RawSteps(n, (3,), np.float32, seed=5)
    py, _ = make(PythonRecorder, n, (3,))
    nat, _ = make(NativeRecorder, n, (3,))
    for i in range(12):
        raw = steps()
        strided = (np.asfortranarray(raw[0]), *raw[1:])
        py.write(0, step_from_raw(*copy_raw(raw)), 0, i % T)
        nat.write_raw(0, strided, 0, i % T)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(state_of(py), state_of(nat)))
        assert py.take_finished() == nat.take_finished()
    assert "C-contiguous" in nat.unsupported
    assert sum("numpy reference" in r.getMessage() for r in caplog.records) == 1


@native_only
def test_native_on_real_envpool_steps_matches_the_reference():
    """Two CartPole splits from one seed, stepped with the same actions, one recorded each way."""
    from fastrl.config.schema import EnvConfig
    from fastrl.envs import make_split, resolve_env

    env_cfg = EnvConfig(id="CartPole-v1")
    spec = resolve_env(env_cfg)
    n = 8
    envs = [make_split(env_cfg, spec, n, 1, seed=3) for _ in range(2)]
    recs = [make_recorder(True, envs[0], make_bufs(n, spec.obs_shape, spec.obs_dtype), GROUPS, n, None, print),
            make_recorder(False, envs[1], make_bufs(n, spec.obs_shape, spec.obs_dtype), GROUPS, n, None, print)]
    assert isinstance(recs[0], NativeRecorder) and type(recs[1]) is PythonRecorder
    rng = np.random.default_rng(0)
    for env in envs:
        env.reset()
    finished = 0
    for i in range(300):
        actions = rng.integers(0, 2, size=n)
        slot, t = (i // T) % SLOTS, i % T
        for env, rec in zip(envs, recs):
            env.send(actions)
            rec.record(0, env, slot, t)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(state_of(recs[0]), state_of(recs[1])))
        got = [rec.take_finished() for rec in recs]
        assert got[0] == got[1]
        finished += len(got[0][0])
    assert finished > 20  # random CartPole episodes last ~20 steps: the ends were exercised
    for env in envs:
        env.close()


def test_gymnasium_splits_and_a_disabled_switch_get_the_reference():
    class NoRaw:
        pass

    args = (make_bufs(2, (1,), np.float32), GROUPS, 2, None, print)
    assert type(make_recorder(True, NoRaw(), *args)) is PythonRecorder
    assert type(make_recorder(False, SimpleNamespace(recv_raw=None), *args)) is PythonRecorder
