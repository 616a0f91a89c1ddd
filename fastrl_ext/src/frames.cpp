// fastrl_ext._frames: uint8 frames [N, C, H, W] to the Nature CNN's input, scaled to [0, 1], in one
// pass: bf16 or float32, in the conv's own memory order (channels-last NHWC, or NCHW), or cut into
// blocks for a space-to-depth first conv (fastrl.models.space_to_depth).
//
// Why native: torch does it in three passes (cast, relayout, scale) and its bf16 relayout is slow:
// 58-87 us per 84x84x4 Pong frame on the AVX-512 EPYC for the learner's channels-last bf16 input
// (7-16 us here), which it pays three times per env step trained (the no-grad forward and two
// epochs): the Pong learner's CPU per batch 0.97x with this pass. One pass reads the 28 KB frame once
// and writes the input once (bench/frames_microbench.py [--learner configs/atari_pong.yaml]).
//   frames_to_input(frames, out, channels_last, block=1):
//     frames: uint8, C-contiguous [N, C, H, W]
//     out:    C-contiguous [N, H, W, C] (channels_last) or [N, C, H, W], float32 ('f') or bf16 passed
//             as its int16 bits ('h'), the same element count
//     block b > 1 (channels_last only; b divides H and W): out is [N, H/b, W/b, C*b*b], torch's
//             pixel_unshuffle(x, b) in channels-last memory: out[n, i, j, (c*b + dy)*b + dx] =
//             frames[n, c, b*i + dy, b*j + dx]
//     out = frames * float32(1/255), rounded to bf16 to nearest even for a bf16 out
// The product is the one torch's `x.mul_(1.0 / 255.0)` computes on the cast frames (float32 opmath,
// then one rounding); fastrl.models.frames checks all 256 values against torch before first use.
#include "bf16.h"
#include "buffer_view.h"
#include "isa.h"

#include <cstdint>
#include <cstring>
#if FASTRL_X86_VARIANTS
#include <immintrin.h>
#endif

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

// One tile pixel at a time: its C*b*b bytes are gathered from the C*b image rows in b-byte pieces, then
// converted in one fixed-length pass (vectorised) and written as one contiguous run. kCB = C*b*b = 64 (the
// Nature CNN's 4 frames at stride 4) gets its own instance; any other shape takes the generic loop.
template <typename Out, int kC, int kB>
__attribute__((always_inline)) inline void tiles_fixed(const uint8_t* in, Out* out, int64_t n, int64_t h, int64_t w) {
    constexpr int kCB = kC * kB * kB;
    const int64_t hb = h / kB, wb = w / kB;
    for (int64_t k = 0; k < n; ++k) {
        for (int64_t i = 0; i < hb; ++i) {
            const uint8_t* rows = in + (k * kC * h + i * kB) * w;  // channel 0, image row kB*i
            for (int64_t j = 0; j < wb; ++j) {
                uint8_t tile[kCB];
                for (int ch = 0; ch < kC; ++ch) {
                    for (int dy = 0; dy < kB; ++dy) {
                        std::memcpy(tile + (ch * kB + dy) * kB, rows + (ch * h + dy) * w + j * kB, kB);
                    }
                }
                Out* dst = out + ((k * hb + i) * wb + j) * kCB;
                for (int e = 0; e < kCB; ++e) dst[e] = convert<Out>(tile[e]);
            }
        }
    }
}

template <typename Out>
__attribute__((always_inline)) inline void to_blocks(const uint8_t* in, Out* out, int64_t n, int64_t c, int64_t h,
                                                     int64_t w, int64_t b) {
    if (c == 4 && b == 4) {
        tiles_fixed<Out, 4, 4>(in, out, n, h, w);
        return;
    }
    const int64_t hb = h / b, wb = w / b, cbb = c * b * b;
    for (int64_t k = 0; k < n; ++k) {
        for (int64_t ch = 0; ch < c; ++ch) {
            for (int64_t y = 0; y < h; ++y) {
                const uint8_t* row = in + ((k * c + ch) * h + y) * w;
                Out* dst = out + (k * hb + y / b) * wb * cbb + (ch * b + y % b) * b;
                for (int64_t j = 0; j < wb; ++j) {
                    for (int64_t dx = 0; dx < b; ++dx) dst[j * cbb + dx] = convert<Out>(row[j * b + dx]);
                }
            }
        }
    }
}

template <typename Out>
__attribute__((always_inline)) inline void convert_all(const uint8_t* in, Out* out, int64_t n, int64_t c, int64_t h,
                                                       int64_t w, bool cl, int64_t b) {
    if (b > 1) {
        to_blocks(in, out, n, c, h, w, b);
    } else {
        to_input(in, out, n, c, h * w, cl);
    }
}

#if FASTRL_X86_VARIANTS
// The AVX-512 variant's own loops, for the shapes the Nature CNN takes (4-frame stacks; 4x4 tiles for a
// space-to-depth first conv) and the plain NCHW cast. Why: GCC turns the loops above into ~1 cycle per
// value (8.6-9.3 us per 84x84x4 frame in tiles, 6.3-6.6 as NCHW bf16 at batch 16 on the AMX Xeon); these
// take 16 values per instruction (7.3-7.5 and 3.3-3.5 us; bench/frames_microbench.py). The same float32 product, then the same rounding to nearest even as bf16_bits (a byte times
// 1/255 is never a NaN), so the outputs are the loops' bit for bit (tests/test_frames.py runs both).

FASTRL_TARGET_AVX512 inline __m512 scaled16(__m128i bytes) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), _mm512_set1_ps(kScale));
}

FASTRL_TARGET_AVX512 inline void store16(uint16_t* out, __m128i bytes) {
    const __m512i u = _mm512_castps_si512(scaled16(bytes));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(rounded));
}

FASTRL_TARGET_AVX512 inline void store16(float* out, __m128i bytes) { _mm512_storeu_ps(out, scaled16(bytes)); }

template <typename Out>
FASTRL_TARGET_AVX512 inline void store64(Out* out, __m512i bytes) {
    store16(out, _mm512_castsi512_si128(bytes));
    store16(out + 16, _mm512_extracti32x4_epi32(bytes, 1));
    store16(out + 32, _mm512_extracti32x4_epi32(bytes, 2));
    store16(out + 48, _mm512_extracti32x4_epi32(bytes, 3));
}

// 4x4 tiles of 4 planes: each tile's 16 four-byte pieces (one per plane and tile row, in output order)
// gathered as one vector, then its 64 values converted and written in one run.
template <typename Out>
FASTRL_TARGET_AVX512 void tiles44_avx512(const uint8_t* in, Out* out, int64_t n, int64_t h, int64_t w) {
    const int64_t hb = h / 4, wb = w / 4;
    alignas(64) int32_t offsets[16];
    for (int ch = 0; ch < 4; ++ch) {
        for (int dy = 0; dy < 4; ++dy) offsets[ch * 4 + dy] = static_cast<int32_t>((ch * h + dy) * w);
    }
    const __m512i pieces = _mm512_load_si512(offsets);
    for (int64_t k = 0; k < n; ++k) {
        for (int64_t i = 0; i < hb; ++i) {
            const uint8_t* rows = in + (k * 4 * h + i * 4) * w;
            Out* dst = out + (k * hb + i) * wb * 64;
            for (int64_t j = 0; j < wb; ++j) store64(dst + j * 64, _mm512_i32gather_epi32(pieces, rows + j * 4, 1));
        }
    }
}

// 4 planes [4][HW] -> pixels [HW][4]: 16 pixels at a time, the planes' bytes interleaved by two unpacks
template <typename Out>
FASTRL_TARGET_AVX512 void planes4_to_nhwc_avx512(const uint8_t* in, Out* out, int64_t n, int64_t hw) {
    for (int64_t k = 0; k < n; ++k) {
        const uint8_t* src = in + k * 4 * hw;
        Out* dst = out + k * 4 * hw;
        int64_t p = 0;
        for (; p + 16 <= hw; p += 16) {
            const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + p));
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + hw + p));
            const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * hw + p));
            const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 3 * hw + p));
            const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
            const __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
            Out* at = dst + p * 4;
            store16(at, _mm_unpacklo_epi16(ab_lo, cd_lo));
            store16(at + 16, _mm_unpackhi_epi16(ab_lo, cd_lo));
            store16(at + 32, _mm_unpacklo_epi16(ab_hi, cd_hi));
            store16(at + 48, _mm_unpackhi_epi16(ab_hi, cd_hi));
        }
        for (; p < hw; ++p) {
            for (int c = 0; c < 4; ++c) dst[p * 4 + c] = convert<Out>(src[c * hw + p]);
        }
    }
}

template <typename Out>
FASTRL_TARGET_AVX512 void elementwise_avx512(const uint8_t* in, Out* out, int64_t count) {
    int64_t i = 0;
    for (; i + 16 <= count; i += 16) store16(out + i, _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    for (; i < count; ++i) out[i] = convert<Out>(in[i]);
}

template <typename Out>
FASTRL_TARGET_AVX512 void convert_all_avx512(const uint8_t* in, Out* out, int64_t n, int64_t c, int64_t h, int64_t w,
                                             bool cl, int64_t b) {
    // the gather's offsets are int32: a frame stack past 2 GB takes the loops above
    if (c == 4 && b == 4 && 4 * h * w < (int64_t{1} << 31)) {
        tiles44_avx512(in, out, n, h, w);
    } else if (b == 1 && cl && c == 4) {
        planes4_to_nhwc_avx512(in, out, n, h * w);
    } else if (b == 1 && !cl) {
        elementwise_avx512(in, out, n * c * h * w);
    } else {
        convert_all(in, out, n, c, h, w, cl, b);
    }
}
#endif

using Bf16Fn = void (*)(const uint8_t*, uint16_t*, int64_t, int64_t, int64_t, int64_t, bool, int64_t);
using F32Fn = void (*)(const uint8_t*, float*, int64_t, int64_t, int64_t, int64_t, bool, int64_t);

#define FASTRL_FRAMES_VARIANT(ATTR, NAME, OUT)                                                                    \
    ATTR void NAME(const uint8_t* in, OUT* out, int64_t n, int64_t c, int64_t h, int64_t w, bool cl, int64_t b) { \
        convert_all(in, out, n, c, h, w, cl, b);                                                                  \
    }

FASTRL_FRAMES_VARIANT(, bf16_default, uint16_t)
FASTRL_FRAMES_VARIANT(, f32_default, float)
#if FASTRL_X86_VARIANTS
FASTRL_FRAMES_VARIANT(FASTRL_TARGET_AVX2, bf16_avx2, uint16_t)
FASTRL_FRAMES_VARIANT(FASTRL_TARGET_AVX2, f32_avx2, float)
FASTRL_TARGET_AVX512 void bf16_avx512(const uint8_t* in, uint16_t* out, int64_t n, int64_t c, int64_t h, int64_t w,
                                      bool cl, int64_t b) {
    convert_all_avx512(in, out, n, c, h, w, cl, b);
}
FASTRL_TARGET_AVX512 void f32_avx512(const uint8_t* in, float* out, int64_t n, int64_t c, int64_t h, int64_t w, bool cl,
                                     int64_t b) {
    convert_all_avx512(in, out, n, c, h, w, cl, b);
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
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "frames_to_input(frames, out, channels_last, block=1) takes 3 or 4 arguments");
        return nullptr;
    }
    const int channels_last = PyObject_IsTrue(args[2]);
    if (channels_last < 0) return nullptr;
    const long block = nargs == 4 ? PyLong_AsLong(args[3]) : 1;
    if (block == -1 && PyErr_Occurred()) return nullptr;
    if (block < 1 || (block > 1 && !channels_last)) {
        PyErr_SetString(PyExc_ValueError, "frames_to_input: block must be 1, or more with channels_last");
        return nullptr;
    }
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
    if (h % block != 0 || w % block != 0) {
        PyErr_Format(PyExc_ValueError, "frames_to_input: block %ld must divide the frames' height %zd and width %zd",
                     block, h, w);
        return nullptr;
    }
    const Py_ssize_t want[4] = {n, channels_last ? h / block : c, channels_last ? w / block : h,
                                channels_last ? c * block * block : w};
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
        bf16_fn(in, static_cast<uint16_t*>(out.buf.buf), n, c, h, w, channels_last, block);
    } else {
        f32_fn(in, static_cast<float*>(out.buf.buf), n, c, h, w, channels_last, block);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"frames_to_input", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_frames_to_input)),
     METH_FASTCALL,
     "frames_to_input(frames, out, channels_last, block=1): uint8 [N,C,H,W] frames / 255 into out, [N,H,W,C] "
     "when channels_last else [N,C,H,W], or [N,H/b,W/b,C*b*b] blocks (pixel_unshuffle) for block b > 1; float32 "
     "or bf16 (as int16 bits)."},
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
