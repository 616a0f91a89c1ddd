// fastrl_ext._policy_head: the policy distribution's log-probabilities and entropies, and their gradients,
// in one call each, for the learner's minibatch gradient without autograd (fastrl.algo.native_gradient).
//
//   forward(params, actions, log_std, lp, ent[, choices])
//   backward(params, actions, log_std, g_lp, g_ent, g_params, g_log_std[, choices])
//
// Categorical (log_std None): params are logits l [N, K], actions int32 or int64 [N], p = softmax(l):
//   lp_i = l_i[a_i] - logsumexp(l_i)                 ent_i = -sum_k p_ik log p_ik
//   d lp_i / d l_ik = [k == a_i] - p_ik              d ent_i / d l_ik = -p_ik (log p_ik + ent_i)
// Several choices (`choices`: int64 [C], each one's number of options, summing to K): actions [N, C], and
// each choice c is that categorical on its slice of the logits; lp_i and ent_i are the choices' sums (in
// float32, choice after choice), and each slice's gradient is its own choice's, with ent_i there its ent_ic.
// Gaussian (log_std [A]): params are means mu [N, A], actions float32 [N, A], z = (a - mu) / exp(log_std):
//   lp_i = sum_j (-z_ij^2 / 2 - log_std_j - log sqrt(2 pi))     ent_i = sum_j (log_std_j + 1/2 + log sqrt(2 pi))
//   d lp_i / d mu_ij = z_ij / exp(log_std_j)   d lp_i / d log_std_j = z_ij^2 - 1   d ent_i / d log_std_j = 1
// backward writes g_params [N, .] = g_lp * d lp / d params + g_ent * d ent / d params, and (Gaussian)
// g_log_std [A] = that summed over the rows (in float64), for the loss's gradients g_lp and g_ent [N].
// The math is fastrl.models.actor_critic's log_prob and entropy, which stay the reference (tests hold the
// two together through torch's autograd). Everything float32, C-contiguous (numpy views of CPU tensors).
#include "buffer_view.h"
#include "exp_poly.h"
#include "isa.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using View = fastrl_ext::BufferView;
constexpr double LOG_SQRT_2PI = 0.91893853320467274178;

struct Head {
    Py_ssize_t N = 0, width = 0;  // rows; logits or action dimensions
    const float* params = nullptr;
    const void* actions = nullptr;
    bool actions_int64 = false;   // categorical actions: int64, else int32
    const float* log_std = nullptr;  // null: categorical
    std::vector<Py_ssize_t> choices;  // several categorical choices' numbers of options; empty: one over `width`
};

// Reads the optional `choices` (None, or int64 [C] with 2 or more options each summing to the logits' width)
// into head.choices, before parse_head checks the actions against them; false with an error set.
bool parse_choices(Head& head, View& v, PyObject* choices, const char* caller) {
    if (choices == Py_None) return true;
    if (!v.get(choices, false, caller, "choices")) return false;
    const char kind = v.kind();
    if ((kind != 'l' && kind != 'q') || v.buf.itemsize != 8) {
        PyErr_Format(PyExc_TypeError, "%s: choices must be int64", caller);
        return false;
    }
    const long long* n = static_cast<const long long*>(v.buf.buf);
    for (Py_ssize_t c = 0; c < v.items(); ++c) {
        if (n[c] < 2) {
            PyErr_Format(PyExc_ValueError, "%s: a choice needs at least 2 options", caller);
            return false;
        }
        head.choices.push_back(static_cast<Py_ssize_t>(n[c]));
    }
    return true;
}

// Fills `head` from (params, actions, log_std), the views held in v[0..2]; false with an error set.
bool parse_head(Head& head, View* v, PyObject* params, PyObject* actions, PyObject* log_std, const char* caller) {
    if (!fastrl_ext::float32_view(v[0], params, false, caller, "params")) return false;
    if (v[0].buf.ndim != 2) {
        PyErr_Format(PyExc_ValueError, "%s: params must be [rows, width]", caller);
        return false;
    }
    head.N = v[0].dim(0);
    head.width = v[0].dim(1);
    head.params = static_cast<const float*>(v[0].buf.buf);
    if (!v[1].get(actions, false, caller, "actions")) return false;
    head.actions = v[1].buf.buf;
    if (log_std == Py_None) {
        const char kind = v[1].kind();
        if ((kind != 'i' && kind != 'l' && kind != 'q') || (v[1].buf.itemsize != 4 && v[1].buf.itemsize != 8)) {
            PyErr_Format(PyExc_TypeError, "%s: categorical actions must be int32 or int64", caller);
            return false;
        }
        head.actions_int64 = v[1].buf.itemsize == 8;
        Py_ssize_t options = 0;
        for (const Py_ssize_t n : head.choices) options += n;
        if (!head.choices.empty() && options != head.width) {
            PyErr_Format(PyExc_ValueError, "%s: the choices have %zd options for %zd logits", caller, options,
                         head.width);
            return false;
        }
        const Py_ssize_t per_row = head.choices.empty() ? 1 : static_cast<Py_ssize_t>(head.choices.size());
        if (v[1].items() != head.N * per_row) {
            PyErr_Format(PyExc_ValueError, "%s: %zd actions for %zd rows of %zd choices", caller, v[1].items(), head.N,
                         per_row);
            return false;
        }
        return true;
    }
    if (!head.choices.empty()) {
        PyErr_Format(PyExc_ValueError, "%s: a Gaussian head has no choices (pass None)", caller);
        return false;
    }
    if (v[1].kind() != 'f' || v[1].items() != head.N * head.width) {
        PyErr_Format(PyExc_ValueError, "%s: Gaussian actions must be float32 [%zd, %zd]", caller, head.N, head.width);
        return false;
    }
    if (!fastrl_ext::float32_view(v[2], log_std, false, caller, "log_std")) return false;
    if (v[2].items() != head.width) {
        PyErr_Format(PyExc_ValueError, "%s: log_std has %zd elements for %zd action dimensions", caller,
                     v[2].items(), head.width);
        return false;
    }
    head.log_std = static_cast<const float*>(v[2].buf.buf);
    return true;
}

// A float32 [rows] array written or read per row; false with an error set.
bool row_view(View& v, PyObject* obj, bool writable, Py_ssize_t N, const char* caller, const char* name) {
    if (!fastrl_ext::float32_view(v, obj, writable, caller, name)) return false;
    if (v.items() != N) {
        PyErr_Format(PyExc_ValueError, "%s: %s has %zd elements for %zd rows", caller, name, v.items(), N);
        return false;
    }
    return true;
}

// Action number i, checked against its choice's `options` (an out-of-range index is an error, not a read
// past the row); -1 when out of range.
Py_ssize_t action_at(const Head& h, Py_ssize_t i, Py_ssize_t options) {
    const long long a = h.actions_int64 ? static_cast<const long long*>(h.actions)[i]
                                        : static_cast<const int*>(h.actions)[i];
    return a >= 0 && a < options ? static_cast<Py_ssize_t>(a) : -1;
}

// p[k] = exp(l[k] - m), m the row's largest logit, through exp_poly.h so that the loop vectorises (std::exp
// is a call per logit) in each ISA variant (isa.h). A logit more than 86 below the largest (a masked one's
// -1e9) gets exactly 0: std::exp's 1e-37 or less would not change a sum of at least 1.
__attribute__((always_inline)) inline void shifted_exp(const float* l, float m, float* p, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
        const float y = l[k] - m;
        const float e = fastrl_ext::exp_in_range(std::max(y, -86.0f));
        p[k] = y < -86.0f ? 0.0f : e;
    }
}

using ExpFn = void (*)(const float*, float, float*, int64_t);
void exp_default(const float* l, float m, float* p, int64_t n) { shifted_exp(l, m, p, n); }
#if FASTRL_X86_VARIANTS
FASTRL_TARGET_AVX2 void exp_avx2(const float* l, float m, float* p, int64_t n) { shifted_exp(l, m, p, n); }
FASTRL_TARGET_AVX512 void exp_avx512(const float* l, float m, float* p, int64_t n) { shifted_exp(l, m, p, n); }
const ExpFn exp_variants[] = {exp_default, exp_avx2, exp_avx512};  // by fastrl_ext::isa_level()
#else
const ExpFn exp_variants[] = {exp_default, exp_default, exp_default};
#endif
ExpFn exp_fn = exp_default;

// Row i's log-softmax into logp[0..K) and softmax into p[0..K), returning its entropy. One exp per logit,
// kept for p (= exp(l - m) / s) instead of taken again from logp: the head's scalar exps were ~half the
// learner's minibatch at 100 logits (Minesweeper's cells), five per logit between forward and backward.
float log_softmax_row(const float* l, Py_ssize_t K, float* logp, float* p) {
    float m = l[0];
    for (Py_ssize_t k = 1; k < K; ++k) m = l[k] > m ? l[k] : m;
    // a row too short to fill a vector (CartPole's 2 logits) skips the call through the variant's pointer
    if (K < 8) shifted_exp(l, m, p, K);
    else exp_fn(l, m, p, K);
    float s = 0.0f;
    for (Py_ssize_t k = 0; k < K; ++k) s += p[k];
    // (l - m) - log s, not l - (m + log s): where every logit is masked (-1e9) m + log s rounds back to m,
    // which made each log-prob 0 and the entropy 0 instead of log K (torch's log_softmax subtracts as here)
    const float log_s = std::log(s);
    for (Py_ssize_t k = 0; k < K; ++k) {  // apart from the sum below, so that it vectorises
        logp[k] = (l[k] - m) - log_s;
        p[k] /= s;
    }
    float ent = 0.0f;
    for (Py_ssize_t k = 0; k < K; ++k) ent -= p[k] * logp[k];
    return ent;
}

// fn(i, offset, options, a, logp, p, ent) for each row i of a categorical head and each of its choices (the
// whole row for one categorical): the choice's first logit and number of options, its action a, its
// log-softmax logp [options], softmax p [options] and entropy; false at the first action out of range.
template <typename Fn>
bool each_categorical_choice(const Head& h, Fn fn) {
    std::vector<float> logp(static_cast<size_t>(h.width)), p(static_cast<size_t>(h.width));
    const Py_ssize_t C = h.choices.empty() ? 1 : static_cast<Py_ssize_t>(h.choices.size());
    for (Py_ssize_t i = 0; i < h.N; ++i) {
        Py_ssize_t offset = 0;
        for (Py_ssize_t c = 0; c < C; ++c) {
            const Py_ssize_t options = h.choices.empty() ? h.width : h.choices[c];
            const Py_ssize_t a = action_at(h, i * C + c, options);
            if (a < 0) return false;
            const float ent = log_softmax_row(h.params + i * h.width + offset, options, logp.data(), p.data());
            fn(i, offset, options, a, logp.data(), p.data(), ent);
            offset += options;
        }
    }
    return true;
}

bool forward(const Head& h, float* lp, float* ent) {
    const Py_ssize_t N = h.N, W = h.width;
    if (h.log_std == nullptr) {
        return each_categorical_choice(h, [&](Py_ssize_t i, Py_ssize_t offset, Py_ssize_t, Py_ssize_t a,
                                              const float* logp, const float*, float choice_ent) {
            // the first choice sets the row's sums, each further one adds to them
            ent[i] = offset == 0 ? choice_ent : ent[i] + choice_ent;
            lp[i] = offset == 0 ? logp[a] : lp[i] + logp[a];
        });
    }
    const float* actions = static_cast<const float*>(h.actions);
    float entropy = 0.0f;
    std::vector<float> inv_std(static_cast<size_t>(W));
    for (Py_ssize_t j = 0; j < W; ++j) {
        entropy += h.log_std[j] + 0.5f + float(LOG_SQRT_2PI);
        inv_std[j] = 1.0f / std::exp(h.log_std[j]);
    }
    for (Py_ssize_t i = 0; i < N; ++i) {
        const float* mu = h.params + i * W;
        const float* a = actions + i * W;
        float sum = 0.0f;
        for (Py_ssize_t j = 0; j < W; ++j) {
            const float z = (a[j] - mu[j]) * inv_std[j];
            sum += -0.5f * z * z - h.log_std[j] - float(LOG_SQRT_2PI);
        }
        lp[i] = sum;
        ent[i] = entropy;
    }
    return true;
}

bool backward(const Head& h, const float* g_lp, const float* g_ent, float* g_params, float* g_log_std) {
    const Py_ssize_t N = h.N, W = h.width;
    if (h.log_std == nullptr) {
        return each_categorical_choice(h, [&](Py_ssize_t i, Py_ssize_t offset, Py_ssize_t options, Py_ssize_t a,
                                              const float* logp, const float* p, float ent) {
            float* g = g_params + i * W + offset;
            for (Py_ssize_t k = 0; k < options; ++k) g[k] = -g_lp[i] * p[k] - g_ent[i] * p[k] * (logp[k] + ent);
            g[a] += g_lp[i];
        });
    }
    const float* actions = static_cast<const float*>(h.actions);
    std::vector<float> inv_std(static_cast<size_t>(W));
    std::vector<double> sums(static_cast<size_t>(W), 0.0);
    for (Py_ssize_t j = 0; j < W; ++j) inv_std[j] = 1.0f / std::exp(h.log_std[j]);
    double ent_sum = 0.0;
    for (Py_ssize_t i = 0; i < N; ++i) {
        const float* mu = h.params + i * W;
        const float* a = actions + i * W;
        float* g = g_params + i * W;
        for (Py_ssize_t j = 0; j < W; ++j) {
            const float z = (a[j] - mu[j]) * inv_std[j];
            g[j] = g_lp[i] * z * inv_std[j];
            sums[j] += double(g_lp[i]) * (double(z) * z - 1.0);
        }
        ent_sum += g_ent[i];
    }
    for (Py_ssize_t j = 0; j < W; ++j) g_log_std[j] = float(sums[j] + ent_sum);
    return true;
}

PyObject* out_of_range(const char* caller) {
    PyErr_Format(PyExc_IndexError, "%s: an action is outside the logits' range", caller);
    return nullptr;
}

PyObject* py_forward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    static const char* caller = "policy_head.forward";
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "forward(params, actions, log_std, lp, ent[, choices]) takes 5 or 6 arguments");
        return nullptr;
    }
    Head head;
    View v[6];
    if (!parse_choices(head, v[5], nargs == 6 ? args[5] : Py_None, caller) ||
        !parse_head(head, v, args[0], args[1], args[2], caller) ||
        !row_view(v[3], args[3], true, head.N, caller, "lp") || !row_view(v[4], args[4], true, head.N, caller, "ent"))
        return nullptr;
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = forward(head, static_cast<float*>(v[3].buf.buf), static_cast<float*>(v[4].buf.buf));
    Py_END_ALLOW_THREADS if (!ok) return out_of_range(caller);
    Py_RETURN_NONE;
}

PyObject* py_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    static const char* caller = "policy_head.backward";
    if (nargs != 7 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "backward(params, actions, log_std, g_lp, g_ent, g_params, g_log_std"
                                         "[, choices]) takes 7 or 8 arguments");
        return nullptr;
    }
    Head head;
    View v[8];
    if (!parse_choices(head, v[7], nargs == 8 ? args[7] : Py_None, caller) ||
        !parse_head(head, v, args[0], args[1], args[2], caller) ||
        !row_view(v[3], args[3], false, head.N, caller, "g_lp") ||
        !row_view(v[4], args[4], false, head.N, caller, "g_ent") ||
        !row_view(v[5], args[5], true, head.N * head.width, caller, "g_params"))
        return nullptr;
    float* g_log_std = nullptr;
    if (head.log_std != nullptr) {
        if (!row_view(v[6], args[6], true, head.width, caller, "g_log_std")) return nullptr;
        g_log_std = static_cast<float*>(v[6].buf.buf);
    } else if (args[6] != Py_None) {
        PyErr_Format(PyExc_ValueError, "%s: a categorical head has no g_log_std (pass None)", caller);
        return nullptr;
    }
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = backward(head, static_cast<const float*>(v[3].buf.buf),
                                         static_cast<const float*>(v[4].buf.buf), static_cast<float*>(v[5].buf.buf),
                                         g_log_std);
    Py_END_ALLOW_THREADS if (!ok) return out_of_range(caller);
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_forward)), METH_FASTCALL,
     "forward(params, actions, log_std, lp, ent[, choices]): each row's log-probability of its action into lp and "
     "its entropy into ent; categorical logits when log_std is None (several choices, each over its slice, when "
     "choices gives their numbers of options), else Gaussian means with that log-std."},
    {"backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_backward)), METH_FASTCALL,
     "backward(params, actions, log_std, g_lp, g_ent, g_params, g_log_std[, choices]): the gradient of "
     "sum(g_lp * lp + g_ent * ent) w.r.t. params into g_params, and (Gaussian) w.r.t. log_std into g_log_std."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_policy_head",
                      "The policy's log-probabilities and entropies with their gradients (fastrl_ext).", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__policy_head() {
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    const int level = fastrl_ext::isa_level();
    exp_fn = exp_variants[level];
    if (PyModule_AddStringConstant(m, "ISA", fastrl_ext::isa_name(level)) != 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
