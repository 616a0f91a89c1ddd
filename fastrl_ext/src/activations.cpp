// fastrl_ext._activations: tanh and its gradient for the learner's MLPs (fastrl.models.activations).
//
// Why native: on the AVX2-only EPYC neither torch 2.13's CPU tanh nor numpy's is vectorised (numpy's
// SIMD tanh needs AVX-512): 101 and 127 us for a 528x64 float32 activation, four of them per CartPole
// minibatch forward, 14% of its learner; torch's tanh_backward 24 us more each. Here: 43 and 7 us
// (bench/activations_microbench.py; fastrl_ext/README.md has both EPYCs). The loop of
// tanh_row.h (absolute error < 2e-7 against np.tanh) runs as AVX2 or AVX-512 code, picked at import
// like _acting's kernel (isa.h).
//   tanh(x, out):                out = tanh(x)
//   tanh_backward(grad, y, out): out = grad * (1 - y^2), y = tanh(x)   (torch's tanh_backward)
// Arrays: C-contiguous float32 buffers (numpy views of CPU tensors) of one element count; `out` may
// be one of the inputs.
#include "buffer_view.h"
#include "isa.h"
#include "tanh_row.h"

namespace {

using View = fastrl_ext::BufferView;

__attribute__((always_inline)) inline void tanh_grad_rows(const float* grad, const float* y, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = grad[i] * (1.0f - y[i] * y[i]);
}

using TanhFn = void (*)(const float*, float*, int64_t);
using GradFn = void (*)(const float*, const float*, float*, int64_t);

void tanh_default(const float* x, float* out, int64_t n) { fastrl_ext::tanh_row(x, out, n); }
void grad_default(const float* g, const float* y, float* out, int64_t n) { tanh_grad_rows(g, y, out, n); }

#if FASTRL_X86_VARIANTS
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
#else
const TanhFn tanh_variants[] = {tanh_default, tanh_default, tanh_default};
const GradFn grad_variants[] = {grad_default, grad_default, grad_default};
#endif

TanhFn tanh_fn = tanh_default;
GradFn grad_fn = grad_default;

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

PyMethodDef methods[] = {
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
    if (PyModule_AddStringConstant(m, "ISA", fastrl_ext::isa_name(level)) != 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
