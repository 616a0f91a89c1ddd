// fastrl_ext: the recording and reward-scaling arithmetic, shared by _record (one Python call per env
// step) and _rollout (many steps per call). Both modules are built with -ffp-contract=off, so the
// scaling below matches numpy bit for bit in either (record.cpp says what each step writes and why).
#pragma once

#include "buffer_view.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace fastrl_ext::record {

using View = BufferView;

enum Arg {
    OBS_SRC, REWARD, DONE, TRUNC, ENV_ID, SCORE_SRC, GAME_OVER_SRC,         // envpool's outputs
    OBS, REWARDS, TERMINATED, TRUNCATED, VALID,                              // the slots, whole
    WAS_RESET, EP_SCORE, EP_LEN, FINISHED_SCORES, FINISHED_LENGTHS,          // the group's state and outputs
    SLOT, T_INDEX, NUM_ARGS
};

inline const char* const NAMES[NUM_ARGS] = {
    "obs_src", "reward", "done", "trunc", "env_id", "score_src", "game_over_src", "obs", "rewards", "terminated",
    "truncated", "valid", "was_reset", "ep_score", "ep_len", "finished_scores", "finished_lengths", "slot", "t"};

inline bool fail(const char* what) {
    PyErr_Format(PyExc_ValueError, "record_step: %s", what);
    return false;
}

// an integer dtype of `bytes` bytes (numpy's int64 is 'l' on Linux, 'q' elsewhere)
inline bool check_int(const View& v, Py_ssize_t bytes, int arg) {
    const char k = v.kind();
    if (!(k == 'i' || k == 'l' || k == 'q') || v.buf.itemsize != bytes) {
        PyErr_Format(PyExc_TypeError, "record_step: %s must be int%zd", NAMES[arg], bytes * 8);
        return false;
    }
    return true;
}

inline bool is_float(char kind) { return kind == 'f' || kind == 'd'; }

inline bool check_kind(const View& v, char kind, int arg) {
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

// The trajectory slots and one group's episode state, checked: [S, T, N] cells, obs [S, T + 1, N, ...]
struct Target {
    Py_ssize_t S = 0, T = 0, N = 0, obs_row_items = 0, obs_item_bytes = 0;
    char obs_kind = 0;
    char* obs = nullptr;
    float* rewards = nullptr;
    bool *terminated = nullptr, *truncated = nullptr, *valid = nullptr, *was_reset = nullptr;
    double* ep_score = nullptr;
    int64_t* ep_len = nullptr;
};

// envpool's outputs for one step, checked against a Target
struct Source {
    const char* obs = nullptr;
    char obs_kind = 0;
    Py_ssize_t obs_item_bytes = 0;
    const float* reward = nullptr;
    const bool *done = nullptr, *trunc = nullptr;
    const int32_t* env_id = nullptr;
    const float* score = nullptr;        // Atari's unclipped reward, else the reward
    const int32_t* game_over = nullptr;  // Atari's info terminated, else null
};

// `v` indexed by Arg, OBS..EP_LEN filled; false with an error set
inline bool check_target(const View* v, Target& out) {
    out.N = v[REWARDS].dim(2);
    out.S = v[REWARDS].dim(0);
    out.T = v[REWARDS].dim(1);
    const Py_ssize_t S = out.S, T = out.T, N = out.N;
    if (N < 1 || v[REWARDS].buf.ndim != 3) return fail("rewards must be [slots, T, N]");
    for (int k : {TERMINATED, TRUNCATED, VALID}) {
        if (v[k].buf.ndim != 3 || v[k].dim(0) != S || v[k].dim(1) != T || v[k].dim(2) != N)
            return fail("terminated, truncated and valid must be shaped like rewards");
    }
    if (v[OBS].buf.ndim < 3 || v[OBS].dim(0) != S || v[OBS].dim(1) != T + 1 || v[OBS].dim(2) != N)
        return fail("obs must be [slots, T + 1, N, ...]");
    for (int k : {WAS_RESET, EP_SCORE, EP_LEN}) {
        if (v[k].items() != N) {
            PyErr_Format(PyExc_ValueError, "record_step: %s must hold N items", NAMES[k]);
            return false;
        }
    }
    if (!check_kind(v[REWARDS], 'f', REWARDS) || !check_kind(v[EP_SCORE], 'd', EP_SCORE) ||
        !check_int(v[EP_LEN], 8, EP_LEN))
        return false;
    for (int k : {TERMINATED, TRUNCATED, VALID, WAS_RESET}) {
        if (!check_kind(v[k], '?', k)) return false;
    }
    out.obs_row_items = v[OBS].items() / (S * (T + 1) * N);
    out.obs_kind = v[OBS].kind();
    out.obs_item_bytes = v[OBS].buf.itemsize;
    out.obs = static_cast<char*>(v[OBS].buf.buf);
    out.rewards = static_cast<float*>(v[REWARDS].buf.buf);
    out.terminated = static_cast<bool*>(v[TERMINATED].buf.buf);
    out.truncated = static_cast<bool*>(v[TRUNCATED].buf.buf);
    out.valid = static_cast<bool*>(v[VALID].buf.buf);
    out.was_reset = static_cast<bool*>(v[WAS_RESET].buf.buf);
    out.ep_score = static_cast<double*>(v[EP_SCORE].buf.buf);
    out.ep_len = static_cast<int64_t*>(v[EP_LEN].buf.buf);
    return true;
}

// `v` indexed by Arg, OBS_SRC..GAME_OVER_SRC filled (the last two only for Atari); false with an error set
inline bool check_source(const View* v, bool atari, const Target& to, Source& out) {
    const Py_ssize_t N = to.N;
    if (v[REWARD].items() != N) return fail("reward must hold N items (the slots' N)");
    for (int k : {DONE, TRUNC, ENV_ID}) {
        if (v[k].items() != N) {
            PyErr_Format(PyExc_ValueError, "record_step: %s must hold N items", NAMES[k]);
            return false;
        }
    }
    if (atari && (v[SCORE_SRC].items() != N || v[GAME_OVER_SRC].items() != N))
        return fail("score_src and game_over_src must hold N items");
    if (v[OBS_SRC].items() != N * to.obs_row_items || v[OBS_SRC].dim(0) != N)
        return fail("obs_src must be [N, ...] with the slots' observation size");
    if (!check_kind(v[REWARD], 'f', REWARD) || !check_int(v[ENV_ID], 4, ENV_ID) || !check_kind(v[DONE], '?', DONE) ||
        !check_kind(v[TRUNC], '?', TRUNC))
        return false;
    if (atari && (!check_kind(v[SCORE_SRC], 'f', SCORE_SRC) || !check_int(v[GAME_OVER_SRC], 4, GAME_OVER_SRC)))
        return false;
    out.obs_kind = v[OBS_SRC].kind();
    out.obs_item_bytes = v[OBS_SRC].buf.itemsize;
    const bool float_obs = is_float(out.obs_kind);
    // other float widths (float16) would need the reference's finiteness check: left to it
    if (!float_obs && std::strchr("bBhHiIlLqQ?", out.obs_kind) == nullptr) {
        PyErr_Format(PyExc_TypeError, "record_step: obs_src's dtype code '%c' is not supported", out.obs_kind);
        return false;
    }
    if (float_obs ? !is_float(to.obs_kind) : (out.obs_kind != to.obs_kind || out.obs_item_bytes != to.obs_item_bytes))
        return fail("obs_src's dtype must be the slots' (or both float32/float64)");
    out.obs = static_cast<const char*>(v[OBS_SRC].buf.buf);
    out.reward = static_cast<const float*>(v[REWARD].buf.buf);
    out.done = static_cast<const bool*>(v[DONE].buf.buf);
    out.trunc = static_cast<const bool*>(v[TRUNC].buf.buf);
    out.env_id = static_cast<const int32_t*>(v[ENV_ID].buf.buf);
    out.score = atari ? static_cast<const float*>(v[SCORE_SRC].buf.buf) : out.reward;
    out.game_over = atari ? static_cast<const int32_t*>(v[GAME_OVER_SRC].buf.buf) : nullptr;
    return true;
}

inline void copy_obs_row(const Source& from, const Target& to, char* dst_row0, Py_ssize_t j, Py_ssize_t i,
                         bool zero_nonfinite) {
    const Py_ssize_t n = to.obs_row_items;
    const char* s = from.obs + j * n * from.obs_item_bytes;
    char* d = dst_row0 + i * n * to.obs_item_bytes;
    if (from.obs_kind == to.obs_kind && !zero_nonfinite) {
        std::memcpy(d, s, static_cast<size_t>(n * from.obs_item_bytes));
    } else if (from.obs_kind == 'd' && to.obs_kind == 'f') {
        copy_row(reinterpret_cast<const double*>(s), reinterpret_cast<float*>(d), n, zero_nonfinite);
    } else if (from.obs_kind == 'f' && to.obs_kind == 'd') {
        copy_row(reinterpret_cast<const float*>(s), reinterpret_cast<double*>(d), n, zero_nonfinite);
    } else if (from.obs_kind == 'f') {
        copy_row(reinterpret_cast<const float*>(s), reinterpret_cast<float*>(d), n, zero_nonfinite);
    } else {
        copy_row(reinterpret_cast<const double*>(s), reinterpret_cast<double*>(d), n, zero_nonfinite);
    }
}

inline bool obs_row_finite(const Source& from, Py_ssize_t n, Py_ssize_t j) {
    const char* p = from.obs + j * n * from.obs_item_bytes;
    if (from.obs_kind == 'f') return row_finite(reinterpret_cast<const float*>(p), n);
    if (from.obs_kind == 'd') return row_finite(reinterpret_cast<const double*>(p), n);
    return true;
}

// One env step into slot `slot` at step t (observation at t + 1); each finished game's score and length
// go to finished_scores/lengths[0..]. False with an error set when env_id is not a permutation.
inline bool record_into(const Source& from, const Target& to, Py_ssize_t slot, Py_ssize_t t,
                        double* finished_scores, int64_t* finished_lengths, Py_ssize_t* num_finished_out,
                        Py_ssize_t* num_bad_out) {
    const Py_ssize_t N = to.N, T = to.T;
    // env id -> row of the sources holding it. Sync mode returns env-id order, so the map (and its
    // allocation) is only built when the ids come otherwise
    bool in_order = true;
    for (Py_ssize_t j = 0; j < N && in_order; ++j) in_order = from.env_id[j] == j;
    std::vector<Py_ssize_t> row;
    if (!in_order) {
        row.assign(static_cast<size_t>(N), -1);
        for (Py_ssize_t j = 0; j < N; ++j) {
            const int32_t id = from.env_id[j];
            if (id < 0 || id >= N || row[static_cast<size_t>(id)] >= 0)
                return fail("env_id must be a permutation of 0..N-1 (every env in every call)");
            row[static_cast<size_t>(id)] = j;
        }
    }
    auto source_row = [&](Py_ssize_t i) { return in_order ? i : row[static_cast<size_t>(i)]; };

    const bool float_obs = is_float(from.obs_kind);
    const Py_ssize_t cell = (slot * T + t) * N;
    float* rewards = to.rewards + cell;
    bool* terminated = to.terminated + cell;
    bool* truncated = to.truncated + cell;
    bool* valid = to.valid + cell;
    char* obs_dst = to.obs + ((slot * (T + 1) + t + 1) * N) * to.obs_row_items * to.obs_item_bytes;

    // whether any env's transition is not finite: the reference then masks those envs and zeroes every
    // non-finite score of the step; rows are checked again below only in that rare case
    auto row_bad = [&](Py_ssize_t j) {
        return !std::isfinite(from.reward[j]) || (float_obs && !obs_row_finite(from, to.obs_row_items, j));
    };
    Py_ssize_t num_bad = 0;
    for (Py_ssize_t i = 0; i < N; ++i) num_bad += row_bad(i) ? 1 : 0;  // rows in any order: a count
    Py_ssize_t num_finished = 0;
    for (Py_ssize_t i = 0; i < N; ++i) {
        const Py_ssize_t j = source_row(i);
        const bool is_bad = num_bad > 0 && row_bad(j);
        const bool term = from.done[j] && !from.trunc[j];
        rewards[i] = is_bad ? 0.0f : from.reward[j];
        terminated[i] = term;
        truncated[i] = from.trunc[j];
        valid[i] = !to.was_reset[i] && !is_bad;
        to.was_reset[i] = term || from.trunc[j];
        float score = from.score[j];
        if (num_bad > 0) score = finite_or_zero(score);
        to.ep_score[i] += static_cast<double>(score);
        to.ep_len[i] += valid[i] ? 1 : 0;
        const bool game_over = from.game_over ? (from.game_over[j] != 0 || from.trunc[j]) : (term || from.trunc[j]);
        if (game_over) {
            finished_scores[num_finished] = to.ep_score[i];
            finished_lengths[num_finished] = to.ep_len[i];
            ++num_finished;
            to.ep_score[i] = 0.0;
            to.ep_len[i] = 0;
        }
        copy_obs_row(from, to, obs_dst, j, i, float_obs && num_bad > 0);
    }
    *num_finished_out = num_finished;
    *num_bad_out = num_bad;
    return true;
}

// numpy's pairwise summation of float64 (add.reduce on a contiguous array: 8 accumulators in blocks
// of up to 128, halves above that), so that the moments below match ReturnScaler's numpy bit for bit
inline double pairwise_sum(const double* a, Py_ssize_t n) {
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

// fastrl.algo.reward_scaling.ReturnScaler.__call__ for one group of N envs, in place (the reference says why):
//   G = where(valid, gamma * G + r, G);  merge the mean and variance of G[valid] into (count, mean, var)
//   r = float32(clip(r / sqrt(var + eps), -clip, clip));  G[done] = 0
inline void scale_into(double* ret, double* moments, float* rewards, const bool* valid, const bool* done, Py_ssize_t N,
                       double gamma, double clip, double eps) {
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
}

}  // namespace fastrl_ext::record
