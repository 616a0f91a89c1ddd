// fastrl_ext._appo_loss: the APPO loss and its gradient in one pass over the minibatch.
//
// The math is fastrl.algo.appo_loss's, which stays the reference (and the path for GPU tensors).
// w_i = 1 for valid samples, n = max(1, sum w):
//   A_i      = advantages, normalised over the valid samples when `normalize` ((A - mean) / (std + 1e-8))
//   r_i      = exp(lp_i - old_lp_i)
//   surr_i   = min(r_i A_i, clamp(r_i, 1 - clip, 1 + clip) A_i)
//   err_i    = (v_i - vt_i)^2, or max(err_i, (old_v_i + clamp(v_i - old_v_i, -vclip, vclip) - vt_i)^2)
//   loss     = -sum w surr / n + value_coef sum w err / n - entropy_coef sum w ent / n
// and the gradient of `loss` with respect to lp, ent and v, with torch's conventions at the kinks:
// clamp passes the gradient on its closed interval, min and max split it evenly on a tie.
// Why native: the torch version is ~45 small ops forward and ~30 backward on a minibatch of a few
// hundred samples. The MLP presets' learner is bound by how many ops it dispatches (~5-10 us each on
// the 2-core box), not by arithmetic; here the loss and its gradient are one call.
//
// Arrays come in through the buffer protocol (numpy views of CPU tensors, no copies), each C-contiguous
// with n_samples elements in any shape: lp, old_lp, ent, v, old_v, vt, adv in one float dtype (float32 or
// float64), valid bool. Written: grads [3, n_samples] (d loss / d lp, ent, v) in that dtype, and
// stats [6] float64: loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction. Sums run in
// float64 whatever the input dtype.
#include "buffer_view.h"

#include <cmath>

namespace {

using View = fastrl_ext::BufferView;

struct Coefs {
    double clip, value_coef, entropy_coef, value_clip;
    bool use_value_clip, normalize;
};

template <typename F>
void run(const F* lp, const F* old_lp, const F* ent, const F* v, const F* old_v, const F* vt, const F* adv,
         const bool* valid, F* grads, double* stats, Py_ssize_t N, const Coefs& c) {
    double count = 0.0;
    for (Py_ssize_t i = 0; i < N; ++i) count += valid[i] ? 1.0 : 0.0;
    const double n = count < 1.0 ? 1.0 : count;

    double adv_mean = 0.0, adv_scale = 1.0;
    if (c.normalize) {
        double sum = 0.0;
        for (Py_ssize_t i = 0; i < N; ++i)
            if (valid[i]) sum += adv[i];
        adv_mean = sum / n;
        double sq = 0.0;
        for (Py_ssize_t i = 0; i < N; ++i)
            if (valid[i]) sq += (adv[i] - adv_mean) * (adv[i] - adv_mean);
        adv_scale = 1.0 / (std::sqrt(sq / n) + 1e-8);
    }

    F* g_lp = grads;
    F* g_ent = grads + N;
    F* g_v = grads + 2 * N;
    double policy_sum = 0.0, value_sum = 0.0, ent_sum = 0.0, kl_sum = 0.0, clipped_sum = 0.0;
    const F lo = F(1.0 - c.clip), hi = F(1.0 + c.clip), clip = F(c.clip), one = F(1);
    const F vclip = F(c.use_value_clip ? c.value_clip : 0.0);
    for (Py_ssize_t i = 0; i < N; ++i) {
        if (!valid[i]) {
            // an invalid sample adds nothing and gets no gradient, even when its inputs are inf or nan
            g_lp[i] = g_ent[i] = g_v[i] = F(0);
            continue;
        }
        // per-sample values in the input dtype, as torch computes them, so that float32 ratios land on
        // the same side of the clip range's ends; sums in float64
        const F a = c.normalize ? F((adv[i] - adv_mean) * adv_scale) : adv[i];
        const F log_ratio = lp[i] - old_lp[i];
        const F r = std::exp(log_ratio);
        const F r_clipped = r < lo ? lo : (r > hi ? hi : r);
        const F s1 = r * a, s2 = r_clipped * a;
        policy_sum += s1 < s2 ? s1 : s2;
        // d surr / d lp = r a through s1 when it is the smaller one; through s2 only inside the clip
        // range, where s2 == s1, so a tie there gives r a in full (two halves), and a tie outside it
        // needs a == 0
        const bool in_range = r >= lo && r <= hi;
        double d_surr = 0.0;
        if (s1 < s2 || in_range) d_surr = double(r) * a;
        else if (s1 == s2) d_surr = 0.5 * double(r) * a;
        g_lp[i] = F(-d_surr / n);

        const F err = v[i] - vt[i];
        F e = err * err;
        double d_e = 2.0 * double(err);
        if (c.use_value_clip) {
            const F dv = v[i] - old_v[i];
            const F dv_clipped = dv < -vclip ? -vclip : (dv > vclip ? vclip : dv);
            const F err2 = old_v[i] + dv_clipped - vt[i];
            const F e2 = err2 * err2;
            const double d_e2 = (dv >= -vclip && dv <= vclip) ? 2.0 * double(err2) : 0.0;
            if (e2 > e) {
                e = e2;
                d_e = d_e2;
            } else if (e2 == e) {
                d_e = 0.5 * (d_e + d_e2);
            }
        }
        value_sum += e;
        g_v[i] = F(c.value_coef * d_e / n);

        ent_sum += ent[i];
        g_ent[i] = F(-c.entropy_coef / n);

        kl_sum += double((r - one) - log_ratio);
        clipped_sum += std::fabs(r - one) > clip ? 1.0 : 0.0;
    }
    const double policy_loss = -policy_sum / n, value_loss = value_sum / n, entropy = ent_sum / n;
    stats[0] = policy_loss + c.value_coef * value_loss - c.entropy_coef * entropy;
    stats[1] = policy_loss;
    stats[2] = value_loss;
    stats[3] = entropy;
    stats[4] = kl_sum / n;
    stats[5] = clipped_sum / n;
}

PyObject* py_appo_loss(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 15) {
        PyErr_SetString(PyExc_TypeError, "appo_loss(lp, old_lp, ent, v, old_v, vt, adv, valid, grads_out, stats_out, "
                                         "clip_ratio, value_coef, entropy_coef, value_clip, normalize)");
        return nullptr;
    }
    const char* names[10] = {"new_log_probs", "old_log_probs", "entropy", "new_values", "old_values",
                             "value_targets", "advantages", "valid", "grads_out", "stats_out"};
    View v[10];
    for (int k = 0; k < 10; ++k) {
        if (!v[k].get(args[k], k >= 8, "appo_loss", names[k])) return nullptr;
    }
    Coefs c{};
    double* coef_slots[3] = {&c.clip, &c.value_coef, &c.entropy_coef};
    for (int k = 0; k < 3; ++k) {
        *coef_slots[k] = PyFloat_AsDouble(args[10 + k]);
        if (PyErr_Occurred()) return nullptr;
    }
    c.use_value_clip = args[13] != Py_None;
    if (c.use_value_clip) {
        c.value_clip = PyFloat_AsDouble(args[13]);
        if (PyErr_Occurred()) return nullptr;
    }
    const int normalize = PyObject_IsTrue(args[14]);
    if (normalize < 0) return nullptr;
    c.normalize = normalize != 0;

    const Py_ssize_t N = v[0].items();
    for (int k = 1; k < 8; ++k) {
        if (v[k].items() != N) {
            PyErr_Format(PyExc_ValueError, "appo_loss: %s has %zd elements, new_log_probs %zd", names[k],
                         v[k].items(), N);
            return nullptr;
        }
    }
    if (v[8].items() != 3 * N) {
        PyErr_Format(PyExc_ValueError, "appo_loss: grads_out must hold 3 x %zd elements", N);
        return nullptr;
    }
    if (!fastrl_ext::all_bool(v, {7}, "appo_loss", names)) return nullptr;
    if (v[9].kind() != 'd' || v[9].items() != 6) {
        PyErr_SetString(PyExc_TypeError, "appo_loss: stats_out must be 6 float64");
        return nullptr;
    }
    const char kind = fastrl_ext::shared_float_kind(v, {0, 1, 2, 3, 4, 5, 6, 8}, "appo_loss");
    if (!kind) return nullptr;
    auto ptr = [&](int k) { return v[k].buf.buf; };
    const bool* valid = static_cast<const bool*>(ptr(7));
    double* stats = static_cast<double*>(ptr(9));
    if (kind == 'f') {
        auto f = [&](int k) { return static_cast<const float*>(ptr(k)); };
        run<float>(f(0), f(1), f(2), f(3), f(4), f(5), f(6), valid, static_cast<float*>(ptr(8)), stats, N, c);
    } else {
        auto d = [&](int k) { return static_cast<const double*>(ptr(k)); };
        run<double>(d(0), d(1), d(2), d(3), d(4), d(5), d(6), valid, static_cast<double*>(ptr(8)), stats, N, c);
    }
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"appo_loss", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_appo_loss)), METH_FASTCALL,
     "appo_loss(lp, old_lp, ent, v, old_v, vt, adv, valid, grads_out, stats_out, clip_ratio, value_coef, "
     "entropy_coef, value_clip, normalize): write the gradient of the APPO loss with respect to lp, ent and v "
     "into grads_out [3, n] and (loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction) into stats_out."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_appo_loss", "The APPO loss and its gradient in C++ (see fastrl.algo.appo_loss).",
                      -1, methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__appo_loss(void) { return PyModule_Create(&module); }
