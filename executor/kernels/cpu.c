/* executor/kernels/cpu.c - run-time CPU feature detection (cpuid and OS-enabled register state). */
#include "kernels.h"

#include "kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* __builtin_cpu_supports() reads cpuid and also checks XCR0, so AVX/AVX-512 features are only
 * reported when the OS saves their registers. */
void executor_cpu_detect(struct executor_cpu_features *out)
{
    struct executor_cpu_features f = {0};
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    /* clang (14) has no "f16c" for __builtin_cpu_supports: read CPUID.1:ECX bit 29 directly. F16C
     * uses the AVX register state, which the avx2 check above has confirmed the OS saves. */
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    f.f16c = f.avx2 && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512dq = __builtin_cpu_supports("avx512dq");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512vnni = __builtin_cpu_supports("avx512vnni");
    f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
    *out = f;
}
