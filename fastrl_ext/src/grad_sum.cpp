// fastrl_ext._grad_sum: the learner's bf16 gradient pieces summed into a parameter's float32 .grad, and
// the sum of squares of that .grad, in one pass.
//
// Why native: with a bf16 working copy (fastrl.algo.bf16_copy) each of the learner's shards hands back
// bf16 gradients; torch then sums them with a cast-copy and an add (two passes over the fp32 .grad),
// and the clip reads the .grad again for its norm: ~1.9 CPU-ms per optimizer step of Pong's CNN (1.7M
// parameters) with the caches cold, nearly all of it memory traffic. Here the pieces are read once and
// the .grad written once.
//   sum_pieces(dst, pieces) -> float:
//     dst:    float32, C-contiguous (a flat view of the .grad's memory)
//     pieces: a sequence of bf16 buffers passed as their int16 bits, each with dst's element count
//     dst = float(pieces[0]) + float(pieces[1]) + ... in that order, in float32: the bits torch's
//     `copy_` then `add_` leave. Returns sum(dst**2), accumulated in float64 (the clip's norm comes
//     from the sum over all parameters; its order differs from torch's, so the norm may differ from
//     torch.linalg.vector_norm's in the last bits). A NaN or inf anywhere makes the sum non-finite.
#include "buffer_view.h"
#include "isa.h"

#include <cstdint>
#include <vector>

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

__attribute__((always_inline)) inline double sum_into(float* dst, const uint16_t* const* pieces, int count,
                                                     int64_t n) {
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int j = 0; j < kLanes; ++j) {
            float s = widen(pieces[0][i + j]);
            for (int k = 1; k < count; ++k) s += widen(pieces[k][i + j]);
            dst[i + j] = s;
            acc[j] += static_cast<double>(s) * s;
        }
    }
    for (; i < n; ++i) {
        float s = widen(pieces[0][i]);
        for (int k = 1; k < count; ++k) s += widen(pieces[k][i]);
        dst[i] = s;
        acc[0] += static_cast<double>(s) * s;
    }
    double total = 0.0;
    for (double a : acc) total += a;
    return total;
}

// two pieces (two learner shards) get their own instance: a fixed inner loop the compiler unrolls
template <int kCount>
__attribute__((always_inline)) inline double sum_fixed(float* dst, const uint16_t* const* pieces, int64_t n) {
    return sum_into(dst, pieces, kCount, n);
}

using SumFn = double (*)(float*, const uint16_t* const*, int, int64_t);

double sum_default(float* dst, const uint16_t* const* pieces, int count, int64_t n) {
    return count == 2 ? sum_fixed<2>(dst, pieces, n) : sum_into(dst, pieces, count, n);
}
#if FASTRL_X86_VARIANTS
FASTRL_TARGET_AVX2 double sum_avx2(float* dst, const uint16_t* const* pieces, int count, int64_t n) {
    return count == 2 ? sum_fixed<2>(dst, pieces, n) : sum_into(dst, pieces, count, n);
}
FASTRL_TARGET_AVX512 double sum_avx512(float* dst, const uint16_t* const* pieces, int count, int64_t n) {
    return count == 2 ? sum_fixed<2>(dst, pieces, n) : sum_into(dst, pieces, count, n);
}
const SumFn sum_variants[] = {sum_default, sum_avx2, sum_avx512};
#else
const SumFn sum_variants[] = {sum_default, sum_default, sum_default};
#endif

SumFn sum_fn = sum_default;

PyObject* py_sum_pieces(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "sum_pieces(dst, pieces) takes 2 arguments");
        return nullptr;
    }
    View dst;
    if (!dst.get(args[0], true, "sum_pieces", "dst")) return nullptr;
    if (dst.kind() != 'f' || dst.buf.itemsize != 4) {
        PyErr_SetString(PyExc_TypeError, "sum_pieces: dst must be float32");
        return nullptr;
    }
    PyObject* seq = PySequence_Fast(args[1], "sum_pieces: pieces must be a sequence");
    if (seq == nullptr) return nullptr;
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count < 1 || count > kMaxPieces) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "sum_pieces: 1 to %d pieces, got %zd", kMaxPieces, count);
        return nullptr;
    }
    View views[kMaxPieces];
    const uint16_t* pieces[kMaxPieces];
    for (Py_ssize_t k = 0; k < count; ++k) {
        View& v = views[k];
        if (!v.get(PySequence_Fast_GET_ITEM(seq, k), false, "sum_pieces", "each piece")) {
            Py_DECREF(seq);
            return nullptr;
        }
        if (v.kind() != 'h' || v.buf.itemsize != 2 || v.items() != dst.items()) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "sum_pieces: each piece must be bf16 as int16, with dst's element count");
            return nullptr;
        }
        pieces[k] = static_cast<const uint16_t*>(v.buf.buf);
    }
    Py_DECREF(seq);  // the views hold their buffers
    double total;
    float* out = static_cast<float*>(dst.buf.buf);
    const int64_t n = dst.items();
    Py_BEGIN_ALLOW_THREADS
    total = sum_fn(out, pieces, static_cast<int>(count), n);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(total);
}

PyMethodDef methods[] = {
    {"sum_pieces", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_sum_pieces)), METH_FASTCALL,
     "sum_pieces(dst, pieces) -> float: dst (float32) := the float32 sum of the bf16 pieces (int16 bits), "
     "in order; returns the float64 sum of dst's squares."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_grad_sum",
                      "bf16 gradient pieces into a float32 .grad, with its sum of squares, in one pass (fastrl_ext).",
                      -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__grad_sum() {
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    const int level = fastrl_ext::isa_level();
    sum_fn = sum_variants[level];
    if (PyModule_AddStringConstant(m, "ISA", fastrl_ext::isa_name(level)) != 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
