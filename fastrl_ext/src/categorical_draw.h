// fastrl_ext: the categorical draw, one row of logits and a uniform at a time, shared by _acting's MLP kernel
// (acting.cpp) and its `sample_categorical`, the draw alone after a forward that ran elsewhere (an inference
// worker's torch network), so both draw alike from the same uniforms. NumpyPolicy.sample is the reference.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "acting_plan.h"
#include "buffer_view.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fastrl_ext::acting {

// the cumulative sums a draw keeps on the stack; a wider row counts the rest in a second pass
constexpr int64_t CDF_ON_STACK = 64;

// One categorical draw from logits [A] (any A >= 1) and a uniform u in [0, 1): the formula at the top of
// acting.cpp. Shared by the MLP kernel's head and `sample_categorical`, so both draw alike from the same u.
__attribute__((always_inline)) inline void categorical_row(const float* logits, int64_t A, float u, int64_t* action,
                                                           float* log_prob) {
    float top = logits[0];
    for (int64_t j = 1; j < A; ++j) top = std::max(top, logits[j]);
    float cdf[CDF_ON_STACK];
    float total = 0.0f;
    for (int64_t j = 0; j < A; ++j) {
        total += std::exp(logits[j] - top);
        if (j < CDF_ON_STACK) cdf[j] = total;
    }
    const float threshold = u * total;
    const int64_t kept = std::min(A, CDF_ON_STACK);
    int64_t chosen = 0;
    for (int64_t j = 0; j < kept; ++j) chosen += cdf[j] <= threshold;
    if (chosen == kept) {
        // every kept sum is <= threshold: count the rest, the same float32 additions in the same order as the
        // first pass (so the same sums), their exps computed again rather than stored
        float sum = cdf[kept - 1];
        for (int64_t j = kept; j < A; ++j) {
            sum += std::exp(logits[j] - top);
            chosen += sum <= threshold;
        }
    }
    chosen = std::min(chosen, A - 1);
    *action = chosen;
    *log_prob = (logits[chosen] - top) - std::log(total);
}

// sample_categorical(logits, random, actions, log_probs[, choices]): the draw alone, for a policy whose forward
// ran elsewhere (an inference worker's torch network): one row per sample of float32 logits [B, A], a uniform
// per choice in `random` [B] or [B, K], written into int32 or int64 `actions` [B] or [B, K] (a trajectory
// slot's cells) and float32 `log_probs` [B]. `choices` (int64 [K], each choice's options, summing to A): K
// choices, each drawn from its slice of the row as act_mlp draws them; None or absent, one categorical.
// Replaces torch's log_softmax, multinomial and gather (~30 us a call warm, ~8 tensors).
inline PyObject* py_sample_categorical(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    enum { LOGITS, UNIFORMS, OUT_ACTIONS, OUT_LOG_PROBS, CHOICES, N };
    static const char* const names[N] = {"logits", "random", "actions", "log_probs", "choices"};
    if (nargs != N - 1 && nargs != N) {
        PyErr_SetString(PyExc_TypeError,
                        "sample_categorical takes 4 or 5 arguments (logits, random, actions, log_probs[, choices])");
        return nullptr;
    }
    View v[N];
    if (!fastrl_ext::float32_view(v[LOGITS], args[LOGITS], false, "sample_categorical", names[LOGITS]) ||
        !fastrl_ext::float32_view(v[UNIFORMS], args[UNIFORMS], false, "sample_categorical", names[UNIFORMS]) ||
        !v[OUT_ACTIONS].get(args[OUT_ACTIONS], true, "sample_categorical", names[OUT_ACTIONS]) ||
        !fastrl_ext::float32_view(v[OUT_LOG_PROBS], args[OUT_LOG_PROBS], true, "sample_categorical", names[OUT_LOG_PROBS]))
        return nullptr;
    const char k = v[OUT_ACTIONS].kind();
    const Py_ssize_t action_bytes = v[OUT_ACTIONS].buf.itemsize;
    if (!((k == 'i' || k == 'l' || k == 'q') && (action_bytes == 4 || action_bytes == 8))) {
        PyErr_SetString(PyExc_TypeError, "sample_categorical: actions must be int32 or int64");
        return nullptr;
    }
    if (v[LOGITS].buf.ndim != 2) {
        PyErr_SetString(PyExc_ValueError, "sample_categorical: logits must be [B, A]");
        return nullptr;
    }
    const int64_t B = v[LOGITS].dim(0), A = v[LOGITS].dim(1);
    // each choice's options: the whole row for one categorical (kept by the thread: no allocation per call on
    // an inference worker's path once it has grown)
    thread_local std::vector<int64_t> options;
    options.assign(1, A);
    if (nargs == N && args[CHOICES] != Py_None) {
        if (!v[CHOICES].get(args[CHOICES], false, "sample_categorical", names[CHOICES])) return nullptr;
        const char ck = v[CHOICES].kind();
        if ((ck != 'l' && ck != 'q') || v[CHOICES].buf.itemsize != 8) {
            PyErr_SetString(PyExc_TypeError, "sample_categorical: choices must be int64");
            return nullptr;
        }
        const int64_t* n = static_cast<const int64_t*>(v[CHOICES].buf.buf);
        options.assign(n, n + v[CHOICES].items());
        int64_t total = 0;
        for (const int64_t c : options) total += c;
        if (options.empty() || total != A) {
            PyErr_SetString(PyExc_ValueError, "sample_categorical: the choices' options do not add up to the logits");
            return nullptr;
        }
    }
    for (const int64_t c : options) {
        if (c < 1) {
            PyErr_SetString(PyExc_ValueError, "sample_categorical: each choice needs at least 1 action");
            return nullptr;
        }
    }
    const int64_t K = static_cast<int64_t>(options.size());
    if (v[UNIFORMS].items() != B * K || v[OUT_ACTIONS].items() != B * K || v[OUT_LOG_PROBS].items() != B) {
        PyErr_SetString(PyExc_ValueError,
                        "sample_categorical: random and actions must hold B items per choice, log_probs B items");
        return nullptr;
    }
    const float* logits = static_cast<const float*>(v[LOGITS].buf.buf);
    const float* u = static_cast<const float*>(v[UNIFORMS].buf.buf);
    float* log_probs = static_cast<float*>(v[OUT_LOG_PROBS].buf.buf);
    for (int64_t i = 0; i < B; ++i) {
        const float* row = logits + i * A;
        float log_prob = 0.0f;
        for (int64_t c = 0; c < K; ++c) {
            int64_t action;
            float choice_log_prob;
            categorical_row(row, options[c], u[i * K + c], &action, &choice_log_prob);
            log_prob += choice_log_prob;  // in float32, choice after choice, as act_mlp adds them
            row += options[c];
            if (action_bytes == 4)
                static_cast<int32_t*>(v[OUT_ACTIONS].buf.buf)[i * K + c] = static_cast<int32_t>(action);
            else
                static_cast<int64_t*>(v[OUT_ACTIONS].buf.buf)[i * K + c] = action;
        }
        log_probs[i] = log_prob;
    }
    Py_RETURN_NONE;
}

}  // namespace fastrl_ext::acting
