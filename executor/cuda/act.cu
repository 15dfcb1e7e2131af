/* executor/cuda/act.cu - activations rounded as the CPU's kernels quantize them before a dot
 * product (executor_quantize_act: Q8_0, Q8_1, Q8_K, F16, BF16), then expanded back to f32, so a
 * matvec over them gives the CPU's (and llama.cpp's) result up to the order of the sums. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.h"
#include "gpu_impl.cuh"

#define ACT_THREADS 128

/* One block of 32 (Q8_0, Q8_1): d = amax / 127 stored as f16, q = round-half-even(x * 127 /
 * amax) clamped to [-128, 127]; out = f16(d) * q. */
static __global__ void k_act_q8_32(const float *x, int64_t x_stride, int64_t n, int64_t cols,
                                   float *out)
{
    const int64_t nb = cols / 32;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * nb)
        return;
    const int64_t t = i / nb, b = i % nb;
    const float  *xs = x + t * x_stride + b * 32;
    float        *ys = out + t * cols + b * 32;
    float         amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(xs[j]));
    const float d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    for (int j = 0; j < 32; j++) {
        int v = __float2int_rn(__fmul_rn(xs[j], id));
        v = v < -128 ? -128 : v > 127 ? 127 : v;
        ys[j] = __fmul_rn(d, (float)v);
    }
}

/* One block of 256 (Q8_K): the signed value of the largest magnitude (first one), iscale =
 * -127 / it, q = min(127, round-half-even(iscale * x)), d = 1 / iscale; out = d * q. */
static __global__ void k_act_q8_K(const float *x, int64_t x_stride, int64_t n, int64_t cols,
                                  float *out)
{
    const int64_t nb = cols / 256;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * nb)
        return;
    const int64_t t = i / nb, b = i % nb;
    const float  *xs = x + t * x_stride + b * 256;
    float        *ys = out + t * cols + b * 256;
    float         amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; j++)
        if (fabsf(xs[j]) > amax) {
            amax = fabsf(xs[j]);
            max = xs[j];
        }
    if (amax == 0.0f) {
        for (int j = 0; j < 256; j++)
            ys[j] = 0.0f;
        return;
    }
    const float iscale = __fdiv_rn(-127.0f, max);
    const float d = __fdiv_rn(1.0f, iscale);
    for (int j = 0; j < 256; j++) {
        int v = __float2int_rn(__fmul_rn(iscale, xs[j]));
        v = v > 127 ? 127 : v;
        ys[j] = __fmul_rn(d, (float)v);
    }
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
        k_act_q8_32<<<gpu_blocks(n * (cols / 32), ACT_THREADS), ACT_THREADS, 0, gpu_stream()>>>(
            x, x_stride, n, cols, out);
        return GPU_LAUNCHED("k_act_q8_32");
    case COMMON_GGML_TYPE_Q8_K:
        if (cols % 256)
            return gpu_record(cudaErrorInvalidValue, "gpu_act_round: cols not a multiple of 256");
        k_act_q8_K<<<gpu_blocks(n * (cols / 256), ACT_THREADS), ACT_THREADS, 0, gpu_stream()>>>(
            x, x_stride, n, cols, out);
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
