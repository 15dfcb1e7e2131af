/* tests/executor/test_cpu_backend.c - the CPU backend of the device interface (executor/gpu_cpu.c,
 * SLUICE_GPU_BACKEND=cpu) called through its table: its products equal the CPU's own kernels
 * (executor_vec_dot over the same activation blocks) for every int8 and float weight type, at
 * edge sizes, over one thread and over three (pieces cut at other rows); its expert products
 * (ids, GLU, the combined sum, groups) the same item by item, repeated experts included; its
 * attention the host backend's reference. executor_test_gpu_cpu in ctest runs the forward-pass
 * suite (executor_test_gpu) on it too. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#define CUDA_TEST_SEED 0x243F6A8885A308D3ull
#include "cuda_test.h"
#include "executor.h"
#include "kernels/kernels.h"

#define CT_RTOL 1e-5f /* of an output's magnitude plus the rms of its row: summation order */

static const struct gpu_backend   *be;
static struct executor_threadpool *pool3;

static void ct_types(void);

static void ct_setup(void)
{
    be = gpu_backend_cpu();
    cr_assert_not_null(be);
    cr_assert_eq(be->select(0, NULL, NULL, 0), 0);
    cr_assert_eq(executor_threadpool_create(3, &pool3), 0);
    ct_types();
}

static void ct_teardown(void)
{
    be->threads(NULL);
    executor_threadpool_destroy(pool3);
}

TestSuite(executor_gpu_cpu, .init = ct_setup, .fini = ct_teardown);

/* Every type of the int8 path (gpu_matvec_q8_supported), whatever the list holds. */
static uint32_t q8_types[64];
static size_t   N_Q8;

static void ct_types(void)
{
    N_Q8 = 0;
    for (uint32_t t = 0; t < 64; t++)
        if (gpu_matvec_q8_supported(t) && common_ggml_type_get(t))
            q8_types[N_Q8++] = t;
    cr_assert_geq(N_Q8, 16, "the int8 types: %zu", N_Q8);
}

static size_t row_size(uint32_t type, int64_t cols)
{
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    return (size_t)(cols / ti->blck) * ti->type_size;
}

/* The widths a type is tested at: its smallest (32 or a block), two more, and a wide one. */
static int ct_cols(uint32_t type, int64_t *out)
{
    const uint32_t blck = common_ggml_type_get(type)->blck;
    int            k = 0;
    if (blck < 256)
        out[k++] = blck > 32 ? blck : 32;
    out[k++] = 256;
    out[k++] = 512;
    out[k++] = 4096 + 256;
    return k;
}

/* rows x cols weights of `type`, made by its reference quantizer (device memory of the backend). */
static uint8_t *ct_weights(uint32_t type, int64_t rows, int64_t cols)
{
    const size_t rb = row_size(type, cols);
    float       *src = xmalloc((size_t)cols * sizeof(float));
    uint8_t     *w = be->alloc((size_t)rows * rb);
    cr_assert_not_null(w);
    for (int64_t r = 0; r < rows; r++) {
        fill_data(src, (size_t)cols);
        cr_assert_eq(executor_quantize_row_ref(type, src, w + (size_t)r * rb, cols), 0);
    }
    free(src);
    return w;
}

/* n activation rows for weights of `type`: floats x and their q8 image (the backend's). */
static uint8_t *ct_image(uint32_t type, int64_t n, int64_t cols, float **x)
{
    *x = be->alloc((size_t)(n * cols) * sizeof(float));
    uint8_t *q8 = be->alloc((size_t)n * gpu_q8_row_bytes(cols));
    cr_assert(*x && q8);
    fill_data(*x, (size_t)(n * cols));
    cr_assert_eq(be->act_q8(executor_vec_dot_type(type), *x, cols, n, cols, q8), 0, "act_q8: %s",
                 be->last_error());
    return q8;
}

/* The CPU's dot of weight row w with image row a. */
static float ct_dot(uint32_t type, int64_t cols, const uint8_t *w, const uint8_t *a)
{
    return executor_vec_dot(type, cols, w, a);
}

static void ct_near(const char *what, float got, float want, float rms)
{
    cr_assert(fabsf(got - want) <= CT_RTOL * (fabsf(want) + rms) + 1e-30f, "%s: %.9g, want %.9g",
              what, (double)got, (double)want);
}

static float ct_rms(const float *v, int64_t n, int64_t stride)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)v[i * stride] * (double)v[i * stride];
    return n ? (float)sqrt(s / (double)n) : 0.0f;
}

static float ct_silu_mul(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

Test(executor_gpu_cpu, image_rows_are_the_cpus_activation_blocks)
{
    for (size_t ti = 0; ti < N_Q8; ti++) {
        int64_t   cols_l[4];
        const int nc = ct_cols(q8_types[ti], cols_l);
        for (int ci = 0; ci < nc; ci++) {
            const int64_t cols = cols_l[ci], n = 5;
            float        *x;
            uint8_t      *q8 = ct_image(q8_types[ti], n, cols, &x);
            uint8_t      *want = xmalloc(executor_act_row_size(q8_types[ti], cols));
            for (int64_t t = 0; t < n; t++) {
                cr_assert_eq(executor_quantize_act(q8_types[ti], x + t * cols, want, cols), 0);
                cr_assert(memcmp(q8 + (size_t)t * gpu_q8_row_bytes(cols), want,
                                 executor_act_row_size(q8_types[ti], cols)) == 0,
                          "type %u, %lld cols: row %lld", q8_types[ti], (long long)cols,
                          (long long)t);
            }
            free(want);
            be->release(x);
            be->release(q8);
        }
    }
    float   x[64] = {0};
    uint8_t q8[128];
    cr_assert_eq(be->act_q8(COMMON_GGML_TYPE_Q8_K, x, 64, 1, 64, q8), -1, "Q8_K of 64 refused");
    cr_assert_eq(be->act_q8(COMMON_GGML_TYPE_F16, x, 64, 1, 64, q8), -1, "not an int8 type");
}

/* gpu_matvec_q8 (set, add, GLU) of n rows against the CPU's dots, at every edge size. */
static void ct_matvec_q8(uint32_t type)
{
    static const int64_t rows_l[] = {1, 31, 32, 33, 255, 256, 257};
    static const int64_t n_l[] = {1, 2, 3, 8, 17};
    int64_t              cols_l[4];
    const int            nc = ct_cols(type, cols_l);
    for (int ci = 0; ci < nc; ci++) {
        const int64_t cols = cols_l[ci], rmax = 257, nmax = 17;
        const size_t  rb = row_size(type, cols), xrb = gpu_q8_row_bytes(cols);
        uint8_t      *w = ct_weights(type, rmax, cols), *w2 = ct_weights(type, rmax, cols);
        float        *x;
        uint8_t      *q8 = ct_image(type, nmax, cols, &x);
        for (size_t ni = 0; ni < sizeof(n_l) / sizeof(n_l[0]); ni++)
            for (size_t ri = 0; ri < sizeof(rows_l) / sizeof(rows_l[0]); ri++)
                for (int op = GPU_MV_SET; op <= GPU_MV_GLU; op++) {
                    const int64_t n = n_l[ni], rows = rows_l[ri], ys = rows + 3;
                    float        *y = be->alloc((size_t)(n * ys) * sizeof(float));
                    float        *y0 = xmalloc((size_t)(n * ys) * sizeof(float));
                    for (int64_t i = 0; i < n * ys; i++)
                        y[i] = y0[i] = (float)(i % 7) - 3.0f;
                    be->threads(ni % 2 ? pool3 : NULL);
                    cr_assert_eq(be->matvec_q8(op, type, w, w2, rb, rows, cols, q8, n, y, ys), 0,
                                 "%s", be->last_error());
                    for (int64_t t = 0; t < n; t++) {
                        float *want = xmalloc((size_t)rows * sizeof(float));
                        for (int64_t r = 0; r < rows; r++) {
                            const uint8_t *a = q8 + (size_t)t * xrb;
                            const float    v = ct_dot(type, cols, w + (size_t)r * rb, a);
                            want[r] =
                                op == GPU_MV_GLU
                                    ? ct_silu_mul(v, ct_dot(type, cols, w2 + (size_t)r * rb, a))
                                : op == GPU_MV_ADD ? y0[t * ys + r] + v
                                                   : v;
                        }
                        const float rms = ct_rms(want, rows, 1);
                        char        what[160];
                        for (int64_t r = 0; r < rows; r++) {
                            snprintf(what, sizeof(what),
                                     "matvec_q8 op %d type %u %lldx%lld n=%lld: y[%lld][%lld]", op,
                                     type, (long long)rows, (long long)cols, (long long)n,
                                     (long long)t, (long long)r);
                            ct_near(what, y[t * ys + r], want[r], rms);
                        }
                        for (int64_t r = rows; r < ys; r++)
                            cr_assert_eq(y[t * ys + r], y0[t * ys + r], "padding written");
                        free(want);
                    }
                    be->release(y);
                    free(y0);
                }
        be->release(w);
        be->release(w2);
        be->release(x);
        be->release(q8);
    }
}

Test(executor_gpu_cpu, matvec_q8_is_the_cpus_dots, .timeout = 600)
{
    for (size_t ti = 0; ti < N_Q8; ti++)
        ct_matvec_q8(q8_types[ti]);
}

Test(executor_gpu_cpu, float_matvec_is_the_cpus_dots)
{
    static const uint32_t types[] = {COMMON_GGML_TYPE_F32, COMMON_GGML_TYPE_F16,
                                     COMMON_GGML_TYPE_BF16};
    static const int64_t  cols_l[] = {1, 31, 32, 33, 256, 257};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ci = 0; ci < sizeof(cols_l) / sizeof(cols_l[0]); ci++) {
            const uint32_t type = types[ti];
            const int64_t  cols = cols_l[ci], rows = 33, n = 3, xs = cols + 2;
            const size_t   rb = row_size(type, cols);
            uint8_t       *w = ct_weights(type, rows, cols);
            float         *x = be->alloc((size_t)(n * xs) * sizeof(float));
            float         *y = be->alloc((size_t)(n * rows) * sizeof(float));
            uint8_t       *a = xmalloc(executor_act_row_size(type, cols) + 4);
            fill_data(x, (size_t)(n * xs));
            be->threads(pool3);
            cr_assert_eq(be->matvec(type, w, rb, rows, cols, x, xs, n, y, rows), 0, "%s",
                         be->last_error());
            for (int64_t t = 0; t < n; t++) {
                cr_assert_eq(executor_quantize_act(type, x + t * xs, a, cols), 0);
                for (int64_t r = 0; r < rows; r++)
                    ct_near("matvec", y[t * rows + r], ct_dot(type, cols, w + (size_t)r * rb, a),
                            ct_rms(y + t * rows, rows, 1));
            }
            free(a);
            be->release(w);
            be->release(x);
            be->release(y);
        }
}

/* The routed experts' calls over items with repeated and lone experts. */
Test(executor_gpu_cpu, expert_products_are_the_cpus_dots_item_by_item, .timeout = 300)
{
    static const uint32_t types[] = {COMMON_GGML_TYPE_Q4_0, COMMON_GGML_TYPE_Q4_K,
                                     COMMON_GGML_TYPE_Q6_K, COMMON_GGML_TYPE_Q8_0};
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const uint32_t type = types[ti];
        const int64_t  cols = 512, rows = 33, E = 5, K = 3, n_tok = 7, items = n_tok * K;
        const size_t   rb = row_size(type, cols), eb = (size_t)rows * rb + 64,
                     xrb = gpu_q8_row_bytes(cols);
        uint8_t *w = be->alloc((size_t)E * eb), *w2 = be->alloc((size_t)E * eb);
        for (int64_t e = 0; e < E; e++) {
            uint8_t *a = ct_weights(type, rows, cols), *b = ct_weights(type, rows, cols);
            memcpy(w + (size_t)e * eb, a, (size_t)rows * rb);
            memcpy(w2 + (size_t)e * eb, b, (size_t)rows * rb);
            be->release(a);
            be->release(b);
        }
        int32_t *ids = be->alloc((size_t)items * sizeof(int32_t));
        float   *sel_w = be->alloc((size_t)items * sizeof(float));
        for (int64_t i = 0; i < items; i++) {
            ids[i] = (int32_t)((i * 7 + i / K) % E); /* every expert, most of them several times */
            sel_w[i] = 0.25f + rng_uniform();
        }
        float        *x;
        uint8_t      *q8tok = ct_image(type, n_tok, cols, &x); /* a row a token (x_div K) */
        float        *xi;
        uint8_t      *q8item = ct_image(type, items, cols, &xi); /* a row an item */
        const int64_t ys = rows + 1;
        float        *y = be->alloc((size_t)(items * ys) * sizeof(float));
        for (int pass = 0; pass < 2; pass++) {
            be->threads(pass ? pool3 : NULL);
            for (int glu = 0; glu < 2; glu++) {
                cr_assert_eq(be->matvec_ids_q8(type, w, glu ? w2 : NULL, eb, rb, rows, cols, ids,
                                               items, q8tok, K, y, ys),
                             0, "%s", be->last_error());
                for (int64_t i = 0; i < items; i++) {
                    const uint8_t *a = q8tok + (size_t)(i / K) * xrb;
                    const uint8_t *we = w + (size_t)ids[i] * eb, *we2 = w2 + (size_t)ids[i] * eb;
                    const float    rms = ct_rms(y + i * ys, rows, 1);
                    for (int64_t r = 0; r < rows; r++) {
                        const float v = ct_dot(type, cols, we + (size_t)r * rb, a);
                        ct_near("matvec_ids_q8", y[i * ys + r],
                                glu ? ct_silu_mul(v, ct_dot(type, cols, we2 + (size_t)r * rb, a))
                                    : v,
                                rms);
                    }
                }
            }
            /* the combined sum: x row t += sum over j of sel_w * item (t, j)'s product */
            float *xs = be->alloc((size_t)(n_tok * rows) * sizeof(float));
            float *want = xmalloc((size_t)(n_tok * rows) * sizeof(float));
            for (int64_t i = 0; i < n_tok * rows; i++)
                xs[i] = want[i] = (float)(i % 5) * 0.5f;
            cr_assert_eq(be->matvec_ids_combine_q8(type, w, eb, rb, rows, cols, ids, sel_w, n_tok,
                                                   (int32_t)K, q8item, xs, rows),
                         0, "%s", be->last_error());
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t r = 0; r < rows; r++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < K; j++) {
                        const int64_t i = t * K + j;
                        acc +=
                            sel_w[i] * ct_dot(type, cols, w + (size_t)ids[i] * eb + (size_t)r * rb,
                                              q8item + (size_t)i * xrb);
                    }
                    ct_near("matvec_ids_combine_q8", xs[t * rows + r], want[t * rows + r] + acc,
                            ct_rms(xs + t * rows, rows, 1));
                }
            be->release(xs);
            free(want);
            /* groups: expert 2 twice (two groups), expert 0 once, rows out of order */
            struct gpu_group *g = be->alloc(3 * sizeof(*g));
            memset(g, 0, 3 * sizeof(*g));
            g[0] = (struct gpu_group){.expert = 2, .n = 3};
            g[1] = (struct gpu_group){.expert = 0, .n = 1};
            g[2] = (struct gpu_group){.expert = 2, .n = 2};
            const int32_t xr[] = {4, 0, 19, 7, 12, 3}, yr[] = {5, 1, 2, 0, 20, 9};
            for (int k = 0, at = 0; k < 3; k++)
                for (int r = 0; r < g[k].n; r++, at++) {
                    g[k].x_row[r] = xr[at];
                    g[k].y_row[r] = yr[at];
                }
            cr_assert_eq(be->matvec_groups_q8(type, w, eb, rb, rows, cols, g, 3, q8item, y, ys), 0,
                         "%s", be->last_error());
            for (int k = 0, at = 0; k < 3; k++)
                for (int r = 0; r < g[k].n; r++, at++)
                    for (int64_t o = 0; o < rows; o++)
                        ct_near("matvec_groups_q8", y[yr[at] * ys + o],
                                ct_dot(type, cols, w + (size_t)g[k].expert * eb + (size_t)o * rb,
                                       q8item + (size_t)xr[at] * xrb),
                                ct_rms(y + yr[at] * ys, rows, 1));
            be->release(g);
        }
        const int32_t bad = -1;
        cr_assert_eq(be->matvec_ids_q8(type, w, NULL, eb, rb, rows, cols, &bad, 1, q8tok, 1, y, ys),
                     -1, "a negative expert refused");
        be->release(w);
        be->release(w2);
        be->release(ids);
        be->release(sel_w);
        be->release(x);
        be->release(xi);
        be->release(q8tok);
        be->release(q8item);
        be->release(y);
    }
}

/* gpu_matvec_q8_cat: each matrix's products. */
Test(executor_gpu_cpu, cat_is_each_matrix_alone)
{
    const uint32_t type = COMMON_GGML_TYPE_Q4_K;
    const int64_t  cols = 256, rows[3] = {32, 1, 257};
    const size_t   rb = row_size(type, cols);
    uint8_t       *wm[3];
    const void    *w[3];
    float         *y[3];
    for (int i = 0; i < 3; i++) {
        w[i] = wm[i] = ct_weights(type, rows[i], cols);
        y[i] = be->alloc((size_t)rows[i] * sizeof(float));
    }
    float   *x;
    uint8_t *q8 = ct_image(type, 1, cols, &x);
    be->threads(pool3);
    cr_assert_eq(be->matvec_q8_cat(type, 3, w, rows, rb, cols, q8, y), 0, "%s", be->last_error());
    for (int i = 0; i < 3; i++) {
        for (int64_t r = 0; r < rows[i]; r++)
            ct_near("matvec_q8_cat", y[i][r],
                    ct_dot(type, cols, (const uint8_t *)w[i] + (size_t)r * rb, q8),
                    ct_rms(y[i], rows[i], 1));
        be->release(wm[i]);
        be->release(y[i]);
    }
    be->release(x);
    be->release(q8);
}

/* Attention over the f16 and q8_0 caches against the host backend's, with a window, sinks,
 * grouped heads and latent attention (no value cache). */
static void ct_attention(bool q8, bool latent, uint32_t window, bool sinks, uint32_t n_head,
                         uint32_t n_kv)
{
    const struct gpu_backend *h = gpu_backend_host();
    const uint32_t            hk = 64, hv = latent ? 32 : 64;
    const uint32_t pos0 = 37, n_tok = 5, np = pos0 + n_tok;
    const size_t   kw = (size_t)n_kv * hk, vw = (size_t)n_kv * hv;
    const size_t   kb = q8 ? kw / 32 * 34 : kw * 2, vb = q8 ? vw / 32 * 34 : vw * 2;
    uint8_t       *kc = be->alloc(np * kb), *vc = latent ? NULL : be->alloc(np * vb);
    float         *k = be->alloc(np * kw * sizeof(float)), *v = be->alloc(np * vw * sizeof(float));
    float         *q = be->alloc((size_t)n_tok * n_head * hk * sizeof(float));
    float         *sk = be->alloc(n_head * sizeof(float));
    float         *sc = be->alloc((size_t)n_tok * n_head * np * sizeof(float));
    float         *o1 = be->alloc((size_t)n_tok * n_head * hv * sizeof(float));
    float         *o2 = be->alloc((size_t)n_tok * n_head * hv * sizeof(float));
    fill_data(k, np * kw);
    fill_data(v, np * vw);
    fill_data(q, (size_t)n_tok * n_head * hk);
    for (uint32_t i = 0; i < n_head; i++)
        sk[i] = rng_gauss();
    const uint32_t vs = latent ? 0 : (uint32_t)vw; /* latent: the keys alone */
    const int      st =
        q8 ? h->kv_store_q8(kc, vc, (uint32_t)kw, vs, k, v, 0, NULL, np)
                : h->kv_store((uint16_t *)kc, (uint16_t *)vc, (uint32_t)kw, vs, k, v, 0, NULL, np);
    cr_assert_eq(st, 0, "%s", h->last_error());
    const float scale = 0.125f;
    be->threads(pool3);
    for (int side = 0; side < 2; side++) {
        const struct gpu_backend *b = side ? be : h;
        float                    *o = side ? o2 : o1;
        const int                 rc =
            q8 ? b->attention_q8(o, q, kc, vc, n_tok, pos0, NULL, 0, n_head, n_kv, hk, hv, scale,
                                                 window, sc, sinks ? sk : NULL)
                               : b->attention(o, q, (const uint16_t *)kc, (const uint16_t *)vc, n_tok, pos0, NULL,
                                              0, n_head, n_kv, hk, hv, scale, window, sc, sinks ? sk : NULL);
        cr_assert_eq(rc, 0, "%s", b->last_error());
    }
    for (uint32_t i = 0; i < n_tok * n_head; i++) {
        const float rms = ct_rms(o1 + (size_t)i * hv, hv, 1);
        for (uint32_t d = 0; d < hv; d++)
            cr_assert(fabsf(o2[(size_t)i * hv + d] - o1[(size_t)i * hv + d]) <=
                          1e-4f * rms + 1e-30f,
                      "attention (q8 %d latent %d window %u sinks %d) row %u dim %u: %.9g, the "
                      "host %.9g",
                      q8, latent, window, sinks, i, d, (double)o2[(size_t)i * hv + d],
                      (double)o1[(size_t)i * hv + d]);
    }
    be->release(kc);
    be->release(vc);
    be->release(k);
    be->release(v);
    be->release(q);
    be->release(sk);
    be->release(sc);
    be->release(o1);
    be->release(o2);
}

Test(executor_gpu_cpu, attention_is_the_host_backends)
{
    /* heads a KV head serves: 3 (one group), 8 (two groups of 4), 4 (latent, one KV head) */
    for (int q8 = 0; q8 < 2; q8++) {
        ct_attention(q8, false, 0, false, 6, 2);
        ct_attention(q8, false, 9, true, 6, 2);
        ct_attention(q8, false, 0, false, 16, 2);
        ct_attention(q8, false, 9, true, 16, 2);
        ct_attention(q8, true, 0, false, 4, 1);
        ct_attention(q8, true, 9, true, 4, 1);
    }
}

/* A sliding-window layer's ring of cap = window + n_tok cells (position p in cell p % cap,
 * stored in position order, so older positions are overwritten) gives the attention over the
 * whole cache, bit for bit: windows that wrap the ring or not, prompts and single tokens, both
 * cache types, a latent cache (no values). */
static void ct_ring(bool q8, bool latent, uint32_t window, uint32_t pos0, uint32_t n_tok)
{
    const struct gpu_backend *h = gpu_backend_host();
    const uint32_t            n_head = 8, n_kv = latent ? 1 : 2, hk = 64, hv = latent ? 32 : 64;
    const uint32_t            np = pos0 + n_tok, cap = window + n_tok;
    const size_t              kw = (size_t)n_kv * hk, vw = (size_t)n_kv * hv;
    const size_t              kb = q8 ? kw / 32 * 34 : kw * 2, vb = q8 ? vw / 32 * 34 : vw * 2;
    uint8_t                  *kc = be->alloc(np * kb), *vc = latent ? NULL : be->alloc(np * vb);
    uint8_t                  *kr = be->alloc(cap * kb), *vr = latent ? NULL : be->alloc(cap * vb);
    float *k = be->alloc(np * kw * sizeof(float)), *v = be->alloc(np * vw * sizeof(float));
    float *q = be->alloc((size_t)n_tok * n_head * hk * sizeof(float));
    float *sk = be->alloc(n_head * sizeof(float));
    float *sc = be->alloc((size_t)n_tok * n_head * np * sizeof(float));
    float *o1 = be->alloc((size_t)n_tok * n_head * hv * sizeof(float));
    float *o2 = be->alloc((size_t)n_tok * n_head * hv * sizeof(float));
    fill_data(k, np * kw);
    fill_data(v, np * vw);
    fill_data(q, (size_t)n_tok * n_head * hk);
    for (uint32_t i = 0; i < n_head; i++)
        sk[i] = rng_gauss();
    const uint32_t vs = latent ? 0 : (uint32_t)vw;
    for (uint32_t p = 0; p < np; p++) { /* the whole cache, and the ring cell by cell */
        const float *kp = k + (size_t)p * kw, *vp = v + (size_t)p * vw;
        const int    st = q8 ? h->kv_store_q8(kc, vc, (uint32_t)kw, vs, kp, vp, p, NULL, 1) ||
                                h->kv_store_q8(kr, vr, (uint32_t)kw, vs, kp, vp, p % cap, NULL, 1)
                             : h->kv_store((uint16_t *)kc, (uint16_t *)vc, (uint32_t)kw, vs, kp, vp, p,
                                           NULL, 1) ||
                                h->kv_store((uint16_t *)kr, (uint16_t *)vr, (uint32_t)kw, vs, kp,
                                               vp, p % cap, NULL, 1);
        cr_assert_eq(st, 0, "%s", h->last_error());
    }
    const float scale = 0.125f;
    be->threads(pool3);
    const int rc = q8 ? be->attention_q8(o1, q, kc, vc, n_tok, pos0, NULL, 0, n_head, n_kv, hk, hv,
                                         scale, window, sc, sk)
                      : be->attention(o1, q, (const uint16_t *)kc, (const uint16_t *)vc, n_tok,
                                      pos0, NULL, 0, n_head, n_kv, hk, hv, scale, window, sc, sk);
    cr_assert_eq(rc, 0, "%s", be->last_error());
    cr_assert_eq(be->attention_ring(q8, o2, q, kr, vr, n_tok, pos0, cap, n_head, n_kv, hk, hv,
                                    scale, window, sk),
                 0, "%s", be->last_error());
    cr_assert(memcmp(o1, o2, (size_t)n_tok * n_head * hv * sizeof(float)) == 0,
              "ring (q8 %d latent %d window %u, %u tokens at %u): not the whole cache's bits", q8,
              latent, window, n_tok, pos0);
    /* a ring too small for the window and the tokens is refused */
    cr_assert_lt(be->attention_ring(q8, o2, q, kr, vr, n_tok, pos0, cap - 1, n_head, n_kv, hk, hv,
                                    scale, window, sk),
                 0);
    void *bufs[] = {kc, vc, kr, vr, k, v, q, sk, sc, o1, o2};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        be->release(bufs[i]);
}

Test(executor_gpu_cpu, attention_over_a_ring_is_the_whole_caches)
{
    const uint32_t pos0s[] = {0, 3, 16, 31, 33, 61}, ns[] = {1, 5, 16};
    for (int q8 = 0; q8 < 2; q8++)
        for (size_t a = 0; a < sizeof(pos0s) / sizeof(pos0s[0]); a++)
            for (size_t b = 0; b < sizeof(ns) / sizeof(ns[0]); b++) {
                ct_ring(q8, false, 9, pos0s[a], ns[b]);
                ct_ring(q8, false, 16, pos0s[a], ns[b]);
            }
    ct_ring(false, true, 9, 33, 5);
    ct_ring(true, true, 9, 61, 1);
}
