/* executor/kernels/avx2.c - AVX2+FMA+F16C dot products and activation quantizers. */
#include "kernels.h"

#include "kernels_impl.h"

void executor_kernels_fill_avx2(struct executor_kernel_set *ks)
{
    (void)ks;
}
