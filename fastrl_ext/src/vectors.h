// fastrl_ext: the vector types that _mlp's products and _acting's blocks of rows are written in, one per
// target: GCC and clang compile each to one register of the enclosing function's target. Written out
// because GCC 12 would not vectorise the accumulator arrays of the plain loops across the k loop (they
// stayed scalar: ~3.5 GMAC/s); and one per target because a 16-float type in an AVX2 function was
// lowered to element-by-element code (4x slower than torch; in _acting, 3x slower than row by row).
#pragma once

namespace fastrl_ext {

typedef float Vec16 __attribute__((vector_size(16 * sizeof(float))));  // AVX-512
typedef float Vec8 __attribute__((vector_size(8 * sizeof(float))));    // AVX2
typedef float Vec4 __attribute__((vector_size(4 * sizeof(float))));    // SSE2, the plain x86-64 baseline

// Loads and stores go through a 4-byte-aligned alias of each type, GCC's idiom for an unaligned vector
// access: a memcpy into an array of them became 16-byte pieces re-read as one wider load, a
// store-forwarding stall that took half of _mlp's AVX2 variant's time.
template <typename V> struct Unaligned;
template <> struct Unaligned<Vec16> { typedef float type __attribute__((vector_size(64), aligned(4), may_alias)); };
template <> struct Unaligned<Vec8> { typedef float type __attribute__((vector_size(32), aligned(4), may_alias)); };
template <> struct Unaligned<Vec4> { typedef float type __attribute__((vector_size(16), aligned(4), may_alias)); };

template <typename V>
__attribute__((always_inline)) inline void load(V& v, const float* p) {
    v = *reinterpret_cast<const typename Unaligned<V>::type*>(p);
}
template <typename V>
__attribute__((always_inline)) inline void store(float* p, const V& v) {
    *reinterpret_cast<typename Unaligned<V>::type*>(p) = v;
}

// floats in one V
template <typename V>
constexpr int lanes_of() {
    return static_cast<int>(sizeof(V) / sizeof(float));
}

}  // namespace fastrl_ext
