// Hot loops built twice, for AVX2 and for baseline x86-64, the one to run picked when the
// process loads (GCC's target_clones: an ifunc resolver chooses by the CPU).
//
// Not under ThreadSanitizer: the resolvers run during relocation, before its runtime is up,
// and its instrumentation of them crashes the program before main. Nor with other compilers
// or CPUs. There the attribute is empty and the baseline build runs alone.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
// AVX2 without FMA: every product and sum rounds as in the baseline build, so both clones
// give the same bits (the coordinator's fold and update check).
#define TESSERA_CLONES_AVX2 __attribute__((target_clones("avx2", "default")))
// AVX2 with FMA: fused multiply-adds round once where the baseline rounds twice, so results
// may differ in the last bit between machines (the CPU device's kernels).
#define TESSERA_CLONES_AVX2_FMA __attribute__((target_clones("avx2,fma", "default")))
#else
#define TESSERA_CLONES_AVX2
#define TESSERA_CLONES_AVX2_FMA
#endif
