/* executor/cuda/act.cu - activations rounded as the CPU's kernels quantize them before a dot
 * product (executor_quantize_act: Q8_0, Q8_1, Q8_K, F16, BF16), then expanded back to f32, so a
 * matvec over them gives the CPU's (and llama.cpp's) result up to the order of the sums. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.h"
#include "gpu_impl.cuh"

#define ACT_THREADS 128

/* One warp per block of 32 (Q8_0, Q8_1), lane j on value j (gpu_q8_32): out = f16(d) * q
 * (OUT), and the q8 image's q and d (Q8). */
template <bool OUT, bool Q8>
static __global__ void k_act_q8_32(const float *x, int64_t x_stride, int64_t n, int64_t cols,
                                   float *out, uint8_t *q8)
{
    const int64_t nb = cols / 32;
    const int64_t wi = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int     lane = threadIdx.x & 31;
    if (wi >= n * nb) /* the whole warp leaves together */
        return;
    const int64_t t = wi / nb, b = wi % nb;
    float         d;
    const int     q = gpu_q8_32(x[t * x_stride + b * 32 + lane], &d);
    if (OUT)
        out[t * cols + b * 32 + lane] = __fmul_rn(d, (float)q);
    if (Q8) {
        uint8_t *row = q8 + t * (int64_t)gpu_q8_row_bytes(cols);
        row[b * 32 + lane] = (uint8_t)(int8_t)q;
        if (lane == 0)
            reinterpret_cast<float *>(row + cols)[b] = d;
    }
}

/* One warp per block of 256 (Q8_K), lane l on values l, 32 + l, .. (gpu_q8_K): out = d * q
 * (OUT), and the q8 image's q and d, d for each of the eight 32s (Q8). */
template <bool OUT, bool Q8>
static __global__ void k_act_q8_K(const float *x, int64_t x_stride, int64_t n, int64_t cols,
                                  float *out, uint8_t *q8)
{
    const int64_t nb = cols / 256;
    const int64_t wi = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int     lane = threadIdx.x & 31;
    if (wi >= n * nb)
        return;
    const int64_t t = wi / nb, b = wi % nb;
    const float  *xs = x + t * x_stride + b * 256;
    float         v[8], d;
    int           q[8];
    bool          zero;
#pragma unroll
    for (int k = 0; k < 8; k++)
        v[k] = xs[k * 32 + lane];
    gpu_q8_K(v, lane, q, &d, &zero);
    float   *ys = OUT ? out + t * cols + b * 256 : nullptr;
    uint8_t *row = Q8 ? q8 + t * (int64_t)gpu_q8_row_bytes(cols) : nullptr;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        if (OUT)
            ys[k * 32 + lane] = zero ? 0.0f : __fmul_rn(d, (float)q[k]);
        if (Q8)
            row[b * 256 + k * 32 + lane] = (uint8_t)(int8_t)q[k];
    }
    if (Q8 && lane < 8)
        reinterpret_cast<float *>(row + cols)[b * 8 + lane] = d;
}

/* F16 / BF16: each value rounded to nearest even. */
template <bool BF>
static __global__ void k_act_half(const float *x, int64_t x_stride, int64_t n, int64_t cols,
                                  float *out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * cols)
        return;
    const float v = x[(i / cols) * x_stride + i % cols];
    out[i] = BF ? __bfloat162float(__float2bfloat16_rn(v)) : __half2float(__float2half_rn(v));
}

int cuda_act_round(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                   float *out)
{
    if (!x || !out || n < 0 || cols < 0 || x_stride < cols)
        return gpu_record(cudaErrorInvalidValue, "gpu_act_round: bad arguments");
    if (n == 0 || cols == 0)
        return 0;
    switch (act_type) {
    case COMMON_GGML_TYPE_Q8_0:
    case COMMON_GGML_TYPE_Q8_1:
        if (cols % 32)
            return gpu_record(cudaErrorInvalidValue, "gpu_act_round: cols not a multiple of 32");
        k_act_q8_32<true, false>
            <<<gpu_blocks(n * (cols / 32) * 32, ACT_THREADS), ACT_THREADS, 0, gpu_stream()>>>(
                x, x_stride, n, cols, out, nullptr);
        return GPU_LAUNCHED("k_act_q8_32");
    case COMMON_GGML_TYPE_Q8_K:
        if (cols % 256)
            return gpu_record(cudaErrorInvalidValue, "gpu_act_round: cols not a multiple of 256");
        k_act_q8_K<true, false>
            <<<gpu_blocks(n * (cols / 256) * 32, ACT_THREADS), ACT_THREADS, 0, gpu_stream()>>>(
                x, x_stride, n, cols, out, nullptr);
        return GPU_LAUNCHED("k_act_q8_K");
    case COMMON_GGML_TYPE_F16:
        k_act_half<false><<<gpu_blocks(n * cols, ACT_THREADS), ACT_THREADS, 0, gpu_stream()>>>(
            x, x_stride, n, cols, out);
        return GPU_LAUNCHED("k_act_half");
    case COMMON_GGML_TYPE_BF16:
        k_act_half<true><<<gpu_blocks(n * cols, ACT_THREADS), ACT_THREADS, 0, gpu_stream()>>>(
            x, x_stride, n, cols, out);
        return GPU_LAUNCHED("k_act_half");
    default:
        return gpu_record(cudaErrorInvalidValue, "gpu_act_round: not an activation type");
    }
}

int cuda_act_q8(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                void *q8)
{
    if (!x || !q8 || n < 0 || cols < 0 || cols % 32 || x_stride < cols)
        return gpu_record(cudaErrorInvalidValue, "gpu_act_q8: bad arguments");
    if (n == 0 || cols == 0)
        return 0;
    uint8_t *img = static_cast<uint8_t *>(q8);
    switch (act_type) {
    case COMMON_GGML_TYPE_Q8_0:
    case COMMON_GGML_TYPE_Q8_1:
        k_act_q8_32<false, true>
            <<<gpu_blocks(n * (cols / 32) * 32, ACT_THREADS), ACT_THREADS, 0, gpu_stream()>>>(
                x, x_stride, n, cols, nullptr, img);
        return GPU_LAUNCHED("k_act_q8_32");
    case COMMON_GGML_TYPE_Q8_K:
        if (cols % 256)
            return gpu_record(cudaErrorInvalidValue, "gpu_act_q8: cols not a multiple of 256");
        k_act_q8_K<false, true>
            <<<gpu_blocks(n * (cols / 256) * 32, ACT_THREADS), ACT_THREADS, 0, gpu_stream()>>>(
                x, x_stride, n, cols, nullptr, img);
        return GPU_LAUNCHED("k_act_q8_K");
    default:
        return gpu_record(cudaErrorInvalidValue, "gpu_act_q8: not an int8 activation type");
    }
}
