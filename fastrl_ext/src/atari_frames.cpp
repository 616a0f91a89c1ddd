// fastrl_ext._atari_frames: an Atari frame's area-average resize (210x160 to 84x84 in the presets) and
// the frame stack, for rollout workers that take envpool's raw grayscale frames
// (fastrl.envs.atari_frames).
//
// Why native: envpool resizes each maxpooled frame with OpenCV's INTER_AREA, whose generic
// (non-integer scale) path is a scalar loop that accumulates into memory, every entry a
// store-to-load chain: ~10% of the machine's CPU in a live Pong sample stage (perf), ~45 us an env
// step. The same sums in registers and 16-lane vectors take a few microseconds.
//
// Bit for bit: the weights are OpenCV's area weights (computeResizeAreaTab's definition: a destination
// cell [d * s, d * s + s) in source units, s = 1 / (dsize / ssize) in double, covers whole source
// pixels at weight 1 / cell and cut ones at their covered fraction / cell, a cut under 1e-3 dropped),
// rounded to float; each row is summed across (x) first, in float, entries in order, then the rows
// down (y), in float, each product rounded before its add (no fused multiply-adds: -ffp-contract=off),
// then rounded to the nearest integer (ties to even) and saturated to 0..255. The tests hold the result
// to envpool's own 84x84 frames for whole episodes (tests/test_atari_frames.py).
//
//   area_resize(src, dst): src uint8 [N, H, W], dst uint8 [N, h, w], h <= H and w <= W
//   push_frames(src, stacked, full): src uint8 [N, H, W] (or [N, 1, H, W]), stacked uint8 [N, K, h, w],
//     full bool [N]: each env's frame resized into stacked[i, K - 1] after the older K - 1 frames move
//     down one place; where full[i], into every place (envpool's stack after a new game).
#include "buffer_view.h"
#include "isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if FASTRL_X86_VARIANTS
#include <immintrin.h>
#endif

namespace {

using View = fastrl_ext::BufferView;

constexpr int kLanes = 16;

// One axis' weights: for destination d, entries [first[d], first[d + 1]) of (src, weight).
struct Axis {
    std::vector<int> first, src;
    std::vector<float> weight;
    int most = 0;  // the most entries any destination has
};

Axis area_axis(int ssize, int dsize) {
    Axis a;
    const double scale = 1.0 / (static_cast<double>(dsize) / static_cast<double>(ssize));
    auto add = [&](int s, double w) {
        a.src.push_back(s);
        a.weight.push_back(static_cast<float>(w));
    };
    for (int d = 0; d < dsize; ++d) {
        a.first.push_back(static_cast<int>(a.src.size()));
        const double from = d * scale, to = from + scale;
        const double cell = std::min(scale, ssize - from);
        int whole_from = static_cast<int>(std::ceil(from)), whole_to = static_cast<int>(std::floor(to));
        whole_to = std::min(whole_to, ssize - 1);
        whole_from = std::min(whole_from, whole_to);
        if (whole_from - from > 1e-3) add(whole_from - 1, (whole_from - from) / cell);
        for (int s = whole_from; s < whole_to; ++s) add(s, 1.0 / cell);
        if (to - whole_to > 1e-3) add(whole_to, std::min(std::min(to - whole_to, 1.0), cell) / cell);
    }
    a.first.push_back(static_cast<int>(a.src.size()));
    for (int d = 0; d < dsize; ++d) a.most = std::max(a.most, a.first[d + 1] - a.first[d]);
    return a;
}

// The x weights laid out for the row pass: entry k of destination d at [k * w_pad + d], padded with
// weight 0 (an exact no-op on a sum of non-negative products) up to `most` entries and w_pad columns.
// For the AVX-512 pass, each group of 16 destinations also gets a base column at or before the first one it
// reads (and at most 32 before the row's end) and its entries' offsets from it; `in_window` says whether
// every group reads within the 32 columns from its base (two vectors), else the pass gathers.
struct Plan {
    int H = 0, W = 0, h = 0, w = 0, w_pad = 0, W_pad = 0;
    Axis x, y;
    std::vector<int> x_src;        // [most][w_pad]
    std::vector<float> x_weight;   // [most][w_pad]
    std::vector<int> group_base;   // [w_pad / 16]
    std::vector<int> x_offset;     // [most][w_pad]: x_src - its group's base
    bool in_window = true;
    // The AVX2 pass's byte shuffles: 4 destinations a 16-byte window, two windows a vector. quad_base:
    // [w_pad / 4] window starts; quad_shuffle: [w_pad / 8][most][32] bytes picking each entry's source
    // byte into the low byte of its lane (0x80: a zero, for padding); quad_fits: every window holds its
    // 4 destinations' sources.
    std::vector<int> quad_base;
    std::vector<uint8_t> quad_shuffle;
    bool quad_fits = true;
};

// A window of `width` source bytes for destinations [from, to): its start (at or before the first source
// they read, at most `width` before the row's end), and whether it holds every source they read.
std::pair<int, bool> source_window(const Axis& x, int from, int to, int W, int width) {
    int lo = W, hi = 0;
    for (int d = from; d < to; ++d) {
        for (int e = x.first[d]; e < x.first[d + 1]; ++e) {
            lo = std::min(lo, x.src[e]);
            hi = std::max(hi, x.src[e]);
        }
    }
    if (lo > hi) lo = hi = 0;  // only padding
    if (W >= width) lo = std::min(lo, W - width);
    return {lo, W >= width && hi - lo < width};
}

Plan make_plan(int H, int W, int h, int w) {
    Plan p;
    p.H = H, p.W = W, p.h = h, p.w = w;
    p.w_pad = (w + kLanes - 1) / kLanes * kLanes;
    p.W_pad = W + 2 * kLanes;  // a row as floats, room to read two vectors from any base
    p.x = area_axis(W, w);
    p.y = area_axis(H, h);
    const int K = p.x.most;
    p.x_src.assign(static_cast<size_t>(K * p.w_pad), 0);
    p.x_weight.assign(static_cast<size_t>(K * p.w_pad), 0.0f);
    for (int d = 0; d < w; ++d) {
        for (int e = p.x.first[d], k = 0; e < p.x.first[d + 1]; ++e, ++k) {
            p.x_src[k * p.w_pad + d] = p.x.src[e];
            p.x_weight[k * p.w_pad + d] = p.x.weight[e];
        }
    }
    p.x_offset.assign(p.x_src.size(), 0);
    for (int g = 0; g < p.w_pad / kLanes; ++g) {
        // the AVX-512 pass reads 32 bytes from the base
        const auto [lo, fits] = source_window(p.x, g * kLanes, std::min(w, (g + 1) * kLanes), W, 2 * kLanes);
        p.group_base.push_back(lo);
        p.in_window = p.in_window && fits;
        for (int k = 0; k < K; ++k) {
            for (int d = g * kLanes; d < (g + 1) * kLanes; ++d) {
                // padding entries read the base itself, at weight 0
                const bool real = d < w && k < p.x.first[d + 1] - p.x.first[d];
                p.x_offset[k * p.w_pad + d] = real ? p.x_src[k * p.w_pad + d] - lo : 0;
                if (!real) p.x_src[k * p.w_pad + d] = lo;
            }
        }
    }
    constexpr int kQuad = 4;
    const int quads = p.w_pad / kQuad;
    p.quad_shuffle.assign(static_cast<size_t>(quads / 2) * K * 32, 0x80);
    for (int q = 0; q < quads; ++q) {
        const auto [lo, fits] = source_window(p.x, q * kQuad, std::min(w, (q + 1) * kQuad), W, 16);
        p.quad_base.push_back(lo);
        p.quad_fits = p.quad_fits && fits;
        for (int d = q * kQuad; d < std::min(w, (q + 1) * kQuad); ++d) {
            for (int e = p.x.first[d], k = 0; e < p.x.first[d + 1]; ++e, ++k) {
                const int lane = (q % 2) * 16 + (d - q * kQuad) * 4;
                p.quad_shuffle[(static_cast<size_t>(q / 2) * K + k) * 32 + lane] = static_cast<uint8_t>(p.x.src[e] - lo);
            }
        }
    }
    return p;
}

inline uint8_t round_saturate(float v) {
    const long r = std::lrint(v);  // the current rounding mode: to nearest, ties to even
    return static_cast<uint8_t>(r < 0 ? 0 : (r > 255 ? 255 : r));
}

// The scalar pass: plain x86-64's, and the AVX2 pass's where a group's sources do not fit its windows.
// `rows`: [H][w_pad] floats of scratch for the x sums of every source row.
__attribute__((always_inline)) inline void resize_scalar(const Plan& p, const uint8_t* src, uint8_t* dst,
                                                         float* rowf, float* rows) {
    const int K = p.x.most;
    for (int r = 0; r < p.H; ++r) {
        const uint8_t* s = src + static_cast<size_t>(r) * p.W;
        for (int c = 0; c < p.W; ++c) rowf[c] = static_cast<float>(s[c]);
        float* out = rows + static_cast<size_t>(r) * p.w_pad;
        for (int d = 0; d < p.w; ++d) out[d] = rowf[p.x_src[d]] * p.x_weight[d];
        for (int k = 1; k < K; ++k) {
            const int* xs = p.x_src.data() + k * p.w_pad;
            const float* xw = p.x_weight.data() + k * p.w_pad;
            for (int d = 0; d < p.w; ++d) out[d] = out[d] + rowf[xs[d]] * xw[d];
        }
    }
    for (int d = 0; d < p.h; ++d) {
        uint8_t* o = dst + static_cast<size_t>(d) * p.w;
        const int e0 = p.y.first[d], e1 = p.y.first[d + 1];
        for (int c = 0; c < p.w; ++c) {
            float sum = p.y.weight[e0] * rows[static_cast<size_t>(p.y.src[e0]) * p.w_pad + c];
            for (int e = e0 + 1; e < e1; ++e) sum = sum + p.y.weight[e] * rows[static_cast<size_t>(p.y.src[e]) * p.w_pad + c];
            o[c] = round_saturate(sum);
        }
    }
}

using ResizeFn = void (*)(const Plan&, const uint8_t*, uint8_t*, float*, float*);

void resize_default(const Plan& p, const uint8_t* src, uint8_t* dst, float* rowf, float* rows) {
    resize_scalar(p, src, dst, rowf, rows);
}

#if FASTRL_X86_VARIANTS
// 8 destinations a vector, in two windows of 16 source bytes (4 destinations each), each entry's bytes
// picked by a byte shuffle; then the scalar pass's products and sums, lane by lane.
// kK: the entries per destination when fixed at compile time (the loop over them then unrolled), else 0.
template <int kK>
FASTRL_TARGET_AVX2 void resize_avx2_k(const Plan& p, const uint8_t* src, uint8_t* dst, float* rows) {
    const int K = kK > 0 ? kK : p.x.most, groups = p.w_pad / 8, w_pad = p.w_pad;
    const float* weights = p.x_weight.data();
    const int* bases = p.quad_base.data();
    const uint8_t* shuffles = p.quad_shuffle.data();
    for (int r = 0; r < p.H; ++r) {
        const uint8_t* s = src + static_cast<size_t>(r) * p.W;
        float* out = rows + static_cast<size_t>(r) * w_pad;
        for (int g = 0; g < groups; ++g) {
            const int at = g * 8;
            const __m256i bytes = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + bases[2 * g]))),
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + bases[2 * g + 1])), 1);
            const uint8_t* shuffle = shuffles + static_cast<size_t>(g) * K * 32;
            __m256 sum = _mm256_setzero_ps();
            for (int k = 0; k < K; ++k) {
                const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(shuffle + k * 32));
                const __m256 px = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(bytes, mask));
                const __m256 prod = _mm256_mul_ps(px, _mm256_loadu_ps(weights + k * w_pad + at));
                sum = k == 0 ? prod : _mm256_add_ps(sum, prod);
            }
            _mm256_storeu_ps(out + at, sum);
        }
    }
    for (int d = 0; d < p.h; ++d) {
        uint8_t* o = dst + static_cast<size_t>(d) * p.w;
        const int e0 = p.y.first[d], e1 = p.y.first[d + 1];
        for (int g = 0; g < groups && g * 8 < p.w; ++g) {
            const int at = g * 8;
            __m256 sum = _mm256_mul_ps(_mm256_set1_ps(p.y.weight[e0]),
                                       _mm256_loadu_ps(rows + static_cast<size_t>(p.y.src[e0]) * w_pad + at));
            for (int e = e0 + 1; e < e1; ++e) {
                const __m256 v = _mm256_loadu_ps(rows + static_cast<size_t>(p.y.src[e]) * w_pad + at);
                sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_set1_ps(p.y.weight[e]), v));
            }
            // to nearest even (the current mode, as lrint), clamped to 0..255, then each lane's low byte
            __m256i v = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(sum), _mm256_setzero_si256()),
                                         _mm256_set1_epi32(255));
            v = _mm256_packus_epi16(_mm256_packus_epi32(v, v), _mm256_setzero_si256());
            const uint32_t low = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(v)));
            const uint32_t high = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(v, 1)));
            uint8_t eight[8];
            std::memcpy(eight, &low, 4);
            std::memcpy(eight + 4, &high, 4);
            std::memcpy(o + at, eight, static_cast<size_t>(std::min(8, p.w - at)));
        }
    }
}

// Pong's 210x160 -> 84x84 has 3 entries per destination on both axes (a scale of 1.9 across, 2.5 down)
constexpr int kPresetEntries = 3;

FASTRL_TARGET_AVX2 void resize_avx2(const Plan& p, const uint8_t* src, uint8_t* dst, float* rowf, float* rows) {
    if (!p.quad_fits) {
        resize_scalar(p, src, dst, rowf, rows);
    } else if (p.x.most == kPresetEntries) {
        resize_avx2_k<kPresetEntries>(p, src, dst, rows);
    } else {
        resize_avx2_k<0>(p, src, dst, rows);
    }
}

// 16 destinations a vector: each x entry's source pixels picked from the 32 source pixels at the group's
// base (or gathered from the row as floats), each product then added in entry order, as the scalar pass
// does lane by lane. The 32 pixels are read as bytes straight from the frame: floats stored and read back
// at another offset would wait on failed store forwarding.
template <int kK>
FASTRL_TARGET_AVX512 void resize_avx512_k(const Plan& p, const uint8_t* src, uint8_t* dst, float* rowf, float* rows) {
    const int K = kK > 0 ? kK : p.x.most, groups = p.w_pad / kLanes, w_pad = p.w_pad;
    const int* offsets = p.x_offset.data();
    const int* sources = p.x_src.data();
    const float* weights = p.x_weight.data();
    const int* bases = p.group_base.data();
    for (int r = 0; r < p.H; ++r) {
        const uint8_t* s = src + static_cast<size_t>(r) * p.W;
        float* out = rows + static_cast<size_t>(r) * w_pad;
        if (p.in_window) {
            for (int g = 0; g < groups; ++g) {
                const int at = g * kLanes;
                const uint8_t* base = s + bases[g];
                const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base))));
                const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + kLanes))));
                __m512 sum = _mm512_mul_ps(_mm512_permutex2var_ps(lo, _mm512_loadu_si512(offsets + at), hi),
                                           _mm512_loadu_ps(weights + at));
                for (int k = 1; k < K; ++k) {
                    const __m512 px = _mm512_permutex2var_ps(lo, _mm512_loadu_si512(offsets + k * w_pad + at), hi);
                    sum = _mm512_add_ps(sum, _mm512_mul_ps(px, _mm512_loadu_ps(weights + k * w_pad + at)));
                }
                _mm512_storeu_ps(out + at, sum);
            }
            continue;
        }
        for (int c = 0; c < p.W; ++c) rowf[c] = static_cast<float>(s[c]);
        for (int g = 0; g < groups; ++g) {
            const int at = g * kLanes;
            __m512 sum = _mm512_mul_ps(_mm512_i32gather_ps(_mm512_loadu_si512(sources + at), rowf, 4),
                                       _mm512_loadu_ps(weights + at));
            for (int k = 1; k < K; ++k) {
                const __m512 px = _mm512_i32gather_ps(_mm512_loadu_si512(sources + k * w_pad + at), rowf, 4);
                sum = _mm512_add_ps(sum, _mm512_mul_ps(px, _mm512_loadu_ps(weights + k * w_pad + at)));
            }
            _mm512_storeu_ps(out + at, sum);
        }
    }
    alignas(64) uint8_t row_out[kLanes];
    for (int d = 0; d < p.h; ++d) {
        uint8_t* o = dst + static_cast<size_t>(d) * p.w;
        const int e0 = p.y.first[d], e1 = p.y.first[d + 1];
        for (int g = 0; g < groups; ++g) {
            const int at = g * kLanes;
            __m512 sum = _mm512_mul_ps(_mm512_set1_ps(p.y.weight[e0]),
                                       _mm512_loadu_ps(rows + static_cast<size_t>(p.y.src[e0]) * p.w_pad + at));
            for (int e = e0 + 1; e < e1; ++e) {
                const __m512 v = _mm512_loadu_ps(rows + static_cast<size_t>(p.y.src[e]) * p.w_pad + at);
                sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_set1_ps(p.y.weight[e]), v));
            }
            // the current rounding mode (to nearest even), as lrint; then saturated to 0..255
            const __m512i rounded = _mm512_max_epi32(_mm512_cvtps_epi32(sum), _mm512_setzero_si512());
            const __m128i bytes = _mm512_cvtusepi32_epi8(rounded);
            const int n = std::min(kLanes, p.w - at);
            if (n == kLanes) {
                _mm_storeu_si128(reinterpret_cast<__m128i*>(o + at), bytes);
            } else {
                _mm_store_si128(reinterpret_cast<__m128i*>(row_out), bytes);
                std::memcpy(o + at, row_out, static_cast<size_t>(n));
            }
        }
    }
}
FASTRL_TARGET_AVX512 void resize_avx512(const Plan& p, const uint8_t* src, uint8_t* dst, float* rowf, float* rows) {
    if (p.x.most == kPresetEntries) {
        resize_avx512_k<kPresetEntries>(p, src, dst, rowf, rows);
    } else {
        resize_avx512_k<0>(p, src, dst, rowf, rows);
    }
}
const ResizeFn resize_variants[] = {resize_default, resize_avx2, resize_avx512};
#else
const ResizeFn resize_variants[] = {resize_default, resize_default, resize_default};
#endif

ResizeFn resize_fn = resize_default;

// The last plan made on this thread, reused while the sizes stay (a worker resizes one shape for its whole
// life). Per thread, so that a call that released the GIL keeps its plan whatever sizes another thread asks for.
const Plan& plan_for(int H, int W, int h, int w) {
    static thread_local Plan plan;
    if (plan.H != H || plan.W != W || plan.h != h || plan.w != w) plan = make_plan(H, W, h, w);
    return plan;
}

// The source frames' (N, H, W) from a [N, H, W] or [N, 1, H, W] uint8 buffer; false with an error set.
bool frame_dims(const View& v, const char* caller, Py_ssize_t* n, Py_ssize_t* H, Py_ssize_t* W) {
    const int nd = v.buf.ndim;
    if (v.kind() != 'B' || v.buf.itemsize != 1 || !(nd == 3 || (nd == 4 && v.dim(1) == 1))) {
        PyErr_Format(PyExc_TypeError, "%s: src must be uint8 [N, H, W] or [N, 1, H, W]", caller);
        return false;
    }
    *n = v.dim(0), *H = v.dim(nd - 2), *W = v.dim(nd - 1);
    return true;
}

bool check_sizes(const char* caller, Py_ssize_t H, Py_ssize_t W, Py_ssize_t h, Py_ssize_t w) {
    if (h < 1 || w < 1 || h > H || w > W) {
        PyErr_Format(PyExc_ValueError, "%s: the frames shrink only: %zdx%zd to %zdx%zd", caller, H, W, h, w);
        return false;
    }
    return true;
}

PyObject* py_area_resize(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "area_resize(src, dst) takes 2 arguments");
        return nullptr;
    }
    View src, dst;
    Py_ssize_t n, H, W;
    if (!src.get(args[0], false, "area_resize", "src") || !dst.get(args[1], true, "area_resize", "dst") ||
        !frame_dims(src, "area_resize", &n, &H, &W)) {
        return nullptr;
    }
    if (dst.kind() != 'B' || dst.buf.itemsize != 1 || dst.buf.ndim != 3 || dst.dim(0) != n) {
        PyErr_SetString(PyExc_TypeError, "area_resize: dst must be uint8 [N, h, w], N as src's");
        return nullptr;
    }
    const Py_ssize_t h = dst.dim(1), w = dst.dim(2);
    if (!check_sizes("area_resize", H, W, h, w)) return nullptr;
    const Plan& p = plan_for(static_cast<int>(H), static_cast<int>(W), static_cast<int>(h), static_cast<int>(w));
    const auto* in = static_cast<const uint8_t*>(src.buf.buf);
    auto* out = static_cast<uint8_t*>(dst.buf.buf);
    std::vector<float> rowf(static_cast<size_t>(p.W_pad), 0.0f), rows(static_cast<size_t>(p.H) * p.w_pad);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; ++i) resize_fn(p, in + i * H * W, out + i * h * w, rowf.data(), rows.data());
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyObject* py_push_frames(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "push_frames(src, stacked, full) takes 3 arguments");
        return nullptr;
    }
    View src, stacked, full;
    Py_ssize_t n, H, W;
    if (!src.get(args[0], false, "push_frames", "src") || !stacked.get(args[1], true, "push_frames", "stacked") ||
        !full.get(args[2], false, "push_frames", "full") || !frame_dims(src, "push_frames", &n, &H, &W)) {
        return nullptr;
    }
    if (stacked.kind() != 'B' || stacked.buf.itemsize != 1 || stacked.buf.ndim != 4 || stacked.dim(0) != n) {
        PyErr_SetString(PyExc_TypeError, "push_frames: stacked must be uint8 [N, K, h, w], N as src's");
        return nullptr;
    }
    if (full.kind() != '?' || full.items() != n) {
        PyErr_SetString(PyExc_TypeError, "push_frames: full must be bool [N]");
        return nullptr;
    }
    const Py_ssize_t K = stacked.dim(1), h = stacked.dim(2), w = stacked.dim(3);
    if (K < 1 || !check_sizes("push_frames", H, W, h, w)) return nullptr;
    const Plan& p = plan_for(static_cast<int>(H), static_cast<int>(W), static_cast<int>(h), static_cast<int>(w));
    const auto* in = static_cast<const uint8_t*>(src.buf.buf);
    auto* out = static_cast<uint8_t*>(stacked.buf.buf);
    const auto* whole = static_cast<const bool*>(full.buf.buf);
    thread_local std::vector<float> rowf, rows;
    rowf.assign(static_cast<size_t>(p.W_pad), 0.0f);
    rows.resize(static_cast<size_t>(p.H) * p.w_pad);
    const size_t frame = static_cast<size_t>(h * w);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; ++i) {
        uint8_t* stack = out + static_cast<size_t>(i * K) * frame;
        uint8_t* newest = stack + static_cast<size_t>(K - 1) * frame;
        if (!whole[i]) std::memmove(stack, stack + frame, static_cast<size_t>(K - 1) * frame);
        resize_fn(p, in + i * H * W, newest, rowf.data(), rows.data());
        if (whole[i]) {
            for (Py_ssize_t k = 0; k + 1 < K; ++k) std::memcpy(stack + static_cast<size_t>(k) * frame, newest, frame);
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"area_resize", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_area_resize)), METH_FASTCALL,
     "area_resize(src, dst): uint8 frames [N, H, W] (or [N, 1, H, W]) shrunk into dst [N, h, w] by area "
     "averaging, OpenCV's INTER_AREA bit for bit."},
    {"push_frames", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_push_frames)), METH_FASTCALL,
     "push_frames(src, stacked, full): each env's frame resized (as area_resize) onto the end of its stack "
     "stacked[i] ([N, K, h, w]) after the older frames move down one place, or into every place where full[i]."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_atari_frames",
                      "Atari frames' area resize and frame stack (fastrl_ext).", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__atari_frames() {
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    const int level = fastrl_ext::isa_level();
    resize_fn = resize_variants[level];
    if (PyModule_AddStringConstant(m, "ISA", fastrl_ext::isa_name(level)) != 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
