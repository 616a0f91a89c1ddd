// fastrl_ext._frames: uint8 frames [N, C, H, W] to the Nature CNN's input, scaled to [0, 1], in one
// pass: bf16 or float32, in the conv's own memory order (channels-last NHWC, or NCHW).
//
// Why native: torch does it in three passes (cast, relayout, scale) and its bf16 relayout is slow:
// 58-87 us per 84x84x4 Pong frame on the AVX-512 EPYC for the learner's channels-last bf16 input
// (7-16 us here), which it pays three times per env step trained (the no-grad forward and two
// epochs): the Pong learner's CPU per batch 0.97x with this pass. One pass reads the 28 KB frame once
// and writes the input once (bench/frames_microbench.py [--learner configs/atari_pong.yaml]).
//   frames_to_input(frames, out, channels_last):
//     frames: uint8, C-contiguous [N, C, H, W]
//     out:    C-contiguous [N, H, W, C] (channels_last) or [N, C, H, W], float32 ('f') or bf16 passed
//             as its int16 bits ('h'), the same element count
//     out = frames * float32(1/255), rounded to bf16 to nearest even for a bf16 out
// The product is the one torch's `x.mul_(1.0 / 255.0)` computes on the cast frames (float32 opmath,
// then one rounding); fastrl.models.frames checks all 256 values against torch before first use.
#include "bf16.h"
#include "buffer_view.h"
#include "isa.h"

#include <cstdint>

namespace {

using View = fastrl_ext::BufferView;

constexpr float kScale = static_cast<float>(1.0 / 255.0);

template <typename Out>
__attribute__((always_inline)) inline Out convert(uint8_t v) {
    const float f = static_cast<float>(v) * kScale;
    if constexpr (sizeof(Out) == 2) {
        return fastrl_ext::bf16_bits(f);
    } else {
        return f;
    }
}

// One frame, planes [C][HW] -> pixels [HW][C]. C = 4 (a frame stack) gets its own instance so that
// the inner loop is a fixed 4-way interleave the compiler vectorises.
template <typename Out, int kC>
__attribute__((always_inline)) inline void frame_to_nhwc(const uint8_t* in, Out* out, int64_t hw) {
    for (int64_t p = 0; p < hw; ++p) {
        for (int c = 0; c < kC; ++c) out[p * kC + c] = convert<Out>(in[c * hw + p]);
    }
}

template <typename Out>
__attribute__((always_inline)) inline void to_input(const uint8_t* in, Out* out, int64_t n, int64_t c, int64_t hw,
                                                    bool channels_last) {
    const int64_t frame = c * hw;
    if (!channels_last) {
        for (int64_t i = 0; i < n * frame; ++i) out[i] = convert<Out>(in[i]);
        return;
    }
    for (int64_t k = 0; k < n; ++k) {
        const uint8_t* src = in + k * frame;
        Out* dst = out + k * frame;
        if (c == 4) {
            frame_to_nhwc<Out, 4>(src, dst, hw);
        } else {
            for (int64_t p = 0; p < hw; ++p) {
                for (int64_t j = 0; j < c; ++j) dst[p * c + j] = convert<Out>(src[j * hw + p]);
            }
        }
    }
}

using Bf16Fn = void (*)(const uint8_t*, uint16_t*, int64_t, int64_t, int64_t, bool);
using F32Fn = void (*)(const uint8_t*, float*, int64_t, int64_t, int64_t, bool);

void bf16_default(const uint8_t* in, uint16_t* out, int64_t n, int64_t c, int64_t hw, bool cl) {
    to_input(in, out, n, c, hw, cl);
}
void f32_default(const uint8_t* in, float* out, int64_t n, int64_t c, int64_t hw, bool cl) {
    to_input(in, out, n, c, hw, cl);
}
#if FASTRL_X86_VARIANTS
FASTRL_TARGET_AVX2 void bf16_avx2(const uint8_t* in, uint16_t* out, int64_t n, int64_t c, int64_t hw, bool cl) {
    to_input(in, out, n, c, hw, cl);
}
FASTRL_TARGET_AVX2 void f32_avx2(const uint8_t* in, float* out, int64_t n, int64_t c, int64_t hw, bool cl) {
    to_input(in, out, n, c, hw, cl);
}
FASTRL_TARGET_AVX512 void bf16_avx512(const uint8_t* in, uint16_t* out, int64_t n, int64_t c, int64_t hw, bool cl) {
    to_input(in, out, n, c, hw, cl);
}
FASTRL_TARGET_AVX512 void f32_avx512(const uint8_t* in, float* out, int64_t n, int64_t c, int64_t hw, bool cl) {
    to_input(in, out, n, c, hw, cl);
}
const Bf16Fn bf16_variants[] = {bf16_default, bf16_avx2, bf16_avx512};
const F32Fn f32_variants[] = {f32_default, f32_avx2, f32_avx512};
#else
const Bf16Fn bf16_variants[] = {bf16_default, bf16_default, bf16_default};
const F32Fn f32_variants[] = {f32_default, f32_default, f32_default};
#endif

Bf16Fn bf16_fn = bf16_default;
F32Fn f32_fn = f32_default;

PyObject* py_frames_to_input(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "frames_to_input(frames, out, channels_last) takes 3 arguments");
        return nullptr;
    }
    const int channels_last = PyObject_IsTrue(args[2]);
    if (channels_last < 0) return nullptr;
    View frames, out;
    if (!frames.get(args[0], false, "frames_to_input", "frames") || !out.get(args[1], true, "frames_to_input", "out")) {
        return nullptr;
    }
    if (frames.kind() != 'B' || frames.buf.itemsize != 1 || frames.buf.ndim != 4) {
        PyErr_SetString(PyExc_TypeError, "frames_to_input: frames must be uint8 [N, C, H, W]");
        return nullptr;
    }
    const char kind = out.kind();
    if (!((kind == 'f' && out.buf.itemsize == 4) || (kind == 'h' && out.buf.itemsize == 2)) || out.buf.ndim != 4) {
        PyErr_SetString(PyExc_TypeError, "frames_to_input: out must be float32, or bf16 as int16, with 4 dimensions");
        return nullptr;
    }
    const Py_ssize_t n = frames.dim(0), c = frames.dim(1), h = frames.dim(2), w = frames.dim(3);
    const Py_ssize_t want[4] = {n, channels_last ? h : c, channels_last ? w : h, channels_last ? c : w};
    for (int i = 0; i < 4; ++i) {
        if (out.dim(i) != want[i]) {
            PyErr_Format(PyExc_ValueError, "frames_to_input: out must be [%zd, %zd, %zd, %zd] for these frames", want[0],
                         want[1], want[2], want[3]);
            return nullptr;
        }
    }
    const auto* in = static_cast<const uint8_t*>(frames.buf.buf);
    Py_BEGIN_ALLOW_THREADS  // the learner's shards convert their pieces at once
    if (kind == 'h') {
        bf16_fn(in, static_cast<uint16_t*>(out.buf.buf), n, c, h * w, channels_last);
    } else {
        f32_fn(in, static_cast<float*>(out.buf.buf), n, c, h * w, channels_last);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"frames_to_input", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_frames_to_input)),
     METH_FASTCALL,
     "frames_to_input(frames, out, channels_last): uint8 [N,C,H,W] frames / 255 into out, [N,H,W,C] when "
     "channels_last else [N,C,H,W], float32 or bf16 (as int16 bits)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_frames", "uint8 frames to the CNN's input in one pass (fastrl_ext).",
                      -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__frames() {
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    const int level = fastrl_ext::isa_level();
    bf16_fn = bf16_variants[level];
    f32_fn = f32_variants[level];
    if (PyModule_AddStringConstant(m, "ISA", fastrl_ext::isa_name(level)) != 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
