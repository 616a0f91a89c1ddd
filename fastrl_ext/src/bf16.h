// fastrl_ext: float32 -> bf16 bits, rounded to nearest even as torch rounds, shared by _frames (the
// CNN's input) and _optim (the learner's working copy). Branch-free, so that the loops calling it
// still vectorise.
#pragma once

#include <cstdint>
#include <cstring>

namespace fastrl_ext {

__attribute__((always_inline)) inline uint16_t bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // to nearest even
    const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;                 // stays a quiet NaN, as in torch
    return static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

}  // namespace fastrl_ext
