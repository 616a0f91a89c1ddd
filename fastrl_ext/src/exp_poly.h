// fastrl_ext: a branch-free float32 exp for arguments in [-86, 0], inlined into vectorised loops (the tanh of
// tanh_row.h, the policy head's softmax). std::exp is a call per element, which keeps a loop scalar.
#pragma once

#include <cstdint>
#include <cstring>

namespace fastrl_ext {

// exp(y) for y in [-86, 0] (callers clamp): 2^k p(r) with k = round(y / ln 2), r = y - k ln 2 (split in two
// constants) and p the degree-7 Taylor polynomial (|r| <= ln2 / 2: relative error < 1e-8), so within a few
// ulps of std::exp. Down to -86 the result stays a normal float (no denormal arithmetic).
__attribute__((always_inline)) inline float exp_in_range(float y) {
    const float t = y * 1.44269504088896341f;
    const float kf = (t + 12582912.0f) - 12582912.0f;  // round to nearest: 1.5 * 2^23
    const float r = (y - kf * 0.693359375f) - kf * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

}  // namespace fastrl_ext
