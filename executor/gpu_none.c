/* executor/gpu_none.c - a build without CUDA (SLUICE_CUDA off or no nvcc): no CUDA backend. */
#include <stddef.h>

#include "cuda/gpu.h"

const struct gpu_backend *gpu_backend_cuda(void)
{
    return NULL;
}
