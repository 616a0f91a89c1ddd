// fastrl_ext._activations: tanh and its gradient for the learner's MLPs (fastrl.models.activations), and
// the ReLU's gradient for the learner's CNN (fastrl.models.conv_relu.relu_backward).
//
// Why native: on the AVX2-only EPYC neither torch 2.13's CPU tanh nor numpy's is vectorised (numpy's
// SIMD tanh needs AVX-512): 101 and 127 us for a 528x64 float32 activation, four of them per CartPole
// minibatch forward, 14% of its learner; torch's tanh_backward 24 us more each. Here: 43 and 7 us
// (bench/activations_microbench.py; fastrl_ext/README.md has both EPYCs). The loop of
// tanh_row.h (absolute error < 2e-7 against np.tanh) runs as AVX2 or AVX-512 code, picked at import
// like _acting's kernel (isa.h).
//   tanh(x, out):                out = tanh(x)
//   tanh_backward(grad, y, out): out = grad * (1 - y^2), y = tanh(x)   (torch's tanh_backward)
//   relu_backward(grad, y, out): out = 0 where y <= 0, else grad   (torch's threshold_backward(grad, y, 0))
// Arrays: C-contiguous float32 buffers (numpy views of CPU tensors) of one element count; `out` may
// be one of the inputs. relu_backward also takes bf16 as its int16 bits: torch's threshold_backward
// widens each bf16 value to float to compare and select: on the Pong learner's third conv output (64x64x7x7,
// cold, its gradient in the other memory layout) ~1,050 us, where this loop of integer compares with the
// gradient's relayout takes ~175 (bench/relu_backward_microbench.py; AVX-512 or AVX2, picked as tanh's).
#include "buffer_view.h"
#include "isa.h"
#include "tanh_row.h"

#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using View = fastrl_ext::BufferView;

__attribute__((always_inline)) inline void tanh_grad_rows(const float* grad, const float* y, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = grad[i] * (1.0f - y[i] * y[i]);
}

// out = y <= 0 ? 0 : grad, on the floats' bits: a bf16 (int16_t) or float32 (int32_t) y is <= 0 when its bits
// are <= 0 as a signed integer (negative, or a signed zero) and it is not a NaN (magnitude above infinity's);
// with `daz` (the CPU's denormals-are-zero mode, which torch's float compare obeys) also when its exponent is
// 0 (a denormal). Exactly torch's threshold_backward(grad, y, 0) in either mode, NaNs included, no float
// arithmetic: the gradient's bits pass through untouched.
template <typename Bits>
__attribute__((always_inline)) inline void relu_grad_rows(const Bits* grad, const Bits* y, Bits* out, int64_t n,
                                                          bool daz) {
    constexpr Bits kMagnitude = sizeof(Bits) == 2 ? Bits(0x7FFF) : Bits(0x7FFFFFFF);
    constexpr Bits kInf = sizeof(Bits) == 2 ? Bits(0x7F80) : Bits(0x7F800000);  // also the exponent's bits
    // the exponent's mask, or all bits, which only +0 leaves at 0 (not positive anyway)
    const Bits denormal_exponent = daz ? kInf : Bits(-1);
    // both loads and a mask, no branch: GCC vectorises only this form
    for (int64_t i = 0; i < n; ++i) {
        const Bits b = y[i], g = grad[i];
        const bool not_positive = (b <= 0) & (Bits(b & kMagnitude) <= kInf);
        const bool flushed = Bits(b & denormal_exponent) == 0;
        const Bits zero = Bits(-Bits(not_positive | flushed));
        out[i] = Bits(g & Bits(~zero));
    }
}

using TanhFn = void (*)(const float*, float*, int64_t);
using GradFn = void (*)(const float*, const float*, float*, int64_t);

void tanh_default(const float* x, float* out, int64_t n) { fastrl_ext::tanh_row(x, out, n); }
void grad_default(const float* g, const float* y, float* out, int64_t n) { tanh_grad_rows(g, y, out, n); }

using ReluGrad16Fn = void (*)(const int16_t*, const int16_t*, int16_t*, int64_t, bool);
using ReluGrad32Fn = void (*)(const int32_t*, const int32_t*, int32_t*, int64_t, bool);
void relu16_default(const int16_t* g, const int16_t* y, int16_t* out, int64_t n, bool daz) {
    relu_grad_rows(g, y, out, n, daz);
}
void relu32_default(const int32_t* g, const int32_t* y, int32_t* out, int64_t n, bool daz) {
    relu_grad_rows(g, y, out, n, daz);
}

#if FASTRL_X86_VARIANTS
FASTRL_TARGET_AVX2 void relu16_avx2(const int16_t* g, const int16_t* y, int16_t* out, int64_t n, bool daz) {
    relu_grad_rows(g, y, out, n, daz);
}
FASTRL_TARGET_AVX2 void relu32_avx2(const int32_t* g, const int32_t* y, int32_t* out, int64_t n, bool daz) {
    relu_grad_rows(g, y, out, n, daz);
}
FASTRL_TARGET_AVX512 void relu16_avx512(const int16_t* g, const int16_t* y, int16_t* out, int64_t n, bool daz) {
    relu_grad_rows(g, y, out, n, daz);
}
FASTRL_TARGET_AVX512 void relu32_avx512(const int32_t* g, const int32_t* y, int32_t* out, int64_t n, bool daz) {
    relu_grad_rows(g, y, out, n, daz);
}
FASTRL_TARGET_AVX2 void tanh_avx2(const float* x, float* out, int64_t n) { fastrl_ext::tanh_row(x, out, n); }
FASTRL_TARGET_AVX2 void grad_avx2(const float* g, const float* y, float* out, int64_t n) {
    tanh_grad_rows(g, y, out, n);
}
FASTRL_TARGET_AVX512 void tanh_avx512(const float* x, float* out, int64_t n) { fastrl_ext::tanh_row(x, out, n); }
FASTRL_TARGET_AVX512 void grad_avx512(const float* g, const float* y, float* out, int64_t n) {
    tanh_grad_rows(g, y, out, n);
}
// by fastrl_ext::isa_level()
const TanhFn tanh_variants[] = {tanh_default, tanh_avx2, tanh_avx512};
const GradFn grad_variants[] = {grad_default, grad_avx2, grad_avx512};
const ReluGrad16Fn relu16_variants[] = {relu16_default, relu16_avx2, relu16_avx512};
const ReluGrad32Fn relu32_variants[] = {relu32_default, relu32_avx2, relu32_avx512};
#else
const TanhFn tanh_variants[] = {tanh_default, tanh_default, tanh_default};
const GradFn grad_variants[] = {grad_default, grad_default, grad_default};
const ReluGrad16Fn relu16_variants[] = {relu16_default, relu16_default, relu16_default};
const ReluGrad32Fn relu32_variants[] = {relu32_default, relu32_default, relu32_default};
#endif

TanhFn tanh_fn = tanh_default;
GradFn grad_fn = grad_default;
ReluGrad16Fn relu16_fn = relu16_default;
ReluGrad32Fn relu32_fn = relu32_default;

// args[0..count) as float32 views with one element count (the last one writable) into `views`, that
// count into `n`; false with a TypeError or ValueError set.
bool float32_views(View* views, PyObject* const* args, const char* const* names, int count, const char* caller,
                   Py_ssize_t* n) {
    for (int k = 0; k < count; ++k) {
        if (!fastrl_ext::float32_view(views[k], args[k], k == count - 1, caller, names[k])) return false;
        if (k > 0 && views[k].items() != views[0].items()) {
            PyErr_Format(PyExc_ValueError, "%s: %s has %zd items, %s has %zd", caller, names[k], views[k].items(),
                         names[0], views[0].items());
            return false;
        }
    }
    *n = views[0].items();
    return true;
}

PyObject* py_tanh(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "tanh(x, out) takes 2 arguments");
        return nullptr;
    }
    static const char* const names[] = {"x", "out"};
    View views[2];
    Py_ssize_t n = 0;
    if (!float32_views(views, args, names, 2, "tanh", &n)) return nullptr;
    tanh_fn(static_cast<const float*>(views[0].buf.buf), static_cast<float*>(views[1].buf.buf), n);
    Py_RETURN_NONE;
}

PyObject* py_tanh_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "tanh_backward(grad, y, out) takes 3 arguments");
        return nullptr;
    }
    static const char* const names[] = {"grad", "y", "out"};
    View views[3];
    Py_ssize_t n = 0;
    if (!float32_views(views, args, names, 3, "tanh_backward", &n)) return nullptr;
    grad_fn(static_cast<const float*>(views[0].buf.buf), static_cast<const float*>(views[1].buf.buf),
            static_cast<float*>(views[2].buf.buf), n);
    Py_RETURN_NONE;
}

// The calling thread's denormals-are-zero mode (MXCSR's DAZ bit; torch.set_flush_denormal sets it with FTZ).
bool denormals_are_zero() {
#if defined(__x86_64__) && defined(__SSE__)
    return (_mm_getcsr() & 0x0040) != 0;
#else
    return false;
#endif
}

PyObject* py_relu_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "relu_backward(grad, y, out) takes 3 arguments");
        return nullptr;
    }
    static const char* const names[] = {"grad", "y", "out"};
    View views[3];
    for (int k = 0; k < 3; ++k) {
        if (!views[k].get(args[k], k == 2, "relu_backward", names[k])) return nullptr;
        const Py_ssize_t size = views[k].buf.itemsize;
        const char kind = views[k].kind();
        if (!((size == 2 && kind == 'h') || (size == 4 && kind == 'f'))) {
            PyErr_Format(PyExc_TypeError, "relu_backward: %s must be int16 (bf16 bits) or float32", names[k]);
            return nullptr;
        }
        if (k > 0 && (views[k].buf.itemsize != views[0].buf.itemsize || views[k].items() != views[0].items())) {
            PyErr_Format(PyExc_ValueError, "relu_backward: %s must have grad's dtype and element count", names[k]);
            return nullptr;
        }
    }
    const int64_t n = views[0].items();
    const bool daz = denormals_are_zero();
    if (views[0].buf.itemsize == 2) {
        relu16_fn(static_cast<const int16_t*>(views[0].buf.buf), static_cast<const int16_t*>(views[1].buf.buf),
                  static_cast<int16_t*>(views[2].buf.buf), n, daz);
    } else {
        relu32_fn(static_cast<const int32_t*>(views[0].buf.buf), static_cast<const int32_t*>(views[1].buf.buf),
                  static_cast<int32_t*>(views[2].buf.buf), n, daz);
    }
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"relu_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_relu_backward)), METH_FASTCALL,
     "relu_backward(grad, y, out): out = 0 where y <= 0, else grad; bf16 as int16 bits or float32, C-contiguous, "
     "one element count (out may be grad)."},
    {"tanh", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_tanh)), METH_FASTCALL,
     "tanh(x, out): out = tanh(x), float32, C-contiguous, same element count (out may be x)."},
    {"tanh_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_tanh_backward)), METH_FASTCALL,
     "tanh_backward(grad, y, out): out = grad * (1 - y * y), float32, C-contiguous, same element count."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_activations", "tanh and its gradient for the learner (fastrl_ext).",
                      -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__activations() {
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    const int level = fastrl_ext::isa_level();
    tanh_fn = tanh_variants[level];
    grad_fn = grad_variants[level];
    relu16_fn = relu16_variants[level];
    relu32_fn = relu32_variants[level];
    if (PyModule_AddStringConstant(m, "ISA", fastrl_ext::isa_name(level)) != 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
