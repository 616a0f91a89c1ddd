// fastrl_ext._conv_grad: a bf16 conv's weight and bias gradients on the AMX tiles of Intel CPUs that have
// them, for the learner's backward (fastrl.models.conv_weight_grad).
//
// Why native: the weight gradient is one product, dW[oc][kh,kw,c] = sum over output positions p of
// dY[p][oc] * X[pixel(p) + (kh, kw)][c], with a long sum (64 images x 81 positions for Pong's second conv)
// and a small result. oneDNN's kernel for it took 1.0-1.3 ms of a Pong minibatch's ~10 ms per conv on the
// AMX Xeon, more than twice the forward's time for the same products (bench/README, stop 78). Here the
// product runs as one tiled matrix product: the left operand dY transposed ([OC][P], 16 output channels a
// tile row), the right operand the input's patches with pairs of positions interleaved (the VNNI pairs a
// bf16 tile product wants), built a block of positions at a time by AVX-512 permutes from the
// channels-last input, whose C channels for one pixel lie together. The sums are float32 tiles; each
// gradient is rounded to bf16 to nearest even once, at the end. The order of the sums differs from
// oneDNN's, so results may differ from torch's in the last bf16 place (tests/test_conv_weight_grad.py holds
// them to a float64 reference).
//
//   available() -> bool: the CPU has AMX-BF16 and AVX-512 BW, and the kernel granted this process the tiles
//   weight_grad(x, grad, grad_weight, grad_bias, stride): x [N, H, W, C], grad (the output's gradient)
//       [N, OH, OW, OC], grad_weight [OC, KH, KW, C], grad_bias [OC] or None, all bf16 as int16 bits,
//       C-contiguous (channels-last tensors' memory); an unpadded, undilated, ungrouped conv of this stride;
//       C and OC multiples of 32. Writes grad_weight and grad_bias.
#include "bf16.h"
#include "buffer_view.h"

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FASTRL_AMX 1
#define FASTRL_TARGET_AVX512BW __attribute__((target("avx512f,avx512bw")))
#define FASTRL_TARGET_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))
#else
#define FASTRL_AMX 0
#endif

namespace {

using View = fastrl_ext::BufferView;

constexpr int kTileRows = 16;    // every tile is 16 rows of 64 bytes
constexpr int kKStep = 32;       // bf16 values of the sum per tile row
constexpr int kBlock = 32;       // output channels and columns per tile pair
constexpr int64_t kPositions = 128;  // positions per block: its dY^T rows and each 32 columns' patches (8 KB) stay in L1

struct Conv {
    int64_t n, h, w, c, oh, ow, oc, kh, kw, stride;
    int64_t positions() const { return n * oh * ow; }
    int64_t columns() const { return kh * kw * c; }  // dW's row: (kh, kw, c), channels-last order
};

#if FASTRL_AMX
constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an extended state component
constexpr long kXfeatureXtiledata = 18;     // the tiles' data

struct alignas(64) TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

bool cpu_has_amx_bf16() {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
    if (!tile || !bf16) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return false;  // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((lo >> 17) & 3u) == 3u;  // the OS saves the tiles' config and data
}

// Linux hands a process the tiles' 8 KB of state only once asked; oneDNN asks too, and asking twice is fine
bool amx_ready() {
    static const bool ready = cpu_has_amx_bf16() && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    return ready;
}

// Row strides of the scratch arrays, in elements: an odd number of 64-byte lines, so that a tile's 16 rows do not
// all fall into the same few L1 sets (Pong's first conv: 25,600 positions, a row of dY^T 51,200 bytes apart)
int64_t odd_lines(int64_t count, int64_t item_bytes) {
    const int64_t per_line = 64 / item_bytes, lines = (count + per_line - 1) / per_line;
    return (lines % 2 == 0 ? lines + 1 : lines) * per_line;
}

struct Layout {
    int64_t p_pad;         // positions rounded up to a tile's sum (32); the rest are zeros
    int64_t dyt_stride;    // a block of dY^T: [OC][dyt_stride] bf16
    int64_t sums_stride;   // the float32 sums [OC][sums_stride]
    explicit Layout(const Conv& cv)
        : p_pad((cv.positions() + kKStep - 1) / kKStep * kKStep),
          dyt_stride(odd_lines(kPositions, 2)),
          sums_stride(odd_lines(cv.columns(), 4)) {}
};

// The indices of two permutes that interleave two rows of 32 bf16 a and b: the first gives a0 b0 a1 b1 ... a15 b15,
// the second a16 b16 ... a31 b31 (each pair one 32-bit word, as a VNNI pair or a pair of positions)
struct PairIndices {
    alignas(64) uint16_t low[32], high[32];
    PairIndices() {
        for (int i = 0; i < 16; ++i) {
            low[2 * i] = static_cast<uint16_t>(i);
            low[2 * i + 1] = static_cast<uint16_t>(32 + i);
            high[2 * i] = static_cast<uint16_t>(16 + i);
            high[2 * i + 1] = static_cast<uint16_t>(48 + i);
        }
    }
    FASTRL_TARGET_AVX512BW __m512i first() const { return _mm512_load_si512(low); }
    FASTRL_TARGET_AVX512BW __m512i second() const { return _mm512_load_si512(high); }
};

// 16 x 16 32-bit words in 16 registers transposed in place: at each scale d, the top-right and bottom-left
// d x d blocks of every 2d x 2d block trade places
FASTRL_TARGET_AVX512BW inline void transpose_16x16(__m512i* r) {
    for (int d = 8; d >= 1; d /= 2) {
        alignas(64) int first[16], second[16];
        for (int j = 0; j < 16; ++j) {
            first[j] = (j & d) ? 16 + j - d : j;   // row i keeps its lanes without bit d, takes row i+d's
            second[j] = (j & d) ? 16 + j : j + d;  // row i+d takes row i's lanes with bit d, keeps its own
        }
        const __m512i take_first = _mm512_load_si512(first), take_second = _mm512_load_si512(second);
        for (int i = 0; i < 16; ++i) {
            if (i & d) continue;
            const __m512i a = r[i], b = r[i + d];
            r[i] = _mm512_permutex2var_epi32(a, take_first, b);
            r[i + d] = _mm512_permutex2var_epi32(a, take_second, b);
        }
    }
}

// The block [p0, p0 + count) of dY [P][OC] transposed: dyt [OC][dyt_stride] (zeros past P), 32 positions x 32
// channels at a time: each pair of positions' channels interleaved into words (the pair's two values side by
// side), 16 x 16 words transposed, and each channel's row is then its 32 positions in order. `bias_sums` (OC
// float32, or null) adds each channel's values, position by position, read from the same rows.
FASTRL_TARGET_AVX512BW void transpose_block(const uint16_t* grad, const Conv& cv, int64_t p0, int64_t count, uint16_t* dyt,
                                            int64_t dyt_stride, float* bias_sums) {
    const PairIndices pairs;
    const __m512i take_low = pairs.first(), take_high = pairs.second();
    const int64_t p = cv.positions(), oc = cv.oc;
    for (int64_t c0 = 0; c0 < oc; c0 += 32) {
        __m512 sums_low = _mm512_setzero_ps(), sums_high = _mm512_setzero_ps();
        for (int64_t k = 0; k < count; k += 32) {
            __m512i low[16], high[16];
            for (int i = 0; i < 16; ++i) {
                __m512i rows[2];
                for (int j = 0; j < 2; ++j) {
                    const int64_t pos = p0 + k + 2 * i + j;
                    rows[j] = pos < p ? _mm512_loadu_si512(grad + pos * oc + c0) : _mm512_setzero_si512();
                    // the bias: channels c0..c0+15 and c0+16..c0+31 widened to float32 (a bf16 is a float's high half)
                    sums_low = _mm512_add_ps(sums_low, _mm512_castsi512_ps(_mm512_slli_epi32(
                        _mm512_cvtepu16_epi32(_mm512_castsi512_si256(rows[j])), 16)));
                    sums_high = _mm512_add_ps(sums_high, _mm512_castsi512_ps(_mm512_slli_epi32(
                        _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(rows[j], 1)), 16)));
                }
                low[i] = _mm512_permutex2var_epi16(rows[0], take_low, rows[1]);
                high[i] = _mm512_permutex2var_epi16(rows[0], take_high, rows[1]);
            }
            transpose_16x16(low);
            transpose_16x16(high);
            for (int i = 0; i < 16; ++i) {
                _mm512_store_si512(dyt + (c0 + i) * dyt_stride + k, low[i]);
                _mm512_store_si512(dyt + (c0 + 16 + i) * dyt_stride + k, high[i]);
            }
        }
        if (bias_sums != nullptr) {
            _mm512_storeu_ps(bias_sums + c0, _mm512_add_ps(_mm512_loadu_ps(bias_sums + c0), sums_low));
            _mm512_storeu_ps(bias_sums + c0 + 16, _mm512_add_ps(_mm512_loadu_ps(bias_sums + c0 + 16), sums_high));
        }
    }
}

// Where each position of the block [p0, p0 + count) starts in x (its window's top-left pixel), -1 past P
void window_offsets(const Conv& cv, int64_t p0, int64_t count, int64_t* offsets) {
    const int64_t per_image = cv.oh * cv.ow, p = cv.positions();
    int64_t img = p0 / per_image, y = (p0 % per_image) / cv.ow, x0 = p0 % cv.ow;  // counted on, not divided again
    for (int64_t i = 0; i < count; ++i) {
        offsets[i] = p0 + i < p ? ((img * cv.h + y * cv.stride) * cv.w + x0 * cv.stride) * cv.c : -1;
        if (++x0 == cv.ow) {
            x0 = 0;
            if (++y == cv.oh) {
                y = 0;
                ++img;
            }
        }
    }
}

// 32 columns of the block's patches (one (kh, kw) and 32 channels, at `column_offset` from each window's start) as
// VNNI pairs: packed [count / 2][64], a pair row holding the two positions' values of each column side by side,
// the first 16 columns then the next 16 (two B tiles, 128 bytes apart row to row); zeros past P. 8 KB for 128
// positions: it stays in L1 for the products that read it.
FASTRL_TARGET_AVX512BW void pack_columns(const uint16_t* x, const int64_t* offsets, int64_t count, int64_t column_offset,
                                         uint16_t* packed) {
    const PairIndices pairs;
    const __m512i take_first = pairs.first(), take_second = pairs.second();
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t q = 0; q < count / 2; ++q) {
        const int64_t o0 = offsets[2 * q], o1 = offsets[2 * q + 1];
        const __m512i a = o0 >= 0 ? _mm512_loadu_si512(x + o0 + column_offset) : zero;
        const __m512i b = o1 >= 0 ? _mm512_loadu_si512(x + o1 + column_offset) : zero;
        _mm512_store_si512(packed + q * 64, _mm512_permutex2var_epi16(a, take_first, b));
        _mm512_store_si512(packed + q * 64 + 32, _mm512_permutex2var_epi16(a, take_second, b));
    }
}

// float32 -> bf16 bits, to nearest even, a NaN a quiet NaN: bf16.h's bf16_bits, 16 at a time
FASTRL_TARGET_AVX512BW void round_to_bf16(const float* src, uint16_t* dst, int64_t count) {
    const __m512i round_bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    const __m512i quiet_nan = _mm512_set1_epi32(0x7FC0);
    int64_t i = 0;
    for (; i + 16 <= count; i += 16) {
        const __m512i u = _mm512_loadu_si512(src + i);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(round_bias, lsb)), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_mov_epi32(r, nan, quiet_nan);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_maskz_cvtepi32_epi16(0xFFFF, r));
    }
    for (; i < count; ++i) dst[i] = fastrl_ext::bf16_bits(src[i]);
}

// sums[:, c0:c0+32] += dY^T's block of positions x its 32 packed columns, in 2 x 2 tiles of 16 x 16 float32 sums
FASTRL_TARGET_AMX void multiply_columns(const uint16_t* dyt_block, const uint16_t* packed, float* sums, const Conv& cv,
                                        const Layout& lay, int64_t count, int64_t c0) {
    const int64_t sums_bytes = lay.sums_stride * 4, a_bytes = lay.dyt_stride * 2, b_bytes = 128;
    for (int64_t o0 = 0; o0 < cv.oc; o0 += kBlock) {
        const uint16_t* a0 = dyt_block + o0 * lay.dyt_stride;
        const uint16_t* a1 = a0 + kTileRows * lay.dyt_stride;
        float* s00 = sums + o0 * lay.sums_stride + c0;
        float* s10 = s00 + kTileRows * lay.sums_stride;
        _tile_loadd(0, s00, sums_bytes);
        _tile_loadd(1, s00 + kTileRows, sums_bytes);
        _tile_loadd(2, s10, sums_bytes);
        _tile_loadd(3, s10 + kTileRows, sums_bytes);
        for (int64_t k = 0; k < count; k += kKStep) {
            const uint16_t* bk = packed + (k / 2) * 64;
            _tile_loadd(4, a0 + k, a_bytes);
            _tile_loadd(5, a1 + k, a_bytes);
            _tile_loadd(6, bk, b_bytes);
            _tile_loadd(7, bk + 32, b_bytes);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, s00, sums_bytes);
        _tile_stored(1, s00 + kTileRows, sums_bytes);
        _tile_stored(2, s10, sums_bytes);
        _tile_stored(3, s10 + kTileRows, sums_bytes);
    }
}

FASTRL_TARGET_AMX void weight_grad_amx(const uint16_t* x, const uint16_t* grad, uint16_t* grad_weight, uint16_t* grad_bias,
                                       const Conv& cv) {
    const Layout lay(cv);
    const int64_t columns = cv.columns();
    thread_local std::vector<int64_t> offsets;
    thread_local std::vector<float> sums, bias_sums;
    thread_local std::vector<uint16_t> dyt_storage;
    alignas(64) uint16_t packed[kPositions / 2 * 64];
    offsets.resize(static_cast<size_t>(kPositions));
    dyt_storage.resize(static_cast<size_t>(cv.oc * lay.dyt_stride + 32));
    auto* dyt = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(dyt_storage.data()) + 63) & ~uintptr_t{63});
    sums.assign(static_cast<size_t>(cv.oc * lay.sums_stride), 0.0f);
    bias_sums.assign(static_cast<size_t>(cv.oc), 0.0f);
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = kTileRows;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    for (int64_t p0 = 0; p0 < lay.p_pad; p0 += kPositions) {
        const int64_t count = lay.p_pad - p0 < kPositions ? lay.p_pad - p0 : kPositions;
        transpose_block(grad, cv, p0, count, dyt, lay.dyt_stride, grad_bias != nullptr ? bias_sums.data() : nullptr);
        window_offsets(cv, p0, count, offsets.data());
        for (int64_t c0 = 0; c0 < columns; c0 += kBlock) {
            const int64_t tap = c0 / cv.c, column_offset = ((tap / cv.kw) * cv.w + tap % cv.kw) * cv.c + c0 % cv.c;
            pack_columns(x, offsets.data(), count, column_offset, packed);
            multiply_columns(dyt, packed, sums.data(), cv, lay, count, c0);
        }
    }
    _tile_release();
    for (int64_t o = 0; o < cv.oc; ++o) {
        round_to_bf16(sums.data() + o * lay.sums_stride, grad_weight + o * columns, columns);
    }
    if (grad_bias != nullptr) round_to_bf16(bias_sums.data(), grad_bias, cv.oc);
}
#endif

bool bf16_array(View& v, PyObject* obj, bool writable, int ndim, const char* name) {
    if (!v.get(obj, writable, "weight_grad", name)) return false;
    if (v.kind() != 'h' || v.buf.itemsize != 2 || v.buf.ndim != ndim) {
        PyErr_Format(PyExc_TypeError, "weight_grad: %s must be bf16 (as int16 bits) with %d dimensions", name, ndim);
        return false;
    }
    return true;
}

PyObject* py_available(PyObject*, PyObject*) {
#if FASTRL_AMX
    if (amx_ready()) Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

PyObject* py_weight_grad(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "weight_grad(x, grad, grad_weight, grad_bias, stride) takes 5 arguments");
        return nullptr;
    }
    View x, g, gw, gb;
    if (!bf16_array(x, args[0], false, 4, "x") || !bf16_array(g, args[1], false, 4, "grad") ||
        !bf16_array(gw, args[2], true, 4, "grad_weight")) {
        return nullptr;
    }
    const bool has_bias = args[3] != Py_None;
    if (has_bias && !bf16_array(gb, args[3], true, 1, "grad_bias")) return nullptr;
    const long stride = PyLong_AsLong(args[4]);
    if (stride == -1 && PyErr_Occurred()) return nullptr;
    Conv cv{x.dim(0), x.dim(1), x.dim(2), x.dim(3), g.dim(1), g.dim(2), g.dim(3), gw.dim(1), gw.dim(2), stride};
    if (stride < 1 || cv.h < cv.kh || cv.w < cv.kw || g.dim(0) != cv.n || gw.dim(0) != cv.oc || gw.dim(3) != cv.c ||
        cv.oh != (cv.h - cv.kh) / stride + 1 || cv.ow != (cv.w - cv.kw) / stride + 1 || (has_bias && gb.dim(0) != cv.oc)) {
        PyErr_SetString(PyExc_ValueError, "weight_grad: shapes must be x [N, H, W, C], grad [N, OH, OW, OC], grad_weight "
                                          "[OC, KH, KW, C], grad_bias [OC], OH = (H - KH) / stride + 1, likewise OW");
        return nullptr;
    }
    if (cv.c % kKStep != 0 || cv.oc % kBlock != 0 || cv.n < 1) {
        PyErr_SetString(PyExc_ValueError, "weight_grad: C and OC must be multiples of 32");
        return nullptr;
    }
#if FASTRL_AMX
    if (!amx_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "weight_grad: this CPU or kernel gives no AMX tiles (see available())");
        return nullptr;
    }
    const auto* xp = static_cast<const uint16_t*>(x.buf.buf);
    const auto* gp = static_cast<const uint16_t*>(g.buf.buf);
    auto* wp = static_cast<uint16_t*>(gw.buf.buf);
    auto* bp = has_bias ? static_cast<uint16_t*>(gb.buf.buf) : nullptr;
    Py_BEGIN_ALLOW_THREADS
    weight_grad_amx(xp, gp, wp, bp, cv);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    PyErr_SetString(PyExc_RuntimeError, "weight_grad: built without AMX support");
    return nullptr;
#endif
}

PyMethodDef methods[] = {
    {"available", py_available, METH_NOARGS,
     "available() -> bool: whether weight_grad can run here (AMX-BF16 and AVX-512 BW, tiles granted by the kernel)."},
    {"weight_grad", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_weight_grad)), METH_FASTCALL,
     "weight_grad(x, grad, grad_weight, grad_bias, stride): a bf16 conv's weight (and bias) gradient on AMX tiles. "
     "x [N, H, W, C], grad [N, OH, OW, OC], grad_weight [OC, KH, KW, C], grad_bias [OC] or None: bf16 as int16 "
     "bits, C-contiguous; unpadded, undilated, ungrouped; C and OC multiples of 32."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_conv_grad",
                      "A bf16 conv's weight and bias gradients on AMX tiles (fastrl_ext).", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__conv_grad() { return PyModule_Create(&module); }
