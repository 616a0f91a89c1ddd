// fastrl_ext: the acting MLP's dense layers, y = act(x W + b), for acting.cpp's kernel: one row at a time
// (the narrow heads, and a batch's last rows) or a block of ROWS rows (the wide layers).
#pragma once

#include "acting_plan.h"
#include "tanh_row.h"
#include "vectors.h"

#include <algorithm>
#include <cstdint>

namespace fastrl_ext::acting {

// Accumulators of one chunk of a row's outputs stay in registers across the whole input loop; the
// straightforward loop (y[j] += x[k] W[k, j] over memory) is bound by store-to-load forwarding.
constexpr int64_t CHUNK = 64;
constexpr int64_t LANES = 16;

// The wide layers take ROWS rows at a time, two vectors of outputs of each held in registers: each chunk
// of W loaded serves every row of the block. Row by row, every row read all of W, and a 256 x 256 layer
// (256 KiB) streamed from L2: Minesweeper's [256, 256] MLP acted at 27 us an observation (13.5 in blocks),
// no faster than numpy's BLAS calls. The sums are the same float32 operations in the same order as the
// row-by-row loop's, so a row's results do not depend on the rows beside it.
constexpr int64_t ROWS = 4;

// y[j0 .. j0 + C) of one row, for W stored (in, out), its C accumulators held across the input loop
template <int64_t C>
__attribute__((always_inline)) inline void dense_chunk(const Layer& l, const float* x, float* y, int64_t j0) {
    float acc[C];
    for (int64_t j = 0; j < C; ++j) acc[j] = l.b[j0 + j];
    for (int64_t k = 0; k < l.in; ++k) {
        const float xk = x[k];
        const float* w = l.w + k * l.out + j0;
        for (int64_t j = 0; j < C; ++j) acc[j] += xk * w[j];
    }
    for (int64_t j = 0; j < C; ++j) y[j0 + j] = acc[j];
}

// y[j] = b[j] + sum_k x[k] W[k, j] for one row, W stored (in, out): the wide layers
__attribute__((always_inline)) inline void dense_wide(const Layer& l, const float* x, float* y) {
    int64_t j0 = 0;
    for (; j0 + CHUNK <= l.out; j0 += CHUNK) dense_chunk<CHUNK>(l, x, y, j0);
    for (; j0 + LANES <= l.out; j0 += LANES) dense_chunk<LANES>(l, x, y, j0);
    for (; j0 < l.out; ++j0) dense_chunk<1>(l, x, y, j0);
}

// y[r][j0 .. j0 + 2 vectors) for the ROWS rows x[r] (`stride` floats apart, in y too), W stored (in, out):
// 8 accumulators, half of SSE2's and AVX2's 16 registers (a quarter of AVX-512's 32)
template <typename V>
__attribute__((always_inline)) inline void dense_block(const Layer& l, const float* x, float* y, int64_t stride,
                                                       int64_t j0) {
    constexpr int L = fastrl_ext::lanes_of<V>();
    V acc[ROWS][2], bias[2];
    fastrl_ext::load(bias[0], l.b + j0);
    fastrl_ext::load(bias[1], l.b + j0 + L);
    for (int64_t r = 0; r < ROWS; ++r) acc[r][0] = bias[0], acc[r][1] = bias[1];
    const float* w = l.w + j0;
    for (int64_t k = 0; k < l.in; ++k, w += l.out) {
        V w0, w1;
        fastrl_ext::load(w0, w);
        fastrl_ext::load(w1, w + L);
        for (int64_t r = 0; r < ROWS; ++r) {
            const float xk = x[r * stride + k];
            acc[r][0] += xk * w0;
            acc[r][1] += xk * w1;
        }
    }
    for (int64_t r = 0; r < ROWS; ++r) {
        fastrl_ext::store(y + r * stride + j0, acc[r][0]);
        fastrl_ext::store(y + r * stride + j0 + L, acc[r][1]);
    }
}

// the same for W stored (out, in): the narrow heads, one dot product per output in LANES partial sums
__attribute__((always_inline)) inline void dense_narrow(const Layer& l, const float* x, float* y) {
    const int64_t in = l.in;
    for (int64_t j = 0; j < l.out; ++j) {
        const float* w = l.w + j * in;
        float part[LANES] = {};
        int64_t k = 0;
        for (; k + LANES <= in; k += LANES) {
            for (int64_t i = 0; i < LANES; ++i) part[i] += x[k + i] * w[k + i];
        }
        float acc = 0.0f;
        for (; k < in; ++k) acc += x[k] * w[k];
        for (int64_t i = 0; i < LANES; ++i) acc += part[i];
        y[j] = l.b[j] + acc;
    }
}

// y = act(y) over n floats: 0 none, 1 tanh, 2 relu
__attribute__((always_inline)) inline void activate(float* y, int64_t n, int act) {
    if (act == 1) {
        tanh_row(y, y, n);
    } else if (act == 2) {
        for (int64_t j = 0; j < n; ++j) y[j] = std::max(y[j], 0.0f);
    }
}

// y = act(x W + b) for one row
__attribute__((always_inline)) inline void dense_row(const Layer& l, const float* x, float* y, int act) {
    if (l.by_output) {
        dense_narrow(l, x, y);
    } else {
        dense_wide(l, x, y);
    }
    activate(y, l.out, act);
}

// y = act(x W + b) for the ROWS rows of x (`stride` floats apart, in y too)
template <typename V>
__attribute__((always_inline)) inline void dense_rows(const Layer& l, const float* x, float* y, int64_t stride,
                                                      int act) {
    if (l.by_output) {
        for (int64_t r = 0; r < ROWS; ++r) dense_row(l, x + r * stride, y + r * stride, act);
        return;
    }
    int64_t j0 = 0;
    constexpr int64_t C = 2 * fastrl_ext::lanes_of<V>();
    for (; j0 + C <= l.out; j0 += C) dense_block<V>(l, x, y, stride, j0);
    // the last outputs (fewer than C) row by row, the same sums
    for (; j0 < l.out; ++j0)
        for (int64_t r = 0; r < ROWS; ++r) dense_chunk<1>(l, x + r * stride, y + r * stride, j0);
    for (int64_t r = 0; r < ROWS; ++r) activate(y + r * stride, l.out, act);
}

}  // namespace fastrl_ext::acting
