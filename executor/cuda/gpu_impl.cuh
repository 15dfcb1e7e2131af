/* executor/cuda/gpu_impl.cuh - private to executor/cuda/: the stream, error recording, launch
 * checks shared by the .cu files. */
#ifndef EXECUTOR_CUDA_GPU_IMPL_CUH
#define EXECUTOR_CUDA_GPU_IMPL_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpu.h"

/* The calling thread's device's stream (created by gpu_select; 0 before). */
cudaStream_t gpu_stream(void);
/* The calling thread's device (gpu_use). */
int gpu_current_device(void);
/* Records `err` with `what` for gpu_last_error; returns 0 for cudaSuccess, else -1. */
int gpu_record(cudaError_t err, const char *what);

/* The CUDA backend's operations (struct gpu_backend's members; gpu.h says what each does),
 * gathered into its table by gpu_backend_cuda (device.cu). */
int         cuda_device_count(char *why, size_t why_len);
int         cuda_select(int dev, struct gpu_info *info, char *why, size_t why_len);
int         cuda_use(int dev);
int         cuda_current(void);
const char *cuda_last_error(void);
void       *cuda_malloc(size_t bytes);
void        cuda_free(void *p);
int         cuda_upload(void *dst, const void *src, size_t bytes);
int         cuda_download(void *dst, const void *src, size_t bytes);
int         cuda_memset(void *dst, int byte, size_t bytes);
int         cuda_sync(void);
double      cuda_membw_probe(size_t bytes);
bool        cuda_type_supported(uint32_t type);
int         cuda_dequant_rows(uint32_t type, const void *w, size_t row_bytes, int64_t cols,
                              const int32_t *ids, int64_t n_rows, void *out, int64_t out_stride,
                              bool out_f16);
int         cuda_matvec(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                        const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride);
int         cuda_matvec_ids(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                            int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items, const float *x,
                            int64_t x_stride, int64_t x_div, float *y, int64_t y_stride);
int cuda_f32_to_f16(const float *x, int64_t x_stride, int64_t n, int64_t cols, uint16_t *out);
int cuda_gemm_f16(const uint16_t *w16, int64_t rows, int64_t cols, const uint16_t *x16, int64_t n,
                  float *y, int64_t y_stride);
int cuda_gemm_q(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes, int64_t rows,
                int64_t cols, const uint16_t *x16, int64_t n, const struct gpu_mm_tile *tiles,
                int64_t n_tiles, const int32_t *n_used, const int32_t *items, int32_t x_div,
                float *y, int64_t y_stride);
int cuda_moe_sort(const int32_t *sel, uint32_t n, uint32_t n_expert, int32_t tile, int32_t *items,
                  struct gpu_mm_tile *tiles, int32_t *n_tiles);
int cuda_act_round(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                   float *out);
int cuda_act_q8(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                void *q8);
int cuda_matvec_q8(int op, uint32_t type, const void *w, const void *w2, size_t row_bytes,
                   int64_t rows, int64_t cols, const void *q8, int64_t n, float *y,
                   int64_t y_stride);
int         cuda_matvec_q8_cat(uint32_t type, int n_mat, const void *const *w, const int64_t *rows,
                               size_t row_bytes, int64_t cols, const void *q8, float *const *y);
int cuda_matvec_ids_q8(uint32_t type, const void *w, const void *w2, size_t expert_bytes,
                       size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                       int64_t n_items, const void *q8, int64_t x_div, float *y, int64_t y_stride);
int cuda_matvec_ids_combine_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                               int64_t rows, int64_t cols, const int32_t *ids, const float *sel_w,
                               int64_t n_tok, int32_t k, const void *q8, float *x,
                               int64_t x_stride);
int cuda_matvec_groups_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                          int64_t rows, int64_t cols, const struct gpu_group *groups,
                          int64_t n_groups, const void *q8, float *y, int64_t y_stride);
int cuda_rmsnorm(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                 int64_t n_rows, int64_t width, float eps);
int cuda_rmsnorm_q8(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                    int64_t n_rows, int64_t width, float eps, uint32_t act_type, void *q8);
int cuda_add(float *y, const float *a, const float *b, int64_t n);
int cuda_add_bias(float *y, int64_t stride, const float *bias, int32_t n_bias, const int32_t *ids,
                  int64_t n_rows, int64_t width);
int cuda_scale_rows(float *y, int64_t stride, int64_t n_rows, int64_t width, float s);
int cuda_swiglu(float *g, const float *u, int64_t n, bool relu2);
int cuda_swiglu_oai(float *g, const float *u, int64_t n_rows, int64_t width, const float *gb,
                    const float *ub, int32_t n_bias, const int32_t *ids);
int cuda_rope(float *v, int64_t n_tok, int64_t tok_stride, uint32_t n_heads, uint32_t head_dim,
              uint32_t n_rot, const float *cs, bool neox);
int         cuda_rope_qk(float *q, int64_t q_stride, uint32_t n_head, float *k, int64_t k_stride,
                         uint32_t n_head_kv, int64_t n_tok, uint32_t head_dim, uint32_t n_rot,
                         const float *cs, bool neox, const float *q_norm, const float *k_norm, float eps,
                         const struct gpu_kv_dst *kv);
int cuda_kv_store(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                  const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                  uint32_t n_tok);
int cuda_attention(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                   uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                   uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v,
                   float scale, uint32_t window, float *scratch, const float *sinks);
int cuda_kv_store_q8(void *k_cache, void *v_cache, uint32_t k_width, uint32_t v_width,
                     const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                     uint32_t n_tok);
int cuda_attention_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                      uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                      uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v,
                      float scale, uint32_t window, float *scratch, const float *sinks);
int cuda_moe_route(const float *logits, const float *bias, uint32_t n_tok, uint32_t n_expert,
                   uint32_t k, uint32_t n_group, uint32_t n_group_used, int gating, bool norm,
                   float scale, int32_t *sel, float *sel_w);
int cuda_moe_combine(float *x, const float *y, const float *sel_w, uint32_t n_tok, uint32_t k,
                     uint32_t ne);
int cuda_gated_add(float *x, const float *y, const float *gate, uint32_t n_tok, uint32_t ne);
int cuda_gather_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                     const int32_t *rows, int64_t n, int64_t width);
int cuda_scatter_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                      const int32_t *rows, int64_t n, int64_t width);

/* silu(g) * u with the CPU's expressions and no fused multiply-adds (executor_fwd_dense_gate_up):
 * the swiglu kernel's, and the fused gate/up matvec's. */
static __device__ __forceinline__ float gpu_silu_mul(float g, float u)
{
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/* The int8 activations of one block of 32 (Q8_0, Q8_1), the whole warp, lane j holding value
 * j (v): *d = amax / 127 rounded to f16, q = round-half-even(v * 127 / amax) clamped to
 * [-128, 127], returned. */
static __device__ __forceinline__ int gpu_q8_32(float v, float *d)
{
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    *d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const int   q = __float2int_rn(__fmul_rn(v, id));
    return q < -128 ? -128 : q > 127 ? 127 : q;
}

/* The int8 activations of one block of 256 (Q8_K), the whole warp, lane l holding values
 * l, 32 + l, .. (v[8]): the signed value of the largest magnitude (the first one), iscale =
 * -127 / it, q[k] = min(127, round-half-even(iscale * v[k])), *d = 1 / iscale; all 0 for a block
 * of zeros (*zero). */
static __device__ __forceinline__ void gpu_q8_K(const float v[8], int lane, int q[8], float *d,
                                                bool *zero)
{
    float amax = 0.0f, max = 0.0f;
    int   at = 256; /* the index of max; 256 = none */
#pragma unroll
    for (int k = 0; k < 8; k++) {
        if (fabsf(v[k]) > amax) { /* in increasing index: the lane's first largest */
            amax = fabsf(v[k]);
            max = v[k];
            at = k * 32 + lane;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
        const float om = __shfl_xor_sync(0xffffffffu, max, o);
        const int   oi = __shfl_xor_sync(0xffffffffu, at, o);
        if (oa > amax || (oa == amax && oi < at)) {
            amax = oa;
            max = om;
            at = oi;
        }
    }
    *zero = amax == 0.0f;
    const float iscale = *zero ? 0.0f : __fdiv_rn(-127.0f, max);
    *d = *zero ? 0.0f : __fdiv_rn(1.0f, iscale);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int r = *zero ? 0 : __float2int_rn(__fmul_rn(iscale, v[k]));
        q[k] = r > 127 ? 127 : r;
    }
}

/* After a launch: the launch error (bad configuration), recorded under the kernel's name. */
#define GPU_LAUNCHED(name) gpu_record(cudaGetLastError(), name)

/* Blocks of `threads` covering n items. */
static inline unsigned gpu_blocks(long long n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

#endif /* EXECUTOR_CUDA_GPU_IMPL_CUH */
