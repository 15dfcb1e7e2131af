/* executor/cuda/gpu_impl.cuh - private to executor/cuda/: the stream, error recording, launch
 * checks shared by the .cu files. */
#ifndef EXECUTOR_CUDA_GPU_IMPL_CUH
#define EXECUTOR_CUDA_GPU_IMPL_CUH

#include <cuda_runtime.h>

#include "gpu.h"

/* The backend's stream (created by gpu_select; 0 before). */
cudaStream_t gpu_stream(void);
/* Records `err` with `what` for gpu_last_error; returns 0 for cudaSuccess, else -1. */
int gpu_record(cudaError_t err, const char *what);

/* After a launch: the launch error (bad configuration), recorded under the kernel's name. */
#define GPU_LAUNCHED(name) gpu_record(cudaGetLastError(), name)

/* Blocks of `threads` covering n items. */
static inline unsigned gpu_blocks(long long n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

#endif /* EXECUTOR_CUDA_GPU_IMPL_CUH */
