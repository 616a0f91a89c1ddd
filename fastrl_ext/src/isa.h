// fastrl_ext: which instruction-set variant of a vectorised loop to run, shared by _acting and
// _activations. Each compiles the same loop three times (plain x86-64, i.e. SSE2; AVX2+FMA; AVX-512)
// so that a build stays portable while the loops use the widest vectors the CPU has, and picks one
// at import. FASTRL_ACTING_ISA=avx2|default caps the pick, so the tests run every variant on one
// machine.
#pragma once

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FASTRL_X86_VARIANTS 1
#define FASTRL_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define FASTRL_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx2,fma")))
#else
#define FASTRL_X86_VARIANTS 0
#endif

namespace fastrl_ext {

// 0: plain, 1: AVX2+FMA, 2: AVX-512 (F, VL, DQ): an index into a module's {plain, avx2, avx512} table
inline int isa_level() {
#if FASTRL_X86_VARIANTS
    __builtin_cpu_init();
    const char* cap = std::getenv("FASTRL_ACTING_ISA");
    const bool allow_512 = cap == nullptr || *cap == 0 || std::strcmp(cap, "avx512") == 0;
    const bool allow_256 = allow_512 || std::strcmp(cap, "avx2") == 0;
    if (allow_512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq")) {
        return 2;
    }
    if (allow_256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    return 0;
}

inline const char* isa_name(int level) {
    static const char* const names[] = {"default", "avx2", "avx512"};
    return names[level];
}

}  // namespace fastrl_ext
