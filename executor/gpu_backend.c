/* executor/gpu_backend.c - the device interface (cuda/gpu.h) over the backend of the process:
 * the host's when SLUICE_GPU_BACKEND=host, none when it is "none", otherwise CUDA's (none in a
 * build without CUDA). Chosen once, at the first call. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cuda/gpu.h"

static const char g_none[] = "this sluice was built without CUDA (-DSLUICE_CUDA=OFF or no nvcc)";
static const char g_off[] = "no device backend (SLUICE_GPU_BACKEND=none)";

static const struct gpu_backend *g_be;
static const char               *g_why = g_none; /* why there is none */
static pthread_once_t            g_once = PTHREAD_ONCE_INIT;

static void be_pick(void)
{
    const char *v = getenv("SLUICE_GPU_BACKEND");
    if (v && strcmp(v, "host") == 0) {
        g_be = gpu_backend_host();
    } else if (v && strcmp(v, "none") == 0) {
        g_be = NULL;
        g_why = g_off;
    } else {
        g_be = gpu_backend_cuda();
    }
}

static const struct gpu_backend *be(void)
{
    (void)pthread_once(&g_once, be_pick);
    return g_be;
}

bool gpu_built(void)
{
    return be() != NULL;
}

const char *gpu_backend_name(void)
{
    return be() ? be()->name : "CUDA";
}

int gpu_device_count(char *why, size_t why_len)
{
    if (be())
        return be()->device_count(why, why_len);
    if (why && why_len)
        snprintf(why, why_len, "%s", g_why);
    return 0;
}

int gpu_select(int dev, struct gpu_info *info, char *why, size_t why_len)
{
    if (be())
        return be()->select(dev, info, why, why_len);
    if (why && why_len)
        snprintf(why, why_len, "%s", g_why);
    return -1;
}

const char *gpu_last_error(void)
{
    return be() ? be()->last_error() : g_why;
}

void *gpu_malloc(size_t bytes)
{
    return be() ? be()->alloc(bytes) : NULL;
}

void gpu_free(void *p)
{
    if (be())
        be()->release(p);
}

struct gpu_event *gpu_event_new(void)
{
    return be() ? be()->event_new() : NULL;
}

void gpu_event_free(struct gpu_event *ev)
{
    if (be() && ev)
        be()->event_free(ev);
}

int gpu_copy_async(void *dst_device, const void *src_host, size_t bytes)
{
    return be() ? be()->copy_async(dst_device, src_host, bytes) : -1;
}

int gpu_event_record_copy(struct gpu_event *ev)
{
    return be() ? be()->event_record_copy(ev) : -1;
}

int gpu_event_record_kernels(struct gpu_event *ev)
{
    return be() ? be()->event_record_kernels(ev) : -1;
}

int gpu_stream_wait(struct gpu_event *ev)
{
    return be() ? be()->stream_wait(ev) : -1;
}

int gpu_copy_wait(struct gpu_event *ev)
{
    return be() ? be()->copy_wait(ev) : -1;
}

int gpu_event_sync(struct gpu_event *ev)
{
    return be() ? be()->event_sync(ev) : -1;
}

bool gpu_copy_times(uint64_t *busy_ns, uint64_t *stall_ns)
{
    return be() && be()->copy_times(busy_ns, stall_ns);
}

bool gpu_graphs_supported(void)
{
    return be() && be()->graph_begin;
}

int gpu_graph_begin(void)
{
    return gpu_graphs_supported() ? be()->graph_begin() : -1;
}

int gpu_graph_end(struct gpu_graph **graph)
{
    return gpu_graphs_supported() ? be()->graph_end(graph) : -1;
}

int gpu_graph_launch(struct gpu_graph *graph)
{
    return gpu_graphs_supported() && graph ? be()->graph_launch(graph) : -1;
}

void gpu_graph_free(struct gpu_graph *graph)
{
    if (graph && gpu_graphs_supported())
        be()->graph_free(graph);
}

int gpu_upload(void *dst, const void *src, size_t bytes)
{
    return be() ? be()->upload(dst, src, bytes) : -1;
}

int gpu_download(void *dst, const void *src, size_t bytes)
{
    return be() ? be()->download(dst, src, bytes) : -1;
}

int gpu_memset(void *dst, int byte, size_t bytes)
{
    return be() ? be()->fill(dst, byte, bytes) : -1;
}

int gpu_sync(void)
{
    return be() ? be()->sync() : -1;
}

double gpu_membw_probe(size_t bytes)
{
    return be() ? be()->membw_probe(bytes) : 0.0;
}

bool gpu_type_supported(uint32_t type)
{
    return be() && be()->type_supported(type);
}

int gpu_dequant_rows(uint32_t type, const void *w, size_t row_bytes, int64_t cols,
                     const int32_t *ids, int64_t n_rows, void *out, int64_t out_stride,
                     bool out_f16)
{
    return be()
               ? be()->dequant_rows(type, w, row_bytes, cols, ids, n_rows, out, out_stride, out_f16)
               : -1;
}

int gpu_matvec(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
               const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride)
{
    return be() ? be()->matvec(type, w, row_bytes, rows, cols, x, x_stride, n, y, y_stride) : -1;
}

int gpu_matvec_ids(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                   int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items, const float *x,
                   int64_t x_stride, int64_t x_div, float *y, int64_t y_stride)
{
    return be() ? be()->matvec_ids(type, w, expert_bytes, row_bytes, rows, cols, ids, n_items, x,
                                   x_stride, x_div, y, y_stride)
                : -1;
}

int gpu_f32_to_f16(const float *x, int64_t x_stride, int64_t n, int64_t cols, uint16_t *out)
{
    return be() ? be()->f32_to_f16(x, x_stride, n, cols, out) : -1;
}

int gpu_gemm_f16(const uint16_t *w16, int64_t rows, int64_t cols, const uint16_t *x16, int64_t n,
                 float *y, int64_t y_stride)
{
    return be() ? be()->gemm_f16(w16, rows, cols, x16, n, y, y_stride) : -1;
}

bool gpu_matvec_q8_supported(uint32_t type)
{
    switch (type) {
    case COMMON_GGML_TYPE_Q4_0:
    case COMMON_GGML_TYPE_Q4_1:
    case COMMON_GGML_TYPE_Q5_0:
    case COMMON_GGML_TYPE_Q5_1:
    case COMMON_GGML_TYPE_Q8_0:
    case COMMON_GGML_TYPE_Q4_K:
    case COMMON_GGML_TYPE_Q5_K:
    case COMMON_GGML_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

int gpu_act_q8(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
               void *q8)
{
    return be() ? be()->act_q8(act_type, x, x_stride, n, cols, q8) : -1;
}

int gpu_matvec_q8(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                  const void *q8, int64_t n, float *y, int64_t y_stride)
{
    return gpu_matvec_q8_op(GPU_MV_SET, type, w, NULL, row_bytes, rows, cols, q8, n, y, y_stride);
}

int gpu_matvec_q8_op(enum gpu_mv_op op, uint32_t type, const void *w, const void *w2,
                     size_t row_bytes, int64_t rows, int64_t cols, const void *q8, int64_t n,
                     float *y, int64_t y_stride)
{
    return be() ? be()->matvec_q8((int)op, type, w, w2, row_bytes, rows, cols, q8, n, y, y_stride)
                : -1;
}

int gpu_matvec_ids_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                      int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items,
                      const void *q8, int64_t x_div, float *y, int64_t y_stride)
{
    return be() ? be()->matvec_ids_q8(type, w, NULL, expert_bytes, row_bytes, rows, cols, ids,
                                      n_items, q8, x_div, y, y_stride)
                : -1;
}

int gpu_matvec_ids_glu_q8(uint32_t type, const void *wg, const void *wu, size_t expert_bytes,
                          size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                          int64_t n_items, const void *q8, int64_t x_div, float *y,
                          int64_t y_stride)
{
    return be() && wu ? be()->matvec_ids_q8(type, wg, wu, expert_bytes, row_bytes, rows, cols, ids,
                                            n_items, q8, x_div, y, y_stride)
                      : -1;
}

int gpu_matvec_groups_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                         int64_t rows, int64_t cols, const struct gpu_group *groups,
                         int64_t n_groups, const void *q8, float *y, int64_t y_stride)
{
    return be() ? be()->matvec_groups_q8(type, w, expert_bytes, row_bytes, rows, cols, groups,
                                         n_groups, q8, y, y_stride)
                : -1;
}

int gpu_act_round(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                  float *out)
{
    return be() ? be()->act_round(act_type, x, x_stride, n, cols, out) : -1;
}

int gpu_rmsnorm(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                int64_t n_rows, int64_t width, float eps)
{
    return be() ? be()->rmsnorm(y, y_stride, x, x_stride, w, n_rows, width, eps) : -1;
}

int gpu_add(float *y, const float *a, const float *b, int64_t n)
{
    return be() ? be()->add(y, a, b, n) : -1;
}

int gpu_add_bias(float *y, int64_t stride, const float *bias, int64_t n_rows, int64_t width)
{
    return be() ? be()->add_bias(y, stride, bias, n_rows, width) : -1;
}

int gpu_swiglu(float *g, const float *u, int64_t n, bool relu2)
{
    return be() ? be()->swiglu(g, u, n, relu2) : -1;
}

int gpu_rope(float *v, int64_t n_tok, int64_t tok_stride, uint32_t n_heads, uint32_t head_dim,
             uint32_t n_rot, const float *cs, bool neox)
{
    return be() ? be()->rope(v, n_tok, tok_stride, n_heads, head_dim, n_rot, cs, neox) : -1;
}

int gpu_kv_store(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                 const float *k, const float *v, uint32_t pos0, uint32_t n_tok)
{
    return be() ? be()->kv_store(k_cache, v_cache, k_width, v_width, k, v, pos0, NULL, n_tok) : -1;
}

int gpu_kv_store_at(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                    const float *k, const float *v, const uint32_t *pos_dev, uint32_t n_tok)
{
    return be() && pos_dev
               ? be()->kv_store(k_cache, v_cache, k_width, v_width, k, v, 0, pos_dev, n_tok)
               : -1;
}

int gpu_attention(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                  uint32_t n_tok, uint32_t pos0, uint32_t n_head, uint32_t n_head_kv,
                  uint32_t head_dim_k, uint32_t head_dim_v, float scale, uint32_t window,
                  float *scratch)
{
    return be() ? be()->attention(out, q, k_cache, v_cache, n_tok, pos0, NULL, 0, n_head, n_head_kv,
                                  head_dim_k, head_dim_v, scale, window, scratch)
                : -1;
}

int gpu_attention_at(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                     uint32_t n_tok, const uint32_t *pos_dev, uint32_t row_stride, uint32_t n_head,
                     uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v, float scale,
                     uint32_t window, float *scratch)
{
    return be() && pos_dev && row_stride
               ? be()->attention(out, q, k_cache, v_cache, n_tok, 0, pos_dev, row_stride, n_head,
                                 n_head_kv, head_dim_k, head_dim_v, scale, window, scratch)
               : -1;
}

int gpu_moe_route(const float *logits, const float *bias, uint32_t n_tok, uint32_t n_expert,
                  uint32_t k, int gating, bool norm, float scale, int32_t *sel, float *sel_w)
{
    return be() ? be()->moe_route(logits, bias, n_tok, n_expert, k, gating, norm, scale, sel, sel_w)
                : -1;
}

int gpu_moe_combine(float *x, const float *y, const float *sel_w, uint32_t n_tok, uint32_t k,
                    uint32_t ne)
{
    return be() ? be()->moe_combine(x, y, sel_w, n_tok, k, ne) : -1;
}

int gpu_gather_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                    const int32_t *rows, int64_t n, int64_t width)
{
    return be() ? be()->gather_rows(dst, dst_stride, src, src_stride, rows, n, width) : -1;
}

int gpu_scatter_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                     const int32_t *rows, int64_t n, int64_t width)
{
    return be() ? be()->scatter_rows(dst, dst_stride, src, src_stride, rows, n, width) : -1;
}
