// fastrl_ext._record: one env step of a group of envs, from envpool's raw outputs into a trajectory slot.
//
// The reference is fastrl.workers.recording.PythonRecorder (EnvpoolSplit.recv's post-processing and the
// rollout worker's per-step writes), which this reproduces value for value:
//   terminated = done and not trunc;  score = Atari's unclipped info reward, else the reward;
//   game_over = Atari's info terminated or trunc, else terminated or trunc
//   rewards[s, t] = reward;  terminated[s, t], truncated[s, t];  valid[s, t] = not was_reset
//   was_reset = terminated or trunc (envpool ignores the action of the next step: never trained on)
//   a non-finite reward or float observation masks that env's transition (valid = false, reward 0),
//   zeroes the non-finite observation values and, for the whole step, non-finite scores
//   ep_score += score;  ep_len += valid;  a finished game hands over (ep_score, ep_len) and restarts
//   obs[s, t + 1] = obs, cast to the slot's dtype
// Rows arrive in env-id order in envpool's sync mode; any permutation of the ids is put back in order.
//
// Why native: on CartPole the Python version is ~25 numpy calls per env step of 32 envs, each a few
// microseconds of dispatch for a few nanoseconds of work, which made the rollout worker's bookkeeping
// cost about as much CPU as stepping the envs (bench/README, "Where the time goes").
#include "record_core.h"

namespace {

using namespace fastrl_ext::record;

PyObject* py_record_step(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != NUM_ARGS) {
        PyErr_SetString(PyExc_TypeError,
                        "record_step(obs_src, reward, done, trunc, env_id, score_src|None, game_over_src|None, obs, "
                        "rewards, terminated, truncated, valid, was_reset, ep_score, ep_len, finished_scores, "
                        "finished_lengths, slot, t)");
        return nullptr;
    }
    const bool atari = args[SCORE_SRC] != Py_None;
    if (atari != (args[GAME_OVER_SRC] != Py_None)) {
        PyErr_SetString(PyExc_TypeError, "record_step: score_src and game_over_src are both None or both arrays");
        return nullptr;
    }
    View v[SLOT];
    for (int k = 0; k < SLOT; ++k) {
        if ((k == SCORE_SRC || k == GAME_OVER_SRC) && !atari) continue;
        const bool writable = k >= OBS;
        if (!v[k].get(args[k], writable, "record_step", NAMES[k])) return nullptr;
    }
    const Py_ssize_t slot = PyLong_AsSsize_t(args[SLOT]);
    const Py_ssize_t t = PyLong_AsSsize_t(args[T_INDEX]);
    if (PyErr_Occurred()) return nullptr;
    Target to;
    Source from;
    if (!check_target(v, to) || !check_source(v, atari, to, from)) return nullptr;
    for (int k : {FINISHED_SCORES, FINISHED_LENGTHS}) {
        if (v[k].items() != to.N) return PyErr_Format(PyExc_ValueError, "record_step: %s must hold N items", NAMES[k]);
    }
    if (!check_kind(v[FINISHED_SCORES], 'd', FINISHED_SCORES) || !check_int(v[FINISHED_LENGTHS], 8, FINISHED_LENGTHS))
        return nullptr;
    if (slot < 0 || slot >= to.S || t < 0 || t >= to.T) {
        fail("slot or t out of range");
        return nullptr;
    }
    Py_ssize_t num_finished = 0, num_bad = 0;
    if (!record_into(from, to, slot, t, static_cast<double*>(v[FINISHED_SCORES].buf.buf),
                     static_cast<int64_t*>(v[FINISHED_LENGTHS].buf.buf), &num_finished, &num_bad))
        return nullptr;
    return Py_BuildValue("(nn)", num_finished, num_bad);
}

enum ScaleArg { S_RETURNS, S_MOMENTS, S_REWARDS, S_VALID, S_DONE, S_GAMMA, S_CLIP, S_EPS, S_NUM_ARGS };
const char* const SCALE_NAMES[S_GAMMA] = {"returns", "moments", "rewards", "valid", "done"};

// HalfCheetah's reference is ~15 numpy calls per env step of 32 envs, the largest Python left in its
// rollout worker after the recorder and the acting forward went native (the arithmetic: scale_into).
PyObject* py_scale_rewards(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != S_NUM_ARGS) {
        PyErr_SetString(PyExc_TypeError, "scale_rewards(returns, moments, rewards, valid, done, gamma, clip, eps)");
        return nullptr;
    }
    View v[S_GAMMA];
    for (int k = 0; k < S_GAMMA; ++k) {
        const bool writable = k == S_RETURNS || k == S_MOMENTS || k == S_REWARDS;
        if (!v[k].get(args[k], writable, "scale_rewards", SCALE_NAMES[k])) return nullptr;
    }
    const double gamma = PyFloat_AsDouble(args[S_GAMMA]);
    const double clip = PyFloat_AsDouble(args[S_CLIP]);
    const double eps = PyFloat_AsDouble(args[S_EPS]);
    if (PyErr_Occurred()) return nullptr;
    const Py_ssize_t N = v[S_REWARDS].items();
    auto bad_type = [](const char* what) {
        PyErr_Format(PyExc_TypeError, "scale_rewards: %s", what);
        return nullptr;
    };
    if (v[S_RETURNS].kind() != 'd' || v[S_MOMENTS].kind() != 'd') return bad_type("returns and moments must be float64");
    if (v[S_REWARDS].kind() != 'f') return bad_type("rewards must be float32");
    if (v[S_VALID].kind() != '?' || v[S_DONE].kind() != '?') return bad_type("valid and done must be bool");
    if (v[S_RETURNS].items() != N || v[S_VALID].items() != N || v[S_DONE].items() != N)
        return PyErr_Format(PyExc_ValueError, "scale_rewards: returns, rewards, valid and done must hold one item per env");
    if (v[S_MOMENTS].items() != 3) return PyErr_Format(PyExc_ValueError, "scale_rewards: moments must be (count, mean, var)");
    scale_into(static_cast<double*>(v[S_RETURNS].buf.buf), static_cast<double*>(v[S_MOMENTS].buf.buf),
               static_cast<float*>(v[S_REWARDS].buf.buf), static_cast<const bool*>(v[S_VALID].buf.buf),
               static_cast<const bool*>(v[S_DONE].buf.buf), N, gamma, clip, eps);
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"record_step", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_record_step)), METH_FASTCALL,
     "record_step(obs_src, reward, done, trunc, env_id, score_src|None, game_over_src|None, obs, rewards, terminated, "
     "truncated, valid, was_reset, ep_score, ep_len, finished_scores, finished_lengths, slot, t) -> "
     "(finished, nonfinite): write one env step of a group into slot `slot` at step `t` (observation at t + 1), "
     "update the group's episode state, and put each finished game's score and length first in finished_*."},
    {"scale_rewards", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_scale_rewards)), METH_FASTCALL,
     "scale_rewards(returns, moments, rewards, valid, done, gamma, clip, eps): one group's rewards divided by the "
     "running std of the discounted return, clipped, in place (ReturnScaler.__call__; moments = count, mean, var)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record",
                      "A rollout worker's per-step writes into trajectory slots (see fastrl.workers.recording).", -1,
                      methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__record(void) { return PyModule_Create(&module); }
