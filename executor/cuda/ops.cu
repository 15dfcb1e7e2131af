/* executor/cuda/ops.cu - the layer operations other than the weight products: RMS norm, adds,
 * SwiGLU, RoPE, the f16 KV store, attention, MoE routing and combination, row gather/scatter. */
#include <cuda_fp16.h>
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpu_impl.cuh"

#define OPS_THREADS        256  /* threads of the elementwise kernels */
#define OPS_MAX_BLOCKS     4096 /* elementwise kernels loop over the rest (grid-stride) */
#define OPS_ATT_THREADS    256  /* threads of one (token, head) attention block */
#define OPS_ATT_MAX_DIM    4096 /* largest head dim: query and partial sums in shared memory */
#define OPS_ATT_MIN_BLOCKS 512  /* fewer (token, head) rows than this split their positions */
#define OPS_ATT_MAX_SPLIT  32   /* most chunks of one row */
#define OPS_ATT_MIN_CHUNK  256  /* fewest positions of a chunk (and at least head_dim_v + 2) */
#define OPS_ROUTE_MAX_E    4096 /* most experts: probabilities and scores sit in shared memory */
#define OPS_ROUTE_MAX_K    64   /* most experts chosen per token */
#define OPS_FULL_MASK      0xffffffffu
#define OPS_FA_MIN_TOK     16 /* from this many tokens on, attention takes the tensor-core kernel */
#define OPS_Q8_BLOCK       34 /* a q8_0 cache block: an f16 scale and 32 int8 */

/* Grid of the grid-stride elementwise kernels for n items. */
static unsigned ops_grid(long long n)
{
    unsigned b = gpu_blocks(n, OPS_THREADS);
    return b < OPS_MAX_BLOCKS ? b : OPS_MAX_BLOCKS;
}

static int ops_bad(const char *what)
{
    return gpu_record(cudaErrorInvalidValue, what);
}

/* ---- block reductions --------------------------------------------------------------------- */

struct ops_sum {
    template <class T> __device__ T operator()(T a, T b) const
    {
        return a + b;
    }
};

struct ops_max {
    __device__ float operator()(float a, float b) const
    {
        return fmaxf(a, b);
    }
};

template <class T, class Op> static __device__ T ops_warp_reduce(T v, Op op)
{
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(OPS_FULL_MASK, v, o));
    return v;
}

/* The reduction of every thread's v, returned to every thread. Called by all threads of the
 * block (blockDim.x a multiple of 32); `red` is a shared array of 32; ends with a barrier, so
 * `red` may be reused at once, and global or shared writes made before the call are visible to
 * the whole block after it. */
template <class T, class Op> static __device__ T ops_block_reduce(T v, Op op, T *red)
{
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    v = ops_warp_reduce(v, op);
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    T r = red[0];
    for (unsigned w = 1; w < blockDim.x / 32u; w++)
        r = op(r, red[w]);
    __syncthreads();
    return r;
}

/* ---- RMS norm ----------------------------------------------------------------------------- */

/* The threads of a row's norm: the reduction's order, so that the fused kernels give
 * ops_rmsnorm_kernel's bits. */
static unsigned ops_norm_threads(int64_t width)
{
    return width <= 1024 ? 256u : 1024u;
}

/* The scale of an RMS norm of the `width` values at xr, as fwd_rmsnorm's: each square in f32,
 * their sum in double (thread i taking i, i + blockDim.x, .., then the block's reduction), then
 * 1 / sqrtf(mean + eps). Called by every thread of the block; `red` as ops_block_reduce's. */
static __device__ float ops_rms_scale(const float *xr, int64_t width, float eps, double *red)
{
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = xr[i];
        sum += (double)(v * v);
    }
    sum = ops_block_reduce(sum, ops_sum(), red);
    const float mean = (float)(sum / (double)width);
    return __fdiv_rn(1.0f, __fsqrt_rn(mean + eps));
}

/* One block per row. As fwd_rmsnorm: each square in f32, their sum in double, then
 * y = (x * scale) * w with scale = 1 / sqrtf(mean + eps). y may be x: each thread rewrites only
 * the elements it read, after the reduction's barrier. */
static __global__ void ops_rmsnorm_kernel(float *y, int64_t y_stride, const float *x,
                                          int64_t x_stride, const float *w, int64_t width,
                                          float eps)
{
    __shared__ double red[32];
    const float      *xr = x + (int64_t)blockIdx.x * x_stride;
    float            *yr = y + (int64_t)blockIdx.x * y_stride;
    const float       scale = ops_rms_scale(xr, width, eps, red);
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
        yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

int cuda_rmsnorm(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                 int64_t n_rows, int64_t width, float eps)
{
    if (!y || !x || !w || n_rows < 0 || n_rows > INT32_MAX || width < 1 || y_stride < width ||
        x_stride < width)
        return ops_bad("gpu_rmsnorm: bad arguments");
    if (n_rows == 0)
        return 0;
    const unsigned threads = ops_norm_threads(width);
    ops_rmsnorm_kernel<<<(unsigned)n_rows, threads, 0, gpu_stream()>>>(y, y_stride, x, x_stride, w,
                                                                       width, eps);
    return GPU_LAUNCHED("ops_rmsnorm_kernel");
}

/* ops_rmsnorm_kernel, then the q8 image of the row (k_act_q8_32 or k_act_q8_K's, K256): warp w
 * takes blocks w, w + warps, .., each lane recomputing its normalised values as the norm does. */
template <bool K256>
static __global__ void ops_rmsnorm_q8_kernel(float *y, int64_t y_stride, const float *x,
                                             int64_t x_stride, const float *w, int64_t width,
                                             float eps, uint8_t *q8)
{
    __shared__ double red[32];
    const float      *xr = x + (int64_t)blockIdx.x * x_stride;
    float            *yr = y + (int64_t)blockIdx.x * y_stride;
    uint8_t          *row = q8 + (int64_t)blockIdx.x * (int64_t)gpu_q8_row_bytes(width);
    float            *ds = reinterpret_cast<float *>(row + width);
    const float       scale = ops_rms_scale(xr, width, eps, red);
    const int   lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (!K256) {
        for (int64_t b = warp; b < width / 32; b += warps) {
            const int64_t i = b * 32 + lane;
            const float   v = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
            float         d;
            yr[i] = v;
            row[i] = (uint8_t)(int8_t)gpu_q8_32(v, &d);
            if (lane == 0)
                ds[b] = d;
        }
    }
    for (int64_t b = warp; K256 && b < width / 256; b += warps) {
        float v[8], d;
        int   q[8];
        bool  zero;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int64_t i = b * 256 + k * 32 + lane;
            v[k] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
            yr[i] = v[k];
        }
        gpu_q8_K(v, lane, q, &d, &zero);
#pragma unroll
        for (int k = 0; k < 8; k++)
            row[b * 256 + k * 32 + lane] = (uint8_t)(int8_t)q[k];
        if (lane < 8)
            ds[b * 8 + lane] = d;
    }
}

int cuda_rmsnorm_q8(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                    int64_t n_rows, int64_t width, float eps, uint32_t act_type, void *q8)
{
    const bool k256 = act_type == COMMON_GGML_TYPE_Q8_K;
    if (!y || !x || !w || !q8 || y == x || n_rows < 0 || n_rows > INT32_MAX || width < 1 ||
        y_stride < width || x_stride < width || width % (k256 ? 256 : 32) ||
        (reinterpret_cast<uintptr_t>(q8) & 3) ||
        (!k256 && act_type != COMMON_GGML_TYPE_Q8_0 && act_type != COMMON_GGML_TYPE_Q8_1))
        return ops_bad("gpu_rmsnorm_q8: bad arguments");
    if (n_rows == 0)
        return 0;
    uint8_t *img = static_cast<uint8_t *>(q8);
    if (k256)
        ops_rmsnorm_q8_kernel<true><<<(unsigned)n_rows, ops_norm_threads(width), 0, gpu_stream()>>>(
            y, y_stride, x, x_stride, w, width, eps, img);
    else
        ops_rmsnorm_q8_kernel<false>
            <<<(unsigned)n_rows, ops_norm_threads(width), 0, gpu_stream()>>>(
                y, y_stride, x, x_stride, w, width, eps, img);
    return GPU_LAUNCHED("ops_rmsnorm_q8_kernel");
}

/* ---- elementwise -------------------------------------------------------------------------- */

static __global__ void ops_add_kernel(float *y, const float *a, const float *b, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(a[i], b[i]);
}

int cuda_add(float *y, const float *a, const float *b, int64_t n)
{
    if (!y || !a || !b || n < 0)
        return ops_bad("gpu_add: bad arguments");
    if (n == 0)
        return 0;
    ops_add_kernel<<<ops_grid(n), OPS_THREADS, 0, gpu_stream()>>>(y, a, b, n);
    return GPU_LAUNCHED("ops_add_kernel");
}

/* Row r's bias row: ids[r] (row 0 without ids), or -1 when it is out of range. */
static __device__ __forceinline__ int64_t ops_bias_row(const int32_t *ids, int64_t r,
                                                       int32_t n_bias)
{
    const int32_t e = ids ? __ldg(ids + r) : 0;
    return e >= 0 && e < n_bias ? e : -1;
}

static __global__ void ops_add_bias_kernel(float *y, int64_t stride, const float *bias,
                                           int32_t n_bias, const int32_t *ids, int64_t n_rows,
                                           int64_t width)
{
    const int64_t n = n_rows * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / width, c = i - r * width, e = ops_bias_row(ids, r, n_bias);
        float        *p = y + r * stride + c;
        if (e >= 0)
            *p = __fadd_rn(*p, bias[e * width + c]);
    }
}

int cuda_add_bias(float *y, int64_t stride, const float *bias, int32_t n_bias, const int32_t *ids,
                  int64_t n_rows, int64_t width)
{
    if (!y || !bias || n_bias < 1 || n_rows < 0 || width < 0 || stride < width)
        return ops_bad("gpu_add_bias: bad arguments");
    if (n_rows == 0 || width == 0)
        return 0;
    ops_add_bias_kernel<<<ops_grid(n_rows * width), OPS_THREADS, 0, gpu_stream()>>>(
        y, stride, bias, n_bias, ids, n_rows, width);
    return GPU_LAUNCHED("ops_add_bias_kernel");
}

static __global__ void ops_scale_rows_kernel(float *y, int64_t stride, int64_t n_rows,
                                             int64_t width, float s)
{
    const int64_t n = n_rows * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / width, c = i - r * width;
        float        *p = y + r * stride + c;
        *p = __fmul_rn(*p, s);
    }
}

int cuda_scale_rows(float *y, int64_t stride, int64_t n_rows, int64_t width, float s)
{
    if (!y || n_rows < 0 || width < 0 || stride < width)
        return ops_bad("gpu_scale_rows: bad arguments");
    if (n_rows == 0 || width == 0)
        return 0;
    ops_scale_rows_kernel<<<ops_grid(n_rows * width), OPS_THREADS, 0, gpu_stream()>>>(
        y, stride, n_rows, width, s);
    return GPU_LAUNCHED("ops_scale_rows_kernel");
}

/* The CPU's expressions (executor_fwd_dense_gate_up), with no fused multiply-adds. */
static __global__ void ops_swiglu_kernel(float *g, const float *u, int64_t n, bool relu2)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float x = g[i];
        if (relu2) {
            const float r = x > 0.0f ? x : 0.0f;
            g[i] = __fmul_rn(__fmul_rn(r, r), u[i]);
        } else {
            g[i] = gpu_silu_mul(x, u[i]);
        }
    }
}

int cuda_swiglu(float *g, const float *u, int64_t n, bool relu2)
{
    if (!g || !u || n < 0)
        return ops_bad("gpu_swiglu: bad arguments");
    if (n == 0)
        return 0;
    ops_swiglu_kernel<<<ops_grid(n), OPS_THREADS, 0, gpu_stream()>>>(g, u, n, relu2);
    return GPU_LAUNCHED("ops_swiglu_kernel");
}

/* executor_fwd_oai_gate_up's expressions, with no fused multiply-adds. */
static __global__ void ops_swiglu_oai_kernel(float *g, const float *u, int64_t n_rows,
                                             int64_t width, const float *gb, const float *ub,
                                             int32_t n_bias, const int32_t *ids)
{
    const float   alpha = 1.702f, limit = 7.0f;
    const int64_t n = n_rows * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / width, c = i - r * width, e = ops_bias_row(ids, r, n_bias);
        if (e < 0)
            continue;
        const float gv = __fadd_rn(g[i], gb[e * width + c]);
        const float uv = __fadd_rn(u[i], ub[e * width + c]);
        const float x = gv < limit ? gv : limit;
        const float y = uv < -limit ? -limit : uv > limit ? limit : uv;
        const float s = __fdiv_rn(x, __fadd_rn(1.0f, expf(__fmul_rn(alpha, -x))));
        g[i] = __fmul_rn(s, __fadd_rn(y, 1.0f));
    }
}

int cuda_swiglu_oai(float *g, const float *u, int64_t n_rows, int64_t width, const float *gb,
                    const float *ub, int32_t n_bias, const int32_t *ids)
{
    if (!g || !u || !gb || !ub || n_bias < 1 || n_rows < 0 || width < 0)
        return ops_bad("gpu_swiglu_oai: bad arguments");
    if (n_rows == 0 || width == 0)
        return 0;
    ops_swiglu_oai_kernel<<<ops_grid(n_rows * width), OPS_THREADS, 0, gpu_stream()>>>(
        g, u, n_rows, width, gb, ub, n_bias, ids);
    return GPU_LAUNCHED("ops_swiglu_oai_kernel");
}

/* ---- RoPE --------------------------------------------------------------------------------- */

/* Rotated pair i of a head (of n_rot = 2 * half dims): its dimensions *a, *b ((2i, 2i+1), or
 * (i, i + half) with neox) and their values rotated by the (cos, sin) pair i of the token's cs,
 * read from src: x0' = x0 * c - x1 * s, x1' = x0 * s + x1 * c, fwd_rope_apply's arithmetic. */
static __device__ __forceinline__ void ops_rope_pair(const float *src, const float *cs, uint32_t i,
                                                     uint32_t half, bool neox, uint32_t *a,
                                                     uint32_t *b, float *ya, float *yb)
{
    *a = neox ? i : 2 * i;
    *b = neox ? i + half : 2 * i + 1;
    const float c = cs[2 * i], s = cs[2 * i + 1], x0 = src[*a], x1 = src[*b];
    *ya = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    *yb = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

/* One thread per rotated pair (token, head, i); fwd_rope_apply's arithmetic, unfused. */
static __global__ void ops_rope_kernel(float *v, int64_t n_tok, int64_t tok_stride,
                                       uint32_t n_heads, uint32_t head_dim, uint32_t n_rot,
                                       const float *cs, bool neox)
{
    const uint32_t half = n_rot / 2;
    const int64_t  n = n_tok * n_heads * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t i = (uint32_t)(idx % half);
        const int64_t  th = idx / half;
        const uint32_t h = (uint32_t)(th % n_heads);
        const int64_t  t = th / n_heads;
        float         *x = v + t * tok_stride + (int64_t)h * head_dim;
        uint32_t       a, b;
        float          ya, yb;
        ops_rope_pair(x, cs + t * n_rot, i, half, neox, &a, &b, &ya, &yb);
        x[a] = ya;
        x[b] = yb;
    }
}

int cuda_rope(float *v, int64_t n_tok, int64_t tok_stride, uint32_t n_heads, uint32_t head_dim,
              uint32_t n_rot, const float *cs, bool neox)
{
    if (!v || !cs || n_tok < 0 || n_rot > head_dim ||
        tok_stride < (int64_t)n_heads * (int64_t)head_dim)
        return ops_bad("gpu_rope: bad arguments");
    const int64_t n = n_tok * n_heads * (int64_t)(n_rot / 2);
    if (n == 0)
        return 0;
    ops_rope_kernel<<<ops_grid(n), OPS_THREADS, 0, gpu_stream()>>>(v, n_tok, tok_stride, n_heads,
                                                                   head_dim, n_rot, cs, neox);
    return GPU_LAUNCHED("ops_rope_kernel");
}

/* One block per (token, head) of q (the first n_head of a token), of k (the next n_head_kv),
 * and with a cache store (kv.k_cache not NULL) of v (the last n_head_kv): a q or k head's values,
 * normalised as ops_rmsnorm_kernel does where a norm is given, into shared memory, then rotated
 * as ops_rope_kernel does and written back, a key's also to the cache as ops_kv_store_kernel
 * does; a value head to the cache. */
static __global__ void ops_rope_qk_kernel(float *q, int64_t q_stride, uint32_t n_head, float *k,
                                          int64_t k_stride, uint32_t n_head_kv, uint32_t head_dim,
                                          uint32_t n_rot, const float *cs, bool neox,
                                          const float *q_norm, const float *k_norm, float eps,
                                          const gpu_kv_dst kv)
{
    __shared__ double       red[32];
    extern __shared__ float hv[]; /* head_dim */
    const uint32_t          per = n_head + n_head_kv + (kv.k_cache ? n_head_kv : 0);
    const int64_t           t = blockIdx.x / per;
    const uint32_t          h = blockIdx.x % per;
    const int64_t pos = kv.k_cache ? (int64_t)(kv.pos_dev ? *kv.pos_dev : kv.pos0) + t : 0;
    if (h >= n_head + n_head_kv) { /* a value head: its row into the cache */
        const uint32_t hvd = kv.head_dim_v, vw = n_head_kv * hvd, hh = h - n_head - n_head_kv;
        const float   *vr = kv.v + t * vw + (int64_t)hh * hvd;
        uint16_t      *vc = kv.v_cache + pos * vw + (int64_t)hh * hvd;
        for (uint32_t i = threadIdx.x; i < hvd; i += blockDim.x)
            vc[i] = __half_as_ushort(__float2half_rn(vr[i]));
        return;
    }
    const bool   isq = h < n_head;
    float       *x = isq ? q + t * q_stride + (int64_t)h * head_dim
                         : k + t * k_stride + (int64_t)(h - n_head) * head_dim;
    uint16_t    *kc = !isq && kv.k_cache ? kv.k_cache + pos * (int64_t)n_head_kv * head_dim +
                                            (int64_t)(h - n_head) * head_dim
                                         : nullptr;
    const float *nw = isq ? q_norm : k_norm;
    float        scale = 1.0f;
    if (nw) /* uniform over the block: every thread takes part in the reduction */
        scale = ops_rms_scale(x, head_dim, eps, red);
    for (uint32_t i = threadIdx.x; i < head_dim; i += blockDim.x)
        hv[i] = nw ? __fmul_rn(__fmul_rn(x[i], scale), nw[i]) : x[i];
    __syncthreads();
    const uint32_t half = n_rot / 2;
    for (uint32_t i = threadIdx.x; i < half; i += blockDim.x) {
        uint32_t a, b;
        float    ya, yb;
        ops_rope_pair(hv, cs + t * n_rot, i, half, neox, &a, &b, &ya, &yb);
        x[a] = ya;
        x[b] = yb;
        if (kc) {
            kc[a] = __half_as_ushort(__float2half_rn(ya));
            kc[b] = __half_as_ushort(__float2half_rn(yb));
        }
    }
    /* the dimensions past the rotated pairs: normalised, and stored */
    for (uint32_t i = 2 * half + threadIdx.x; i < head_dim; i += blockDim.x) {
        if (nw)
            x[i] = hv[i];
        if (kc)
            kc[i] = __half_as_ushort(__float2half_rn(hv[i]));
    }
}

int cuda_rope_qk(float *q, int64_t q_stride, uint32_t n_head, float *k, int64_t k_stride,
                 uint32_t n_head_kv, int64_t n_tok, uint32_t head_dim, uint32_t n_rot,
                 const float *cs, bool neox, const float *q_norm, const float *k_norm, float eps,
                 const struct gpu_kv_dst *kv)
{
    const uint32_t per = n_head + n_head_kv + (kv ? n_head_kv : 0);
    if (!q || !k || !cs || n_tok < 0 || head_dim == 0 || head_dim > OPS_ATT_MAX_DIM ||
        n_rot > head_dim || q_stride < (int64_t)n_head * head_dim ||
        k_stride < (int64_t)n_head_kv * head_dim || n_tok * (int64_t)per > INT32_MAX ||
        (kv && (k_stride != (int64_t)n_head_kv * head_dim || !kv->k_cache || !kv->v_cache ||
                !kv->v || kv->head_dim_v == 0)))
        return ops_bad("gpu_rope_qk: bad arguments");
    const int64_t blocks = n_tok * (int64_t)per;
    if (blocks == 0)
        return 0;
    const gpu_kv_dst none = {};
    ops_rope_qk_kernel<<<(unsigned)blocks, ops_norm_threads(head_dim), head_dim * sizeof(float),
                         gpu_stream()>>>(q, q_stride, n_head, k, k_stride, n_head_kv, head_dim,
                                         n_rot, cs, neox, q_norm, k_norm, eps, kv ? *kv : none);
    return GPU_LAUNCHED("ops_rope_qk_kernel");
}

/* ---- KV store ----------------------------------------------------------------------------- */

/* Items [0, n_tok * k_width) are keys, the rest values. */
static __global__ void ops_kv_store_kernel(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width,
                                           uint32_t v_width, const float *k, const float *v,
                                           uint32_t pos0, const uint32_t *pos_dev, uint32_t n_tok)
{
    if (pos_dev)
        pos0 = *pos_dev;
    const int64_t nk = (int64_t)n_tok * k_width, n = nk + (int64_t)n_tok * v_width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (i < nk) {
            const int64_t t = i / k_width, c = i - t * k_width;
            k_cache[((int64_t)pos0 + t) * k_width + c] = __half_as_ushort(__float2half_rn(k[i]));
        } else {
            const int64_t j = i - nk, t = j / v_width, c = j - t * v_width;
            v_cache[((int64_t)pos0 + t) * v_width + c] = __half_as_ushort(__float2half_rn(v[j]));
        }
    }
}

int cuda_kv_store(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                  const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                  uint32_t n_tok)
{
    if ((k_width && (!k_cache || !k)) || (v_width && (!v_cache || !v)))
        return ops_bad("gpu_kv_store: bad arguments");
    const int64_t n = (int64_t)n_tok * ((int64_t)k_width + v_width);
    if (n == 0)
        return 0;
    ops_kv_store_kernel<<<ops_grid(n), OPS_THREADS, 0, gpu_stream()>>>(
        k_cache, v_cache, k_width, v_width, k, v, pos0, pos_dev, n_tok);
    return GPU_LAUNCHED("ops_kv_store_kernel");
}

/* ---- attention ---------------------------------------------------------------------------- */

/* True when an attention call's arguments are not ones its kernels take: head dims multiples
 * of `mult` (32 for the q8_0 cache) up to OPS_ATT_MAX_DIM, whole GQA groups, counts within int32,
 * with pos_dev a scratch row stride of at least n_tok, and without a value cache (v NULL: the
 * values are the head of each key row) one KV head no narrower than the values. */
static bool ops_att_bad(const float *out, const float *q, const void *k, const void *v,
                        const float *scratch, uint32_t n_tok, uint32_t pos0,
                        const uint32_t *pos_dev, uint32_t row_stride, uint32_t n_head,
                        uint32_t n_head_kv, uint32_t hk, uint32_t hv, uint32_t mult)
{
    return (pos_dev && ((uint64_t)row_stride < n_tok || row_stride > INT32_MAX)) || !out || !q ||
           !k || (!v && (n_head_kv != 1 || hv > hk)) || !scratch || n_head == 0 || n_head_kv == 0 ||
           n_head % n_head_kv != 0 || hk == 0 || hv == 0 || hk % mult || hv % mult ||
           hk > OPS_ATT_MAX_DIM || hv > OPS_ATT_MAX_DIM || (uint64_t)pos0 + n_tok > INT32_MAX ||
           (uint64_t)n_tok * n_head > INT32_MAX;
}

/* The geometry of one gpu_attention call, shared by its blocks. */
struct ops_att_args {
    float          *out;
    const float    *q;
    const uint16_t *k_cache, *v_cache;
    float          *scratch; /* (n_tok * n_head, row): scores, probabilities, chunk partials */
    const uint32_t *pos_dev; /* the first position in device memory, or NULL: pos0 */
    const float    *sinks;   /* n_head sink logits (gpt-oss), or NULL */
    uint32_t        pos0, n_head, gqa, hk, hv, window;
    uint32_t        k_width, v_width; /* n_head_kv * hk, n_head_kv * hv */
    int64_t         row;              /* pos0 + n_tok: scratch floats per (token, head) */
    float           scale;
    unsigned        k_lanes;  /* lanes per position in the score pass, a power of two <= 32 */
    unsigned        v_groups; /* position groups of the value pass (1: threads over dims only) */
    unsigned        n_split;  /* most chunks a (token, head) is split into (gridDim.y) */
    unsigned        c_min;    /* fewest positions of a chunk, >= hv + 2 */
};

/* The visible positions of query token t: p_lo .. p_lo + n_kv - 1. */
static __device__ void ops_att_span(const uint32_t *pos_dev, uint32_t pos0, uint32_t window,
                                    uint32_t t, uint32_t *p_lo, int *n_kv)
{
    const uint32_t last = (pos_dev ? *pos_dev : pos0) + t + 1; /* past the query's position */
    *p_lo = window && last > window ? last - window : 0;
    *n_kv = (int)(last - *p_lo);
}

/* Chunks of a row of n_kv positions: as many as n_split allows with c_min positions each. */
static __device__ unsigned ops_att_nchunks(int n_kv, unsigned c_min, unsigned n_split)
{
    const unsigned n = (unsigned)n_kv / c_min;
    return n < 1 ? 1 : n < n_split ? n : n_split;
}

static __device__ unsigned ops_att_chunks(const struct ops_att_args *a, int n_kv)
{
    return ops_att_nchunks(n_kv, a->c_min, a->n_split);
}

/* First position (relative to p_lo) of chunk c of n_c; chunk c is [start(c), start(c + 1)). */
static __device__ int ops_att_chunk_start(int n_kv, unsigned c, unsigned n_c)
{
    return (int)((int64_t)c * n_kv / n_c);
}

/* The softmax of a chunk's scores sc[c0..c1) (lmax: this thread's largest of them): *mx the
 * chunk's max, exp(s - max) in place, *total their sum. A sink (gpt-oss: a logit with no value)
 * takes part in the max and the sum here when the row is one chunk, else in the combine. */
static __device__ void ops_att_chunk_softmax(float *sc, int c0, int c1, float lmax,
                                             const float *sink, float *red, float *mx, float *total)
{
    float m = ops_block_reduce(lmax, ops_max(), red);
    if (sink)
        m = fmaxf(m, *sink);
    float lsum = 0.0f;
    for (int i = c0 + (int)threadIdx.x; i < c1; i += (int)blockDim.x) {
        const float e = expf(sc[i] - m);
        sc[i] = e;
        lsum += e;
    }
    float t = ops_block_reduce(lsum, ops_sum(), red); /* its barrier: sc is whole */
    if (sink)
        t += expf(*sink - m);
    *mx = m;
    *total = t;
}

/* The split of a call's positions (cuda_attention, cuda_attention_q8): few (token, head) rows
 * (decode) split theirs so that about OPS_ATT_MIN_BLOCKS blocks share the work, each chunk long
 * enough to hold its partials afterwards (hv + 2 floats). */
static void ops_att_split(uint64_t rows, uint32_t hv, unsigned *n_split, unsigned *c_min)
{
    const unsigned n =
        rows >= OPS_ATT_MIN_BLOCKS ? 1u : (unsigned)((OPS_ATT_MIN_BLOCKS + rows - 1) / rows);
    *n_split = n < OPS_ATT_MAX_SPLIT ? n : OPS_ATT_MAX_SPLIT;
    *c_min = hv + 2 > OPS_ATT_MIN_CHUNK ? hv + 2 : OPS_ATT_MIN_CHUNK;
}

/* Loads `VEC` consecutive f16 values (VEC 2: 4-byte aligned) as floats. */
template <int VEC> static __device__ float2 ops_load_h(const uint16_t *p)
{
    if (VEC == 2)
        return __half22float2(*reinterpret_cast<const __half2 *>(p));
    return make_float2(__half2float(__ushort_as_half(*p)), 0.0f);
}

/* One block per (token t, head h, chunk c): blockIdx.x = t * n_head + h, blockIdx.y = c. The
 * visible positions split into n_c chunks of at least c_min positions (n_c = 1 unless the grid
 * is too small for the device: decode). Pass 1: groups of k_lanes lanes take one position each
 * and reduce q . k over their lanes; the scaled score goes to the scratch row. Then the chunk's
 * max, exp(score - max) in place and their sum. Pass 2: threads over output units (VV dims
 * each), v_groups groups of them over interleaved positions, their partial sums added in group
 * order through shared memory. With one chunk, out = sum / total; with more, the chunk leaves
 * (max, total, sum[hv]) at the start of its own stretch of the scratch row (c_min >= hv + 2
 * floats, its probabilities no longer needed) for ops_attention_combine_kernel.
 * VK, VV: f16 elements per load of K and V (2 when the rows allow 4-byte loads). */
template <int VK, int VV> static __global__ void ops_attention_kernel(struct ops_att_args a)
{
    extern __shared__ float sh[]; /* hk floats of query, then the pass-2 partials */
    __shared__ float        red[32];
    const uint32_t          t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head;
    const uint32_t          kvh = h / a.gqa;
    uint32_t                p_lo;
    int                     n_kv;
    ops_att_span(a.pos_dev, a.pos0, a.window, t, &p_lo, &n_kv);
    const unsigned n_c = ops_att_chunks(&a, n_kv);
    if (blockIdx.y >= n_c)
        return;
    const int    c0 = ops_att_chunk_start(n_kv, blockIdx.y, n_c);
    const int    c1 = ops_att_chunk_start(n_kv, blockIdx.y + 1, n_c);
    const float *qv = a.q + ((int64_t)t * a.n_head + h) * a.hk;
    float       *sc = a.scratch + (int64_t)blockIdx.x * a.row;
    float       *sq = sh;

    /* The query rounded to f16, as the CPU (and llama.cpp's CPU path) dots it with an f16 K. */
    for (uint32_t d = threadIdx.x; d < a.hk; d += blockDim.x)
        sq[d] = __half2float(__float2half_rn(qv[d]));
    __syncthreads();

    /* Pass 1: scores. The loop bound depends on the warp only, so whole warps shuffle. */
    const unsigned  lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned  S = a.k_lanes, sub = lane / S, lg = lane % S, per_warp = 32u / S;
    const unsigned  n_warps = blockDim.x >> 5;
    const uint32_t  k_units = (a.hk + VK - 1) / VK;
    const uint16_t *kbase = a.k_cache + (int64_t)kvh * a.hk + (int64_t)p_lo * a.k_width;
    float           lmax = -INFINITY;
    for (int base = c0 + (int)(warp * per_warp); base < c1; base += (int)(n_warps * per_warp)) {
        const int i = base + (int)sub;
        float     s = 0.0f;
        if (i < c1) {
            const uint16_t *kr = kbase + (int64_t)i * a.k_width;
#pragma unroll 4
            for (uint32_t u = lg; u < k_units; u += S) {
                const float2 kk = ops_load_h<VK>(kr + u * VK);
                s += sq[u * VK] * kk.x;
                if (VK == 2)
                    s += sq[u * VK + 1] * kk.y;
            }
        }
        for (unsigned o = S / 2; o > 0; o >>= 1)
            s += __shfl_xor_sync(OPS_FULL_MASK, s, o);
        if (i < c1 && lg == 0) {
            s *= a.scale;
            sc[i] = s;
            lmax = fmaxf(lmax, s);
        }
    }
    float mx, total;
    ops_att_chunk_softmax(sc, c0, c1, lmax, a.sinks && n_c == 1 ? a.sinks + h : NULL, red, &mx,
                          &total);

    /* Pass 2: the weighted sum of the values into part (G, v_units * VV). With G == 1 a thread
     * may own several units; with G > 1, G * v_units <= blockDim.x and it owns one at most. */
    /* One chunk: the probabilities normalised and rounded to f16 before the V dot, as on the
     * CPU; several chunks (a long decode) normalise in the combine kernel, unrounded. */
    const float     inv = n_c == 1 ? 1.0f / total : 1.0f;
    const uint32_t  v_units = (a.hv + VV - 1) / VV;
    const unsigned  G = a.v_groups;
    const uint16_t *vbase = a.v_cache + (int64_t)kvh * a.hv + (int64_t)p_lo * a.v_width;
    float          *part = sh + a.hk;
    for (uint32_t j = threadIdx.x; j < G * v_units; j += blockDim.x) {
        const unsigned g = j / v_units, u = j % v_units;
        float2         acc = make_float2(0.0f, 0.0f);
#pragma unroll 4
        for (int i = c0 + (int)g; i < c1; i += (int)G) {
            const float  p = n_c == 1 ? __half2float(__float2half_rn(sc[i] * inv)) : sc[i];
            const float2 vv = ops_load_h<VV>(vbase + (int64_t)i * a.v_width + u * VV);
            acc.x += p * vv.x;
            acc.y += p * vv.y;
        }
        part[j * VV] = acc.x;
        if (VV == 2)
            part[j * VV + 1] = acc.y;
    }
    /* Every read of this chunk's probabilities is done: its stretch may take the partials. */
    __syncthreads();
    float *dst = n_c == 1 ? a.out + ((int64_t)t * a.n_head + h) * a.hv : sc + c0 + 2;
    for (uint32_t d = threadIdx.x; d < a.hv; d += blockDim.x) {
        float acc = 0.0f;
        for (unsigned g = 0; g < G; g++)
            acc += part[g * v_units * VV + d];
        dst[d] = acc;
    }
    if (n_c > 1 && threadIdx.x == 0) {
        sc[c0] = mx;
        sc[c0 + 1] = total;
    }
}

/* One block per (token, head) split into chunks: out = sum_c e_c * sum_c / sum_c e_c * total_c,
 * e_c = exp(max_c - max), from the partials the chunks left in the scratch row. */
static __global__ void ops_attention_combine_kernel(struct ops_att_args a)
{
    const uint32_t t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head;
    uint32_t       p_lo;
    int            n_kv;
    ops_att_span(a.pos_dev, a.pos0, a.window, t, &p_lo, &n_kv);
    const unsigned n_c = ops_att_chunks(&a, n_kv);
    if (n_c == 1)
        return;
    const float *sc = a.scratch + (int64_t)blockIdx.x * a.row;
    float       *o = a.out + ((int64_t)t * a.n_head + h) * a.hv;
    float        mx = a.sinks ? a.sinks[h] : -INFINITY, total = 0.0f;
    for (unsigned c = 0; c < n_c; c++)
        mx = fmaxf(mx, sc[ops_att_chunk_start(n_kv, c, n_c)]);
    for (unsigned c = 0; c < n_c; c++) {
        const float *pc = sc + ops_att_chunk_start(n_kv, c, n_c);
        total += pc[1] * expf(pc[0] - mx);
    }
    if (a.sinks)
        total += expf(a.sinks[h] - mx);
    const float inv = 1.0f / total;
    for (uint32_t d = threadIdx.x; d < a.hv; d += blockDim.x) {
        float acc = 0.0f;
        for (unsigned c = 0; c < n_c; c++) {
            const float *pc = sc + ops_att_chunk_start(n_kv, c, n_c);
            acc += pc[2 + d] * expf(pc[0] - mx);
        }
        o[d] = acc * inv;
    }
}

/* ---- flash attention (prefill) -------------------------------------------------------------- */

/* Values j and j + 1 (j even) of the q8_0 block at blk, dequantized (d * q in f32) and rounded to
 * f16. */
static __device__ __forceinline__ __half2 ops_q8_pair(const uint8_t *blk, int j)
{
    const float d = __half2float(*reinterpret_cast<const __half *>(blk));
    const char2 q = *reinterpret_cast<const char2 *>(blk + 2 + j);
    return __floats2half2_rn(d * static_cast<float>(q.x), d * static_cast<float>(q.y));
}

/* A prefill's attention on the tensor cores, for equal key and value head dims D (64 or 128):
 * one block per (64 query tokens, head), four warps of 16 queries. Over the visible positions in
 * tiles of 64: the tile's keys and values into shared memory (f16, as cached), S = Q K^T (the
 * queries rounded to f16, f32 sums), the running max and sum of each query row updated and
 * exp(s - max) written as f16, the output rows (f32, in shared memory) scaled by exp(old max -
 * new max) and P V added by the tensor cores; at the end out = O / sum. Positions past a query's
 * own or before its window are masked. Two lanes of a warp per query row in the softmax. A sink
 * (gpt-oss) is a logit with no value: each row's max starts at it and its sum at 1. Q8: a q8_0
 * cache (k_width and v_width are then a position's bytes), each tile's keys and values
 * dequantized into the same f16 tiles as they are loaded. */
#define FA_BQ   64
#define FA_BK   64
#define FA_WARP 16 /* query rows per warp */
#define FA_LDS  (FA_BK + 4)
#define FA_LDP  (FA_BK + 8)

template <int D> struct fa_layout {
    static constexpr int    ldh = D + 8, ldo = D + 4;
    static constexpr size_t q = 0, k = q + sizeof(__half) * FA_BQ * ldh,
                            v = k + sizeof(__half) * FA_BK * ldh,
                            s = v + sizeof(__half) * FA_BK * ldh,
                            p = s + sizeof(float) * FA_BQ * FA_LDS,
                            o = p + sizeof(__half) * FA_BQ * FA_LDP,
                            bytes = o + sizeof(float) * FA_BQ * ldo;
};

template <int D, bool Q8>
static __global__ void __launch_bounds__(128)
    ops_flash_kernel(struct ops_att_args a, uint32_t n_tok)
{
    using namespace nvcuda;
    using L = fa_layout<D>;
    extern __shared__ __align__(128) unsigned char fsm[];
    __half                                        *sq = reinterpret_cast<__half *>(fsm + L::q),
           *sk = reinterpret_cast<__half *>(fsm + L::k),
           *sv = reinterpret_cast<__half *>(fsm + L::v),
           *sp = reinterpret_cast<__half *>(fsm + L::p);
    float *ss = reinterpret_cast<float *>(fsm + L::s), *so = reinterpret_cast<float *>(fsm + L::o);
    const uint32_t t0 = blockIdx.x * FA_BQ, h = blockIdx.y, kvh = h / a.gqa;
    const int      tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t t_end = t0 + FA_BQ < n_tok ? t0 + FA_BQ : n_tok; /* one past the block's last */

    for (int i = tid; i < FA_BQ * D; i += blockDim.x) {
        const int      r = i / D, d = i % D;
        const uint32_t t = t0 + r;
        sq[r * L::ldh + d] =
            t < n_tok ? __float2half_rn(a.q[((int64_t)t * a.n_head + h) * D + d]) : __half();
        so[r * L::ldo + d] = 0.0f;
    }
    /* lane's query row (of the warp's 16) and half of the tile's columns / the output dims */
    const int      row = lane >> 1, half = lane & 1, qr = warp * FA_WARP + row;
    const uint32_t tq = t0 + qr, pq = a.pos0 + tq; /* its token and position */
    const uint32_t lo_q = a.window && pq + 1 > a.window ? pq + 1 - a.window : 0;
    float          m = a.sinks ? a.sinks[h] : -INFINITY, l = a.sinks ? 1.0f : 0.0f;
    /* the block's span: from the first query's window start to the last query's position */
    const uint32_t first = a.pos0 + t0 + 1,
                   kv_lo = a.window && first > a.window ? first - a.window : 0;
    const uint32_t kv_hi = a.pos0 + t_end; /* one past */
    __half        *pw = sp + warp * FA_WARP * FA_LDP;
    float         *sw = ss + warp * FA_WARP * FA_LDS, *ow = so + warp * FA_WARP * L::ldo;

    for (uint32_t j0 = kv_lo; j0 < kv_hi; j0 += FA_BK) {
        __syncthreads(); /* the last tile's K and V read by every warp (and Q, O filled) */
        const __half  *kc = reinterpret_cast<const __half *>(a.k_cache);
        const __half  *vc = reinterpret_cast<const __half *>(a.v_cache);
        const uint8_t *k8 = reinterpret_cast<const uint8_t *>(a.k_cache);
        const uint8_t *v8 = reinterpret_cast<const uint8_t *>(a.v_cache);
        for (int i = tid; i < FA_BK * (D / 2); i += blockDim.x) {
            const int      r = i / (D / 2), d = 2 * (i % (D / 2));
            const uint32_t p = j0 + r;
            __half2        kk = __half2(), vv = __half2();
            if (p < kv_hi && Q8) {
                const int64_t b = ((int64_t)kvh * (D / 32) + d / 32) * OPS_Q8_BLOCK;
                kk = ops_q8_pair(k8 + (int64_t)p * a.k_width + b, d % 32);
                vv = ops_q8_pair(v8 + (int64_t)p * a.v_width + b, d % 32);
            } else if (p < kv_hi) {
                kk = *reinterpret_cast<const __half2 *>(kc + (int64_t)p * a.k_width + kvh * D + d);
                vv = *reinterpret_cast<const __half2 *>(vc + (int64_t)p * a.v_width + kvh * D + d);
            }
            *reinterpret_cast<__half2 *>(sk + r * L::ldh + d) = kk;
            *reinterpret_cast<__half2 *>(sv + r * L::ldh + d) = vv;
        }
        __syncthreads();
        /* S = Q K^T for the warp's 16 rows */
#pragma unroll
        for (int nb = 0; nb < FA_BK / 16; nb++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < D; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fq;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fk;
                wmma::load_matrix_sync(fq, sq + warp * FA_WARP * L::ldh + kk, L::ldh);
                wmma::load_matrix_sync(fk, sk + nb * 16 * L::ldh + kk, L::ldh);
                wmma::mma_sync(acc, fq, fk, acc);
            }
            wmma::store_matrix_sync(sw + nb * 16, acc, FA_LDS, wmma::mem_row_major);
        }
        __syncwarp();
        /* the softmax update of the lane's row over its 32 columns, the pair combined */
        float sv_[32], mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            const uint32_t p = j0 + half * 32 + c;
            const bool     ok = tq < n_tok && p <= pq && p >= lo_q && p < kv_hi;
            sv_[c] = ok ? sw[row * FA_LDS + half * 32 + c] * a.scale : -INFINITY;
            mx = fmaxf(mx, sv_[c]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(OPS_FULL_MASK, mx, 1));
        const float mn = fmaxf(m, mx);
        const float alpha = mn == -INFINITY ? 1.0f : expf(m - mn);
        float       sum = 0.0f;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            const float e = sv_[c] == -INFINITY ? 0.0f : expf(sv_[c] - mn);
            pw[row * FA_LDP + half * 32 + c] = __float2half_rn(e);
            sum += e;
        }
        sum += __shfl_xor_sync(OPS_FULL_MASK, sum, 1);
        l = l * alpha + sum;
        m = mn;
        for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
            ow[row * L::ldo + d] *= alpha;
        __syncwarp();
        /* O += P V */
#pragma unroll
        for (int db = 0; db < D / 16; db++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, ow + db * 16, L::ldo, wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < FA_BK; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fp;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fv;
                wmma::load_matrix_sync(fp, pw + kk, FA_LDP);
                wmma::load_matrix_sync(fv, sv + kk * L::ldh + db * 16, L::ldh);
                wmma::mma_sync(acc, fp, fv, acc);
            }
            wmma::store_matrix_sync(ow + db * 16, acc, L::ldo, wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (tq >= n_tok)
        return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float      *out = a.out + ((int64_t)tq * a.n_head + h) * D;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
        out[d] = ow[row * L::ldo + d] * inv;
}

/* Launches ops_flash_kernel<D, Q8> (its shared memory opted in on first use); -1 when D is not
 * one of its dims. */
template <int D, bool Q8> static int ops_flash_launch(const struct ops_att_args &a, uint32_t n_tok)
{
    static unsigned opted; /* a bit per device: the attribute is the device's */
    const unsigned  me = 1u << gpu_current_device();
    if (!(opted & me)) {
        if (gpu_record(cudaFuncSetAttribute(ops_flash_kernel<D, Q8>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)fa_layout<D>::bytes),
                       "ops_flash_kernel shared memory") < 0)
            return -1;
        opted |= me;
    }
    const dim3 grid((n_tok + FA_BQ - 1) / FA_BQ, a.n_head);
    ops_flash_kernel<D, Q8><<<grid, 128, fa_layout<D>::bytes, gpu_stream()>>>(a, n_tok);
    return GPU_LAUNCHED("ops_flash_kernel");
}

/* Whether a prefill takes the flash kernel: 16 tokens or more at positions given by value, equal
 * key and value head dims of 64 or 128, values of their own, rows `align`-byte aligned. */
static bool ops_flash_takes(const void *k_cache, const void *v_cache, uint32_t n_tok,
                            const uint32_t *pos_dev, uint32_t n_head, uint32_t head_dim_k,
                            uint32_t head_dim_v, unsigned align)
{
    return !pos_dev && v_cache && n_tok >= OPS_FA_MIN_TOK && head_dim_k == head_dim_v &&
           n_head <= 65535 && (head_dim_k == 64 || head_dim_k == 128) &&
           (uintptr_t)k_cache % align == 0 && (uintptr_t)v_cache % align == 0 &&
           !getenv("SLUICE_NO_FLASH_ATTN");
}

int cuda_attention(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                   uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                   uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v,
                   float scale, uint32_t window, float *scratch, const float *sinks)
{
    if (ops_att_bad(out, q, k_cache, v_cache, scratch, n_tok, pos0, pos_dev, row_stride, n_head,
                    n_head_kv, head_dim_k, head_dim_v, 1))
        return ops_bad("gpu_attention: bad arguments");
    if (n_tok == 0)
        return 0;
    const bool v_in_k = !v_cache; /* latent attention: the values head the key rows */
    if (v_in_k)
        v_cache = k_cache;
    struct ops_att_args a;
    a.out = out;
    a.q = q;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.scratch = scratch;
    a.pos_dev = pos_dev;
    a.sinks = sinks;
    a.pos0 = pos0;
    a.n_head = n_head;
    a.gqa = n_head / n_head_kv;
    a.hk = head_dim_k;
    a.hv = head_dim_v;
    a.window = window;
    a.k_width = n_head_kv * head_dim_k;
    a.v_width = v_in_k ? a.k_width : n_head_kv * head_dim_v;
    a.row = pos_dev ? (int64_t)row_stride : (int64_t)pos0 + n_tok;
    a.scale = scale;
    /* A prefill with equal head dims of 64 or 128 (rows 4-byte aligned), values of their own:
     * the tensor cores. */
    if (ops_flash_takes(k_cache, v_in_k ? NULL : v_cache, n_tok, pos_dev, n_head, head_dim_k,
                        head_dim_v, 4))
        return head_dim_k == 64 ? ops_flash_launch<64, false>(a, n_tok)
                                : ops_flash_launch<128, false>(a, n_tok);
    /* 4-byte loads when every row start of a head is even and the cache is 4-byte aligned. */
    const int vk = head_dim_k % 2 == 0 && (uintptr_t)k_cache % 4 == 0 ? 2 : 1;
    const int vv = head_dim_v % 2 == 0 && a.v_width % 2 == 0 && (uintptr_t)v_cache % 4 == 0 ? 2 : 1;
    const uint32_t k_units = (head_dim_k + vk - 1) / vk, v_units = (head_dim_v + vv - 1) / vv;
    a.k_lanes = 1;
    while (a.k_lanes < 32 && a.k_lanes < k_units)
        a.k_lanes *= 2;
    a.v_groups = v_units >= OPS_ATT_THREADS ? 1u : OPS_ATT_THREADS / v_units;
    const uint64_t rows = (uint64_t)n_tok * n_head;
    ops_att_split(rows, head_dim_v, &a.n_split, &a.c_min);
    const size_t shm = sizeof(float) * (head_dim_k + (size_t)a.v_groups * v_units * vv);
    const dim3   grid((unsigned)rows, a.n_split);
    if (vk == 2 && vv == 2)
        ops_attention_kernel<2, 2><<<grid, OPS_ATT_THREADS, shm, gpu_stream()>>>(a);
    else if (vk == 2)
        ops_attention_kernel<2, 1><<<grid, OPS_ATT_THREADS, shm, gpu_stream()>>>(a);
    else if (vv == 2)
        ops_attention_kernel<1, 2><<<grid, OPS_ATT_THREADS, shm, gpu_stream()>>>(a);
    else
        ops_attention_kernel<1, 1><<<grid, OPS_ATT_THREADS, shm, gpu_stream()>>>(a);
    const int rc = GPU_LAUNCHED("ops_attention_kernel");
    if (rc != 0 || a.n_split == 1)
        return rc;
    ops_attention_combine_kernel<<<(unsigned)rows, OPS_ATT_THREADS, 0, gpu_stream()>>>(a);
    return GPU_LAUNCHED("ops_attention_combine_kernel");
}

/* ---- the q8_0 KV cache -------------------------------------------------------------------- */

/* 32 values quantized by a warp, lane j on value j, as the CPU's activation quantizer (and
 * k_act_q8_32) does: d = f16(amax / 127), q = round-half-even(x * 127 / amax) in [-128, 127].
 * Returns q; *d the scale (as a float). */
static __device__ int ops_q8_lane(float x, float *d)
{
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(OPS_FULL_MASK, amax, o));
    *d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const int   q = __float2int_rn(__fmul_rn(x, id));
    return q < -128 ? -128 : q > 127 ? 127 : q;
}

/* One warp per block of 32 of a row: warps [0, n_tok * kb) the keys' blocks, the rest the
 * values'. kb, vb: blocks per row. */
static __global__ void ops_kv_store_q8_kernel(uint8_t *k8, uint8_t *v8, uint32_t kb, uint32_t vb,
                                              const float *k, const float *v, uint32_t pos0,
                                              const uint32_t *pos_dev, uint32_t n_tok)
{
    const int64_t wi = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int     lane = threadIdx.x & 31;
    const int64_t nk = (int64_t)n_tok * kb;
    if (wi >= nk + (int64_t)n_tok * vb) /* the whole warp leaves together */
        return;
    const bool     key = wi < nk;
    const uint32_t per = key ? kb : vb;
    const int64_t  j = key ? wi : wi - nk, t = j / per, b = j % per;
    const float    x = (key ? k : v)[t * per * 32 + b * 32 + lane];
    float          d;
    const int      q = ops_q8_lane(x, &d);
    const int64_t  p = (int64_t)(pos_dev ? *pos_dev : pos0) + t;
    uint8_t       *blk = (key ? k8 : v8) + (p * per + b) * OPS_Q8_BLOCK;
    blk[2 + lane] = (uint8_t)(int8_t)q;
    if (lane == 0)
        *reinterpret_cast<__half *>(blk) = __float2half_rn(d); /* 34-byte blocks: 2-aligned */
}

int cuda_kv_store_q8(void *k_cache, void *v_cache, uint32_t k_width, uint32_t v_width,
                     const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                     uint32_t n_tok)
{
    if (k_width % 32 || v_width % 32 || (k_width && (!k_cache || !k)) ||
        (v_width && (!v_cache || !v)))
        return ops_bad("gpu_kv_store_q8: bad arguments");
    const int64_t warps = (int64_t)n_tok * ((int64_t)k_width / 32 + v_width / 32);
    if (warps == 0)
        return 0;
    const int64_t blocks = (warps * 32 + OPS_THREADS - 1) / OPS_THREADS;
    if (blocks > INT32_MAX)
        return ops_bad("gpu_kv_store_q8: too many rows");
    ops_kv_store_q8_kernel<<<(unsigned)blocks, OPS_THREADS, 0, gpu_stream()>>>(
        static_cast<uint8_t *>(k_cache), static_cast<uint8_t *>(v_cache), k_width / 32,
        v_width / 32, k, v, pos0, pos_dev, n_tok);
    return GPU_LAUNCHED("ops_kv_store_q8_kernel");
}

struct ops_att8_args {
    float          *out;
    const float    *q;
    const uint8_t  *k8, *v8;
    float          *scratch; /* (n_tok * n_head, row): scores, then probabilities */
    const uint32_t *pos_dev;
    const float    *sinks; /* n_head sink logits (gpt-oss), or NULL */
    uint32_t        pos0, n_head, gqa, hk, hv, window;
    int64_t         k_row, v_row; /* bytes of one position's keys, values (every kv head) */
    int64_t         row;
    float           scale;
    unsigned        n_split, c_min; /* as ops_att_args' */
};

/* One block per (token, head, chunk), as the CPU's q8_0 path: the query quantized to q8_0 in
 * shared memory (a warp per block of 32); pass 1, a thread per position: the blocks' integer dots
 * times both scales, added in block order, scaled, into the scratch row; the max, exp(s - max)
 * and their sum; pass 2, a thread per output dim: the sum over positions, in order, of the
 * probability times the dequantized value. The positions split into chunks as in
 * ops_attention_kernel (a long decode): each chunk leaves (max, total, unnormalised sums) at the
 * start of its stretch of the scratch row for ops_attention_combine_kernel. */
static __global__ void ops_attention_q8_kernel(struct ops_att8_args a)
{
    extern __shared__ float sh8[]; /* hk / 32 scales, hk int8, then hv partial sums */
    __shared__ float        red[32];
    const uint32_t          t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head;
    const uint32_t          kvh = h / a.gqa, nbk = a.hk / 32, nbv = a.hv / 32;
    uint32_t                p_lo;
    int                     n_kv;
    ops_att_span(a.pos_dev, a.pos0, a.window, t, &p_lo, &n_kv);
    const unsigned n_c = ops_att_nchunks(n_kv, a.c_min, a.n_split);
    if (blockIdx.y >= n_c)
        return;
    const int      c0 = ops_att_chunk_start(n_kv, blockIdx.y, n_c);
    const int      c1 = ops_att_chunk_start(n_kv, blockIdx.y + 1, n_c);
    const float   *qv = a.q + ((int64_t)t * a.n_head + h) * a.hk;
    float         *sc = a.scratch + (int64_t)blockIdx.x * a.row;
    float         *sd = sh8;
    int8_t        *sq = reinterpret_cast<int8_t *>(sh8 + nbk);
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (uint32_t b = warp; b < nbk; b += blockDim.x >> 5) {
        float     d;
        const int q = ops_q8_lane(qv[b * 32 + lane], &d);
        sq[b * 32 + lane] = (int8_t)q;
        if (lane == 0)
            sd[b] = d;
    }
    __syncthreads();

    const uint8_t *kbase = a.k8 + (int64_t)p_lo * a.k_row + (int64_t)kvh * nbk * OPS_Q8_BLOCK;
    float          lmax = -INFINITY;
    for (int i = c0 + (int)threadIdx.x; i < c1; i += (int)blockDim.x) {
        const uint8_t *kr = kbase + (int64_t)i * a.k_row;
        float          s = 0.0f;
        for (uint32_t b = 0; b < nbk; b++) {
            const uint8_t *blk = kr + b * OPS_Q8_BLOCK;
            const int8_t  *qs = reinterpret_cast<const int8_t *>(blk + 2);
            int            isum = 0;
#pragma unroll 8
            for (int j = 0; j < 32; j++)
                isum += (int)qs[j] * (int)sq[b * 32 + j];
            const float dk = __half2float(*reinterpret_cast<const __half *>(blk));
            s += (float)isum * (dk * sd[b]);
        }
        s *= a.scale;
        sc[i] = s;
        lmax = fmaxf(lmax, s);
    }
    float mx, total;
    ops_att_chunk_softmax(sc, c0, c1, lmax, a.sinks && n_c == 1 ? a.sinks + h : NULL, red, &mx,
                          &total);
    /* several chunks: unnormalised sums, normalised in the combine */
    const float    inv = n_c == 1 ? 1.0f / total : 1.0f;
    const uint8_t *vbase = a.v8 + (int64_t)p_lo * a.v_row + (int64_t)kvh * nbv * OPS_Q8_BLOCK;
    float         *o = a.out + ((int64_t)t * a.n_head + h) * a.hv;
    float         *part = sh8 + nbk + a.hk / 4;
    for (uint32_t d = threadIdx.x; d < a.hv; d += blockDim.x) {
        const uint8_t *col = vbase + (d / 32) * OPS_Q8_BLOCK;
        float          acc = 0.0f;
        for (int i = c0; i < c1; i++) {
            const uint8_t *blk = col + (int64_t)i * a.v_row;
            const float    dv = __half2float(*reinterpret_cast<const __half *>(blk));
            acc += (sc[i] * inv) * (dv * (float)reinterpret_cast<const int8_t *>(blk)[2 + d % 32]);
        }
        if (n_c == 1)
            o[d] = acc;
        else
            part[d] = acc;
    }
    if (n_c == 1)
        return;
    /* Every read of this chunk's probabilities is done: its stretch may take the partials
     * (a chunk holds at least hv + 2 positions). */
    __syncthreads();
    for (uint32_t d = threadIdx.x; d < a.hv; d += blockDim.x)
        sc[c0 + 2 + d] = part[d];
    if (threadIdx.x == 0) {
        sc[c0] = mx;
        sc[c0 + 1] = total;
    }
}

int cuda_attention_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                      uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                      uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v,
                      float scale, uint32_t window, float *scratch, const float *sinks)
{
    if (ops_att_bad(out, q, k_cache, v_cache, scratch, n_tok, pos0, pos_dev, row_stride, n_head,
                    n_head_kv, head_dim_k, head_dim_v, 32))
        return ops_bad("gpu_attention_q8: bad arguments");
    if (n_tok == 0)
        return 0;
    struct ops_att8_args a;
    a.out = out;
    a.q = q;
    a.k8 = static_cast<const uint8_t *>(k_cache);
    a.v8 = static_cast<const uint8_t *>(v_cache ? v_cache : k_cache); /* NULL: V heads K */
    a.scratch = scratch;
    a.pos_dev = pos_dev;
    a.sinks = sinks;
    a.pos0 = pos0;
    a.n_head = n_head;
    a.gqa = n_head / n_head_kv;
    a.hk = head_dim_k;
    a.hv = head_dim_v;
    a.window = window;
    a.k_row = (int64_t)n_head_kv * (head_dim_k / 32) * OPS_Q8_BLOCK;
    a.v_row = v_cache ? (int64_t)n_head_kv * (head_dim_v / 32) * OPS_Q8_BLOCK : a.k_row;
    a.row = pos_dev ? (int64_t)row_stride : (int64_t)pos0 + n_tok;
    a.scale = scale;
    if (ops_flash_takes(k_cache, v_cache, n_tok, pos_dev, n_head, head_dim_k, head_dim_v, 2)) {
        /* the tensor cores over the blocks dequantized to f16 as each tile loads (the query
         * rounded to f16, not quantized, as with the f16 cache) */
        struct ops_att_args f = {};
        f.out = out;
        f.q = q;
        f.k_cache = static_cast<const uint16_t *>(k_cache);
        f.v_cache = static_cast<const uint16_t *>(v_cache);
        f.sinks = sinks;
        f.pos0 = pos0;
        f.n_head = n_head;
        f.gqa = a.gqa;
        f.hk = f.hv = head_dim_k;
        f.window = window;
        f.k_width = (uint32_t)a.k_row; /* bytes */
        f.v_width = (uint32_t)a.v_row;
        f.scale = scale;
        return head_dim_k == 64 ? ops_flash_launch<64, true>(f, n_tok)
                                : ops_flash_launch<128, true>(f, n_tok);
    }
    const uint64_t rows = (uint64_t)n_tok * n_head;
    ops_att_split(rows, head_dim_v, &a.n_split, &a.c_min);
    const size_t shm = sizeof(float) * (head_dim_k / 32) + head_dim_k + sizeof(float) * head_dim_v;
    ops_attention_q8_kernel<<<dim3((unsigned)rows, a.n_split), OPS_ATT_THREADS, shm,
                              gpu_stream()>>>(a);
    const int rc = GPU_LAUNCHED("ops_attention_q8_kernel");
    if (rc != 0 || a.n_split == 1)
        return rc;
    /* the f16 path's combine, over the same chunks of the scratch rows */
    struct ops_att_args c = {};
    c.out = out;
    c.scratch = scratch;
    c.pos_dev = pos_dev;
    c.sinks = sinks;
    c.pos0 = pos0;
    c.n_head = n_head;
    c.hv = head_dim_v;
    c.window = window;
    c.row = a.row;
    c.n_split = a.n_split;
    c.c_min = a.c_min;
    ops_attention_combine_kernel<<<(unsigned)rows, OPS_ATT_THREADS, 0, gpu_stream()>>>(c);
    return GPU_LAUNCHED("ops_attention_combine_kernel");
}

/* ---- MoE routing -------------------------------------------------------------------------- */

/* Ties to the lower index: whether candidate (v, i) beats (bv, bi); bi < 0 is no candidate. */
static __device__ bool ops_route_better(float v, int i, float bv, int bi)
{
    return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

/* Group-limited selection (n_group > 1): a lane per group scores it by the sum of its two best
 * scores (ties to the lower index, as the CPU's fwd_topk), lane 0 keeps the n_used best groups
 * (ties to the lower index), and the experts of the others are marked taken. */
static __device__ void ops_route_groups(const float *s, uint32_t n_expert, uint32_t n_group,
                                        uint32_t n_used, float *gs, unsigned char *kept,
                                        unsigned char *taken)
{
    const unsigned lane = threadIdx.x;
    const uint32_t per = n_expert / n_group;
    for (uint32_t g = lane; g < n_group; g += 32) {
        const float *gr = s + (size_t)g * per;
        int          b0 = -1, b1 = -1;
        for (uint32_t e = 0; e < per; e++)
            if (b0 < 0 || gr[e] > gr[b0]) {
                b1 = b0;
                b0 = (int)e;
            } else if (b1 < 0 || gr[e] > gr[b1]) {
                b1 = (int)e;
            }
        gs[g] = b1 < 0 ? gr[b0] : __fadd_rn(gr[b0], gr[b1]);
        kept[g] = 0;
    }
    __syncwarp();
    if (lane == 0)
        for (uint32_t j = 0; j < n_used; j++) {
            int bg = -1;
            for (uint32_t g = 0; g < n_group; g++)
                if (!kept[g] && (bg < 0 || gs[g] > gs[bg]))
                    bg = (int)g;
            kept[bg] = 1;
        }
    __syncwarp();
    for (uint32_t e = lane; e < n_expert; e += 32)
        taken[e] = !kept[e / per];
    __syncwarp();
}

/* One warp per token (blockDim.x == 32, blockIdx.x the token). Shared: p (n_expert), the
 * selection scores s (n_expert, only with a bias), the group scores (n_group, only with
 * groups), the taken flags and the groups' kept flags. Probabilities as moe_route/fwd_softmax:
 * expf(l - max), the sum in double, times (float)(1 / sum); selection by k rounds of a warp
 * argmax over the experts not yet taken, the winner the highest score, ties to the lower index
 * (fwd_topk, for scores without NaN). Lane 0 finishes the k weights in slot order as the CPU
 * does. */
static __global__ void ops_moe_route_kernel(const float *logits, const float *bias,
                                            uint32_t n_expert, uint32_t k, uint32_t n_group,
                                            uint32_t n_group_used, int gating, bool norm,
                                            float scale, int32_t *sel, float *sel_w)
{
    extern __shared__ float rs[];
    const uint32_t          G = n_group > 1 ? n_group : 0;
    float                  *p = rs;
    float                  *s = bias ? rs + n_expert : rs;
    float                  *gs = rs + (bias ? 2 * n_expert : n_expert);
    unsigned char          *taken = (unsigned char *)(gs + G);
    unsigned char          *kept = taken + n_expert;
    const unsigned          lane = threadIdx.x;
    const float            *l = logits + (int64_t)blockIdx.x * n_expert;

    if (gating == 0) {
        float mx = -INFINITY;
        for (uint32_t e = lane; e < n_expert; e += 32)
            mx = fmaxf(mx, l[e]);
        mx = ops_warp_reduce(mx, ops_max());
        double sum = 0.0;
        for (uint32_t e = lane; e < n_expert; e += 32) {
            const float x = expf(l[e] - mx);
            p[e] = x;
            sum += (double)x;
        }
        sum = ops_warp_reduce(sum, ops_sum());
        const float inv = (float)(1.0 / sum);
        for (uint32_t e = lane; e < n_expert; e += 32)
            p[e] = __fmul_rn(p[e], inv);
    } else if (gating == 1) {
        for (uint32_t e = lane; e < n_expert; e += 32)
            p[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-l[e])));
    } else { /* gpt-oss: the logits themselves; the softmax over the chosen ones comes after */
        for (uint32_t e = lane; e < n_expert; e += 32)
            p[e] = l[e];
    }
    for (uint32_t e = lane; e < n_expert; e += 32) {
        if (bias)
            s[e] = __fadd_rn(p[e], bias[e]);
        taken[e] = 0;
    }
    __syncwarp();
    if (G)
        ops_route_groups(s, n_expert, G, n_group_used, gs, kept, taken);

    int32_t *so = sel + (int64_t)blockIdx.x * k;
    for (uint32_t j = 0; j < k; j++) {
        float bv = 0.0f;
        int   bi = -1;
        for (uint32_t e = lane; e < n_expert; e += 32)
            if (!taken[e] && ops_route_better(s[e], (int)e, bv, bi)) {
                bv = s[e];
                bi = (int)e;
            }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(OPS_FULL_MASK, bv, o);
            const int   oi = __shfl_xor_sync(OPS_FULL_MASK, bi, o);
            if (ops_route_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        /* Every lane holds the same winner now; k <= n_expert, so there is one. */
        if (lane == 0) {
            so[j] = bi;
            taken[bi] = 1;
        }
        __syncwarp();
    }
    if (lane != 0)
        return;
    float *wo = sel_w + (int64_t)blockIdx.x * k;
    double sum = 0.0;
    for (uint32_t j = 0; j < k; j++) {
        wo[j] = p[so[j]];
        sum += (double)wo[j];
    }
    if (gating == 2) { /* the softmax of the chosen logits, as fwd_softmax */
        float mx = -INFINITY;
        for (uint32_t j = 0; j < k; j++)
            mx = fmaxf(mx, wo[j]);
        double es = 0.0;
        for (uint32_t j = 0; j < k; j++) {
            wo[j] = expf(wo[j] - mx);
            es += (double)wo[j];
        }
        const float inv = (float)(1.0 / es);
        sum = 0.0;
        for (uint32_t j = 0; j < k; j++) {
            wo[j] = __fmul_rn(wo[j], inv);
            sum += (double)wo[j];
        }
    }
    const float fsum = (float)sum > 6.103515625e-5f ? (float)sum : 6.103515625e-5f;
    for (uint32_t j = 0; norm && j < k; j++)
        wo[j] = __fdiv_rn(wo[j], fsum);
    for (uint32_t j = 0; scale != 0.0f && scale != 1.0f && j < k; j++)
        wo[j] = __fmul_rn(wo[j], scale);
}

int cuda_moe_route(const float *logits, const float *bias, uint32_t n_tok, uint32_t n_expert,
                   uint32_t k, uint32_t n_group, uint32_t n_group_used, int gating, bool norm,
                   float scale, int32_t *sel, float *sel_w)
{
    if (!logits || !sel || !sel_w || n_expert == 0 || n_expert > OPS_ROUTE_MAX_E || k == 0 ||
        k > n_expert || k > OPS_ROUTE_MAX_K || gating < 0 || gating > 2 || n_tok > INT32_MAX ||
        !gpu_route_groups_ok(n_expert, k, n_group, n_group_used))
        return ops_bad("gpu_moe_route: bad arguments");
    if (n_tok == 0)
        return 0;
    const uint32_t G = n_group > 1 ? n_group : 0;
    const size_t   shm = sizeof(float) * (n_expert * (bias ? 2 : 1) + G) + n_expert + G;
    ops_moe_route_kernel<<<n_tok, 32, shm, gpu_stream()>>>(
        logits, bias, n_expert, k, n_group, n_group_used, gating, norm, scale, sel, sel_w);
    return GPU_LAUNCHED("ops_moe_route_kernel");
}

/* ---- MoE combination ---------------------------------------------------------------------- */

/* One thread per (t, d): acc = w_0 * y_0, acc += w_j * y_j in slot order, x = acc + x, each
 * product and sum rounded alone: executor_fwd_moe's order on moe_out rows of w * y. */
static __global__ void ops_moe_combine_kernel(float *x, const float *y, const float *sel_w,
                                              uint32_t n_tok, uint32_t k, uint32_t ne)
{
    const int64_t n = (int64_t)n_tok * ne;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / ne, d = i - t * ne;
        const float  *w = sel_w + t * k;
        const float  *yr = y + t * k * ne + d;
        float         acc = __fmul_rn(w[0], yr[0]);
        for (uint32_t j = 1; j < k; j++)
            acc = __fadd_rn(acc, __fmul_rn(w[j], yr[(int64_t)j * ne]));
        x[i] = __fadd_rn(acc, x[i]);
    }
}

int cuda_moe_combine(float *x, const float *y, const float *sel_w, uint32_t n_tok, uint32_t k,
                     uint32_t ne)
{
    if (!x || !y || !sel_w || k == 0)
        return ops_bad("gpu_moe_combine: bad arguments");
    const int64_t n = (int64_t)n_tok * ne;
    if (n == 0)
        return 0;
    ops_moe_combine_kernel<<<ops_grid(n), OPS_THREADS, 0, gpu_stream()>>>(x, y, sel_w, n_tok, k,
                                                                          ne);
    return GPU_LAUNCHED("ops_moe_combine_kernel");
}

/* One thread per (t, d): x = y * s + x, s = silu(g) / g of the row's gate (gpu_gated_add). */
static __global__ void ops_gated_add_kernel(float *x, const float *y, const float *gate,
                                            uint32_t n_tok, uint32_t ne)
{
    const int64_t n = (int64_t)n_tok * ne;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = gate[i / ne];
        const float s = g != 0.0f ? __fdiv_rn(gpu_silu_mul(g, 1.0f), g) : 0.5f;
        x[i] = __fadd_rn(__fmul_rn(y[i], s), x[i]);
    }
}

int cuda_gated_add(float *x, const float *y, const float *gate, uint32_t n_tok, uint32_t ne)
{
    if (!x || !y || !gate)
        return ops_bad("gpu_gated_add: bad arguments");
    const int64_t n = (int64_t)n_tok * ne;
    if (n == 0)
        return 0;
    ops_gated_add_kernel<<<ops_grid(n), OPS_THREADS, 0, gpu_stream()>>>(x, y, gate, n_tok, ne);
    return GPU_LAUNCHED("ops_gated_add_kernel");
}

/* ---- MoE items by expert ------------------------------------------------------------------ */

/* One block: the items' experts counted (shared atomics), the counts' prefix sums and the
 * tiles (thread 0, in expert order), then one warp places the items in order, 32 at a time: the
 * lanes of an expert found by __match_any_sync, each placed after its lower peers, so that
 * every expert's items keep their order. Expert ids out of range are clamped (the routing kernel
 * never writes one). */
#define OPS_SORT_THREADS 1024

/* A pick's expert, clamped into range (the routing kernel never writes one out of it). */
static __device__ __forceinline__ int32_t ops_expert_of(int32_t x, uint32_t n_expert)
{
    return x < 0 ? 0 : (uint32_t)x >= n_expert ? (int32_t)n_expert - 1 : x;
}
static __global__ void __launch_bounds__(OPS_SORT_THREADS)
    ops_moe_sort_kernel(const int32_t *__restrict__ sel, uint32_t n, uint32_t n_expert,
                        int32_t tile, int32_t *__restrict__ items,
                        struct gpu_mm_tile *__restrict__ tiles, int32_t *__restrict__ n_tiles)
{
    extern __shared__ int32_t cnt[]; /* n_expert counts, then n_expert cursors */
    int32_t                  *cur = cnt + n_expert;
    for (uint32_t x = threadIdx.x; x < n_expert; x += blockDim.x)
        cnt[x] = 0;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        atomicAdd(&cnt[ops_expert_of(sel[i], n_expert)], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t at = 0, nt = 0;
        for (uint32_t x = 0; x < n_expert; x++) {
            const int32_t c = cnt[x];
            cur[x] = at;
            for (int32_t j = 0; j < c; j += tile)
                tiles[nt++] = {(int32_t)x, at + j, c - j < tile ? c - j : tile};
            at += c;
        }
        *n_tiles = nt;
    }
    __syncthreads();
    if (threadIdx.x >= 32)
        return;
    const unsigned lane = threadIdx.x, below = (1u << lane) - 1u;
    for (uint32_t base = 0; base < n; base += 32) {
        const uint32_t i = base + lane;
        const unsigned act = __ballot_sync(OPS_FULL_MASK, i < n);
        if (i < n) {
            const int32_t  x = ops_expert_of(sel[i], n_expert);
            const unsigned peers = __match_any_sync(act, x);
            const int32_t  at = cur[x] + __popc(peers & below);
            items[at] = (int32_t)i;
            __syncwarp(act);
            if ((peers & below) == 0) /* the lowest of its peers moves the cursor */
                cur[x] += __popc(peers);
        }
        __syncwarp();
    }
}

int cuda_moe_sort(const int32_t *sel, uint32_t n, uint32_t n_expert, int32_t tile, int32_t *items,
                  struct gpu_mm_tile *tiles, int32_t *n_tiles)
{
    if (!sel || !items || !tiles || !n_tiles || n_expert == 0 || n_expert > OPS_ROUTE_MAX_E ||
        tile < 1 || n > INT32_MAX)
        return ops_bad("gpu_moe_sort: bad arguments");
    ops_moe_sort_kernel<<<1, OPS_SORT_THREADS, 2 * n_expert * sizeof(int32_t), gpu_stream()>>>(
        sel, n, n_expert, tile, items, tiles, n_tiles);
    return GPU_LAUNCHED("ops_moe_sort_kernel");
}

/* ---- row gather / scatter ----------------------------------------------------------------- */

/* dst row (gather ? i : rows[i]) = src row (gather ? rows[i] : i), one thread per element; a
 * gather without rows copies row i. */
static __global__ void ops_rows_kernel(float *dst, int64_t dst_stride, const float *src,
                                       int64_t src_stride, const int32_t *rows, int64_t n,
                                       int64_t width, bool gather)
{
    const int64_t total = n * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / width, c = i - r * width;
        const int64_t rd = gather ? r : rows[r], rs = !gather ? r : rows ? rows[r] : r;
        dst[rd * dst_stride + c] = src[rs * src_stride + c];
    }
}

static int ops_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                    const int32_t *rows, int64_t n, int64_t width, bool gather)
{
    if (!dst || !src || (!rows && !gather) || n < 0 || width < 0 || dst_stride < width ||
        src_stride < width)
        return ops_bad(gather ? "gpu_gather_rows: bad arguments"
                              : "gpu_scatter_rows: bad arguments");
    if (n == 0 || width == 0)
        return 0;
    ops_rows_kernel<<<ops_grid(n * width), OPS_THREADS, 0, gpu_stream()>>>(
        dst, dst_stride, src, src_stride, rows, n, width, gather);
    return GPU_LAUNCHED(gather ? "ops_rows_kernel (gather)" : "ops_rows_kernel (scatter)");
}

int cuda_gather_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                     const int32_t *rows, int64_t n, int64_t width)
{
    return ops_rows(dst, dst_stride, src, src_stride, rows, n, width, true);
}

int cuda_scatter_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                      const int32_t *rows, int64_t n, int64_t width)
{
    return ops_rows(dst, dst_stride, src, src_stride, rows, n, width, false);
}
