// fastrl_ext._optim: the learner's optimizer step for a bf16 working copy (fastrl.algo.bf16_copy), as
// two passes over memory instead of torch's six.
//
// Why native: the learner's shards each hand back bf16 gradients; torch summed them with a cast-copy
// and an add, the clip read the sum twice (norm, scale), Adam read and wrote it with the parameters and
// moments, and the next minibatch cast the parameters to bf16 again: ~3 CPU-ms per optimizer step of
// Pong's CNN (1.7M parameters) with the caches cold, nearly all of it memory traffic.
//   sum_pieces(dst, pieces) -> float:
//     dst:    float32, C-contiguous (a flat view of the .grad's memory)
//     pieces: a sequence of bf16 buffers passed as their int16 bits, each with dst's element count
//     dst = float(pieces[0]) + float(pieces[1]) + ... in that order, in float32: the bits torch's
//     `copy_` then `add_` leave. Returns sum(dst**2), accumulated in float64 (the clip's norm comes
//     from the sum over all parameters; its order differs from torch's, so the norm may differ from
//     torch.linalg.vector_norm's in the last bits). A NaN or inf anywhere makes the sum non-finite.
//     dst None: the same sum of squares, with the sum left unwritten (adam_step then reads the pieces).
//   sum_squares(a) -> float: sum(a**2) of a float32 buffer, accumulated in float64 as sum_pieces does
//     (the native gradient chain's flat gradient, fastrl.algo.native_gradient: its clip norm without
//     numpy's float64 copy of the gradient, ~20 µs a step on the MLP presets).
//   adam_step(param, grad, exp_avg, exp_avg_sq, copy, lr, beta1, beta2, eps, step, grad_mul):
//     float32 buffers of one count (copy: bf16 as int16 bits, or None); `step` counts this update.
//     grad may also be a list or tuple of bf16 pieces (int16 bits) as sum_pieces takes them: g is then
//     their float32 sum, summed in the same order, so the update is the one after sum_pieces to the
//     bit, without the float32 gradient written by one pass and read by the next (bench/optim_microbench.py).
//     Adam (Kingma & Ba) on g = grad * grad_mul (the clip's scale; grad itself is left alone):
//       m = m + (1 - b1) (g - m); v = b2 v + (1 - b2) g^2
//       param -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
//     per element in float32, the scalars computed once in float64; it agrees with torch's fused
//     kernel to rounding (tests/test_optim.py). The new param is rounded to bf16 (to nearest even)
//     into `copy`, which spares the working copy its refresh pass.
#include "bf16.h"
#include "buffer_view.h"
#include "isa.h"

#include <cmath>
#include <cstdint>

namespace {

using View = fastrl_ext::BufferView;

constexpr int kMaxPieces = 8;
constexpr int kLanes = 16;  // independent float64 accumulators, so the loop vectorises without reassociating

__attribute__((always_inline)) inline float widen(uint16_t bits) {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// the float32 sum of the pieces at element i, in order: one or two pieces (kCount 1 or 2: one or two
// learner shards) with no trip count to test, or any count from 3 (kCount 0)
// (a, b: the first two pieces, loaded once by the caller)
template <int kCount>
__attribute__((always_inline)) inline float piece_sum(const uint16_t* __restrict__ a, const uint16_t* __restrict__ b,
                                                     const uint16_t* const* pieces, int count, int64_t i) {
    float s = widen(a[i]);
    if constexpr (kCount != 1) s += widen(b[i]);
    if constexpr (kCount == 0) {
        for (int k = 2; k < count; ++k) s += widen(pieces[k][i]);
    }
    return s;
}

// the pieces' sums into dst (unless kWrite is off) and the float64 sum of their squares: 16 independent
// float64 accumulators let the loop vectorise without reassociating a sum
template <int kCount, bool kWrite>
__attribute__((always_inline)) inline double sum_fixed(float* __restrict__ dst, const uint16_t* const* pieces,
                                                      int count, int64_t n) {
    const uint16_t* const a = pieces[0];
    const uint16_t* const b = pieces[kCount == 1 ? 0 : 1];
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) {
            const float s = piece_sum<kCount>(a, b, pieces, count, i + j);
            if constexpr (kWrite) dst[i + j] = s;
            acc[j] += static_cast<double>(s) * s;
        }
    }
    for (; i < n; ++i) {
        const float s = piece_sum<kCount>(a, b, pieces, count, i);
        if constexpr (kWrite) dst[i] = s;
        acc[0] += static_cast<double>(s) * s;
    }
    double total = 0.0;
    for (double x : acc) total += x;
    return total;
}

// sum(a**2) in float64, 16 independent accumulators (vectorised without reassociating a sum)
__attribute__((always_inline)) inline double squares(const float* __restrict__ a, int64_t n) {
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) acc[j] += static_cast<double>(a[i + j]) * a[i + j];
    }
    for (; i < n; ++i) acc[0] += static_cast<double>(a[i]) * a[i];
    double total = 0.0;
    for (double x : acc) total += x;
    return total;
}

// more pieces (more shards than this 2-core box runs), written: the first two, then one pass per further
// piece in order (the same float32 sums), then the squares
__attribute__((always_inline)) inline double sum_any(float* __restrict__ dst, const uint16_t* const* pieces, int count,
                                                    int64_t n) {
    double total = sum_fixed<2, true>(dst, pieces, 2, n);
    if (count == 2) return total;
    for (int k = 2; k < count; ++k) {
        const uint16_t* __restrict__ piece = pieces[k];
        for (int64_t i = 0; i < n; ++i) dst[i] += widen(piece[i]);
    }
    return squares(dst, n);
}

// dst nullptr: the squares alone
__attribute__((always_inline)) inline double sum_pieces_into(float* dst, const uint16_t* const* pieces, int count,
                                                            int64_t n) {
    if (dst == nullptr) {
        if (count == 1) return sum_fixed<1, false>(dst, pieces, count, n);
        if (count == 2) return sum_fixed<2, false>(dst, pieces, count, n);
        return sum_fixed<0, false>(dst, pieces, count, n);
    }
    return count == 1 ? sum_fixed<1, true>(dst, pieces, count, n) : sum_any(dst, pieces, count, n);
}

using SumFn = double (*)(float*, const uint16_t* const*, int, int64_t);

double sum_default(float* dst, const uint16_t* const* pieces, int count, int64_t n) {
    return sum_pieces_into(dst, pieces, count, n);
}
#if FASTRL_X86_VARIANTS
FASTRL_TARGET_AVX2 double sum_avx2(float* dst, const uint16_t* const* pieces, int count, int64_t n) {
    return sum_pieces_into(dst, pieces, count, n);
}
FASTRL_TARGET_AVX512 double sum_avx512(float* dst, const uint16_t* const* pieces, int count, int64_t n) {
    return sum_pieces_into(dst, pieces, count, n);
}
const SumFn sum_variants[] = {sum_default, sum_avx2, sum_avx512};
#else
const SumFn sum_variants[] = {sum_default, sum_default, sum_default};
#endif

SumFn sum_fn = sum_default;

using SquaresFn = double (*)(const float*, int64_t);

double squares_default(const float* a, int64_t n) { return squares(a, n); }
#if FASTRL_X86_VARIANTS
FASTRL_TARGET_AVX2 double squares_avx2(const float* a, int64_t n) { return squares(a, n); }
FASTRL_TARGET_AVX512 double squares_avx512(const float* a, int64_t n) { return squares(a, n); }
const SquaresFn squares_variants[] = {squares_default, squares_avx2, squares_avx512};
#else
const SquaresFn squares_variants[] = {squares_default, squares_default, squares_default};
#endif

SquaresFn squares_fn = squares_default;

// 1 to kMaxPieces bf16 buffers (int16 bits) of `items` elements each, held for one call
struct Pieces {
    View views[kMaxPieces];
    const uint16_t* bits[kMaxPieces];
    int count = 0;
    // false with an exception set; `what` names the argument in it ("pieces", "grad")
    bool get(PyObject* obj, Py_ssize_t items, const char* caller, const char* what) {
        PyObject* seq = PySequence_Fast(obj, "pieces must be a sequence");
        if (seq == nullptr) return false;
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n < 1 || n > kMaxPieces) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "%s: 1 to %d %s, got %zd", caller, kMaxPieces, what, n);
            return false;
        }
        for (Py_ssize_t k = 0; k < n; ++k) {
            View& v = views[k];
            if (!v.get(PySequence_Fast_GET_ITEM(seq, k), false, caller, "each piece")) {
                Py_DECREF(seq);
                return false;
            }
            if (v.kind() != 'h' || v.buf.itemsize != 2 || (items >= 0 && v.items() != items) ||
                v.items() != views[0].items()) {
                Py_DECREF(seq);
                PyErr_Format(PyExc_TypeError, "%s: each of %s must be bf16 as int16, with %s element count", caller,
                             what, items >= 0 ? "the other buffers'" : "one");
                return false;
            }
            bits[k] = static_cast<const uint16_t*>(v.buf.buf);
        }
        count = static_cast<int>(n);
        Py_DECREF(seq);  // the views hold their buffers
        return true;
    }
    int64_t items() const { return views[0].items(); }
};

PyObject* py_sum_pieces(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "sum_pieces(dst, pieces) takes 2 arguments");
        return nullptr;
    }
    View dst;
    const bool write = args[0] != Py_None;
    if (write && !fastrl_ext::float32_view(dst, args[0], true, "sum_pieces", "dst")) return nullptr;
    Pieces pieces;
    if (!pieces.get(args[1], write ? dst.items() : -1, "sum_pieces", "pieces")) return nullptr;
    double total;
    float* out = write ? static_cast<float*>(dst.buf.buf) : nullptr;
    const int64_t n = pieces.items();
    Py_BEGIN_ALLOW_THREADS
    total = sum_fn(out, pieces.bits, pieces.count, n);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(total);
}

PyObject* py_sum_squares(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "sum_squares(a) takes 1 argument");
        return nullptr;
    }
    View a;
    if (!fastrl_ext::float32_view(a, args[0], false, "sum_squares", "a")) return nullptr;
    double total;
    const float* data = static_cast<const float*>(a.buf.buf);
    const int64_t n = a.items();
    Py_BEGIN_ALLOW_THREADS
    total = squares_fn(data, n);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(total);
}

struct AdamScalars {
    float one_minus_beta1, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps, grad_mul;
};

// one element's update; `grad` is the gradient before the clip's scale
template <bool kCopy>
__attribute__((always_inline)) inline void adam_element(float grad_unscaled, int64_t i, float* __restrict__ p,
                                                       float* __restrict__ m, float* __restrict__ v,
                                                       uint16_t* __restrict__ copy, const AdamScalars& s) {
    const float grad = grad_unscaled * s.grad_mul;
    const float mi = m[i] + s.one_minus_beta1 * (grad - m[i]);
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / s.bias_correction2_sqrt + s.eps;
    const float pi = p[i] - s.step_size * mi / denom;
    p[i] = pi;
    if constexpr (kCopy) copy[i] = fastrl_ext::bf16_bits(pi);
}

template <bool kCopy>
__attribute__((always_inline)) inline void adam_loop(float* __restrict__ p, const float* __restrict__ g,
                                                    float* __restrict__ m, float* __restrict__ v,
                                                    uint16_t* __restrict__ copy, int64_t n, const AdamScalars& s_in) {
    const AdamScalars s = s_in;  // a local copy: the stores below cannot be taken to change it
    for (int64_t i = 0; i < n; ++i) adam_element<kCopy>(g[i], i, p, m, v, copy, s);
}

// the gradient summed from bf16 pieces as it is read (kCount as piece_sum's)
template <int kCount, bool kCopy>
__attribute__((always_inline)) inline void adam_pieces_loop(float* __restrict__ p, const uint16_t* const* pieces,
                                                           int count, float* __restrict__ m, float* __restrict__ v,
                                                           uint16_t* __restrict__ copy, int64_t n,
                                                           const AdamScalars& s_in) {
    const AdamScalars s = s_in;
    const uint16_t* const a = pieces[0];
    const uint16_t* const b = pieces[kCount == 1 ? 0 : 1];
    for (int64_t i = 0; i < n; ++i) adam_element<kCopy>(piece_sum<kCount>(a, b, pieces, count, i), i, p, m, v, copy, s);
}

__attribute__((always_inline)) inline void adam_pieces(float* p, const uint16_t* const* pieces, int count, float* m,
                                                      float* v, uint16_t* c, int64_t n, const AdamScalars& s) {
    if (count == 1) {
        c ? adam_pieces_loop<1, true>(p, pieces, count, m, v, c, n, s)
          : adam_pieces_loop<1, false>(p, pieces, count, m, v, c, n, s);
    } else if (count == 2) {
        c ? adam_pieces_loop<2, true>(p, pieces, count, m, v, c, n, s)
          : adam_pieces_loop<2, false>(p, pieces, count, m, v, c, n, s);
    } else {
        c ? adam_pieces_loop<0, true>(p, pieces, count, m, v, c, n, s)
          : adam_pieces_loop<0, false>(p, pieces, count, m, v, c, n, s);
    }
}

using AdamFn = void (*)(float*, const float*, float*, float*, uint16_t*, int64_t, const AdamScalars&);
using AdamPiecesFn = void (*)(float*, const uint16_t* const*, int, float*, float*, uint16_t*, int64_t,
                              const AdamScalars&);

void adam_default(float* p, const float* g, float* m, float* v, uint16_t* c, int64_t n, const AdamScalars& s) {
    c ? adam_loop<true>(p, g, m, v, c, n, s) : adam_loop<false>(p, g, m, v, c, n, s);
}
void adam_pieces_default(float* p, const uint16_t* const* g, int count, float* m, float* v, uint16_t* c, int64_t n,
                         const AdamScalars& s) {
    adam_pieces(p, g, count, m, v, c, n, s);
}
#if FASTRL_X86_VARIANTS
FASTRL_TARGET_AVX2 void adam_avx2(float* p, const float* g, float* m, float* v, uint16_t* c, int64_t n,
                                  const AdamScalars& s) {
    c ? adam_loop<true>(p, g, m, v, c, n, s) : adam_loop<false>(p, g, m, v, c, n, s);
}
FASTRL_TARGET_AVX512 void adam_avx512(float* p, const float* g, float* m, float* v, uint16_t* c, int64_t n,
                                      const AdamScalars& s) {
    c ? adam_loop<true>(p, g, m, v, c, n, s) : adam_loop<false>(p, g, m, v, c, n, s);
}
FASTRL_TARGET_AVX2 void adam_pieces_avx2(float* p, const uint16_t* const* g, int count, float* m, float* v,
                                         uint16_t* c, int64_t n, const AdamScalars& s) {
    adam_pieces(p, g, count, m, v, c, n, s);
}
FASTRL_TARGET_AVX512 void adam_pieces_avx512(float* p, const uint16_t* const* g, int count, float* m, float* v,
                                             uint16_t* c, int64_t n, const AdamScalars& s) {
    adam_pieces(p, g, count, m, v, c, n, s);
}
const AdamFn adam_variants[] = {adam_default, adam_avx2, adam_avx512};
const AdamPiecesFn adam_pieces_variants[] = {adam_pieces_default, adam_pieces_avx2, adam_pieces_avx512};
#else
const AdamFn adam_variants[] = {adam_default, adam_default, adam_default};
const AdamPiecesFn adam_pieces_variants[] = {adam_pieces_default, adam_pieces_default, adam_pieces_default};
#endif

AdamFn adam_fn = adam_default;
AdamPiecesFn adam_pieces_fn = adam_pieces_default;

bool float_arg(PyObject* obj, const char* name, double* out) {
    *out = PyFloat_AsDouble(obj);
    if (*out == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "adam_step: %s must be a number", name);
        return false;
    }
    return true;
}

PyObject* py_adam_step(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "adam_step(param, grad, exp_avg, exp_avg_sq, copy, lr, beta1, beta2, eps, "
                                         "step, grad_mul) takes 11 arguments");
        return nullptr;
    }
    static const char* const names[] = {"param", "grad", "exp_avg", "exp_avg_sq"};
    View views[4];
    // a list or tuple of bf16 pieces in grad's place: summed as they are read
    const bool from_pieces = PyList_Check(args[1]) || PyTuple_Check(args[1]);
    for (int k = 0; k < 4; ++k) {
        if (k == 1 && from_pieces) continue;
        if (!views[k].get(args[k], k != 1, "adam_step", names[k])) return nullptr;
        if (views[k].kind() != 'f' || views[k].buf.itemsize != 4 || views[k].items() != views[0].items()) {
            PyErr_Format(PyExc_TypeError, "adam_step: %s must be float32 with param's element count", names[k]);
            return nullptr;
        }
    }
    View copy;
    uint16_t* copy_bits = nullptr;
    if (args[4] != Py_None) {
        if (!copy.get(args[4], true, "adam_step", "copy")) return nullptr;
        if (copy.kind() != 'h' || copy.buf.itemsize != 2 || copy.items() != views[0].items()) {
            PyErr_SetString(PyExc_TypeError, "adam_step: copy must be bf16 as int16, with param's element count");
            return nullptr;
        }
        copy_bits = static_cast<uint16_t*>(copy.buf.buf);
    }
    Pieces pieces;
    if (from_pieces && !pieces.get(args[1], views[0].items(), "adam_step", "grad's pieces")) return nullptr;
    double lr, beta1, beta2, eps, step, grad_mul;
    if (!float_arg(args[5], "lr", &lr) || !float_arg(args[6], "beta1", &beta1) || !float_arg(args[7], "beta2", &beta2) ||
        !float_arg(args[8], "eps", &eps) || !float_arg(args[9], "step", &step) ||
        !float_arg(args[10], "grad_mul", &grad_mul)) {
        return nullptr;
    }
    if (step < 1.0) {
        PyErr_SetString(PyExc_ValueError, "adam_step: step counts this update, so it is at least 1");
        return nullptr;
    }
    const double bias_correction1 = 1.0 - std::pow(beta1, step);
    const double bias_correction2 = 1.0 - std::pow(beta2, step);
    const AdamScalars s{static_cast<float>(1.0 - beta1),
                        static_cast<float>(beta2),
                        static_cast<float>(1.0 - beta2),
                        static_cast<float>(lr / bias_correction1),
                        static_cast<float>(std::sqrt(bias_correction2)),
                        static_cast<float>(eps),
                        static_cast<float>(grad_mul)};
    auto* p = static_cast<float*>(views[0].buf.buf);
    auto* m = static_cast<float*>(views[2].buf.buf);
    auto* v = static_cast<float*>(views[3].buf.buf);
    const int64_t n = views[0].items();
    if (from_pieces) {
        Py_BEGIN_ALLOW_THREADS
        adam_pieces_fn(p, pieces.bits, pieces.count, m, v, copy_bits, n, s);
        Py_END_ALLOW_THREADS
    } else {
        const auto* g = static_cast<const float*>(views[1].buf.buf);
        Py_BEGIN_ALLOW_THREADS
        adam_fn(p, g, m, v, copy_bits, n, s);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"adam_step", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_adam_step)), METH_FASTCALL,
     "adam_step(param, grad, exp_avg, exp_avg_sq, copy, lr, beta1, beta2, eps, step, grad_mul): one Adam update of "
     "float32 buffers in place on grad * grad_mul, the new param rounded to bf16 into copy (int16 bits) unless None; "
     "grad may be a list or tuple of bf16 pieces (int16 bits), summed as sum_pieces sums them."},
    {"sum_pieces", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_sum_pieces)), METH_FASTCALL,
     "sum_pieces(dst, pieces) -> float: dst (float32) := the float32 sum of the bf16 pieces (int16 bits), "
     "in order; returns the float64 sum of dst's squares. dst None: the sum of squares alone."},
    {"sum_squares", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_sum_squares)), METH_FASTCALL,
     "sum_squares(a) -> float: the float64 sum of a float32 buffer's squares (a flat gradient's, for the clip)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_optim",
                      "bf16 gradient pieces into a float32 .grad, with its sum of squares, in one pass (fastrl_ext).",
                      -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__optim() {
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    const int level = fastrl_ext::isa_level();
    sum_fn = sum_variants[level];
    squares_fn = squares_variants[level];
    adam_fn = adam_variants[level];
    adam_pieces_fn = adam_pieces_variants[level];
    if (PyModule_AddStringConstant(m, "ISA", fastrl_ext::isa_name(level)) != 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
