// fastrl_ext._vtrace: V-trace targets (IMPALA, Espeholt et al. 2018, §4.1) in one pass of plain loops.
//
// The math is fastrl.algo.vtrace's, which stays the reference (and the path for GPU tensors):
//   rho_t = min(rho_bar, exp(log_ratio_t)),  c_t = lam * min(c_bar, exp(log_ratio_t))
//   delta_t = rho_t (r_t + gamma (1 - term_t) V(x_{t+1}) - V(x_t))
//   vs_t - V(x_t) = delta_t + gamma (1 - done_t) c_t (vs_{t+1} - V(x_{t+1}))     (done = term or trunc)
//   adv_t = rho_t (r_t + gamma (1 - term_t) next_t - V(x_t)),  next_t = vs_{t+1} inside an episode,
//           V(x_{t+1}) across an end, V(x_T) after the last step.
// Why native: in torch the backward recursion is a Python loop of two small ops per time step. With
// the MLP presets' minibatches of a few trajectories (64 steps x 4 on HalfCheetah) that loop is
// ~1 ms a call, 40 calls a batch, about a fifth of the learner's time; here a call is tens of microseconds
// (mostly the Python wrapper around it).
//
// Arrays come in through the buffer protocol (numpy views of CPU tensors, no copies): log_ratios,
// rewards [T, B]; values [T + 1, B]; terminated, truncated [T, B] bool; vs and pg_advantages [T, B]
// are written. All float arrays share one dtype, float32 or float64, and the math runs in it, in
// the same order of operations as the torch version.
#include "buffer_view.h"

#include <cmath>
#include <vector>

namespace {

using View = fastrl_ext::BufferView;

template <typename F>
void run(const F* log_ratios, const F* rewards, const F* values, const bool* terminated, const bool* truncated,
         F* vs, F* adv, Py_ssize_t T, Py_ssize_t B, F gamma, F rho_bar, F c_bar, F lam) {
    // rho_t is kept in `adv` between the two passes: the second reads adv[i] before writing it
    std::vector<F> acc(static_cast<size_t>(B), F(0));
    for (Py_ssize_t t = T - 1; t >= 0; --t) {
        for (Py_ssize_t b = 0; b < B; ++b) {
            const Py_ssize_t i = t * B + b;
            const F ratio = std::exp(log_ratios[i]);
            // written so that a NaN ratio stays NaN, as torch.clamp keeps it
            const F r = ratio > rho_bar ? rho_bar : ratio;
            const F c = lam * (ratio > c_bar ? c_bar : ratio);
            const F not_term = terminated[i] ? F(0) : F(1);
            const F not_done = not_term * (truncated[i] ? F(0) : F(1));
            const F v_t = values[i], v_next = values[i + B];
            const F delta = r * (rewards[i] + gamma * not_term * v_next - v_t);
            acc[b] = delta + gamma * not_done * c * acc[b];
            vs[i] = v_t + acc[b];
            adv[i] = r;
        }
    }
    for (Py_ssize_t t = 0; t < T; ++t) {
        for (Py_ssize_t b = 0; b < B; ++b) {
            const Py_ssize_t i = t * B + b;
            const bool done = terminated[i] || truncated[i];
            const F v_next = values[i + B];
            const F next = done ? v_next : (t + 1 < T ? vs[i + B] : v_next);
            const F not_term = terminated[i] ? F(0) : F(1);
            adv[i] = adv[i] * (rewards[i] + gamma * not_term * next - values[i]);
        }
    }
}

PyObject* py_vtrace(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "vtrace(log_ratios, rewards, values, terminated, truncated, vs_out, "
                                         "adv_out, gamma, rho_bar, c_bar, lam)");
        return nullptr;
    }
    const char* names[7] = {"log_ratios", "rewards", "values", "terminated", "truncated", "vs_out", "adv_out"};
    View v[7];
    for (int k = 0; k < 7; ++k) {
        if (!v[k].get(args[k], k >= 5, "vtrace", names[k])) return nullptr;
    }
    double scalars[4];
    for (int k = 0; k < 4; ++k) {
        scalars[k] = PyFloat_AsDouble(args[7 + k]);
        if (PyErr_Occurred()) return nullptr;
    }
    const Py_ssize_t T = v[1].dim(0), B = v[1].dim(1);
    if (v[1].buf.ndim != 2 || T < 1 || B < 1) {
        PyErr_SetString(PyExc_ValueError, "vtrace: rewards must be [T, B] with T, B >= 1");
        return nullptr;
    }
    for (int k = 0; k < 7; ++k) {
        const Py_ssize_t rows = k == 2 ? T + 1 : T;
        if (v[k].buf.ndim != 2 || v[k].dim(0) != rows || v[k].dim(1) != B) {
            PyErr_Format(PyExc_ValueError, "vtrace: %s must be [%zd, %zd]", names[k], rows, B);
            return nullptr;
        }
    }
    if (!fastrl_ext::all_bool(v, {3, 4}, "vtrace", names)) return nullptr;
    const char kind = fastrl_ext::shared_float_kind(v, {0, 1, 2, 5, 6}, "vtrace");
    if (!kind) return nullptr;
    auto ptr = [&](int k) { return v[k].buf.buf; };
    auto flag = [&](int k) { return static_cast<const bool*>(ptr(k)); };
    if (kind == 'f') {
        run<float>(static_cast<const float*>(ptr(0)), static_cast<const float*>(ptr(1)),
                   static_cast<const float*>(ptr(2)), flag(3), flag(4), static_cast<float*>(ptr(5)),
                   static_cast<float*>(ptr(6)), T, B, static_cast<float>(scalars[0]), static_cast<float>(scalars[1]),
                   static_cast<float>(scalars[2]), static_cast<float>(scalars[3]));
    } else {
        run<double>(static_cast<const double*>(ptr(0)), static_cast<const double*>(ptr(1)),
                    static_cast<const double*>(ptr(2)), flag(3), flag(4), static_cast<double*>(ptr(5)),
                    static_cast<double*>(ptr(6)), T, B, scalars[0], scalars[1], scalars[2], scalars[3]);
    }
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"vtrace", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_vtrace)), METH_FASTCALL,
     "vtrace(log_ratios, rewards, values, terminated, truncated, vs_out, adv_out, gamma, rho_bar, c_bar, lam): "
     "write V-trace's value targets and policy-gradient advantages into vs_out and adv_out."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_vtrace", "V-trace targets in C++ (see fastrl.algo.vtrace).", -1,
                      methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__vtrace(void) { return PyModule_Create(&module); }
