// fastrl_ext._mlp: a small MLP's forward and backward for the learner, one C++ call each
// (fastrl.models.native_mlp wraps them in an autograd Function).
//
// Why native: the MLP presets' learner is bound by how many torch ops it dispatches, not by their
// arithmetic. HalfCheetah's optimizer step on 256 samples (2x64 tanh actor and critic) spent 356 us in
// the forward and 544 in the backward (bench/profile_learner.py), where its ~8M multiply-adds take
// ~250 us at torch's own matmul rate: per layer a matmul, a bias, a tanh through a Python autograd
// Function (fastrl.models.activations), and their backward nodes. Here a network's layers run in
// one call, each product with its bias and activation, without allocations or autograd nodes.
//
//   forward(x, params, hs, act)                    hs[i] = act(hs[i-1] @ W_i^T + b_i), no act on the last
//   backward(g, x, params, hs, grads, act, gx)     grads = (dW_1, db_1, ...) of sum(g * hs[-1]); gx = dx or None
//   normalize(x, mean, std, clip, out)             out = clamp((x - mean) / std, -clip, clip): the input layer's
//                                                  observation normaliser (fastrl.models.normalizer), bit for bit
//
// x [N, d0]; params (W_1, b_1, ..., W_L, b_L), W_i [d_i, d_{i-1}] as torch's nn.Linear holds it;
// hs (H_1, ..., H_L), H_i [N, d_i], written by forward and read by backward; act 0 = tanh, 1 = relu.
// All C-contiguous float32 buffers (numpy views of CPU tensors). Every product is one kernel,
// rows_times (Y = init + A @ B, blocks of rows by 16 columns held in registers: 8 rows in AVX-512, 4 in AVX2, 2 in SSE2), compiled for
// AVX-512, AVX2+FMA and plain x86-64 and picked at import (isa.h); sums run in float32 like torch's
// CPU matmul, in another order, so results agree with torch to float rounding, not bit for bit.
#include <vector>

#include "buffer_view.h"
#include "isa.h"
#include "tanh_row.h"
#include "vectors.h"

namespace {

using View = fastrl_ext::BufferView;
constexpr int CHUNK = 16;  // columns of B per register block
constexpr int TANH = 0, RELU = 1;

// The vector types the kernel is written in, one per target, and their unaligned loads and stores
using fastrl_ext::Vec16;
using fastrl_ext::Vec8;
using fastrl_ext::Vec4;
using fastrl_ext::load;
using fastrl_ext::store;

// Y[r0..r0+RB, c..c+width) = start + sum_k A[r, k] * B[k, 0..width), A[r, k] at A[r * a_row + k * a_k]
// (so a transposed A is read in place), B with row stride ldb (B points at column c's chunk, or at a
// zero-padded copy of it), start 16 floats; RB x CHUNK accumulators held in registers over k.
template <typename V, int RB>
__attribute__((always_inline)) inline void row_block(const float* __restrict A, int64_t a_row, int64_t a_k, int64_t K,
                                                     const float* __restrict B, int64_t ldb, const float* start,
                                                     float* __restrict Y, int64_t ldy, int64_t width) {
    constexpr int NV = CHUNK * sizeof(float) / sizeof(V);  // vectors per row of the chunk
    constexpr int VW = CHUNK / NV;                          // floats per vector
    V acc[RB][NV];
    for (int i = 0; i < RB; ++i)
        for (int v = 0; v < NV; ++v) load(acc[i][v], start + v * VW);
    for (int64_t k = 0; k < K; ++k) {
        V b[NV];
        for (int v = 0; v < NV; ++v) load(b[v], B + k * ldb + v * VW);
        for (int i = 0; i < RB; ++i) {
            const float a = A[i * a_row + k * a_k];
            for (int v = 0; v < NV; ++v) acc[i][v] += a * b[v];
        }
    }
    // whole vectors out; a ragged chunk's through a row buffer, of which only `width` columns are Y's
    for (int i = 0; i < RB; ++i) {
        if (width == CHUNK) {
            for (int v = 0; v < NV; ++v) store(Y + i * ldy + v * VW, acc[i][v]);
        } else {
            float row[CHUNK];
            for (int v = 0; v < NV; ++v) store(row + v * VW, acc[i][v]);
            for (int64_t j = 0; j < width; ++j) Y[i * ldy + j] = row[j];
        }
    }
}

std::vector<float>& scratch(int which, size_t n);

// Y[r, :M] = (init ? init[:M] : 0) + sum_k A[r, k] * B[k, :M] for r < R: chunks of CHUNK columns, each
// over blocks of ROWS rows; the last, ragged chunk (a head's 6 or 1 outputs, an input's 17 columns)
// reads its columns of B from a zero-padded copy so that it runs the same vector code.
template <typename V, int ROWS>
__attribute__((always_inline)) inline void rows_times(const float* __restrict A, int64_t a_row, int64_t a_k, int64_t R,
                                                      int64_t K, const float* __restrict B, int64_t ldb, int64_t M,
                                                      const float* __restrict init, float* __restrict Y,
                                                      int64_t ldy) {
    for (int64_t c = 0; c < M; c += CHUNK) {
        const int64_t width = M - c < CHUNK ? M - c : CHUNK;
        const float* b = B + c;
        int64_t b_stride = ldb;
        float start[CHUNK] = {};
        if (init)
            for (int64_t j = 0; j < width; ++j) start[j] = init[c + j];
        if (width < CHUNK) {
            float* padded = scratch(3, static_cast<size_t>(K * CHUNK)).data();
            for (int64_t k = 0; k < K; ++k)
                for (int64_t j = 0; j < CHUNK; ++j) padded[k * CHUNK + j] = j < width ? B[k * ldb + c + j] : 0.0f;
            b = padded;
            b_stride = CHUNK;
        }
        int64_t r = 0;
        for (; r + ROWS <= R; r += ROWS)
            row_block<V, ROWS>(A + r * a_row, a_row, a_k, K, b, b_stride, start, Y + r * ldy + c, ldy, width);
        for (; r < R; ++r) row_block<V, 1>(A + r * a_row, a_row, a_k, K, b, b_stride, start, Y + r * ldy + c, ldy, width);
    }
}

// dst[c, r] = src[r, c] for an R x C src
__attribute__((always_inline)) inline void transpose(const float* __restrict src, int64_t R, int64_t C,
                                                     float* __restrict dst) {
    for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) dst[c * R + r] = src[r * C + c];
}

struct Net {
    int64_t N = 0;
    int layers = 0;
    std::vector<int64_t> width;                   // d_0 .. d_L
    std::vector<const float*> w, b;               // per layer
    std::vector<float*> h;                        // H_1 .. H_L
    const float* x = nullptr;
    int act = TANH;
    const float* input(int i) const { return i == 0 ? x : h[i - 1]; }  // layer i's input, i from 0
};

// per-thread scratch, grown once to the largest size asked for
std::vector<float>& scratch(int which, size_t n) {
    thread_local std::vector<float> bufs[4];
    if (bufs[which].size() < n) bufs[which].resize(n);
    return bufs[which];
}

template <typename V, int ROWS>
__attribute__((always_inline)) inline void forward_core(const Net& net) {
    for (int i = 0; i < net.layers; ++i) {
        const int64_t in = net.width[i], out = net.width[i + 1];
        float* wt = scratch(0, static_cast<size_t>(in * out)).data();
        transpose(net.w[i], out, in, wt);  // [in, out]: the product's inner loop runs along out
        float* y = net.h[i];
        rows_times<V, ROWS>(net.input(i), in, 1, net.N, in, wt, out, out, net.b[i], y, out);
        if (i + 1 < net.layers) {
            if (net.act == TANH) {
                fastrl_ext::tanh_row(y, y, net.N * out);
            } else {
                for (int64_t j = 0; j < net.N * out; ++j) y[j] = y[j] > 0.0f ? y[j] : 0.0f;
            }
        }
    }
}

// g: the gradient of H_L; dw/db per layer; gx: the gradient of x, or nullptr
template <typename V, int ROWS>
__attribute__((always_inline)) inline void backward_core(const Net& net, const float* g, float* const* dw,
                                                         float* const* db, float* gx) {
    const int64_t N = net.N;
    int64_t widest = 0;
    for (int64_t d : net.width) widest = d > widest ? d : widest;
    float* cur = scratch(1, static_cast<size_t>(N * widest)).data();   // the gradient at a layer's output
    float* prev = scratch(2, static_cast<size_t>(N * widest)).data();  // ... at its input
    std::copy(g, g + N * net.width[net.layers], cur);
    for (int i = net.layers - 1; i >= 0; --i) {
        const int64_t in = net.width[i], out = net.width[i + 1];
        // dW = G^T @ input, G^T read in place (a transposed copy cost more than the product: its writes stride N)
        rows_times<V, ROWS>(cur, 1, out, out, N, net.input(i), in, in, nullptr, dw[i], in);
        std::fill(db[i], db[i] + out, 0.0f);
        for (int64_t n = 0; n < N; ++n)
            for (int64_t o = 0; o < out; ++o) db[i][o] += cur[n * out + o];
        if (i == 0 && gx == nullptr) break;
        float* dst = i == 0 ? gx : prev;
        rows_times<V, ROWS>(cur, out, 1, N, out, net.w[i], in, in, nullptr, dst, in);  // d input = G @ W
        if (i == 0) break;
        const float* hin = net.h[i - 1];  // this layer's input is the previous layer's activation
        if (net.act == TANH) {
            for (int64_t j = 0; j < N * in; ++j) dst[j] *= 1.0f - hin[j] * hin[j];
        } else {
            for (int64_t j = 0; j < N * in; ++j) dst[j] = hin[j] > 0.0f ? dst[j] : 0.0f;
        }
        std::swap(cur, prev);
    }
}

using ForwardFn = void (*)(const Net&);
using BackwardFn = void (*)(const Net&, const float*, float* const*, float* const*, float*);

void forward_default(const Net& n) { forward_core<Vec4, 2>(n); }
void backward_default(const Net& n, const float* g, float* const* dw, float* const* db, float* gx) {
    backward_core<Vec4, 2>(n, g, dw, db, gx);
}
#if FASTRL_X86_VARIANTS
FASTRL_TARGET_AVX2 void forward_avx2(const Net& n) { forward_core<Vec8, 4>(n); }
FASTRL_TARGET_AVX2 void backward_avx2(const Net& n, const float* g, float* const* dw, float* const* db, float* gx) {
    backward_core<Vec8, 4>(n, g, dw, db, gx);
}
FASTRL_TARGET_AVX512 void forward_avx512(const Net& n) { forward_core<Vec16, 8>(n); }
FASTRL_TARGET_AVX512 void backward_avx512(const Net& n, const float* g, float* const* dw, float* const* db,
                                          float* gx) {
    backward_core<Vec16, 8>(n, g, dw, db, gx);
}
const ForwardFn forward_variants[] = {forward_default, forward_avx2, forward_avx512};
const BackwardFn backward_variants[] = {backward_default, backward_avx2, backward_avx512};
#else
const ForwardFn forward_variants[] = {forward_default, forward_default, forward_default};
const BackwardFn backward_variants[] = {backward_default, backward_default, backward_default};
#endif
ForwardFn forward_fn = forward_default;
BackwardFn backward_fn = backward_default;

// A float32 view of `obj` with `dims` dimensions of the given sizes (-1: any); false with an error set.
bool float_view(View& v, PyObject* obj, bool writable, const char* caller, const char* name,
                std::initializer_list<Py_ssize_t> dims) {
    if (!fastrl_ext::float32_view(v, obj, writable, caller, name)) return false;
    if (v.buf.ndim != static_cast<int>(dims.size())) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have %zd dimension(s), has %d", caller, name, dims.size(),
                     v.buf.ndim);
        return false;
    }
    int i = 0;
    for (Py_ssize_t d : dims) {
        if (d >= 0 && v.dim(i) != d) {
            PyErr_Format(PyExc_ValueError, "%s: %s has %zd in dimension %d where %zd is needed", caller, name,
                         v.dim(i), i, d);
            return false;
        }
        ++i;
    }
    return true;
}

// Fills `net` from (x, params, hs, act), holding the views in `views`; false with an error set.
bool parse_net(Net& net, std::vector<View>& views, PyObject* x, PyObject* params, PyObject* hs, PyObject* act,
               const char* caller) {
    if (!PyTuple_Check(params) || !PyTuple_Check(hs)) {
        PyErr_Format(PyExc_TypeError, "%s: params and hs must be tuples", caller);
        return false;
    }
    const Py_ssize_t L = PyTuple_GET_SIZE(hs);
    if (L < 1 || PyTuple_GET_SIZE(params) != 2 * L) {
        PyErr_Format(PyExc_ValueError, "%s: %zd params for %zd layers (a weight and a bias each)", caller,
                     PyTuple_GET_SIZE(params), L);
        return false;
    }
    const long a = PyLong_AsLong(act);
    if (a == -1 && PyErr_Occurred()) return false;
    if (a != TANH && a != RELU) {
        PyErr_Format(PyExc_ValueError, "%s: act must be 0 (tanh) or 1 (relu), got %ld", caller, a);
        return false;
    }
    views = std::vector<View>(static_cast<size_t>(1 + 3 * L));
    if (!float_view(views[0], x, false, caller, "x", {-1, -1})) return false;
    net.N = views[0].dim(0);
    net.layers = static_cast<int>(L);
    net.act = static_cast<int>(a);
    net.x = static_cast<const float*>(views[0].buf.buf);
    net.width = {views[0].dim(1)};
    for (Py_ssize_t i = 0; i < L; ++i) {
        View& w = views[1 + 3 * i];
        View& b = views[2 + 3 * i];
        View& h = views[3 + 3 * i];
        if (!float_view(w, PyTuple_GET_ITEM(params, 2 * i), false, caller, "a weight", {-1, net.width.back()}))
            return false;
        const Py_ssize_t out = w.dim(0);
        if (!float_view(b, PyTuple_GET_ITEM(params, 2 * i + 1), false, caller, "a bias", {out})) return false;
        if (!float_view(h, PyTuple_GET_ITEM(hs, i), true, caller, "an activation", {net.N, out})) return false;
        net.width.push_back(out);
        net.w.push_back(static_cast<const float*>(w.buf.buf));
        net.b.push_back(static_cast<const float*>(b.buf.buf));
        net.h.push_back(static_cast<float*>(h.buf.buf));
    }
    return true;
}

PyObject* py_forward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "forward(x, params, hs, act) takes 4 arguments");
        return nullptr;
    }
    Net net;
    std::vector<View> views;
    if (!parse_net(net, views, args[0], args[1], args[2], args[3], "mlp.forward")) return nullptr;
    Py_BEGIN_ALLOW_THREADS forward_fn(net);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

PyObject* py_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    static const char* caller = "mlp.backward";
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "backward(g, x, params, hs, grads, act, gx) takes 7 arguments");
        return nullptr;
    }
    Net net;
    std::vector<View> views;
    if (!parse_net(net, views, args[1], args[2], args[3], args[5], caller)) return nullptr;
    View g, gx;
    if (!float_view(g, args[0], false, caller, "g", {net.N, net.width.back()})) return nullptr;
    if (args[6] != Py_None && !float_view(gx, args[6], true, caller, "gx", {net.N, net.width[0]})) return nullptr;
    PyObject* grads = args[4];
    if (!PyTuple_Check(grads) || PyTuple_GET_SIZE(grads) != 2 * net.layers) {
        PyErr_Format(PyExc_ValueError, "%s: grads must be a tuple of %d arrays", caller, 2 * net.layers);
        return nullptr;
    }
    std::vector<View> grad_views(static_cast<size_t>(2 * net.layers));
    std::vector<float*> dw, db;
    for (int i = 0; i < net.layers; ++i) {
        if (!float_view(grad_views[2 * i], PyTuple_GET_ITEM(grads, 2 * i), true, caller, "a weight gradient",
                        {net.width[i + 1], net.width[i]}) ||
            !float_view(grad_views[2 * i + 1], PyTuple_GET_ITEM(grads, 2 * i + 1), true, caller, "a bias gradient",
                        {net.width[i + 1]}))
            return nullptr;
        dw.push_back(static_cast<float*>(grad_views[2 * i].buf.buf));
        db.push_back(static_cast<float*>(grad_views[2 * i + 1].buf.buf));
    }
    const float* gp = static_cast<const float*>(g.buf.buf);
    float* gxp = args[6] == Py_None ? nullptr : static_cast<float*>(gx.buf.buf);
    Py_BEGIN_ALLOW_THREADS backward_fn(net, gp, dw.data(), db.data(), gxp);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

// out = clamp((x - mean) / std, -clip, clip) per row: fastrl.models.normalizer's forward, the same float32
// operations in the same order (bit for bit; a NaN stays NaN, as torch.clamp leaves it). For the native
// gradient chain, where torch's five ops on each minibatch cost ~11 µs of HalfCheetah's step.
void normalize_rows(const float* x, const float* mean, const float* std, float clip, float* out, Py_ssize_t rows,
                    Py_ssize_t d) {
    for (Py_ssize_t r = 0; r < rows; ++r) {
        const float* xr = x + r * d;
        float* o = out + r * d;
        for (Py_ssize_t j = 0; j < d; ++j) {
            const float v = (xr[j] - mean[j]) / std[j];
            o[j] = v < -clip ? -clip : (v > clip ? clip : v);
        }
    }
}

PyObject* py_normalize(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    static const char* caller = "mlp.normalize";
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "normalize(x, mean, std, clip, out) takes 5 arguments");
        return nullptr;
    }
    View x, mean, std, out;
    if (!float_view(x, args[0], false, caller, "x", {-1, -1})) return nullptr;  // [rows, features]
    const Py_ssize_t rows = x.dim(0), d = x.dim(1);
    if (!float_view(mean, args[1], false, caller, "mean", {d}) || !float_view(std, args[2], false, caller, "std", {d}) ||
        !float_view(out, args[4], true, caller, "out", {rows, d}))
        return nullptr;
    const double clip = PyFloat_AsDouble(args[3]);
    if (clip == -1.0 && PyErr_Occurred()) return nullptr;
    normalize_rows(static_cast<const float*>(x.buf.buf), static_cast<const float*>(mean.buf.buf),
                   static_cast<const float*>(std.buf.buf), static_cast<float>(clip), static_cast<float*>(out.buf.buf),
                   rows, d);
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_forward)), METH_FASTCALL,
     "forward(x, params, hs, act): hs[i] = act(hs[i-1] @ W_i.T + b_i), the last layer without act "
     "(0 tanh, 1 relu); float32, C-contiguous; params = (W_1, b_1, ...)."},
    {"backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_backward)), METH_FASTCALL,
     "backward(g, x, params, hs, grads, act, gx): the gradients of sum(g * hs[-1]) w.r.t. each W_i and b_i "
     "into grads = (dW_1, db_1, ...), and w.r.t. x into gx unless it is None; hs as forward left them."},
    {"normalize", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_normalize)), METH_FASTCALL,
     "normalize(x, mean, std, clip, out): out = clamp((x - mean) / std, -clip, clip), x and out [rows, d], "
     "mean and std [d], float32: the observation normaliser's forward."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mlp", "A small MLP's forward and backward for the learner (fastrl_ext).",
                      -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__mlp() {
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    const int level = fastrl_ext::isa_level();
    forward_fn = forward_variants[level];
    backward_fn = backward_variants[level];
    if (PyModule_AddStringConstant(m, "ISA", fastrl_ext::isa_name(level)) != 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
