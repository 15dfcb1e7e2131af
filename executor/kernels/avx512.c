/* executor/kernels/avx512.c - AVX-512 (F/BW/VL/VNNI) dot products and activation quantizers. */
#include "kernels.h"

#include "kernels_impl.h"

void executor_kernels_fill_avx512(struct executor_kernel_set *ks)
{
    (void)ks;
}
