// fastrl_ext: the acting MLP as _acting reads it: the plan format, the network it describes, and the
// check of every offset and shape against the params block (acting.cpp runs the network).
//
// `plan` (int64) describes the network inside the float32 `params` block:
//   [D, A, discrete, relu, normalized, n_actor, n_critic, K,
//    (in, out, w_offset, b_offset, by_output) for each actor layer, each critic layer, the policy head and
//    the value head (by_output: W stored (out, in), as torch keeps it, rather than (in, out)),
//    mean_offset, inv_std_offset, std_offset, log_prob_const_offset,     (offsets: -1 where unused)
//    mask_column,  (categorical: the first of the A observation columns that hold the action mask, -1 for none)
//    n_1 .. n_K]   (several discrete choices: each one's number of options, summing to A; K = 0 for one
//                   categorical over all A logits, or a Gaussian)
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "buffer_view.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace fastrl_ext::acting {

using View = BufferView;

constexpr int HEADER = 8;
constexpr int PER_LAYER = 5;
constexpr int TAIL = 5;
// What a forbidden action's logit becomes: fastrl.models.actor_critic's MASKED_LOGIT (exp of it less any logit
// a network gives is 0 in float32, and it stays finite so that 0 * log p is 0 in the entropy)
constexpr float MASKED_LOGIT = -1e9f;

struct Layer {
    int64_t in, out;
    bool by_output;  // W stored (out, in) rather than (in, out)
    const float* w;
    const float* b;
};

struct Net {
    int64_t D, A;
    bool discrete, relu, normalized;
    std::vector<Layer> actor, critic;
    Layer policy_head, value_head;
    const float *mean = nullptr, *inv_std = nullptr, *std_dev = nullptr;
    float log_prob_const = 0.0f;
    int64_t mask_column = -1;  // obs columns mask_column .. + A - 1 hold the action mask (> 0.5: allowed)
    std::vector<int64_t> choices;  // several discrete choices' numbers of options; empty: one categorical over A
    int64_t widest = 0;
};

inline PyObject* fail(const char* what) {
    PyErr_Format(PyExc_ValueError, "act_mlp: %s", what);
    return nullptr;
}

inline int refuse(const char* what) {
    fail(what);
    return -1;
}

// Reads the plan and checks every offset and shape against the params block; false with an error set.
inline bool read_plan(const View& plan, const View& params, Net& net) {
    const int64_t* p = static_cast<const int64_t*>(plan.buf.buf);
    const int64_t n = plan.items();
    const int64_t size = params.items();
    const float* base = static_cast<const float*>(params.buf.buf);
    if (n < HEADER) {
        fail("plan too short");
        return false;
    }
    // `net` is reused call after call (its layer vectors keep their capacity): reset what may not be set below
    net.widest = 0;
    net.mean = net.inv_std = net.std_dev = nullptr;
    net.log_prob_const = 0.0f;
    net.D = p[0];
    net.A = p[1];
    net.discrete = p[2] != 0;
    net.relu = p[3] != 0;
    net.normalized = p[4] != 0;
    const int64_t n_actor = p[5], n_critic = p[6], K = p[7];
    if (net.D <= 0 || net.A <= 0 || n_actor < 0 || n_critic < 0 || K < 0 ||
        n != HEADER + PER_LAYER * (n_actor + n_critic + 2) + TAIL + K) {
        PyErr_SetString(PyExc_ValueError, "act_mlp: plan does not describe a network");
        return false;
    }
    auto at = [&](int64_t offset, int64_t count, const float** out) {
        if (offset < 0 || count < 0 || offset + count > size) return false;
        *out = base + offset;
        return true;
    };
    auto layer = [&](int64_t i, Layer& l) {
        const int64_t* q = p + HEADER + PER_LAYER * i;
        l.in = q[0];
        l.out = q[1];
        l.by_output = q[4] != 0;
        return l.in > 0 && l.out > 0 && at(q[2], l.in * l.out, &l.w) && at(q[3], l.out, &l.b);
    };
    net.actor.resize(n_actor);
    net.critic.resize(n_critic);
    bool ok = true;
    for (int64_t i = 0; i < n_actor; ++i) ok = ok && layer(i, net.actor[i]);
    for (int64_t i = 0; i < n_critic; ++i) ok = ok && layer(n_actor + i, net.critic[i]);
    ok = ok && layer(n_actor + n_critic, net.policy_head) && layer(n_actor + n_critic + 1, net.value_head);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "act_mlp: a layer lies outside params");
        return false;
    }
    // each layer takes what the one before it gives
    auto chain = [&](const std::vector<Layer>& layers, const Layer& head) {
        int64_t width = net.D;
        for (const Layer& l : layers) {
            if (l.in != width) return false;
            width = l.out;
            net.widest = std::max(net.widest, width);
        }
        return head.in == width;
    };
    const std::vector<Layer>& value_trunk = n_critic ? net.critic : net.actor;
    if (!chain(net.actor, net.policy_head) || !chain(value_trunk, net.value_head) || net.policy_head.out != net.A ||
        net.value_head.out != 1) {
        PyErr_SetString(PyExc_ValueError, "act_mlp: the layers' shapes do not chain");
        return false;
    }
    net.widest = std::max({net.widest, net.D, net.A});
    const int64_t* tail = p + n - TAIL - K;
    if (net.normalized && !(at(tail[0], net.D, &net.mean) && at(tail[1], net.D, &net.inv_std))) {
        PyErr_SetString(PyExc_ValueError, "act_mlp: normaliser outside params");
        return false;
    }
    if (!net.discrete) {
        const float* lpc = nullptr;
        if (!(at(tail[2], net.A, &net.std_dev) && at(tail[3], 1, &lpc))) {
            PyErr_SetString(PyExc_ValueError, "act_mlp: Gaussian std outside params");
            return false;
        }
        net.log_prob_const = *lpc;
    }
    net.mask_column = tail[4];
    if (net.mask_column != -1 && (!net.discrete || net.mask_column < 0 || net.mask_column + net.A > net.D)) {
        PyErr_SetString(PyExc_ValueError, "act_mlp: the action mask's columns lie outside the observation");
        return false;
    }
    net.choices.assign(tail + TAIL, tail + TAIL + K);
    int64_t options = 0;
    for (const int64_t c : net.choices) {
        if (c < 2) {
            PyErr_SetString(PyExc_ValueError, "act_mlp: a discrete choice needs at least 2 options");
            return false;
        }
        options += c;
    }
    if (K > 0 && (!net.discrete || options != net.A)) {
        PyErr_SetString(PyExc_ValueError, "act_mlp: the choices' options do not add up to the categorical's logits");
        return false;
    }
    return true;
}

}  // namespace fastrl_ext::acting
