/* executor/kernels/cpu.c - run-time CPU feature detection (cpuid and OS-enabled register state). */
#include "kernels.h"

#include "kernels_impl.h"

/* __builtin_cpu_supports() reads cpuid and also checks XCR0, so AVX/AVX-512 features are only
 * reported when the OS saves their registers. */
void executor_cpu_detect(struct executor_cpu_features *out)
{
    struct executor_cpu_features f = {0};
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.f16c = __builtin_cpu_supports("f16c");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512dq = __builtin_cpu_supports("avx512dq");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512vnni = __builtin_cpu_supports("avx512vnni");
    f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
    *out = f;
}
