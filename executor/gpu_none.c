/* executor/gpu_none.c - the CUDA backend's face (cuda/gpu.h) in a build without CUDA: no device,
 * every call fails. Compiled only when SLUICE_CUDA is off or nvcc was not found. */
#include <stdio.h>

#include "cuda/gpu.h"

static const char g_none[] = "this sluice was built without CUDA (-DSLUICE_CUDA=OFF or no nvcc)";

bool gpu_built(void)
{
    return false;
}

int gpu_device_count(char *why, size_t why_len)
{
    if (why && why_len)
        snprintf(why, why_len, "%s", g_none);
    return 0;
}

int gpu_select(int dev, struct gpu_info *info, char *why, size_t why_len)
{
    (void)dev;
    (void)info;
    return gpu_device_count(why, why_len) - 1;
}

const char *gpu_last_error(void)
{
    return g_none;
}

void *gpu_malloc(size_t bytes)
{
    (void)bytes;
    return NULL;
}

void gpu_free(void *p)
{
    (void)p;
}

int gpu_upload(void *dst, const void *src, size_t bytes)
{
    (void)dst;
    (void)src;
    (void)bytes;
    return -1;
}

int gpu_download(void *dst, const void *src, size_t bytes)
{
    (void)dst;
    (void)src;
    (void)bytes;
    return -1;
}

int gpu_memset(void *dst, int byte, size_t bytes)
{
    (void)dst;
    (void)byte;
    (void)bytes;
    return -1;
}

int gpu_sync(void)
{
    return -1;
}

double gpu_membw_probe(size_t bytes)
{
    (void)bytes;
    return 0.0;
}

/* The kernels: never reached (no device is ever selected), present for the link. */

bool gpu_type_supported(uint32_t type)
{
    (void)type;
    return false;
}

int gpu_dequant_rows(uint32_t type, const void *w, size_t row_bytes, int64_t cols,
                     const int32_t *ids, int64_t n_rows, void *out, int64_t out_stride,
                     bool out_f16)
{
    (void)type, (void)w, (void)row_bytes, (void)cols, (void)ids, (void)n_rows, (void)out;
    (void)out_stride, (void)out_f16;
    return -1;
}

int gpu_matvec(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
               const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride)
{
    (void)type, (void)w, (void)row_bytes, (void)rows, (void)cols, (void)x, (void)x_stride;
    (void)n, (void)y, (void)y_stride;
    return -1;
}

int gpu_matvec_ids(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                   int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items, const float *x,
                   int64_t x_stride, int64_t x_div, float *y, int64_t y_stride)
{
    (void)type, (void)w, (void)expert_bytes, (void)row_bytes, (void)rows, (void)cols, (void)ids;
    (void)n_items, (void)x, (void)x_stride, (void)x_div, (void)y, (void)y_stride;
    return -1;
}

int gpu_f32_to_f16(const float *x, int64_t x_stride, int64_t n, int64_t cols, uint16_t *out)
{
    (void)x, (void)x_stride, (void)n, (void)cols, (void)out;
    return -1;
}

int gpu_gemm_f16(const uint16_t *w16, int64_t rows, int64_t cols, const uint16_t *x16, int64_t n,
                 float *y, int64_t y_stride)
{
    (void)w16, (void)rows, (void)cols, (void)x16, (void)n, (void)y, (void)y_stride;
    return -1;
}

int gpu_rmsnorm(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                int64_t n_rows, int64_t width, float eps)
{
    (void)y, (void)y_stride, (void)x, (void)x_stride, (void)w, (void)n_rows, (void)width, (void)eps;
    return -1;
}

int gpu_add(float *y, const float *a, const float *b, int64_t n)
{
    (void)y, (void)a, (void)b, (void)n;
    return -1;
}

int gpu_add_bias(float *y, int64_t stride, const float *bias, int64_t n_rows, int64_t width)
{
    (void)y, (void)stride, (void)bias, (void)n_rows, (void)width;
    return -1;
}

int gpu_swiglu(float *g, const float *u, int64_t n, bool relu2)
{
    (void)g, (void)u, (void)n, (void)relu2;
    return -1;
}

int gpu_rope(float *v, int64_t n_tok, int64_t tok_stride, uint32_t n_heads, uint32_t head_dim,
             uint32_t n_rot, const float *cs, bool neox)
{
    (void)v, (void)n_tok, (void)tok_stride, (void)n_heads, (void)head_dim, (void)n_rot, (void)cs;
    (void)neox;
    return -1;
}

int gpu_kv_store(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                 const float *k, const float *v, uint32_t pos0, uint32_t n_tok)
{
    (void)k_cache, (void)v_cache, (void)k_width, (void)v_width, (void)k, (void)v, (void)pos0;
    (void)n_tok;
    return -1;
}

int gpu_attention(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                  uint32_t n_tok, uint32_t pos0, uint32_t n_head, uint32_t n_head_kv,
                  uint32_t head_dim_k, uint32_t head_dim_v, float scale, uint32_t window,
                  float *scratch)
{
    (void)out, (void)q, (void)k_cache, (void)v_cache, (void)n_tok, (void)pos0, (void)n_head;
    (void)n_head_kv, (void)head_dim_k, (void)head_dim_v, (void)scale, (void)window, (void)scratch;
    return -1;
}

int gpu_moe_route(const float *logits, const float *bias, uint32_t n_tok, uint32_t n_expert,
                  uint32_t k, int gating, bool norm, float scale, int32_t *sel, float *sel_w)
{
    (void)logits, (void)bias, (void)n_tok, (void)n_expert, (void)k, (void)gating, (void)norm;
    (void)scale, (void)sel, (void)sel_w;
    return -1;
}

int gpu_moe_combine(float *x, const float *y, const float *sel_w, uint32_t n_tok, uint32_t k,
                    uint32_t ne)
{
    (void)x, (void)y, (void)sel_w, (void)n_tok, (void)k, (void)ne;
    return -1;
}

int gpu_gather_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                    const int32_t *rows, int64_t n, int64_t width)
{
    (void)dst, (void)dst_stride, (void)src, (void)src_stride, (void)rows, (void)n, (void)width;
    return -1;
}

int gpu_scatter_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                     const int32_t *rows, int64_t n, int64_t width)
{
    (void)dst, (void)dst_stride, (void)src, (void)src_stride, (void)rows, (void)n, (void)width;
    return -1;
}

int gpu_act_round(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                  float *out)
{
    (void)act_type, (void)x, (void)x_stride, (void)n, (void)cols, (void)out;
    return -1;
}
