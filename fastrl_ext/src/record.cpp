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
#include "buffer_view.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using View = fastrl_ext::BufferView;

enum Arg {
    OBS_SRC, REWARD, DONE, TRUNC, ENV_ID, SCORE_SRC, GAME_OVER_SRC,         // envpool's outputs
    OBS, REWARDS, TERMINATED, TRUNCATED, VALID,                              // the slots, whole
    WAS_RESET, EP_SCORE, EP_LEN, FINISHED_SCORES, FINISHED_LENGTHS,          // the group's state and outputs
    SLOT, T_INDEX, NUM_ARGS
};

const char* const NAMES[NUM_ARGS] = {
    "obs_src", "reward", "done", "trunc", "env_id", "score_src", "game_over_src", "obs", "rewards", "terminated",
    "truncated", "valid", "was_reset", "ep_score", "ep_len", "finished_scores", "finished_lengths", "slot", "t"};

PyObject* fail(const char* what) {
    PyErr_Format(PyExc_ValueError, "record_step: %s", what);
    return nullptr;
}

// an integer dtype of `bytes` bytes (numpy's int64 is 'l' on Linux, 'q' elsewhere)
bool check_int(const View& v, Py_ssize_t bytes, int arg) {
    const char k = v.kind();
    if (!(k == 'i' || k == 'l' || k == 'q') || v.buf.itemsize != bytes) {
        PyErr_Format(PyExc_TypeError, "record_step: %s must be int%zd", NAMES[arg], bytes * 8);
        return false;
    }
    return true;
}

bool is_float(char kind) { return kind == 'f' || kind == 'd'; }

bool check_kind(const View& v, char kind, int arg) {
    if (v.kind() != kind) {
        PyErr_Format(PyExc_TypeError, "record_step: %s must have dtype code '%c'", NAMES[arg], kind);
        return false;
    }
    return true;
}

// NaN and infinities become 0, as np.nan_to_num(nan=0, posinf=0, neginf=0)
template <typename F>
inline F finite_or_zero(F x) { return std::isfinite(x) ? x : F(0); }

template <typename S, typename D>
void copy_row(const S* src, D* dst, Py_ssize_t n, bool zero_nonfinite) {
    if (zero_nonfinite) {
        for (Py_ssize_t k = 0; k < n; ++k) dst[k] = static_cast<D>(finite_or_zero(src[k]));
    } else {
        for (Py_ssize_t k = 0; k < n; ++k) dst[k] = static_cast<D>(src[k]);
    }
}

template <typename S>
bool row_finite(const S* src, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; ++k) {
        if (!std::isfinite(src[k])) return false;
    }
    return true;
}

struct Obs {
    const char* src;
    char* dst;
    char src_kind, dst_kind;
    Py_ssize_t row_items, src_item_bytes, dst_item_bytes;

    bool row_ok(Py_ssize_t j) const {
        const char* p = src + j * row_items * src_item_bytes;
        if (src_kind == 'f') return row_finite(reinterpret_cast<const float*>(p), row_items);
        if (src_kind == 'd') return row_finite(reinterpret_cast<const double*>(p), row_items);
        return true;
    }
    void copy(Py_ssize_t j, Py_ssize_t i, bool zero_nonfinite) const {
        const char* s = src + j * row_items * src_item_bytes;
        char* d = dst + i * row_items * dst_item_bytes;
        if (src_kind == dst_kind && !zero_nonfinite) {
            std::memcpy(d, s, static_cast<size_t>(row_items * src_item_bytes));
        } else if (src_kind == 'd' && dst_kind == 'f') {
            copy_row(reinterpret_cast<const double*>(s), reinterpret_cast<float*>(d), row_items, zero_nonfinite);
        } else if (src_kind == 'f' && dst_kind == 'd') {
            copy_row(reinterpret_cast<const float*>(s), reinterpret_cast<double*>(d), row_items, zero_nonfinite);
        } else if (src_kind == 'f') {
            copy_row(reinterpret_cast<const float*>(s), reinterpret_cast<float*>(d), row_items, zero_nonfinite);
        } else {
            copy_row(reinterpret_cast<const double*>(s), reinterpret_cast<double*>(d), row_items, zero_nonfinite);
        }
    }
};

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

    // shapes: N envs; slots [S, T, N] and obs [S, T + 1, N, *obs_shape]
    const Py_ssize_t N = v[REWARD].items();
    const Py_ssize_t S = v[REWARDS].dim(0), T = v[REWARDS].dim(1);
    if (N < 1 || v[REWARDS].buf.ndim != 3 || v[REWARDS].dim(2) != N) return fail("rewards must be [slots, T, N]");
    for (int k : {TERMINATED, TRUNCATED, VALID}) {
        if (v[k].buf.ndim != 3 || v[k].dim(0) != S || v[k].dim(1) != T || v[k].dim(2) != N)
            return fail("terminated, truncated and valid must be shaped like rewards");
    }
    if (v[OBS].buf.ndim < 3 || v[OBS].dim(0) != S || v[OBS].dim(1) != T + 1 || v[OBS].dim(2) != N)
        return fail("obs must be [slots, T + 1, N, ...]");
    for (int k : {DONE, TRUNC, ENV_ID, WAS_RESET, EP_SCORE, EP_LEN, FINISHED_SCORES, FINISHED_LENGTHS}) {
        if (v[k].items() != N) return PyErr_Format(PyExc_ValueError, "record_step: %s must hold N items", NAMES[k]);
    }
    if (atari && (v[SCORE_SRC].items() != N || v[GAME_OVER_SRC].items() != N))
        return fail("score_src and game_over_src must hold N items");
    if (slot < 0 || slot >= S || t < 0 || t >= T) return fail("slot or t out of range");
    const Py_ssize_t obs_row_items = v[OBS].items() / (S * (T + 1) * N);
    if (v[OBS_SRC].items() != N * obs_row_items || v[OBS_SRC].dim(0) != N)
        return fail("obs_src must be [N, ...] with the slots' observation size");

    // dtypes
    if (!check_kind(v[REWARD], 'f', REWARD) || !check_kind(v[REWARDS], 'f', REWARDS) ||
        !check_int(v[ENV_ID], 4, ENV_ID) || !check_kind(v[EP_SCORE], 'd', EP_SCORE) ||
        !check_kind(v[FINISHED_SCORES], 'd', FINISHED_SCORES) || !check_int(v[EP_LEN], 8, EP_LEN) ||
        !check_int(v[FINISHED_LENGTHS], 8, FINISHED_LENGTHS))
        return nullptr;
    for (int k : {DONE, TRUNC, TERMINATED, TRUNCATED, VALID, WAS_RESET}) {
        if (!check_kind(v[k], '?', k)) return nullptr;
    }
    if (atari && (!check_kind(v[SCORE_SRC], 'f', SCORE_SRC) || !check_int(v[GAME_OVER_SRC], 4, GAME_OVER_SRC)))
        return nullptr;
    Obs obs{static_cast<const char*>(v[OBS_SRC].buf.buf), static_cast<char*>(v[OBS].buf.buf), v[OBS_SRC].kind(),
            v[OBS].kind(), obs_row_items, v[OBS_SRC].buf.itemsize, v[OBS].buf.itemsize};
    const bool float_obs = is_float(obs.src_kind);
    // other float widths (float16) would need the reference's finiteness check: left to it
    if (!float_obs && std::strchr("bBhHiIlLqQ?", obs.src_kind) == nullptr) {
        PyErr_Format(PyExc_TypeError, "record_step: obs_src's dtype code '%c' is not supported", obs.src_kind);
        return nullptr;
    }
    if (float_obs ? !is_float(obs.dst_kind) : (obs.src_kind != obs.dst_kind || obs.src_item_bytes != obs.dst_item_bytes))
        return fail("obs_src's dtype must be the slots' (or both float32/float64)");

    // env id -> row of the sources holding it. Sync mode returns env-id order, so the map (and its
    // allocation) is only built when the ids come otherwise
    const int32_t* env_id = static_cast<const int32_t*>(v[ENV_ID].buf.buf);
    bool in_order = true;
    for (Py_ssize_t j = 0; j < N && in_order; ++j) in_order = env_id[j] == j;
    std::vector<Py_ssize_t> row;
    if (!in_order) {
        row.assign(static_cast<size_t>(N), -1);
        for (Py_ssize_t j = 0; j < N; ++j) {
            const int32_t id = env_id[j];
            if (id < 0 || id >= N || row[static_cast<size_t>(id)] >= 0)
                return fail("env_id must be a permutation of 0..N-1 (every env in every call)");
            row[static_cast<size_t>(id)] = j;
        }
    }
    auto source_row = [&](Py_ssize_t i) { return in_order ? i : row[static_cast<size_t>(i)]; };

    const float* reward = static_cast<const float*>(v[REWARD].buf.buf);
    const bool* done = static_cast<const bool*>(v[DONE].buf.buf);
    const bool* trunc = static_cast<const bool*>(v[TRUNC].buf.buf);
    const float* score_src = atari ? static_cast<const float*>(v[SCORE_SRC].buf.buf) : reward;
    const int32_t* game_over_src = atari ? static_cast<const int32_t*>(v[GAME_OVER_SRC].buf.buf) : nullptr;
    const Py_ssize_t cell = (slot * T + t) * N;
    float* rewards = static_cast<float*>(v[REWARDS].buf.buf) + cell;
    bool* terminated = static_cast<bool*>(v[TERMINATED].buf.buf) + cell;
    bool* truncated = static_cast<bool*>(v[TRUNCATED].buf.buf) + cell;
    bool* valid = static_cast<bool*>(v[VALID].buf.buf) + cell;
    bool* was_reset = static_cast<bool*>(v[WAS_RESET].buf.buf);
    double* ep_score = static_cast<double*>(v[EP_SCORE].buf.buf);
    int64_t* ep_len = static_cast<int64_t*>(v[EP_LEN].buf.buf);
    double* finished_scores = static_cast<double*>(v[FINISHED_SCORES].buf.buf);
    int64_t* finished_lengths = static_cast<int64_t*>(v[FINISHED_LENGTHS].buf.buf);
    obs.dst += ((slot * (T + 1) + t + 1) * N) * obs_row_items * obs.dst_item_bytes;

    // whether any env's transition is not finite: the reference then masks those envs and zeroes every
    // non-finite score of the step; rows are checked again below only in that rare case
    auto row_bad = [&](Py_ssize_t j) { return !std::isfinite(reward[j]) || (float_obs && !obs.row_ok(j)); };
    Py_ssize_t num_bad = 0;
    for (Py_ssize_t i = 0; i < N; ++i) num_bad += row_bad(i) ? 1 : 0;  // rows in any order: a count
    Py_ssize_t num_finished = 0;
    for (Py_ssize_t i = 0; i < N; ++i) {
        const Py_ssize_t j = source_row(i);
        const bool is_bad = num_bad > 0 && row_bad(j);
        const bool term = done[j] && !trunc[j];
        rewards[i] = is_bad ? 0.0f : reward[j];
        terminated[i] = term;
        truncated[i] = trunc[j];
        valid[i] = !was_reset[i] && !is_bad;
        was_reset[i] = term || trunc[j];
        float score = score_src[j];
        if (num_bad > 0) score = finite_or_zero(score);
        ep_score[i] += static_cast<double>(score);
        ep_len[i] += valid[i] ? 1 : 0;
        const bool game_over = atari ? (game_over_src[j] != 0 || trunc[j]) : (term || trunc[j]);
        if (game_over) {
            finished_scores[num_finished] = ep_score[i];
            finished_lengths[num_finished] = ep_len[i];
            ++num_finished;
            ep_score[i] = 0.0;
            ep_len[i] = 0;
        }
        obs.copy(j, i, float_obs && num_bad > 0);
    }
    return Py_BuildValue("(nn)", num_finished, num_bad);
}

// numpy's pairwise summation of float64 (add.reduce on a contiguous array: 8 accumulators in blocks
// of up to 128, halves above that), so that the moments below match ReturnScaler's numpy bit for bit
double pairwise_sum(const double* a, Py_ssize_t n) {
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; ++i) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; ++j) r[j] = a[j];
        Py_ssize_t i = 8;
        for (; i < n - (n % 8); i += 8) {
            for (int j = 0; j < 8; ++j) r[j] += a[i + j];
        }
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

enum ScaleArg { S_RETURNS, S_MOMENTS, S_REWARDS, S_VALID, S_DONE, S_GAMMA, S_CLIP, S_EPS, S_NUM_ARGS };
const char* const SCALE_NAMES[S_GAMMA] = {"returns", "moments", "rewards", "valid", "done"};

// fastrl.algo.reward_scaling.ReturnScaler.__call__ for one group, in place (the reference says why):
//   G = where(valid, gamma * G + r, G);  merge the mean and variance of G[valid] into (count, mean, var)
//   r = float32(clip(r / sqrt(var + eps), -clip, clip));  G[done] = 0
// HalfCheetah's reference is ~15 numpy calls per env step of 32 envs, the largest Python left in its
// rollout worker after the recorder and the acting forward went native.
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
        return fail("returns, rewards, valid and done must hold one item per env");
    if (v[S_MOMENTS].items() != 3) return fail("moments must be (count, mean, var)");

    double* ret = static_cast<double*>(v[S_RETURNS].buf.buf);
    double* moments = static_cast<double*>(v[S_MOMENTS].buf.buf);
    float* rewards = static_cast<float*>(v[S_REWARDS].buf.buf);
    const bool* valid = static_cast<const bool*>(v[S_VALID].buf.buf);
    const bool* done = static_cast<const bool*>(v[S_DONE].buf.buf);
    thread_local std::vector<double> x;  // G[valid], then its squared deviations
    x.clear();
    for (Py_ssize_t i = 0; i < N; ++i) {
        if (valid[i]) {
            ret[i] = gamma * ret[i] + static_cast<double>(rewards[i]);
            x.push_back(ret[i]);
        }
    }
    const Py_ssize_t n = static_cast<Py_ssize_t>(x.size());
    if (n > 0) {
        // numpy's x.mean() and x.var(), then the parallel-variance merge in the reference's order
        const double b_mean = pairwise_sum(x.data(), n) / static_cast<double>(n);
        for (double& xi : x) xi = (xi - b_mean) * (xi - b_mean);
        const double b_var = pairwise_sum(x.data(), n) / static_cast<double>(n);
        const double count = moments[0], mean = moments[1], var = moments[2];
        const double total = count + static_cast<double>(n);
        const double delta = b_mean - mean;
        moments[1] = mean + delta * static_cast<double>(n) / total;
        moments[2] = (var * count + b_var * static_cast<double>(n) + delta * delta * count * static_cast<double>(n) / total) / total;
        moments[0] = total;
    }
    const double scale = std::sqrt(moments[2] + eps);
    for (Py_ssize_t i = 0; i < N; ++i) {
        double r = static_cast<double>(rewards[i]) / scale;
        r = r < -clip ? -clip : (r > clip ? clip : r);
        rewards[i] = static_cast<float>(r);
        if (done[i]) ret[i] = 0.0;
    }
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
