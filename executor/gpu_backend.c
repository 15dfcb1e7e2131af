/* executor/gpu_backend.c - the device interface (cuda/gpu.h) over the backend of the calling
 * thread's current device: the CPU device's (GPU_DEV_CPU: the CPU's kernels, in every build), or
 * the process's: the host's when SLUICE_GPU_BACKEND=host, the CPU's when "cpu", none when it is
 * "none", otherwise CUDA's (none in a build without CUDA), chosen once, at the first call. */
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
    } else if (v && strcmp(v, "cpu") == 0) {
        g_be = gpu_backend_cpu();
    } else if (v && strcmp(v, "none") == 0) {
        g_be = NULL;
        g_why = g_off;
    } else {
        g_be = gpu_backend_cuda();
    }
}

/* The calling thread's current device (gpu_select, gpu_use): one of the process backend's, or
 * GPU_DEV_CPU, whose operations are the CPU device's backend. */
static _Thread_local int t_dev;

static const struct gpu_backend *be(void)
{
    if (t_dev == GPU_DEV_CPU)
        return gpu_backend_cpu_device();
    (void)pthread_once(&g_once, be_pick);
    return g_be;
}

/* The process backend's, whatever the thread's device. */
static const struct gpu_backend *be_main(void)
{
    (void)pthread_once(&g_once, be_pick);
    return g_be;
}

/* ---- SLUICE_GPU_PROFILE=1: each operation synchronised and timed --------------------------- */

/* With SLUICE_GPU_PROFILE set (not "0"), every kernel operation waits for the device before and
 * after it, and its wall time is added to its name's row; the table goes to stderr at exit. The
 * waits slow a run down (a decode step most), so the figures say where the time of a prefill goes,
 * not how fast a run is. Graph captures are not timed (a graph's launch is, whole). */
#define PROF_MAX 48
struct prof_row {
    const char *name;
    uint64_t    calls, ns;
};
static struct prof_row g_prof[PROF_MAX];
static int             g_prof_on = -1; /* -1: not yet read */
static bool            g_capturing;
static pthread_mutex_t g_prof_mu = PTHREAD_MUTEX_INITIALIZER;

static void prof_report(void)
{
    uint64_t all = 0, ops = 0;
    int      n = 0;
    for (; n < PROF_MAX && g_prof[n].name; n++) {
        all += g_prof[n].ns;
        ops += g_prof[n].calls;
    }
    for (int i = 1; i < n; i++) /* by time, the most first */
        for (int j = i; j > 0 && g_prof[j].ns > g_prof[j - 1].ns; j--) {
            const struct prof_row t = g_prof[j];
            g_prof[j] = g_prof[j - 1];
            g_prof[j - 1] = t;
        }
    fprintf(stderr, "gpu profile: %llu operations, each synchronised, %.1f ms in all\n",
            (unsigned long long)ops, (double)all / 1e6);
    fprintf(stderr, "  %-22s %9s %11s %10s %6s\n", "operation", "calls", "total ms", "mean us",
            "share");
    for (int i = 0; i < n; i++)
        fprintf(stderr, "  %-22s %9llu %11.2f %10.1f %5.1f%%\n", g_prof[i].name,
                (unsigned long long)g_prof[i].calls, (double)g_prof[i].ns / 1e6,
                (double)g_prof[i].ns / 1e3 / (double)g_prof[i].calls,
                all ? 100.0 * (double)g_prof[i].ns / (double)all : 0.0);
}

static bool prof_on(void)
{
    if (g_prof_on < 0) {
        const char *v = getenv("SLUICE_GPU_PROFILE");
        g_prof_on = v && *v && strcmp(v, "0") != 0;
        if (g_prof_on)
            atexit(prof_report);
    }
    return g_prof_on == 1 && !g_capturing && be();
}

/* The start of an operation: 0 when it is not timed. */
static uint64_t prof_begin(void)
{
    if (!prof_on())
        return 0;
    (void)be()->sync();
    return common_now_ns();
}

/* The end of an operation begun at t0; returns its result rc. */
static int prof_end(uint64_t t0, const char *name, int rc)
{
    if (t0 == 0)
        return rc;
    (void)be()->sync();
    const uint64_t dt = common_now_ns() - t0;
    pthread_mutex_lock(&g_prof_mu);
    for (int i = 0; i < PROF_MAX; i++) {
        if (!g_prof[i].name)
            g_prof[i].name = name;
        if (strcmp(g_prof[i].name, name) == 0) {
            g_prof[i].calls++;
            g_prof[i].ns += dt;
            break;
        }
    }
    pthread_mutex_unlock(&g_prof_mu);
    return rc;
}

uint64_t gpu_prof_begin(void)
{
    return prof_begin();
}

int gpu_prof_end(uint64_t t0, const char *name, int rc)
{
    return prof_end(t0, name, rc);
}

bool gpu_built(void)
{
    return be_main() != NULL;
}

const char *gpu_backend_name(void)
{
    return be_main() ? be_main()->name : "CUDA";
}

bool gpu_backend_in_ram(void)
{
    return be_main() && be_main()->weights_in_place;
}

const char *gpu_device_name(int dev, char *buf, size_t len)
{
    if (dev == GPU_DEV_CPU)
        snprintf(buf, len, "CPU");
    else
        snprintf(buf, len, "%s%d", be_main() ? be_main()->name : "CUDA", dev);
    return buf;
}

int gpu_device_count(char *why, size_t why_len)
{
    if (be_main())
        return be_main()->device_count(why, why_len);
    if (why && why_len)
        snprintf(why, why_len, "%s", g_why);
    return 0;
}

/* The backend of device dev. */
static const struct gpu_backend *be_of(int dev)
{
    return dev == GPU_DEV_CPU ? gpu_backend_cpu_device() : be_main();
}

int gpu_select(int dev, struct gpu_info *info, char *why, size_t why_len)
{
    const struct gpu_backend *b = be_of(dev);
    if (!b) {
        if (why && why_len)
            snprintf(why, why_len, "%s", g_why);
        return -1;
    }
    if (b->select(dev, info, why, why_len) < 0)
        return -1;
    t_dev = dev;
    return 0;
}

int gpu_use(int dev)
{
    const struct gpu_backend *b = be_of(dev);
    if (!b || b->use(dev) < 0)
        return -1;
    t_dev = dev;
    return 0;
}

int gpu_current(void)
{
    return t_dev;
}

const char *gpu_last_error(void)
{
    return be() ? be()->last_error() : g_why;
}

bool gpu_matvec_any_rows(void)
{
    return be() && be()->matvec_any_rows;
}

bool gpu_attention_own_scratch(void)
{
    return be() && be()->attention_own_scratch;
}

bool gpu_weights_in_place(void)
{
    return be() && be()->weights_in_place;
}

void gpu_threads(struct executor_threadpool *pool)
{
    /* the CPU's kernels, whichever device they run for (the CPU device or the process's) */
    gpu_backend_cpu()->threads(pool);
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

int gpu_host_register(const void *p, size_t bytes, bool read_only)
{
    return be() ? be()->host_register(p, bytes, read_only) : -1;
}

size_t gpu_va_granularity(void)
{
    const char *no = getenv("SLUICE_NO_VMM");
    if (!be() || !be()->va_granularity || (no && no[0] && strcmp(no, "0") != 0))
        return 0;
    return be()->va_granularity();
}

void *gpu_va_reserve(size_t bytes)
{
    return be() && be()->va_reserve ? be()->va_reserve(bytes) : NULL;
}

int gpu_va_map(void *at, size_t bytes)
{
    return be() && be()->va_map ? be()->va_map(at, bytes) : -1;
}

void gpu_va_unmap(void *at, size_t bytes)
{
    if (be() && be()->va_unmap)
        be()->va_unmap(at, bytes);
}

void gpu_va_free(void *base, size_t bytes)
{
    if (be() && be()->va_free && base)
        be()->va_free(base, bytes);
}

void gpu_host_unregister(const void *p)
{
    if (be() && p)
        be()->host_unregister(p);
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

int gpu_stream_wait_shared(struct common_devmem_event *ev)
{
    return be() ? be()->stream_wait_shared(ev) : -1;
}

int gpu_event_record_kernels_shared(struct common_devmem_event *ev)
{
    return be() ? be()->event_record_kernels_shared(ev) : -1;
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
    const int rc = gpu_graphs_supported() ? be()->graph_begin() : -1;
    g_capturing = rc == 0;
    return rc;
}

int gpu_graph_end(struct gpu_graph **graph)
{
    g_capturing = false;
    return gpu_graphs_supported() ? be()->graph_end(graph) : -1;
}

int gpu_graph_launch(struct gpu_graph *graph)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "graph_launch",
                    gpu_graphs_supported() && graph ? be()->graph_launch(graph) : -1);
}

void gpu_graph_free(struct gpu_graph *graph)
{
    if (graph && gpu_graphs_supported())
        be()->graph_free(graph);
}

int gpu_upload(void *dst, const void *src, size_t bytes)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "upload", be() ? be()->upload(dst, src, bytes) : -1);
}

int gpu_upload_queued(void *dst, const void *src, size_t bytes)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "upload (queued)", be() ? be()->upload_queued(dst, src, bytes) : -1);
}

int gpu_download(void *dst, const void *src, size_t bytes)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "download", be() ? be()->download(dst, src, bytes) : -1);
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
    const uint64_t t0 = prof_begin();
    return prof_end(
        t0, "dequant_rows",
        be() ? be()->dequant_rows(type, w, row_bytes, cols, ids, n_rows, out, out_stride, out_f16)
             : -1);
}

int gpu_matvec(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
               const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "matvec",
                    be() ? be()->matvec(type, w, row_bytes, rows, cols, x, x_stride, n, y, y_stride)
                         : -1);
}

int gpu_matvec_ids(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                   int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items, const float *x,
                   int64_t x_stride, int64_t x_div, float *y, int64_t y_stride)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "matvec_ids",
                    be() ? be()->matvec_ids(type, w, expert_bytes, row_bytes, rows, cols, ids,
                                            n_items, x, x_stride, x_div, y, y_stride)
                         : -1);
}

int gpu_f32_to_f16(const float *x, int64_t x_stride, int64_t n, int64_t cols, uint16_t *out)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "f32_to_f16", be() ? be()->f32_to_f16(x, x_stride, n, cols, out) : -1);
}

int gpu_gemm_f16(const uint16_t *w16, int64_t rows, int64_t cols, const uint16_t *x16, int64_t n,
                 float *y, int64_t y_stride)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "gemm_f16",
                    be() ? be()->gemm_f16(w16, rows, cols, x16, n, y, y_stride) : -1);
}

int gpu_gemm_q(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes, int64_t rows,
               int64_t cols, const uint16_t *x16, int64_t n, const struct gpu_mm_tile *tiles,
               int64_t n_tiles, const int32_t *items, int32_t x_div, float *y, int64_t y_stride)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, tiles ? "gemm_q_tiles" : "gemm_q",
                    be() ? be()->gemm_q(type, w, expert_bytes, row_bytes, rows, cols, x16, n, tiles,
                                        n_tiles, NULL, items, x_div, y, y_stride)
                         : -1);
}

int gpu_gemm_q_used(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                    int64_t rows, int64_t cols, const uint16_t *x16,
                    const struct gpu_mm_tile *tiles, int64_t n_tiles, const int32_t *n_used,
                    const int32_t *items, int32_t x_div, float *y, int64_t y_stride)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "gemm_q_tiles",
                    be() && tiles && n_used
                        ? be()->gemm_q(type, w, expert_bytes, row_bytes, rows, cols, x16, 0, tiles,
                                       n_tiles, n_used, items, x_div, y, y_stride)
                        : -1);
}

int gpu_act_q8(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
               void *q8)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "act_q8", be() ? be()->act_q8(act_type, x, x_stride, n, cols, q8) : -1);
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
    const uint64_t t0 = prof_begin();
    return prof_end(
        t0, "matvec_q8",
        be() ? be()->matvec_q8((int)op, type, w, w2, row_bytes, rows, cols, q8, n, y, y_stride)
             : -1);
}

int gpu_matvec_q8_cat(uint32_t type, int n_mat, const void *const *w, const int64_t *rows,
                      size_t row_bytes, int64_t cols, const void *q8, float *const *y)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "matvec_q8_cat",
                    be() ? be()->matvec_q8_cat(type, n_mat, w, rows, row_bytes, cols, q8, y) : -1);
}

int gpu_matvec_ids_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                      int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items,
                      const void *q8, int64_t x_div, float *y, int64_t y_stride)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "matvec_ids_q8",
                    be() ? be()->matvec_ids_q8(type, w, NULL, expert_bytes, row_bytes, rows, cols,
                                               ids, n_items, q8, x_div, y, y_stride)
                         : -1);
}

int gpu_matvec_ids_glu_q8(uint32_t type, const void *wg, const void *wu, size_t expert_bytes,
                          size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                          int64_t n_items, const void *q8, int64_t x_div, float *y,
                          int64_t y_stride)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "matvec_ids_q8",
                    be() && wu ? be()->matvec_ids_q8(type, wg, wu, expert_bytes, row_bytes, rows,
                                                     cols, ids, n_items, q8, x_div, y, y_stride)
                               : -1);
}

int gpu_matvec_ids_combine_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                              int64_t rows, int64_t cols, const int32_t *ids, const float *sel_w,
                              int64_t n_tok, int32_t k, const void *q8, float *x, int64_t x_stride)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "matvec_ids_combine_q8",
                    be() ? be()->matvec_ids_combine_q8(type, w, expert_bytes, row_bytes, rows, cols,
                                                       ids, sel_w, n_tok, k, q8, x, x_stride)
                         : -1);
}

int gpu_matvec_groups_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                         int64_t rows, int64_t cols, const struct gpu_group *groups,
                         int64_t n_groups, const void *q8, float *y, int64_t y_stride)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "matvec_groups_q8",
                    be() ? be()->matvec_groups_q8(type, w, expert_bytes, row_bytes, rows, cols,
                                                  groups, n_groups, q8, y, y_stride)
                         : -1);
}

int gpu_act_round(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                  float *out)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "act_round",
                    be() ? be()->act_round(act_type, x, x_stride, n, cols, out) : -1);
}

int gpu_rmsnorm(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                int64_t n_rows, int64_t width, float eps)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "rmsnorm",
                    be() ? be()->rmsnorm(y, y_stride, x, x_stride, w, n_rows, width, eps) : -1);
}

int gpu_rmsnorm_q8(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                   int64_t n_rows, int64_t width, float eps, uint32_t act_type, void *q8)
{
    const uint64_t t0 = prof_begin();
    return prof_end(
        t0, "rmsnorm_q8",
        be() ? be()->rmsnorm_q8(y, y_stride, x, x_stride, w, n_rows, width, eps, act_type, q8)
             : -1);
}

int gpu_add(float *y, const float *a, const float *b, int64_t n)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "add", be() ? be()->add(y, a, b, n) : -1);
}

int gpu_add_bias(float *y, int64_t stride, const float *bias, int64_t n_rows, int64_t width)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "add_bias",
                    be() ? be()->add_bias(y, stride, bias, 1, NULL, n_rows, width) : -1);
}

int gpu_add_bias_ids(float *y, int64_t stride, const float *bias, int32_t n_bias,
                     const int32_t *ids, int64_t n_rows, int64_t width)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "add_bias_ids",
                    be() ? be()->add_bias(y, stride, bias, n_bias, ids, n_rows, width) : -1);
}

int gpu_scale_rows(float *y, int64_t stride, int64_t n_rows, int64_t width, float s)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "scale_rows", be() ? be()->scale_rows(y, stride, n_rows, width, s) : -1);
}

int gpu_swiglu(float *g, const float *u, int64_t n, bool relu2)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "swiglu", be() ? be()->swiglu(g, u, n, relu2) : -1);
}

int gpu_swiglu_oai(float *g, const float *u, int64_t n_rows, int64_t width, const float *gb,
                   const float *ub, int32_t n_bias, const int32_t *ids)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "swiglu_oai",
                    be() ? be()->swiglu_oai(g, u, n_rows, width, gb, ub, n_bias, ids) : -1);
}

int gpu_rope(float *v, int64_t n_tok, int64_t tok_stride, uint32_t n_heads, uint32_t head_dim,
             uint32_t n_rot, const float *cs, bool neox)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "rope",
                    be() ? be()->rope(v, n_tok, tok_stride, n_heads, head_dim, n_rot, cs, neox)
                         : -1);
}

int gpu_rope_qk(float *q, int64_t q_stride, uint32_t n_head, float *k, int64_t k_stride,
                uint32_t n_head_kv, int64_t n_tok, uint32_t head_dim, uint32_t n_rot,
                const float *cs, bool neox, const float *q_norm, const float *k_norm, float eps,
                const struct gpu_kv_dst *kv)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "rope_qk",
                    be() ? be()->rope_qk(q, q_stride, n_head, k, k_stride, n_head_kv, n_tok,
                                         head_dim, n_rot, cs, neox, q_norm, k_norm, eps, kv)
                         : -1);
}

int gpu_kv_store(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                 const float *k, const float *v, uint32_t pos0, uint32_t n_tok)
{
    const uint64_t t0 = prof_begin();
    return prof_end(
        t0, "kv_store",
        be() ? be()->kv_store(k_cache, v_cache, k_width, v_width, k, v, pos0, NULL, n_tok) : -1);
}

int gpu_kv_store_at(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                    const float *k, const float *v, const uint32_t *pos_dev, uint32_t n_tok)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "kv_store",
                    be() && pos_dev ? be()->kv_store(k_cache, v_cache, k_width, v_width, k, v, 0,
                                                     pos_dev, n_tok)
                                    : -1);
}

int gpu_attention(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                  uint32_t n_tok, uint32_t pos0, uint32_t n_head, uint32_t n_head_kv,
                  uint32_t head_dim_k, uint32_t head_dim_v, float scale, uint32_t window,
                  float *scratch, const float *sinks)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "attention",
                    be() ? be()->attention(out, q, k_cache, v_cache, n_tok, pos0, NULL, 0, n_head,
                                           n_head_kv, head_dim_k, head_dim_v, scale, window,
                                           scratch, sinks)
                         : -1);
}

int gpu_attention_at(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                     uint32_t n_tok, const uint32_t *pos_dev, uint32_t row_stride, uint32_t n_head,
                     uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v, float scale,
                     uint32_t window, float *scratch, const float *sinks)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "attention",
                    be() && pos_dev && row_stride
                        ? be()->attention(out, q, k_cache, v_cache, n_tok, 0, pos_dev, row_stride,
                                          n_head, n_head_kv, head_dim_k, head_dim_v, scale, window,
                                          scratch, sinks)
                        : -1);
}

int gpu_kv_store_q8(void *k_cache, void *v_cache, uint32_t k_width, uint32_t v_width,
                    const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                    uint32_t n_tok)
{
    const uint64_t t0 = prof_begin();
    return prof_end(
        t0, "kv_store",
        be() && be()->kv_store_q8
            ? be()->kv_store_q8(k_cache, v_cache, k_width, v_width, k, v, pos0, pos_dev, n_tok)
            : -1);
}

int gpu_attention_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                     uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                     uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v,
                     float scale, uint32_t window, float *scratch, const float *sinks)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "attention",
                    be() && be()->attention_q8 && (!pos_dev || row_stride)
                        ? be()->attention_q8(out, q, k_cache, v_cache, n_tok, pos0, pos_dev,
                                             row_stride, n_head, n_head_kv, head_dim_k, head_dim_v,
                                             scale, window, scratch, sinks)
                        : -1);
}

bool gpu_attention_ring_supported(void)
{
    return be() && be()->attention_ring;
}

int gpu_attention_ring(bool q8, float *out, const float *q, const void *k_cache,
                       const void *v_cache, uint32_t n_tok, uint32_t pos0, uint32_t cap,
                       uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k,
                       uint32_t head_dim_v, float scale, uint32_t window, const float *sinks)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "attention",
                    be() && be()->attention_ring
                        ? be()->attention_ring(q8, out, q, k_cache, v_cache, n_tok, pos0, cap,
                                               n_head, n_head_kv, head_dim_k, head_dim_v, scale,
                                               window, sinks)
                        : -1);
}

int gpu_moe_route(const float *logits, const float *bias, uint32_t n_tok, uint32_t n_expert,
                  uint32_t k, uint32_t n_group, uint32_t n_group_used, int gating, bool norm,
                  float scale, int32_t *sel, float *sel_w)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "moe_route",
                    be() ? be()->moe_route(logits, bias, n_tok, n_expert, k, n_group, n_group_used,
                                           gating, norm, scale, sel, sel_w)
                         : -1);
}

int gpu_moe_sort(const int32_t *sel, uint32_t n, uint32_t n_expert, int32_t tile, int32_t *items,
                 struct gpu_mm_tile *tiles, int32_t *n_tiles)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "moe_sort",
                    be() ? be()->moe_sort(sel, n, n_expert, tile, items, tiles, n_tiles) : -1);
}

int gpu_moe_combine(float *x, const float *y, const float *sel_w, uint32_t n_tok, uint32_t k,
                    uint32_t ne)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "moe_combine", be() ? be()->moe_combine(x, y, sel_w, n_tok, k, ne) : -1);
}

int gpu_gated_add(float *x, const float *y, const float *gate, uint32_t n_tok, uint32_t ne)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "gated_add", be() ? be()->gated_add(x, y, gate, n_tok, ne) : -1);
}

int gpu_gather_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                    const int32_t *rows, int64_t n, int64_t width)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "gather_rows",
                    be() ? be()->gather_rows(dst, dst_stride, src, src_stride, rows, n, width)
                         : -1);
}

int gpu_scatter_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                     const int32_t *rows, int64_t n, int64_t width)
{
    const uint64_t t0 = prof_begin();
    return prof_end(t0, "scatter_rows",
                    be() ? be()->scatter_rows(dst, dst_stride, src, src_stride, rows, n, width)
                         : -1);
}
