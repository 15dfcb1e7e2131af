/* tests/executor/test_cuda_ops.c - the CUDA layer operations (executor/cuda/ops.cu) against CPU
 * references in double precision, at edge sizes; skipped, saying so, without a CUDA device. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define CUDA_TEST_SEED 0x2545F4914F6CDD1Dull
#include "common.h"
#include "cuda_test.h"
#include "fixture.h"
#include "kernels/kernels.h"

/* Tolerances: |gpu - ref| <= rtol * scale, where scale is the magnitude the result is made of
 * (|ref| where no cancellation can occur, else the sum of the magnitudes of the terms). */
#define OPS_RTOL     1e-5 /* f32 elementwise operations, norms, routing weights */
#define OPS_ATT_RTOL 1e-3 /* attention over the f16 cache */
/* the flash kernel over the q8_0 cache: its keys and values rounded to f16 too */
#define OPS_ATT_Q8_FLASH_RTOL 2e-3

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static void fill_gauss(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * rng_gauss();
}

static void check_close(const char *what, size_t i, float got, double want, double scale,
                        double rtol)
{
    cr_assert(isfinite(got) && fabs((double)got - want) <= rtol * scale,
              "%s[%zu]: got %.9g, want %.9g (scale %.3g)", what, i, (double)got, want, scale);
}

static const int64_t g_widths[] = {1, 31, 32, 33, 255, 256, 257, 4096};
#define N_WIDTHS (sizeof(g_widths) / sizeof(g_widths[0]))

/* ------------------------------------------------------------------------------------------ */
/* RMS norm                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Description: each row normalised as fwd_rmsnorm, out of place (padding between output rows
 * untouched) and in place; widths at the warp and block edges and up to 16384. */
Test(executor_cuda_ops, rmsnorm_matches_reference)
{
    gpu_or_skip();
    const int64_t widths[] = {1, 31, 32, 33, 255, 256, 257, 1024, 1025, 4096, 16384};
    const int64_t n_rows = 3;
    const float   eps = 1e-5f;
    for (size_t wi = 0; wi < sizeof(widths) / sizeof(widths[0]); wi++) {
        const int64_t width = widths[wi], xs = width + 3, ys = width + 5;
        const size_t  nx = (size_t)(n_rows * xs), ny = (size_t)(n_rows * ys);
        float        *x = xmalloc(nx * sizeof(float)), *w = xmalloc((size_t)width * sizeof(float));
        float        *y = xmalloc(ny * sizeof(float));
        double       *ref = xmalloc((size_t)(n_rows * width) * sizeof(double));
        fill_data(x, nx);
        fill_gauss(w, (size_t)width, 1.0f);
        for (int64_t r = 0; r < n_rows; r++) {
            const float *xr = x + r * xs;
            double       ss = 0.0;
            for (int64_t i = 0; i < width; i++)
                ss += (double)xr[i] * (double)xr[i];
            const double inv = 1.0 / sqrt(ss / (double)width + (double)eps);
            for (int64_t i = 0; i < width; i++)
                ref[r * width + i] = (double)xr[i] * inv * (double)w[i];
        }
        float *dx = dev_from(x, nx * sizeof(float)), *dw = dev_from(w, (size_t)width * 4);
        float *dy = dev_poisoned(ny * sizeof(float));
        cr_assert_eq(gpu_rmsnorm(dy, ys, dx, xs, dw, n_rows, width, eps), 0, "width %lld: %s",
                     (long long)width, gpu_last_error());
        dev_to(y, dy, ny * sizeof(float));
        for (int64_t r = 0; r < n_rows; r++) {
            for (int64_t i = 0; i < width; i++) {
                const double want = ref[r * width + i];
                check_close("rmsnorm", (size_t)(r * width + i), y[r * ys + i], want, fabs(want),
                            OPS_RTOL);
            }
            for (int64_t i = width; i < ys; i++)
                cr_assert(is_poison(&y[r * ys + i]), "rmsnorm wrote padding at row %lld",
                          (long long)r);
        }
        /* In place: y is x. */
        cr_assert_eq(gpu_rmsnorm(dx, xs, dx, xs, dw, n_rows, width, eps), 0, "%s",
                     gpu_last_error());
        dev_to(x, dx, nx * sizeof(float));
        for (int64_t r = 0; r < n_rows; r++)
            for (int64_t i = 0; i < width; i++) {
                const double want = ref[r * width + i];
                check_close("rmsnorm in place", (size_t)(r * width + i), x[r * xs + i], want,
                            fabs(want), OPS_RTOL);
            }
        gpu_free(dx);
        gpu_free(dw);
        gpu_free(dy);
        free(x);
        free(w);
        free(y);
        free(ref);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Elementwise                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Description: y = a + b out of place, and with y aliasing a and b. */
Test(executor_cuda_ops, add_matches_reference)
{
    gpu_or_skip();
    for (size_t wi = 0; wi <= N_WIDTHS; wi++) {
        const int64_t n = wi < N_WIDTHS ? g_widths[wi] : 1000003;
        const size_t  bytes = (size_t)n * sizeof(float);
        float        *a = xmalloc(bytes), *b = xmalloc(bytes), *y = xmalloc(bytes);
        fill_data(a, (size_t)n);
        fill_data(b, (size_t)n);
        float *da = dev_from(a, bytes), *db = dev_from(b, bytes), *dy = dev_poisoned(bytes);
        for (int alias = 0; alias < 3; alias++) {
            float *out = alias == 0 ? dy : alias == 1 ? da : db;
            cr_assert_eq(gpu_upload(da, a, bytes), 0, "%s", gpu_last_error());
            cr_assert_eq(gpu_upload(db, b, bytes), 0, "%s", gpu_last_error());
            cr_assert_eq(gpu_add(out, da, db, n), 0, "%s", gpu_last_error());
            dev_to(y, out, bytes);
            for (int64_t i = 0; i < n; i++)
                check_close("add", (size_t)i, y[i], (double)a[i] + (double)b[i],
                            fabs((double)a[i]) + fabs((double)b[i]), OPS_RTOL);
        }
        gpu_free(da);
        gpu_free(db);
        gpu_free(dy);
        free(a);
        free(b);
        free(y);
    }
}

/* Description: the bias added to every row; the padding between rows untouched. */
Test(executor_cuda_ops, add_bias_matches_reference)
{
    gpu_or_skip();
    const int64_t n_rows = 4;
    for (size_t wi = 0; wi < N_WIDTHS; wi++) {
        const int64_t width = g_widths[wi], stride = width + 2;
        const size_t  ny = (size_t)(n_rows * stride);
        float *y = xmalloc(ny * sizeof(float)), *bias = xmalloc((size_t)width * sizeof(float));
        float *got = xmalloc(ny * sizeof(float));
        fill_data(y, ny);
        fill_data(bias, (size_t)width);
        for (int64_t r = 0; r < n_rows; r++)
            for (int64_t i = width; i < stride; i++)
                memset(&y[r * stride + i], 0xff, sizeof(float));
        float *dy = dev_from(y, ny * sizeof(float));
        float *db = dev_from(bias, (size_t)width * sizeof(float));
        cr_assert_eq(gpu_add_bias(dy, stride, db, n_rows, width), 0, "%s", gpu_last_error());
        dev_to(got, dy, ny * sizeof(float));
        for (int64_t r = 0; r < n_rows; r++) {
            for (int64_t i = 0; i < width; i++) {
                const float v = y[r * stride + i];
                check_close("add_bias", (size_t)(r * stride + i), got[r * stride + i],
                            (double)v + (double)bias[i], fabs((double)v) + fabs((double)bias[i]),
                            OPS_RTOL);
            }
            for (int64_t i = width; i < stride; i++)
                cr_assert(is_poison(&got[r * stride + i]), "add_bias wrote padding");
        }
        gpu_free(dy);
        gpu_free(db);
        free(y);
        free(bias);
        free(got);
    }
}

/* Description: row r takes bias row ids[r] of four (a routed expert's bias, gpt-oss); a row
 * whose id is out of range (-1, 4) stays as it is, and so does the padding between rows. */
Test(executor_cuda_ops, add_bias_ids_matches_reference)
{
    gpu_or_skip();
    const int64_t n_rows = 6;
    const int32_t n_bias = 4, ids[6] = {2, 0, -1, 3, 4, 2};
    for (size_t wi = 0; wi < N_WIDTHS; wi++) {
        const int64_t width = g_widths[wi], stride = width + 2;
        const size_t  ny = (size_t)(n_rows * stride), nb = (size_t)(n_bias * width);
        float        *y = xmalloc(ny * sizeof(float)), *bias = xmalloc(nb * sizeof(float));
        float        *got = xmalloc(ny * sizeof(float));
        fill_data(y, ny);
        fill_data(bias, nb);
        for (int64_t r = 0; r < n_rows; r++)
            for (int64_t i = width; i < stride; i++)
                memset(&y[r * stride + i], 0xff, sizeof(float));
        float   *dy = dev_from(y, ny * sizeof(float)), *db = dev_from(bias, nb * sizeof(float));
        int32_t *di = dev_from(ids, sizeof(ids));
        cr_assert_eq(gpu_add_bias_ids(dy, stride, db, n_bias, di, n_rows, width), 0, "%s",
                     gpu_last_error());
        dev_to(got, dy, ny * sizeof(float));
        for (int64_t r = 0; r < n_rows; r++) {
            const bool in = ids[r] >= 0 && ids[r] < n_bias;
            for (int64_t i = 0; i < width; i++) {
                const float  v = y[r * stride + i];
                const double b = in ? (double)bias[ids[r] * width + i] : 0.0;
                check_close("add_bias_ids", (size_t)(r * stride + i), got[r * stride + i],
                            (double)v + b, fabs((double)v) + fabs(b), OPS_RTOL);
            }
            for (int64_t i = width; i < stride; i++)
                cr_assert(is_poison(&got[r * stride + i]), "add_bias_ids wrote padding");
        }
        gpu_free(dy);
        gpu_free(db);
        gpu_free(di);
        free(y);
        free(bias);
        free(got);
    }
}

/* Description: every row times one scale, the float product bit for bit; the padding between
 * rows untouched. */
Test(executor_cuda_ops, scale_rows_matches_reference)
{
    gpu_or_skip();
    const int64_t n_rows = 3;
    const float   sc = 1.3717f;
    for (size_t wi = 0; wi < N_WIDTHS; wi++) {
        const int64_t width = g_widths[wi], stride = width + 3;
        const size_t  ny = (size_t)(n_rows * stride);
        float        *y = xmalloc(ny * sizeof(float)), *got = xmalloc(ny * sizeof(float));
        fill_data(y, ny);
        for (int64_t r = 0; r < n_rows; r++)
            for (int64_t i = width; i < stride; i++)
                memset(&y[r * stride + i], 0xff, sizeof(float));
        float *dy = dev_from(y, ny * sizeof(float));
        cr_assert_eq(gpu_scale_rows(dy, stride, n_rows, width, sc), 0, "%s", gpu_last_error());
        dev_to(got, dy, ny * sizeof(float));
        for (int64_t r = 0; r < n_rows; r++) {
            for (int64_t i = 0; i < width; i++) {
                const float want = y[r * stride + i] * sc;
                cr_assert(memcmp(&got[r * stride + i], &want, sizeof(float)) == 0,
                          "scale_rows[%lld][%lld]: got %.9g, want %.9g", (long long)r, (long long)i,
                          (double)got[r * stride + i], (double)want);
            }
            for (int64_t i = width; i < stride; i++)
                cr_assert(is_poison(&got[r * stride + i]), "scale_rows wrote padding");
        }
        gpu_free(dy);
        free(y);
        free(got);
    }
}

/* Description: g = silu(g) * u and relu(g)^2 * u. */
Test(executor_cuda_ops, swiglu_matches_reference)
{
    gpu_or_skip();
    for (int relu2 = 0; relu2 < 2; relu2++)
        for (size_t wi = 0; wi <= N_WIDTHS; wi++) {
            const int64_t n = wi < N_WIDTHS ? g_widths[wi] : 100003;
            const size_t  bytes = (size_t)n * sizeof(float);
            float        *g = xmalloc(bytes), *u = xmalloc(bytes), *got = xmalloc(bytes);
            fill_data(g, (size_t)n);
            fill_data(u, (size_t)n);
            float *dg = dev_from(g, bytes), *du = dev_from(u, bytes);
            cr_assert_eq(gpu_swiglu(dg, du, n, relu2 != 0), 0, "%s", gpu_last_error());
            dev_to(got, dg, bytes);
            for (int64_t i = 0; i < n; i++) {
                const double x = (double)g[i];
                const double a = relu2 ? (x > 0.0 ? x * x : 0.0) : x / (1.0 + exp(-x));
                const double want = a * (double)u[i];
                check_close(relu2 ? "relu2" : "swiglu", (size_t)i, got[i], want, fabs(want),
                            OPS_RTOL);
            }
            gpu_free(dg);
            gpu_free(du);
            free(g);
            free(u);
            free(got);
        }
}

/* Description: gpt-oss's clamped SwiGLU with row r's expert biases (ids[r] of three, or row 0
 * for every row without ids): x = min(g + b, 7), y = clamp(u + c, -7, 7), x * sigmoid(1.702 x) *
 * (y + 1); values spread over +-12 so that both clamps act; a row whose id is out of range
 * stays as it is. */
Test(executor_cuda_ops, swiglu_oai_matches_reference)
{
    gpu_or_skip();
    const int64_t n_rows = 5;
    const int32_t n_bias = 3, ids[5] = {1, 2, 0, 3, 1};
    for (int with_ids = 0; with_ids < 2; with_ids++)
        for (size_t wi = 0; wi < N_WIDTHS; wi++) {
            const int64_t width = g_widths[wi];
            const size_t  n = (size_t)(n_rows * width), nb = (size_t)(n_bias * width);
            float        *g = xmalloc(n * sizeof(float)), *u = xmalloc(n * sizeof(float));
            float        *gb = xmalloc(nb * sizeof(float)), *ub = xmalloc(nb * sizeof(float));
            float        *got = xmalloc(n * sizeof(float));
            fill_gauss(g, n, 6.0f);
            fill_gauss(u, n, 6.0f);
            fill_gauss(gb, nb, 1.0f);
            fill_gauss(ub, nb, 1.0f);
            float   *dg = dev_from(g, n * 4), *du = dev_from(u, n * 4);
            float   *dgb = dev_from(gb, nb * 4), *dub = dev_from(ub, nb * 4);
            int32_t *di = dev_from(ids, sizeof(ids));
            cr_assert_eq(
                gpu_swiglu_oai(dg, du, n_rows, width, dgb, dub, n_bias, with_ids ? di : NULL), 0,
                "%s", gpu_last_error());
            dev_to(got, dg, n * sizeof(float));
            for (int64_t r = 0; r < n_rows; r++) {
                const int32_t e = with_ids ? ids[r] : 0;
                for (int64_t i = 0; i < width; i++) {
                    const size_t k = (size_t)(r * width + i);
                    if (e < 0 || e >= n_bias) {
                        cr_assert(memcmp(&got[k], &g[k], sizeof(float)) == 0,
                                  "swiglu_oai changed row %lld, whose id is out of range",
                                  (long long)r);
                        continue;
                    }
                    const double gv = (double)g[k] + (double)gb[e * width + i];
                    const double uv = (double)u[k] + (double)ub[e * width + i];
                    const double x = gv < 7.0 ? gv : 7.0;
                    const double y = uv < -7.0 ? -7.0 : uv > 7.0 ? 7.0 : uv;
                    const double want = x / (1.0 + exp(-1.702 * x)) * (y + 1.0);
                    /* the sums round before the clamp: scale by the terms' magnitudes */
                    const double scale = (fabs(x) + 1.0) * (fabs(y) + 1.0) + fabs(want);
                    check_close("swiglu_oai", k, got[k], want, scale, OPS_RTOL);
                }
            }
            gpu_free(dg);
            gpu_free(du);
            gpu_free(dgb);
            gpu_free(dub);
            gpu_free(di);
            free(g);
            free(u);
            free(gb);
            free(ub);
            free(got);
        }
}

/* ------------------------------------------------------------------------------------------ */
/* RoPE                                                                                        */
/* ------------------------------------------------------------------------------------------ */

struct rope_case {
    uint32_t n_heads, head_dim, n_rot;
};

/* Description: normal and NeoX rotation, n_rot equal to and below head_dim (the rest of each
 * head and the padding between tokens untouched), 1, 3 and 17 tokens. */
Test(executor_cuda_ops, rope_matches_reference)
{
    gpu_or_skip();
    const struct rope_case cases[] = {{8, 64, 64},  {2, 128, 128}, {4, 32, 24},
                                      {8, 128, 64}, {1, 256, 256}, {3, 33, 32}};
    const uint32_t         toks[] = {1, 3, 17};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++)
        for (size_t ti = 0; ti < 3; ti++)
            for (int neox = 0; neox < 2; neox++) {
                const struct rope_case *rc = &cases[ci];
                const uint32_t          n_tok = toks[ti];
                const int64_t           stride = (int64_t)rc->n_heads * rc->head_dim + 7;
                const size_t            nv = (size_t)n_tok * (size_t)stride;
                const size_t            ncs = (size_t)n_tok * rc->n_rot;
                float *v = xmalloc(nv * sizeof(float)), *got = xmalloc(nv * sizeof(float));
                float *cs = xmalloc((ncs ? ncs : 1) * sizeof(float));
                fill_data(v, nv);
                for (uint32_t t = 0; t < n_tok; t++)
                    for (int64_t i = (int64_t)rc->n_heads * rc->head_dim; i < stride; i++)
                        memset(&v[t * stride + i], 0xff, sizeof(float));
                for (size_t i = 0; i + 1 < ncs; i += 2) {
                    const double th = 100.0 * (double)rng_uniform();
                    cs[i] = (float)(1.1 * cos(th));
                    cs[i + 1] = (float)(1.1 * sin(th));
                }
                float *dv = dev_from(v, nv * sizeof(float));
                float *dcs = dev_from(cs, (ncs ? ncs : 1) * sizeof(float));
                cr_assert_eq(gpu_rope(dv, n_tok, stride, rc->n_heads, rc->head_dim, rc->n_rot, dcs,
                                      neox != 0),
                             0, "%s", gpu_last_error());
                dev_to(got, dv, nv * sizeof(float));
                for (uint32_t t = 0; t < n_tok; t++) {
                    const float *c = cs + (size_t)t * rc->n_rot;
                    for (uint32_t h = 0; h < rc->n_heads; h++) {
                        const size_t o = (size_t)t * (size_t)stride + (size_t)h * rc->head_dim;
                        const float *x = v + o;
                        const float *gx = got + o;
                        for (uint32_t i = 0; i < rc->n_rot / 2; i++) {
                            const uint32_t a = neox ? i : 2 * i;
                            const uint32_t b = neox ? i + rc->n_rot / 2 : 2 * i + 1;
                            const double   x0 = (double)x[a], x1 = (double)x[b];
                            const double   cc = (double)c[2 * i], ss = (double)c[2 * i + 1];
                            const double   sc =
                                fabs(x0 * cc) + fabs(x1 * ss) + fabs(x0 * ss) + fabs(x1 * cc);
                            check_close("rope a", o + a, gx[a], x0 * cc - x1 * ss, sc, OPS_RTOL);
                            check_close("rope b", o + b, gx[b], x0 * ss + x1 * cc, sc, OPS_RTOL);
                        }
                        for (uint32_t d = rc->n_rot / 2 * 2; d < rc->head_dim; d++)
                            cr_assert(memcmp(&gx[d], &x[d], sizeof(float)) == 0,
                                      "rope changed dim %u beyond n_rot %u", d, rc->n_rot);
                    }
                    for (int64_t i = (int64_t)rc->n_heads * rc->head_dim; i < stride; i++)
                        cr_assert(is_poison(&got[t * stride + i]), "rope wrote padding");
                }
                gpu_free(dv);
                gpu_free(dcs);
                free(v);
                free(got);
                free(cs);
            }
}

/* ------------------------------------------------------------------------------------------ */
/* Fused operations: the bits of the operations they fuse                                      */
/* ------------------------------------------------------------------------------------------ */

/* Description: gpu_rmsnorm_q8 writes the norm gpu_rmsnorm writes and the q8 image gpu_act_q8
 * makes of it, bit for bit, for the three int8 activation types, at block and warp edges, with
 * strided rows (the padding untouched). */
Test(executor_cuda_ops, rmsnorm_q8_is_the_norm_then_its_image)
{
    gpu_or_skip();
    const int64_t  widths[] = {32, 64, 96, 256, 512, 1024, 1056, 2048, 4096, 7168};
    const uint32_t types[] = {COMMON_GGML_TYPE_Q8_0, COMMON_GGML_TYPE_Q8_1, COMMON_GGML_TYPE_Q8_K};
    const int64_t  rows[] = {1, 3, 17};
    const float    eps = 1e-6f;
    for (size_t wi = 0; wi < sizeof(widths) / sizeof(widths[0]); wi++)
        for (size_t ti = 0; ti < 3; ti++)
            for (size_t ri = 0; ri < 3; ri++) {
                const int64_t  width = widths[wi], n = rows[ri], xs = width + 3, ys = width + 5;
                const uint32_t at = types[ti];
                if (at == COMMON_GGML_TYPE_Q8_K && width % 256)
                    continue;
                const size_t nx = (size_t)(n * xs), ny = (size_t)(n * ys);
                const size_t nq = (size_t)n * gpu_q8_row_bytes(width);
                float       *x = xmalloc(nx * sizeof(float)), *w = xmalloc((size_t)width * 4);
                fill_data(x, nx);
                fill_gauss(w, (size_t)width, 1.0f);
                if (n > 1) /* a row of zeros: its scales are 0 */
                    memset(x + xs, 0, (size_t)width * sizeof(float));
                float   *dx = dev_from(x, nx * sizeof(float)), *dw = dev_from(w, (size_t)width * 4);
                float   *dy = dev_poisoned(ny * sizeof(float)), *dy2 = dev_poisoned(ny * 4);
                uint8_t *dq = dev_poisoned(nq), *dq2 = dev_poisoned(nq);
                cr_assert_eq(gpu_rmsnorm(dy, ys, dx, xs, dw, n, width, eps), 0, "%s",
                             gpu_last_error());
                cr_assert_eq(gpu_act_q8(at, dy, ys, n, width, dq), 0, "%s", gpu_last_error());
                cr_assert_eq(gpu_rmsnorm_q8(dy2, ys, dx, xs, dw, n, width, eps, at, dq2), 0,
                             "width %lld: %s", (long long)width, gpu_last_error());
                float   *y = xmalloc(ny * 4), *y2 = xmalloc(ny * 4);
                uint8_t *q = xmalloc(nq), *q2 = xmalloc(nq);
                dev_to(y, dy, ny * 4);
                dev_to(y2, dy2, ny * 4);
                dev_to(q, dq, nq);
                dev_to(q2, dq2, nq);
                cr_assert(memcmp(y, y2, ny * 4) == 0,
                          "width %lld, type %u, %lld rows: the fused norm differs",
                          (long long)width, at, (long long)n);
                cr_assert(memcmp(q, q2, nq) == 0,
                          "width %lld, type %u, %lld rows: the fused image differs",
                          (long long)width, at, (long long)n);
                gpu_free(dx);
                gpu_free(dw);
                gpu_free(dy);
                gpu_free(dy2);
                gpu_free(dq);
                gpu_free(dq2);
                free(x);
                free(w);
                free(y);
                free(y2);
                free(q);
                free(q2);
            }
}

/* Description: gpu_rope_qk gives what the per-head norms of q and k (either, both or none) and
 * the two RoPEs give, bit for bit: GQA head counts, partial rotation, NeoX and normal pairs,
 * strided token rows (the padding untouched), one token and several. */
Test(executor_cuda_ops, rope_qk_is_the_head_norms_then_the_ropes)
{
    gpu_or_skip();
    const struct {
        uint32_t n_head, n_head_kv, head_dim, n_rot;
    } cases[] = {{4, 2, 64, 64}, {8, 1, 128, 128}, {2, 2, 80, 32},   {6, 3, 256, 64},
                 {3, 1, 32, 0},  {2, 1, 64, 63},   {2, 1, 2048, 128}}; /* odd n_rot; > 1024 */
    const uint32_t toks[] = {1, 5};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++)
        for (size_t ti = 0; ti < 2; ti++)
            for (int neox = 0; neox < 2; neox++)
                for (int norms = 0; norms < 4; norms++) {
                    const uint32_t H = cases[ci].n_head, Hk = cases[ci].n_head_kv;
                    const uint32_t hd = cases[ci].head_dim, nr = cases[ci].n_rot, T = toks[ti];
                    const int64_t  qs = (int64_t)H * hd + 3, ks = (int64_t)Hk * hd + 5;
                    const size_t   nq = (size_t)T * (size_t)qs, nk = (size_t)T * (size_t)ks;
                    const size_t   ncs = (size_t)T * (nr ? nr : 1);
                    float *q = xmalloc(nq * 4), *k = xmalloc(nk * 4), *cs = xmalloc(ncs * 4);
                    float *qn = xmalloc((size_t)hd * 4), *kn = xmalloc((size_t)hd * 4);
                    fill_data(q, nq);
                    fill_data(k, nk);
                    fill_gauss(qn, hd, 1.0f);
                    fill_gauss(kn, hd, 0.5f);
                    for (size_t i = 0; i + 1 < ncs; i += 2) {
                        const double th = 100.0 * (double)rng_uniform();
                        cs[i] = (float)cos(th);
                        cs[i + 1] = (float)sin(th);
                    }
                    float      *dq = dev_from(q, nq * 4), *dk = dev_from(k, nk * 4);
                    float      *dq2 = dev_from(q, nq * 4), *dk2 = dev_from(k, nk * 4);
                    float      *dcs = dev_from(cs, ncs * 4), *dqn = dev_from(qn, (size_t)hd * 4);
                    float      *dkn = dev_from(kn, (size_t)hd * 4);
                    const float eps = 1e-6f;
                    const bool  hq = norms & 1, hk = norms & 2;
                    for (uint32_t t = 0; t < T; t++) {
                        if (hq)
                            cr_assert_eq(
                                gpu_rmsnorm(dq + t * qs, hd, dq + t * qs, hd, dqn, H, hd, eps), 0,
                                "%s", gpu_last_error());
                        if (hk)
                            cr_assert_eq(
                                gpu_rmsnorm(dk + t * ks, hd, dk + t * ks, hd, dkn, Hk, hd, eps), 0,
                                "%s", gpu_last_error());
                    }
                    cr_assert_eq(gpu_rope(dq, T, qs, H, hd, nr, dcs, neox != 0), 0, "%s",
                                 gpu_last_error());
                    cr_assert_eq(gpu_rope(dk, T, ks, Hk, hd, nr, dcs, neox != 0), 0, "%s",
                                 gpu_last_error());
                    cr_assert_eq(gpu_rope_qk(dq2, qs, H, dk2, ks, Hk, T, hd, nr, dcs, neox != 0,
                                             hq ? dqn : NULL, hk ? dkn : NULL, eps, NULL),
                                 0, "%s", gpu_last_error());
                    float *a = xmalloc(nq * 4), *b = xmalloc(nq * 4);
                    float *c = xmalloc(nk * 4), *d = xmalloc(nk * 4);
                    dev_to(a, dq, nq * 4);
                    dev_to(b, dq2, nq * 4);
                    dev_to(c, dk, nk * 4);
                    dev_to(d, dk2, nk * 4);
                    cr_assert(memcmp(a, b, nq * 4) == 0,
                              "case %zu, %u tokens, neox %d, norms %d: q differs", ci, T, neox,
                              norms);
                    cr_assert(memcmp(c, d, nk * 4) == 0,
                              "case %zu, %u tokens, neox %d, norms %d: k differs", ci, T, neox,
                              norms);
                    cr_assert(memcmp(b + qs - 3, q + qs - 3, 3 * 4) == 0, "q padding written");
                    gpu_free(dq);
                    gpu_free(dk);
                    gpu_free(dq2);
                    gpu_free(dk2);
                    gpu_free(dcs);
                    gpu_free(dqn);
                    gpu_free(dkn);
                    free(q);
                    free(k);
                    free(cs);
                    free(qn);
                    free(kn);
                    free(a);
                    free(b);
                    free(c);
                    free(d);
                }
}

/* Description: gpu_rope_qk with a cache store writes the f16 cache gpu_kv_store (or
 * gpu_kv_store_at, the position in device memory) writes after the norms and RoPEs, bit for
 * bit, values of another head width included; positions outside the tokens' stay untouched. */
Test(executor_cuda_ops, rope_qk_stores_the_cache_as_kv_store)
{
    gpu_or_skip();
    const struct {
        uint32_t n_head, n_head_kv, head_dim, head_dim_v, n_rot;
    } cases[] = {{4, 2, 64, 64, 64},
                 {8, 1, 128, 128, 64},
                 {2, 2, 80, 48, 80},
                 {6, 3, 256, 128, 32},
                 {2, 1, 64, 64, 33}}; /* the last: an odd n_rot */
    const uint32_t n_ctx = 16, pos0 = 3;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++)
        for (uint32_t T = 1; T <= 4; T += 3)
            for (int at = 0; at < 4; at++) { /* bit 0: the position in device memory; 1: NeoX */
                const bool     neox = at & 2;
                const uint32_t H = cases[ci].n_head, Hk = cases[ci].n_head_kv;
                const uint32_t hd = cases[ci].head_dim, hdv = cases[ci].head_dim_v;
                const uint32_t nr = cases[ci].n_rot, kd = Hk * hd, vd = Hk * hdv;
                const int64_t  qs = (int64_t)H * hd;
                const size_t nq = (size_t)T * (size_t)qs, nk = (size_t)T * kd, nv = (size_t)T * vd;
                const size_t nkc = (size_t)n_ctx * kd * 2, nvc = (size_t)n_ctx * vd * 2;
                float       *q = xmalloc(nq * 4), *k = xmalloc(nk * 4), *v = xmalloc(nv * 4);
                float       *cs = xmalloc((size_t)T * nr * 4), *kn = xmalloc((size_t)hd * 4);
                fill_data(q, nq);
                fill_data(k, nk);
                fill_data(v, nv);
                fill_gauss(kn, hd, 1.0f);
                for (size_t i = 0; i + 1 < (size_t)T * nr; i += 2) {
                    const double th = 100.0 * (double)rng_uniform();
                    cs[i] = (float)cos(th);
                    cs[i + 1] = (float)sin(th);
                }
                float    *dq = dev_from(q, nq * 4), *dk = dev_from(k, nk * 4);
                float    *dq2 = dev_from(q, nq * 4), *dk2 = dev_from(k, nk * 4);
                float    *dv = dev_from(v, nv * 4), *dcs = dev_from(cs, (size_t)T * nr * 4);
                float    *dkn = dev_from(kn, (size_t)hd * 4);
                uint16_t *kc = dev_poisoned(nkc), *vc = dev_poisoned(nvc);
                uint16_t *kc2 = dev_poisoned(nkc), *vc2 = dev_poisoned(nvc);
                uint32_t *dpos = dev_from(&pos0, sizeof(pos0));
                for (uint32_t t = 0; t < T; t++)
                    cr_assert_eq(gpu_rmsnorm(dk + t * kd, hd, dk + t * kd, hd, dkn, Hk, hd, 1e-6f),
                                 0);
                cr_assert_eq(gpu_rope(dq, T, qs, H, hd, nr, dcs, neox), 0);
                cr_assert_eq(gpu_rope(dk, T, kd, Hk, hd, nr, dcs, neox), 0);
                cr_assert_eq(at & 1 ? gpu_kv_store_at(kc, vc, kd, vd, dk, dv, dpos, T)
                                    : gpu_kv_store(kc, vc, kd, vd, dk, dv, pos0, T),
                             0, "%s", gpu_last_error());
                const struct gpu_kv_dst kv = {.k_cache = kc2,
                                              .v_cache = vc2,
                                              .v = dv,
                                              .head_dim_v = hdv,
                                              .pos0 = at & 1 ? 0 : pos0,
                                              .pos_dev = at & 1 ? dpos : NULL};
                cr_assert_eq(gpu_rope_qk(dq2, qs, H, dk2, kd, Hk, T, hd, nr, dcs, neox, NULL, dkn,
                                         1e-6f, &kv),
                             0, "%s", gpu_last_error());
                uint8_t *a = xmalloc(nkc + nvc + nq * 4 + nk * 4);
                uint8_t *b = xmalloc(nkc + nvc + nq * 4 + nk * 4);
                dev_to(a, kc, nkc);
                dev_to(a + nkc, vc, nvc);
                dev_to(a + nkc + nvc, dq, nq * 4);
                dev_to(a + nkc + nvc + nq * 4, dk, nk * 4);
                dev_to(b, kc2, nkc);
                dev_to(b + nkc, vc2, nvc);
                dev_to(b + nkc + nvc, dq2, nq * 4);
                dev_to(b + nkc + nvc + nq * 4, dk2, nk * 4);
                cr_assert(memcmp(a, b, nkc) == 0, "case %zu, %u tokens, at %d: the key cache", ci,
                          T, at);
                cr_assert(memcmp(a + nkc, b + nkc, nvc) == 0,
                          "case %zu, %u tokens, at %d: the value cache", ci, T, at);
                cr_assert(memcmp(a + nkc + nvc, b + nkc + nvc, nq * 4 + nk * 4) == 0,
                          "case %zu, %u tokens, at %d: q or k", ci, T, at);
                cr_assert(is_poison(a + nkc - 4) && is_poison(a + nkc + nvc - 4),
                          "the last positions were written");
                void *ps[] = {dq, dk, dq2, dk2, dv, dcs, dkn, kc, vc, kc2, vc2, dpos};
                for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
                    gpu_free(ps[i]);
                free(q);
                free(k);
                free(v);
                free(cs);
                free(kn);
                free(a);
                free(b);
            }
}

/* ------------------------------------------------------------------------------------------ */
/* KV store                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Description: k and v rows rounded to f16 (bit-equal to executor_fp32_to_fp16, subnormals
 * included) at positions pos0..; the other positions untouched. */
Test(executor_cuda_ops, kv_store_matches_reference)
{
    gpu_or_skip();
    const uint32_t k_width = 2 * 64, v_width = 2 * 48;
    const uint32_t toks[] = {1, 3, 17}, pos0s[] = {0, 40};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t pi = 0; pi < 2; pi++) {
            const uint32_t n_tok = toks[ti], pos0 = pos0s[pi], cap = pos0 + n_tok + 3;
            float         *k = xmalloc((size_t)n_tok * k_width * sizeof(float));
            float         *v = xmalloc((size_t)n_tok * v_width * sizeof(float));
            uint16_t      *kc = xmalloc((size_t)cap * k_width * 2);
            uint16_t      *vc = xmalloc((size_t)cap * v_width * 2);
            fill_data(k, (size_t)n_tok * k_width);
            fill_data(v, (size_t)n_tok * v_width);
            for (size_t i = 0; i < (size_t)n_tok * k_width; i += 5)
                k[i] *= 1e-6f; /* f16 subnormals */
            for (size_t i = 1; i < (size_t)n_tok * v_width; i += 7)
                v[i] *= 3e3f;
            uint16_t *dkc = dev_poisoned((size_t)cap * k_width * 2);
            uint16_t *dvc = dev_poisoned((size_t)cap * v_width * 2);
            float    *dk = dev_from(k, (size_t)n_tok * k_width * sizeof(float));
            float    *dv = dev_from(v, (size_t)n_tok * v_width * sizeof(float));
            cr_assert_eq(gpu_kv_store(dkc, dvc, k_width, v_width, dk, dv, pos0, n_tok), 0, "%s",
                         gpu_last_error());
            dev_to(kc, dkc, (size_t)cap * k_width * 2);
            dev_to(vc, dvc, (size_t)cap * v_width * 2);
            for (uint32_t p = 0; p < cap; p++) {
                const bool in = p >= pos0 && p < pos0 + n_tok;
                for (uint32_t i = 0; i < k_width; i++) {
                    const uint16_t want =
                        in ? executor_fp32_to_fp16(k[(size_t)(p - pos0) * k_width + i]) : 0xffff;
                    cr_assert_eq(kc[(size_t)p * k_width + i], want, "k pos %u dim %u", p, i);
                }
                for (uint32_t i = 0; i < v_width; i++) {
                    const uint16_t want =
                        in ? executor_fp32_to_fp16(v[(size_t)(p - pos0) * v_width + i]) : 0xffff;
                    cr_assert_eq(vc[(size_t)p * v_width + i], want, "v pos %u dim %u", p, i);
                }
            }
            gpu_free(dkc);
            gpu_free(dvc);
            gpu_free(dk);
            gpu_free(dv);
            free(k);
            free(v);
            free(kc);
            free(vc);
        }
}

/* ------------------------------------------------------------------------------------------ */
/* Attention                                                                                   */
/* ------------------------------------------------------------------------------------------ */

struct att_case {
    uint32_t n_tok, pos0, n_head, n_head_kv, hk, hv, window;
    bool     sinks;  /* a sink logit per head (gpt-oss) */
    bool     v_in_k; /* no value cache: the values head the key rows (one KV head) */
};

/* Sink logits of a case, in [-1, 3) (scores of these queries and keys are about N(0, 1)), or
 * NULL when it has none; *dev gets their device copy (NULL when none). */
static float *att_sinks(const struct att_case *ac, float **dev)
{
    *dev = NULL;
    if (!ac->sinks)
        return NULL;
    float *s = xmalloc(ac->n_head * sizeof(float));
    for (uint32_t h = 0; h < ac->n_head; h++)
        s[h] = -1.0f + 4.0f * rng_uniform();
    *dev = dev_from(s, ac->n_head * sizeof(float));
    return s;
}

#define ATT_GUARD 1024 /* floats past the stated scratch size that must stay untouched */

/* Checks the output of query token t, head h against a double reference: scores of the query as
 * the kernel reads it (qr: hk values) with the keys kf, softmax, the values vf (both as stored:
 * rows of n_head_kv heads, pos0 + n_tok of them): |out - ref| <= OPS_ATT_RTOL * sum_p prob_p
 * |v_p| / sum_p prob_p. prob: pos0 + n_tok doubles of room. */
static double g_att_rtol = OPS_ATT_RTOL; /* att_check_head's tolerance */

static void att_check_head(const struct att_case *ac, uint32_t t, uint32_t h, const float *qr,
                           const float *kf, const float *vf, const float *out, double *prob,
                           const float *sinks, const char *what)
{
    const uint32_t kw = ac->n_head_kv * ac->hk, vw = ac->n_head_kv * ac->hv;
    const uint32_t kvh = h / (ac->n_head / ac->n_head_kv), last = ac->pos0 + t + 1;
    const uint32_t lo = ac->window && last > ac->window ? last - ac->window : 0;
    const double   scale = (double)(1.0f / sqrtf((float)ac->hk));
    double         mx = -(double)INFINITY, sum = 0.0;
    for (uint32_t p = lo; p < last; p++) {
        const float *kr = kf + (size_t)p * kw + (size_t)kvh * ac->hk;
        double       s = 0.0;
        for (uint32_t d = 0; d < ac->hk; d++)
            s += (double)qr[d] * (double)kr[d];
        prob[p] = s * scale;
        mx = prob[p] > mx ? prob[p] : mx;
    }
    if (sinks) /* in the max and the sum, with no value */
        mx = (double)sinks[h] > mx ? (double)sinks[h] : mx;
    for (uint32_t p = lo; p < last; p++) {
        prob[p] = exp(prob[p] - mx);
        sum += prob[p];
    }
    if (sinks)
        sum += exp((double)sinks[h] - mx);
    const size_t o = ((size_t)t * ac->n_head + h) * ac->hv;
    for (uint32_t d = 0; d < ac->hv; d++) {
        double acc = 0.0, mag = 0.0;
        for (uint32_t p = lo; p < last; p++) {
            const double vv = (double)vf[(size_t)p * vw + (size_t)kvh * ac->hv + d];
            acc += prob[p] * vv;
            mag += prob[p] * fabs(vv);
        }
        cr_assert(isfinite(out[o + d]) &&
                      fabs((double)out[o + d] - acc / sum) <= g_att_rtol * mag / sum,
                  "%s n_tok %u pos0 %u heads %u/%u dims %u/%u window %u sinks %d: t %u h %u d %u "
                  "got %.7g want %.7g",
                  what, ac->n_tok, ac->pos0, ac->n_head, ac->n_head_kv, ac->hk, ac->hv, ac->window,
                  ac->sinks, t, h, d, (double)out[o + d], acc / sum);
    }
}

/* Runs one attention case on random q and an f16 cache of pos0 + n_tok positions, and checks
 * every output against a double reference on the same (f16-rounded) keys and values:
 * |gpu - ref| <= OPS_ATT_RTOL * sum_p prob_p |v_p| per output element. Also checks that no
 * scratch float beyond n_tok * n_head * (pos0 + n_tok) was written. */
static void att_run(const struct att_case *ac)
{
    const uint32_t n_pos = ac->pos0 + ac->n_tok, kw = ac->n_head_kv * ac->hk,
                   vw = ac->n_head_kv * ac->hv;
    const size_t nq = (size_t)ac->n_tok * ac->n_head * ac->hk;
    const size_t no = (size_t)ac->n_tok * ac->n_head * ac->hv;
    const size_t nk = (size_t)n_pos * kw, nvv = (size_t)n_pos * vw;
    const size_t nsc = (size_t)ac->n_tok * ac->n_head * n_pos;
    const float  scale = 1.0f / sqrtf((float)ac->hk);
    float       *q = xmalloc(nq * sizeof(float)), *out = xmalloc(no * sizeof(float));
    float       *kf = xmalloc(nk * sizeof(float)), *vf = xmalloc(nvv * sizeof(float));
    uint16_t    *k16 = xmalloc(nk * 2), *v16 = xmalloc(nvv * 2);
    double      *prob = xmalloc((size_t)n_pos * sizeof(double));
    float       *guard = xmalloc(ATT_GUARD * sizeof(float));
    fill_gauss(q, nq, 1.0f);
    fill_gauss(kf, nk, 1.0f);
    fill_data(vf, nvv);
    for (size_t i = 0; i < nk; i++) {
        k16[i] = executor_fp32_to_fp16(kf[i]);
        kf[i] = executor_fp16_to_fp32(k16[i]);
    }
    for (size_t i = 0; i < nvv; i++) {
        v16[i] = executor_fp32_to_fp16(vf[i]);
        vf[i] = executor_fp16_to_fp32(v16[i]);
    }
    for (uint32_t p = 0; ac->v_in_k && p < n_pos; p++) /* the reference's values: the keys' head */
        memcpy(vf + (size_t)p * vw, kf + (size_t)p * kw, vw * sizeof(float));
    float    *dq = dev_from(q, nq * sizeof(float)), *dout = dev_poisoned(no * sizeof(float));
    uint16_t *dk = dev_from(k16, nk * 2), *dv = ac->v_in_k ? NULL : dev_from(v16, nvv * 2);
    float    *dsc = dev_poisoned((nsc + ATT_GUARD) * sizeof(float)), *dsinks;
    float    *sinks = att_sinks(ac, &dsinks);
    cr_assert_eq(gpu_attention(dout, dq, dk, dv, ac->n_tok, ac->pos0, ac->n_head, ac->n_head_kv,
                               ac->hk, ac->hv, scale, ac->window, dsc, dsinks),
                 0, "%s", gpu_last_error());
    dev_to(out, dout, no * sizeof(float));
    dev_to(guard, dsc + nsc, ATT_GUARD * sizeof(float));
    for (size_t i = 0; i < ATT_GUARD; i++)
        cr_assert(is_poison(&guard[i]), "attention wrote scratch float %zu past its size", nsc + i);

    float *qr = xmalloc(ac->hk * sizeof(float));
    for (uint32_t t = 0; t < ac->n_tok; t++)
        for (uint32_t h = 0; h < ac->n_head; h++) {
            const float *qv = q + ((size_t)t * ac->n_head + h) * ac->hk;
            for (uint32_t d = 0; d < ac->hk; d++) /* the query rounded to f16 too */
                qr[d] = executor_fp16_to_fp32(executor_fp32_to_fp16(qv[d]));
            att_check_head(ac, t, h, qr, kf, vf, out, prob, sinks, "attention");
        }
    free(qr);
    free(sinks);
    gpu_free(dsinks);
    gpu_free(dq);
    gpu_free(dout);
    gpu_free(dk);
    gpu_free(dv);
    gpu_free(dsc);
    free(q);
    free(out);
    free(kf);
    free(vf);
    free(k16);
    free(v16);
    free(prob);
    free(guard);
}

/* Description: every combination of head dim 32..256, GQA 8/2, 4/4, 32/8, 1/3/17 tokens at
 * pos0 0 and 40, full and 5-position windows. */
Test(executor_cuda_ops, attention_matches_reference, .timeout = 600)
{
    gpu_or_skip();
    const uint32_t dims[] = {32, 64, 128, 256}, toks[] = {1, 3, 17}, pos0s[] = {0, 40};
    const uint32_t heads[][2] = {{8, 2}, {4, 4}, {32, 8}}, windows[] = {0, 5};
    for (size_t di = 0; di < 4; di++)
        for (size_t hi = 0; hi < 3; hi++)
            for (size_t ti = 0; ti < 3; ti++)
                for (size_t pi = 0; pi < 2; pi++)
                    for (size_t wi = 0; wi < 2; wi++)
                        att_run(&(struct att_case){.n_tok = toks[ti],
                                                   .pos0 = pos0s[pi],
                                                   .n_head = heads[hi][0],
                                                   .n_head_kv = heads[hi][1],
                                                   .hk = dims[di],
                                                   .hv = dims[di],
                                                   .window = windows[wi]});
}

/* ---- the q8_0 cache ---- */

#define Q8_BLOCK 34

/* Runs one attention case over a q8_0 cache (gpu_kv_store_q8 then gpu_attention_q8, or the
 * graph form with the position in device memory): the cache's bytes equal the CPU's quantizer's
 * (executor_quantize_act), the positions before pos0 untouched, and every output is within
 * OPS_ATT_RTOL of a double reference over the same dequantized keys and values and the query
 * quantized the same way (sum_p prob_p |v_p| the scale); a prefill of CUDA's flash kernel within
 * OPS_ATT_Q8_FLASH_RTOL of one over its f16-rounded query. */
static void att_q8_run(const struct att_case *ac, bool at)
{
    const uint32_t n_pos = ac->pos0 + ac->n_tok, kw = ac->n_head_kv * ac->hk,
                   vw = ac->n_head_kv * ac->hv;
    const size_t kb = (size_t)kw / 32 * Q8_BLOCK, vb = (size_t)vw / 32 * Q8_BLOCK;
    const size_t nq = (size_t)ac->n_tok * ac->n_head * ac->hk;
    const size_t no = (size_t)ac->n_tok * ac->n_head * ac->hv;
    const size_t nsc = (size_t)ac->n_tok * ac->n_head * n_pos;
    const float  scale = 1.0f / sqrtf((float)ac->hk);
    float       *q = xmalloc(nq * sizeof(float)), *out = xmalloc(no * sizeof(float));
    float       *kf = xmalloc((size_t)n_pos * kw * sizeof(float));
    float       *vf = xmalloc((size_t)n_pos * vw * sizeof(float));
    uint8_t     *k8 = xmalloc((size_t)n_pos * kb), *v8 = xmalloc((size_t)n_pos * vb);
    uint8_t     *want = xmalloc(kb > vb ? kb : vb), *qb = xmalloc(ac->hk / 32 * Q8_BLOCK);
    float       *qd = xmalloc(ac->hk * sizeof(float));
    double      *prob = xmalloc((size_t)n_pos * sizeof(double));
    fill_gauss(q, nq, 1.0f);
    fill_gauss(kf, (size_t)n_pos * kw, 1.0f);
    fill_data(vf, (size_t)n_pos * vw);
    for (size_t i = 0; i < (size_t)n_pos * kw; i += 37)
        kf[i] = 0.0f; /* a block of zeros now and then does not hurt */
    /* The positions before pos0 as the CPU would have stored them; the rest by the device. */
    uint8_t *dk = dev_poisoned((size_t)n_pos * kb), *dv = dev_poisoned((size_t)n_pos * vb);
    for (uint32_t p = 0; p < ac->pos0; p++) {
        cr_assert_geq(executor_quantize_act(COMMON_GGML_TYPE_Q8_0, kf + (size_t)p * kw, want, kw),
                      0);
        cr_assert_eq(gpu_upload(dk + p * kb, want, kb), 0);
        cr_assert_geq(executor_quantize_act(COMMON_GGML_TYPE_Q8_0, vf + (size_t)p * vw, want, vw),
                      0);
        cr_assert_eq(gpu_upload(dv + p * vb, want, vb), 0);
    }
    float    *dkf = dev_from(kf + (size_t)ac->pos0 * kw, (size_t)ac->n_tok * kw * sizeof(float));
    float    *dvf = dev_from(vf + (size_t)ac->pos0 * vw, (size_t)ac->n_tok * vw * sizeof(float));
    float    *dq = dev_from(q, nq * sizeof(float)), *dout = dev_poisoned(no * sizeof(float));
    float    *dsc = dev_poisoned((nsc + ATT_GUARD) * sizeof(float));
    uint32_t *dpos = dev_from(&ac->pos0, sizeof(uint32_t));
    float    *dsinks, *sinks = att_sinks(ac, &dsinks);
    cr_assert_eq(gpu_kv_store_q8(dk, ac->v_in_k ? NULL : dv, kw, ac->v_in_k ? 0 : vw, dkf,
                                 ac->v_in_k ? NULL : dvf, at ? 0 : ac->pos0, at ? dpos : NULL,
                                 ac->n_tok),
                 0, "%s", gpu_last_error());
    cr_assert_eq(gpu_attention_q8(dout, dq, dk, ac->v_in_k ? NULL : dv, ac->n_tok,
                                  at ? 0 : ac->pos0, at ? dpos : NULL, at ? n_pos : 0, ac->n_head,
                                  ac->n_head_kv, ac->hk, ac->hv, scale, ac->window, dsc, dsinks),
                 0, "%s", gpu_last_error());
    dev_to(k8, dk, (size_t)n_pos * kb);
    dev_to(v8, dv, (size_t)n_pos * vb);
    dev_to(out, dout, no * sizeof(float));
    for (uint32_t p = ac->pos0; p < n_pos; p++) {
        cr_assert_geq(executor_quantize_act(COMMON_GGML_TYPE_Q8_0, kf + (size_t)p * kw, want, kw),
                      0);
        cr_assert(memcmp(k8 + p * kb, want, kb) == 0, "q8_0 keys of position %u", p);
        if (ac->v_in_k)
            continue;
        cr_assert_geq(executor_quantize_act(COMMON_GGML_TYPE_Q8_0, vf + (size_t)p * vw, want, vw),
                      0);
        cr_assert(memcmp(v8 + p * vb, want, vb) == 0, "q8_0 values of position %u", p);
    }
    /* From here on, the reference reads the cache as stored: dequantized keys and values. */
    for (uint32_t p = 0; p < n_pos; p++) {
        cr_assert_geq(
            executor_dequantize_row(COMMON_GGML_TYPE_Q8_0, k8 + p * kb, kf + (size_t)p * kw, kw),
            0);
        if (ac->v_in_k) /* the values: the keys' head */
            memcpy(vf + (size_t)p * vw, kf + (size_t)p * kw, vw * sizeof(float));
        else
            cr_assert_geq(executor_dequantize_row(COMMON_GGML_TYPE_Q8_0, v8 + p * vb,
                                                  vf + (size_t)p * vw, vw),
                          0);
    }
    /* On CUDA, a prefill the flash kernel takes (ops.cu: 16 tokens or more, equal head dims of
     * 64 or 128, values of their own, the positions by value) rounds the query to f16 instead of
     * quantizing it, and the dequantized keys and values to f16 (the host backend quantizes the
     * query as the CPU does). */
    const bool flash = !strcmp(gpu_backend_name(), "CUDA") && !at && !ac->v_in_k &&
                       ac->n_tok >= 16 && ac->hk == ac->hv && (ac->hk == 64 || ac->hk == 128) &&
                       !getenv("SLUICE_NO_FLASH_ATTN");
    g_att_rtol = flash ? OPS_ATT_Q8_FLASH_RTOL : OPS_ATT_RTOL;
    for (uint32_t t = 0; t < ac->n_tok; t++)
        for (uint32_t h = 0; h < ac->n_head; h++) {
            const float *qh = q + ((size_t)t * ac->n_head + h) * ac->hk;
            if (flash) { /* the query as the kernel rounds it */
                for (uint32_t d = 0; d < ac->hk; d++)
                    qd[d] = executor_fp16_to_fp32(executor_fp32_to_fp16(qh[d]));
            } else {
                cr_assert_geq(executor_quantize_act(COMMON_GGML_TYPE_Q8_0, qh, qb, ac->hk), 0);
                cr_assert_geq(executor_dequantize_row(COMMON_GGML_TYPE_Q8_0, qb, qd, ac->hk), 0);
            }
            att_check_head(ac, t, h, qd, kf, vf, out, prob, sinks,
                           flash ? "q8_0 attention (flash)"
                           : at  ? "q8_0 attention (graph form)"
                                 : "q8_0 attention");
        }
    g_att_rtol = OPS_ATT_RTOL;
    free(sinks);
    gpu_free(dsinks);
    gpu_free(dk);
    gpu_free(dv);
    gpu_free(dkf);
    gpu_free(dvf);
    gpu_free(dq);
    gpu_free(dout);
    gpu_free(dsc);
    gpu_free(dpos);
    free(q);
    free(out);
    free(kf);
    free(vf);
    free(k8);
    free(v8);
    free(want);
    free(qb);
    free(qd);
    free(prob);
}

/* Description: the q8_0 cache's store and attention (--cache-type q8_0 on the device): head dims
 * 32 to 256 and unequal ones, GQA, one to 17 tokens after 0, 31, 40 and 300 positions, a
 * window, decodes over 900 and 1200 positions (split into chunks and combined), prefills of 16
 * to 200 tokens on the tensor cores (flash), and the graph form (the position in device
 * memory). */
Test(executor_cuda_ops, kv_q8_attention_matches_reference, .timeout = 300)
{
    gpu_or_skip();
    const struct att_case cases[] = {
        {1, 0, 4, 2, 32, 32, 0, false, false},
        {1, 40, 8, 2, 64, 64, 0, false, false},
        {3, 31, 4, 4, 128, 128, 0, false, false},
        {17, 0, 8, 2, 64, 64, 5, false, false},
        {5, 40, 4, 1, 96, 64, 0, false, false},
        {1, 300, 4, 2, 128, 128, 0, false, false},
        {2, 33, 2, 2, 256, 256, 7, false, false},
        {17, 255, 8, 8, 32, 64, 0, false, false},
        /* long decodes: positions split into chunks of 256 or more, then combined */
        {1, 1200, 8, 2, 128, 128, 0, false, false},
        {2, 900, 4, 4, 64, 96, 0, false, false},
        /* prefills the flash kernel takes (by value; the graph form keeps the kernel above):
         * partial query and position tiles, a start past 0, windows, GQA, sinks */
        {16, 0, 8, 2, 64, 64, 0, false, false},
        {65, 7, 4, 4, 128, 128, 0, false, false},
        {129, 70, 8, 2, 128, 128, 100, false, false},
        {200, 0, 4, 1, 64, 64, 64, true, false},
        {40, 1000, 8, 1, 128, 128, 30, false, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        att_q8_run(&cases[i], false);
        att_q8_run(&cases[i], true);
    }
    /* Widths that are not multiples of 32 are refused, as the CPU refuses them. */
    float *f = dev_poisoned(1024 * sizeof(float));
    cr_assert_eq(gpu_kv_store_q8(f, f, 33, 32, f, f, 0, NULL, 1), -1);
    cr_assert_eq(gpu_attention_q8(f, f, f, f, 1, 0, NULL, 0, 2, 1, 48, 32, 1.0f, 0, f, NULL), -1);
    gpu_free(f);
}

/* Description: a sink logit per head (gpt-oss) in the softmax's max and sum: decode, prefills on
 * the tensor cores (head dims 64; the second with a window), a split decode over a long span
 * (the sink in the chunks' combine), a window, GQA; the f16 cache and the q8_0 cache (and its
 * graph form). */
Test(executor_cuda_ops, attention_sinks_match_reference, .timeout = 300)
{
    gpu_or_skip();
    const struct att_case cases[] = {
        {1, 0, 8, 2, 64, 64, 0, true, false},    {1, 40, 8, 2, 64, 64, 0, true, false},
        {17, 0, 8, 2, 64, 64, 0, true, false},   {64, 30, 4, 4, 64, 64, 16, true, false},
        {1, 2000, 4, 2, 64, 64, 0, true, false}, {1, 1500, 8, 2, 128, 128, 128, true, false},
        {3, 5, 4, 1, 32, 32, 0, true, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        att_run(&cases[i]);
        att_q8_run(&cases[i], false);
        att_q8_run(&cases[i], true);
    }
}

/* Description: no value cache (latent attention: the values head the key rows, one KV head):
 * deepseek2's shape (keys 576 wide, values 512), narrower ones, odd dims, a prefill, a split
 * decode; the f16 cache and the q8_0 cache (and its graph form). */
Test(executor_cuda_ops, attention_values_in_keys_match_reference, .timeout = 300)
{
    gpu_or_skip();
    const struct att_case cases[] = {
        {1, 0, 16, 1, 576, 512, 0, false, true},  {3, 40, 16, 1, 576, 512, 0, false, true},
        {17, 0, 4, 1, 96, 64, 0, false, true},    {1, 2000, 4, 1, 96, 64, 0, false, true},
        {20, 10, 8, 1, 64, 64, 0, false, true},   {2, 5, 4, 1, 33, 17, 0, false, true},
        {1, 600, 8, 1, 160, 128, 0, false, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        att_run(&cases[i]);
        if (cases[i].hk % 32 == 0 && cases[i].hv % 32 == 0) {
            att_q8_run(&cases[i], false);
            att_q8_run(&cases[i], true);
        }
    }
    /* More than one KV head, or values wider than the keys, are refused. */
    float *f = dev_poisoned(4096 * sizeof(float));
    cr_assert_eq(
        gpu_attention(f, f, (uint16_t *)(void *)f, NULL, 1, 0, 4, 2, 64, 64, 1.0f, 0, f, NULL), -1,
        "values in keys with two KV heads");
    cr_assert_eq(
        gpu_attention(f, f, (uint16_t *)(void *)f, NULL, 1, 0, 4, 1, 64, 96, 1.0f, 0, f, NULL), -1,
        "values wider than the keys");
    gpu_free(f);
}

/* Description: key and value head dims that differ, odd dims (2-byte loads), one dim. */
Test(executor_cuda_ops, attention_odd_dims_match_reference)
{
    gpu_or_skip();
    const struct att_case cases[] = {
        {3, 40, 8, 2, 192, 128, 0, false, false}, {17, 0, 4, 4, 96, 64, 5, false, false},
        {3, 40, 8, 2, 33, 33, 0, false, false},   {17, 5, 4, 1, 1, 1, 0, false, false},
        {1, 40, 6, 3, 65, 129, 5, false, false},  {5, 2, 2, 2, 640, 576, 0, false, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        att_run(&cases[i]);
}

/* Description: a decode step over a long cache, and a long prefill (512 tokens; a chunk whose
 * last position passes 4096), with and without a window. */
Test(executor_cuda_ops, attention_long_matches_reference, .timeout = 600)
{
    gpu_or_skip();
    const struct att_case cases[] = {
        {1, 3999, 32, 8, 128, 128, 0, false, false},    {2, 4500, 8, 2, 64, 64, 0, false, false},
        {512, 0, 8, 2, 128, 128, 0, false, false},      {200, 3900, 4, 1, 64, 64, 0, false, false},
        {64, 3000, 8, 2, 256, 256, 0, false, false},    {512, 0, 8, 2, 64, 64, 128, false, false},
        {1, 3999, 32, 8, 128, 128, 4096, false, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        att_run(&cases[i]);
}

/* Description: few (token, head) rows over long spans, which ops.cu splits into chunks of at
 * least max(256, head_dim_v + 2) positions: spans just below, at and above the chunk edges, the
 * most chunks, a window (chunks not starting at position 0), odd dims, rows with 1 and 2 chunks
 * in one call. */
Test(executor_cuda_ops, attention_split_matches_reference, .timeout = 600)
{
    gpu_or_skip();
    const struct att_case cases[] = {
        {1, 510, 8, 2, 64, 64, 0, false, false},   {1, 511, 8, 2, 64, 64, 0, false, false},
        {1, 512, 8, 2, 64, 64, 0, false, false},   {1, 767, 8, 2, 64, 64, 0, false, false},
        {1, 8447, 8, 2, 64, 64, 0, false, false},  {1, 514, 8, 2, 256, 256, 0, false, false},
        {1, 515, 8, 2, 256, 256, 0, false, false}, {1, 516, 8, 2, 256, 256, 0, false, false},
        {3, 510, 4, 4, 128, 128, 0, false, false}, {2, 5000, 4, 4, 128, 128, 600, false, false},
        {1, 2000, 4, 2, 33, 33, 0, false, false},  {1, 3000, 8, 2, 192, 128, 0, false, false},
        {1, 2000, 4, 2, 64, 576, 0, false, false}, {4, 1500, 16, 2, 128, 128, 0, false, false},
        {1, 300, 1, 1, 1, 1, 0, false, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        att_run(&cases[i]);
}

/* Description: prefills of 16 tokens and more with equal head dims of 64 or 128, which ops.cu
 * computes on the tensor cores (64 queries per block, positions in tiles of 64): partial query and
 * position tiles, a start past 0, windows shorter than a tile and across tiles, GQA 1 to 8. */
Test(executor_cuda_ops, attention_flash_matches_reference, .timeout = 600)
{
    gpu_or_skip();
    const struct att_case cases[] = {
        {16, 0, 8, 2, 64, 64, 0, false, false},       {63, 0, 8, 2, 128, 128, 0, false, false},
        {64, 0, 32, 8, 128, 128, 0, false, false},    {65, 7, 4, 4, 128, 128, 0, false, false},
        {129, 70, 8, 2, 128, 128, 100, false, false}, {200, 0, 4, 1, 64, 64, 64, false, false},
        {130, 300, 2, 2, 64, 64, 0, false, false},    {40, 1000, 8, 1, 128, 128, 30, false, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        att_run(&cases[i]);
}

/* Description: with the first position read from device memory (gpu_kv_store_at,
 * gpu_attention_at: what a captured graph runs) the cache and the outputs are bit for bit those
 * of the position given by value, a wider scratch row included: decode, a split decode, a
 * window, a few tokens. */
Test(executor_cuda_ops, positions_from_device_memory_give_the_same_bits, .timeout = 300)
{
    gpu_or_skip();
    const struct att_case cases[] = {
        {1, 0, 8, 2, 64, 64, 0, false, false},      {1, 40, 8, 2, 64, 64, 0, false, false},
        {1, 1500, 8, 2, 128, 128, 0, false, false}, {1, 700, 4, 4, 64, 64, 256, false, false},
        {3, 40, 4, 2, 64, 64, 0, false, false},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const struct att_case *ac = &cases[ci];
        const uint32_t         n_pos = ac->pos0 + ac->n_tok, kw = ac->n_head_kv * ac->hk,
                       vw = ac->n_head_kv * ac->hv, stride = n_pos + 37;
        const size_t nq = (size_t)ac->n_tok * ac->n_head * ac->hk;
        const size_t no = (size_t)ac->n_tok * ac->n_head * ac->hv;
        const size_t nk = (size_t)n_pos * kw, nvv = (size_t)n_pos * vw;
        float       *q = xmalloc(nq * sizeof(float)), *kf = xmalloc(nk * sizeof(float));
        float       *vf = xmalloc(nvv * sizeof(float));
        fill_gauss(q, nq, 1.0f);
        fill_gauss(kf, nk, 1.0f);
        fill_data(vf, nvv);
        /* Both caches: positions before pos0 from the same f16 values, the new ones stored. */
        uint16_t *hk = xmalloc(nk * 2), *hv = xmalloc(nvv * 2);
        for (size_t i = 0; i < nk; i++)
            hk[i] = executor_fp32_to_fp16(kf[i]);
        for (size_t i = 0; i < nvv; i++)
            hv[i] = executor_fp32_to_fp16(vf[i]);
        uint16_t *dk[2], *dv[2];
        float    *dout[2], *dsc[2], *out[2];
        uint32_t *dpos = dev_from(&ac->pos0, sizeof(uint32_t));
        float *dnk = dev_from(kf + (size_t)ac->pos0 * kw, (size_t)ac->n_tok * kw * sizeof(float));
        float *dnv = dev_from(vf + (size_t)ac->pos0 * vw, (size_t)ac->n_tok * vw * sizeof(float));
        float *dq = dev_from(q, nq * sizeof(float));
        for (int w = 0; w < 2; w++) {
            dk[w] = dev_poisoned(nk * 2);
            dv[w] = dev_poisoned(nvv * 2);
            if (ac->pos0) {
                cr_assert_eq(gpu_upload(dk[w], hk, (size_t)ac->pos0 * kw * 2), 0);
                cr_assert_eq(gpu_upload(dv[w], hv, (size_t)ac->pos0 * vw * 2), 0);
            }
            dout[w] = dev_poisoned(no * sizeof(float));
            dsc[w] = dev_poisoned((size_t)ac->n_tok * ac->n_head * stride * sizeof(float));
            out[w] = xmalloc(no * sizeof(float));
        }
        const float scale = 1.0f / sqrtf((float)ac->hk);
        cr_assert_eq(gpu_kv_store(dk[0], dv[0], kw, vw, dnk, dnv, ac->pos0, ac->n_tok), 0, "%s",
                     gpu_last_error());
        cr_assert_eq(gpu_kv_store_at(dk[1], dv[1], kw, vw, dnk, dnv, dpos, ac->n_tok), 0, "%s",
                     gpu_last_error());
        cr_assert_eq(gpu_attention(dout[0], dq, dk[0], dv[0], ac->n_tok, ac->pos0, ac->n_head,
                                   ac->n_head_kv, ac->hk, ac->hv, scale, ac->window, dsc[0], NULL),
                     0, "%s", gpu_last_error());
        cr_assert_eq(gpu_attention_at(dout[1], dq, dk[1], dv[1], ac->n_tok, dpos, stride,
                                      ac->n_head, ac->n_head_kv, ac->hk, ac->hv, scale, ac->window,
                                      dsc[1], NULL),
                     0, "%s", gpu_last_error());
        uint16_t *c0 = xmalloc(nk * 2), *c1 = xmalloc(nk * 2);
        dev_to(c0, dk[0], nk * 2);
        dev_to(c1, dk[1], nk * 2);
        cr_assert(memcmp(c0, c1, nk * 2) == 0, "case %zu: key caches differ", ci);
        for (int w = 0; w < 2; w++)
            dev_to(out[w], dout[w], no * sizeof(float));
        for (size_t i = 0; i < no; i++)
            cr_assert(isfinite(out[0][i]) && memcmp(&out[0][i], &out[1][i], sizeof(float)) == 0,
                      "case %zu: output %zu is %.9g by value, %.9g from device memory", ci, i,
                      (double)out[0][i], (double)out[1][i]);
        for (int w = 0; w < 2; w++) {
            gpu_free(dk[w]);
            gpu_free(dv[w]);
            gpu_free(dout[w]);
            gpu_free(dsc[w]);
            free(out[w]);
        }
        gpu_free(dpos);
        gpu_free(dnk);
        gpu_free(dnv);
        gpu_free(dq);
        free(c0);
        free(c1);
        free(q);
        free(kf);
        free(vf);
        free(hk);
        free(hv);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* MoE routing and combination                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* The CPU's fwd_topk on double scores: k rounds, the highest not taken, ties to the lower index. */
static void ref_topk(const double *s, uint32_t n, uint32_t k, int32_t *out)
{
    for (uint32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < n; e++) {
            bool taken = false;
            for (uint32_t i = 0; i < j && !taken; i++)
                taken = out[i] == (int32_t)e;
            if (!taken && (best < 0 || s[e] > s[best]))
                best = (int32_t)e;
        }
        out[j] = best;
    }
}

/* Probabilities of one row of logits in double: softmax (gating 0), sigmoid (1) or the logits
 * themselves (2, gpt-oss). */
static void ref_probs(const float *l, uint32_t n, int gating, double *p)
{
    double mx = -(double)INFINITY, sum = 0.0;
    for (uint32_t e = 0; e < n; e++)
        mx = (double)l[e] > mx ? (double)l[e] : mx;
    for (uint32_t e = 0; e < n; e++) {
        p[e] = gating == 0   ? exp((double)l[e] - mx)
               : gating == 1 ? 1.0 / (1.0 + exp(-(double)l[e]))
                             : (double)l[e];
        sum += p[e];
    }
    for (uint32_t e = 0; gating == 0 && e < n; e++)
        p[e] /= sum;
}

/* A random permutation of 0..n-1. */
static void rng_perm(uint32_t *perm, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        const uint32_t j = (uint32_t)(rng_next() % i), x = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = x;
    }
}

struct route_case {
    uint32_t n_expert, k, n_group, n_group_used;
    int      gating;
    bool     bias, norm;
    float    scale;
};

/* Whether the top k + 1 of scores s (k + 1 <= n) are apart by more than 1e-5 of the top
 * score, far more than f32 rounding moves them, so f32 and double agree on the selection. */
static bool route_gapped(const double *s, uint32_t n, uint32_t k)
{
    int32_t top[65];
    ref_topk(s, n, k, top);
    for (uint32_t j = 0; j + 1 < k; j++)
        if (s[top[j]] - s[top[j + 1]] <= 1e-5 * fabs(s[top[0]]))
            return false;
    return true;
}

/* DeepSeek V3's group-limited selection on double scores s: each group of E / G scores the sum of
 * its two best, and the scores of every group outside the `used` best become -inf. Returns whether
 * the top used + 1 group scores are clearly apart (route_gapped), so that f32 agrees. */
static bool ref_route_groups(double *s, uint32_t E, uint32_t G, uint32_t used)
{
    const uint32_t per = E / G;
    double         gs[64] = {0};
    int32_t        top[2], keep[64];
    for (uint32_t g = 0; g < G; g++) {
        ref_topk(s + (size_t)g * per, per, per < 2 ? per : 2, top);
        gs[g] = s[(size_t)g * per + (uint32_t)top[0]];
        if (per >= 2)
            gs[g] += s[(size_t)g * per + (uint32_t)top[1]];
    }
    const bool gapped = route_gapped(gs, G, used + 1);
    ref_topk(gs, G, used, keep);
    for (uint32_t g = 0; g < G; g++) {
        bool kept = false;
        for (uint32_t i = 0; i < used; i++)
            kept = kept || keep[i] == (int32_t)g;
        for (uint32_t e = 0; !kept && e < per; e++)
            s[(size_t)g * per + e] = -(double)INFINITY;
    }
    return gapped;
}

/* The selection scores of a token: p + bias, with groups limited as ref_route_groups; whether
 * they are clearly apart where it matters. */
static bool ref_route_scores(const struct route_case *rc, const double *p, const float *bias,
                             double *s, uint32_t K1)
{
    const uint32_t E = rc->n_expert;
    for (uint32_t e = 0; e < E; e++)
        s[e] = p[e] + (double)bias[e];
    const bool groups_gapped =
        rc->n_group <= 1 || ref_route_groups(s, E, rc->n_group, rc->n_group_used);
    /* With groups the k + 1st may be masked (-inf): the top k must still be apart. */
    const uint32_t kept = rc->n_group > 1 ? rc->n_group_used * (E / rc->n_group) : E;
    return groups_gapped && route_gapped(s, E, K1 < kept ? K1 : kept);
}

/* Routes n_tok tokens whose logits are a permutation of evenly spaced values (clear gaps between
 * the probabilities); the bias, when used, is random in [0, 0.3) and shared by the tokens, so
 * the selection differs from p's top-k while the weights still come from p. A token whose top
 * k + 1 scores are not clearly apart gets new logits. Checks sel exactly and sel_w to OPS_RTOL. */
static void route_run(const struct route_case *rc)
{
    const uint32_t n_tok = 7, E = rc->n_expert, K = rc->k, K1 = K < E ? K + 1 : K;
    float         *logits = xmalloc((size_t)n_tok * E * sizeof(float));
    float         *bias = xmalloc(E * sizeof(float));
    uint32_t      *perm = xmalloc(E * sizeof(uint32_t));
    double        *p = xmalloc(E * sizeof(double)), *s = xmalloc(E * sizeof(double));
    int32_t       *sel = xmalloc((size_t)n_tok * K * sizeof(int32_t)), want[64];
    float         *sel_w = xmalloc((size_t)n_tok * K * sizeof(float));
    const double   gap = 8.0 / E;
    for (uint32_t e = 0; e < E; e++)
        bias[e] = rc->bias ? 0.3f * rng_uniform() : 0.0f;
    for (uint32_t t = 0; t < n_tok; t++) {
        float *l = logits + (size_t)t * E;
        int    tries = 0;
        do {
            cr_assert(tries++ < 1000, "no gapped logits for E %u k %u", E, K);
            rng_perm(perm, E);
            for (uint32_t e = 0; e < E; e++)
                l[e] = (float)(-4.0 + gap * ((double)perm[e] + 0.2 * (double)rng_uniform()));
            ref_probs(l, E, rc->gating, p);
        } while (!ref_route_scores(rc, p, bias, s, K1));
    }
    float   *dl = dev_from(logits, (size_t)n_tok * E * sizeof(float));
    float   *db = rc->bias ? dev_from(bias, E * sizeof(float)) : NULL;
    int32_t *dsel = dev_poisoned((size_t)n_tok * K * sizeof(int32_t));
    float   *dw = dev_poisoned((size_t)n_tok * K * sizeof(float));
    cr_assert_eq(gpu_moe_route(dl, db, n_tok, E, K, rc->n_group, rc->n_group_used, rc->gating,
                               rc->norm, rc->scale, dsel, dw),
                 0, "%s", gpu_last_error());
    dev_to(sel, dsel, (size_t)n_tok * K * sizeof(int32_t));
    dev_to(sel_w, dw, (size_t)n_tok * K * sizeof(float));
    for (uint32_t t = 0; t < n_tok; t++) {
        ref_probs(logits + (size_t)t * E, E, rc->gating, p);
        ref_route_scores(rc, p, bias, s, K1);
        ref_topk(s, E, K, want);
        double sum = 0.0, ww[64], mx = -(double)INFINITY, es = 0.0;
        for (uint32_t j = 0; j < K; j++) {
            ww[j] = p[want[j]];
            mx = ww[j] > mx ? ww[j] : mx;
        }
        for (uint32_t j = 0; rc->gating == 2 && j < K; j++) { /* softmax of the chosen logits */
            ww[j] = exp(ww[j] - mx);
            es += ww[j];
        }
        for (uint32_t j = 0; j < K; j++) {
            ww[j] = rc->gating == 2 ? ww[j] / es : ww[j];
            sum += ww[j];
        }
        const double div = rc->norm ? (sum > 6.103515625e-5 ? sum : 6.103515625e-5) : 1.0;
        const double mul = rc->scale != 0.0f && rc->scale != 1.0f ? (double)rc->scale : 1.0;
        for (uint32_t j = 0; j < K; j++) {
            cr_assert_eq(sel[t * K + j], want[j],
                         "E %u k %u groups %u/%u gating %d bias %d: token %u slot %u chose %d, "
                         "want %d",
                         E, K, rc->n_group_used, rc->n_group, rc->gating, rc->bias, t, j,
                         sel[t * K + j], want[j]);
            const double w = ww[j] / div * mul;
            check_close("sel_w", t * K + j, sel_w[t * K + j], w, fabs(w), OPS_RTOL);
        }
    }
    gpu_free(dl);
    gpu_free(db);
    gpu_free(dsel);
    gpu_free(dw);
    free(logits);
    free(bias);
    free(perm);
    free(p);
    free(s);
    free(sel);
    free(sel_w);
}

/* Description: 8..256 experts, k 1..16, softmax, sigmoid and gpt-oss's softmax over the chosen
 * logits, with and without a selection bias, with and without renormalisation, scale 0 (none), 1
 * and 2.5. */
Test(executor_cuda_ops, moe_route_matches_reference)
{
    gpu_or_skip();
    const uint32_t experts[] = {8, 60, 128, 256}, ks[] = {1, 2, 8, 16};
    const float    scales[] = {0.0f, 1.0f, 2.5f};
    for (size_t ei = 0; ei < 4; ei++)
        for (size_t ki = 0; ki < 4; ki++)
            for (int gating = 0; gating < 3; gating++)
                for (int bias = 0; bias < 2; bias++)
                    for (int norm = 0; norm < 2; norm++)
                        for (size_t si = 0; si < 3; si++) {
                            if (ks[ki] > experts[ei])
                                continue;
                            route_run(&(struct route_case){.n_expert = experts[ei],
                                                           .k = ks[ki],
                                                           .gating = gating,
                                                           .bias = bias != 0,
                                                           .norm = norm != 0,
                                                           .scale = scales[si]});
                        }
}

/* Description: DeepSeek V3's group-limited selection: 8..256 experts in 2..64 groups (one, two and
 * many experts a group), 1..G-1 of them kept, k up to what the kept groups hold, softmax and
 * sigmoid, with and without a bias. */
Test(executor_cuda_ops, moe_route_groups_match_reference)
{
    gpu_or_skip();
    static const uint32_t cases[][4] = {
        /* E, G, used, k */
        {8, 4, 2, 2},   {8, 8, 3, 3},   {16, 2, 1, 8},   {64, 8, 3, 6},    {64, 64, 5, 5},
        {160, 8, 4, 8}, {256, 8, 4, 8}, {256, 8, 1, 16}, {256, 32, 7, 16}, {256, 16, 15, 33}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (int gating = 0; gating < 2; gating++)
            for (int bias = 0; bias < 2; bias++) {
                if (cases[i][3] > 64)
                    continue;
                route_run(&(struct route_case){.n_expert = cases[i][0],
                                               .n_group = cases[i][1],
                                               .n_group_used = cases[i][2],
                                               .k = cases[i][3],
                                               .gating = gating,
                                               .bias = bias != 0,
                                               .norm = true,
                                               .scale = 2.5f});
            }
}

/* Routes one token of `E` logits (with `bias` or none) and checks the chosen experts. */
static void route_ties(const float *logits, const float *bias, uint32_t E, uint32_t k, int gating,
                       const int32_t *want)
{
    float   *dl = dev_from(logits, E * sizeof(float));
    float   *db = bias ? dev_from(bias, E * sizeof(float)) : NULL;
    int32_t *dsel = dev_poisoned(k * sizeof(int32_t)), sel[16];
    float   *dw = dev_poisoned(k * sizeof(float));
    cr_assert_eq(gpu_moe_route(dl, db, 1, E, k, 0, 0, gating, true, 0.0f, dsel, dw), 0, "%s",
                 gpu_last_error());
    dev_to(sel, dsel, k * sizeof(int32_t));
    for (uint32_t j = 0; j < k; j++)
        cr_assert_eq(sel[j], want[j], "E %u gating %d bias %d: slot %u chose %d, want %d", E,
                     gating, bias != NULL, j, sel[j], want[j]);
    gpu_free(dl);
    gpu_free(db);
    gpu_free(dsel);
    gpu_free(dw);
}

/* Description: equal scores go to the lower index, within one lane's experts and across lanes,
 * with softmax and sigmoid, with an equal bias. */
Test(executor_cuda_ops, moe_route_ties_to_lower_index)
{
    gpu_or_skip();
    const float   small[8] = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, 2.0f, 3.0f, 1.0f};
    const float   flat[8] = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
    const int32_t want_small[5] = {1, 2, 4, 6, 5};
    float         big[100];
    for (uint32_t e = 0; e < 100; e++)
        big[e] = -1.0f - rng_uniform();
    /* Lanes of 32: 6, 38 and 70 share lane 6, 99 is lane 3, 33 lane 1. */
    const int32_t want_big[6] = {6, 33, 38, 70, 99, 0};
    big[70] = big[6] = big[38] = big[99] = big[33] = 5.0f;
    big[0] = 4.0f;
    for (int gating = 0; gating < 2; gating++) {
        route_ties(small, NULL, 8, 5, gating, want_small);
        route_ties(small, flat, 8, 5, gating, want_small);
        route_ties(big, NULL, 100, 6, gating, want_big);
    }
}

/* Description: x += y * sigmoid(gate) per row (qwen2moe's gated shared expert), the gate at 0,
 * at large magnitudes of either sign and random, over edge widths. */
Test(executor_cuda_ops, gated_add_matches_reference)
{
    gpu_or_skip();
    const uint32_t toks[] = {1, 5, 33}, nes[] = {1, 31, 32, 33, 257, 4096};
    for (size_t ti = 0; ti < sizeof(toks) / sizeof(toks[0]); ti++)
        for (size_t ni = 0; ni < sizeof(nes) / sizeof(nes[0]); ni++) {
            const uint32_t n_tok = toks[ti], ne = nes[ni];
            const size_t   nx = (size_t)n_tok * ne;
            float         *x = xmalloc(nx * sizeof(float)), *y = xmalloc(nx * sizeof(float));
            float         *got = xmalloc(nx * sizeof(float)), *g = xmalloc(n_tok * sizeof(float));
            fill_data(x, nx);
            fill_data(y, nx);
            static const float special[] = {0.0f, 40.0f, -40.0f, 1e-30f};
            for (uint32_t t = 0; t < n_tok; t++)
                g[t] = t < 4 ? special[t] : 8.0f * (rng_uniform() - 0.5f);
            float *dx = dev_from(x, nx * sizeof(float)), *dy = dev_from(y, nx * sizeof(float));
            float *dg = dev_from(g, n_tok * sizeof(float));
            cr_assert_eq(gpu_gated_add(dx, dy, dg, n_tok, ne), 0, "%s", gpu_last_error());
            dev_to(got, dx, nx * sizeof(float));
            for (uint32_t t = 0; t < n_tok; t++) {
                const double s = 1.0 / (1.0 + exp(-(double)g[t]));
                for (uint32_t d = 0; d < ne; d++) {
                    const size_t i = (size_t)t * ne + d;
                    const double term = (double)y[i] * s;
                    check_close("gated_add", i, got[i], term + (double)x[i],
                                fabs(term) + fabs((double)x[i]), OPS_RTOL);
                }
            }
            gpu_free(dx);
            gpu_free(dy);
            gpu_free(dg);
            free(x);
            free(y);
            free(got);
            free(g);
        }
}

/* Description: x += the slot-ordered weighted sum of the k expert rows per token. */
Test(executor_cuda_ops, moe_combine_matches_reference)
{
    gpu_or_skip();
    const uint32_t toks[] = {1, 3, 17}, ks[] = {1, 2, 8}, nes[] = {1, 33, 4096};
    for (size_t ti = 0; ti < 3; ti++)
        for (size_t ki = 0; ki < 3; ki++)
            for (size_t ni = 0; ni < 3; ni++) {
                const uint32_t n_tok = toks[ti], k = ks[ki], ne = nes[ni];
                const size_t   nx = (size_t)n_tok * ne, ny = nx * k;
                float         *x = xmalloc(nx * sizeof(float)), *got = xmalloc(nx * sizeof(float));
                float         *y = xmalloc(ny * sizeof(float)), *w = xmalloc((size_t)n_tok * k * 4);
                fill_data(x, nx);
                fill_data(y, ny);
                for (size_t i = 0; i < (size_t)n_tok * k; i++)
                    w[i] = 0.05f + rng_uniform();
                float *dx = dev_from(x, nx * sizeof(float)), *dy = dev_from(y, ny * sizeof(float));
                float *dw = dev_from(w, (size_t)n_tok * k * sizeof(float));
                cr_assert_eq(gpu_moe_combine(dx, dy, dw, n_tok, k, ne), 0, "%s", gpu_last_error());
                dev_to(got, dx, nx * sizeof(float));
                for (uint32_t t = 0; t < n_tok; t++)
                    for (uint32_t d = 0; d < ne; d++) {
                        const size_t i = (size_t)t * ne + d;
                        double       acc = 0.0, mag = fabs((double)x[i]);
                        for (uint32_t j = 0; j < k; j++) {
                            const double term =
                                (double)w[t * k + j] * (double)y[((size_t)t * k + j) * ne + d];
                            acc += term;
                            mag += fabs(term);
                        }
                        check_close("moe_combine", i, got[i], acc + (double)x[i], mag, OPS_RTOL);
                    }
                gpu_free(dx);
                gpu_free(dy);
                gpu_free(dw);
                free(x);
                free(got);
                free(y);
                free(w);
            }
}

/* ------------------------------------------------------------------------------------------ */
/* Row gather and scatter                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Description: gpu_moe_sort against a stable counting sort on the host: items by expert in
 * increasing order, tiles of up to `tile` in expert order and their count; skewed and uniform
 * picks, an expert with exactly a multiple of the tile, unused experts, one item, none. */
Test(executor_cuda_ops, moe_sort_matches_reference)
{
    gpu_or_skip();
    static const struct {
        uint32_t n, n_expert;
        int32_t  tile;
        int      skew;
    } cases[] = {{4096, 128, 32, 0}, {4096, 128, 32, 1}, {1, 8, 32, 0},  {64, 4, 32, 2},
                 {3000, 256, 7, 0},  {40, 1, 32, 0},     {0, 16, 32, 0}, {1025, 60, 1, 1}};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const uint32_t n = cases[ci].n, E = cases[ci].n_expert;
        const int32_t  tile = cases[ci].tile;
        int32_t       *sel = xmalloc((n ? n : 1) * sizeof(int32_t));
        for (uint32_t i = 0; i < n; i++) {
            const uint64_t r = rng_next();
            /* skew 1: most picks in the first eighth; skew 2: expert 1 holds exactly 2 tiles */
            sel[i] = cases[ci].skew == 1 && r % 4 != 0 ? (int32_t)((r >> 8) % (E / 8 ? E / 8 : 1))
                     : cases[ci].skew == 2             ? (int32_t)(i < 64 ? 1 : 3)
                                                       : (int32_t)((r >> 8) % E);
        }
        /* the reference */
        const uint32_t      max_t = n / (uint32_t)tile + E;
        int32_t            *want = xmalloc((n ? n : 1) * sizeof(int32_t));
        struct gpu_mm_tile *want_t = xmalloc(max_t * sizeof(*want_t));
        int32_t             nt = 0, at = 0;
        for (uint32_t x = 0; x < E; x++) {
            int32_t c = 0;
            for (uint32_t i = 0; i < n; i++)
                if ((uint32_t)sel[i] == x)
                    want[at + c++] = (int32_t)i;
            for (int32_t j = 0; j < c; j += tile)
                want_t[nt++] =
                    (struct gpu_mm_tile){(int32_t)x, at + j, c - j < tile ? c - j : tile};
            at += c;
        }
        int32_t            *dsel = dev_from(sel, (n ? n : 1) * sizeof(int32_t));
        int32_t            *ditems = dev_poisoned((n ? n : 1) * sizeof(int32_t));
        struct gpu_mm_tile *dtiles = dev_poisoned(max_t * sizeof(struct gpu_mm_tile));
        int32_t            *dnt = dev_poisoned(sizeof(int32_t));
        cr_assert_eq(gpu_moe_sort(dsel, n, E, tile, ditems, dtiles, dnt), 0, "%s",
                     gpu_last_error());
        int32_t            *got = xmalloc((n ? n : 1) * sizeof(int32_t)), got_nt = -1;
        struct gpu_mm_tile *got_t = xmalloc(max_t * sizeof(*got_t));
        dev_to(got, ditems, (n ? n : 1) * sizeof(int32_t));
        dev_to(got_t, dtiles, max_t * sizeof(*got_t));
        dev_to(&got_nt, dnt, sizeof(int32_t));
        cr_assert_eq(got_nt, nt, "case %zu: %d tiles, want %d", ci, got_nt, nt);
        for (uint32_t i = 0; i < n; i++)
            cr_assert_eq(got[i], want[i], "case %zu: items[%u] = %d, want %d", ci, i, got[i],
                         want[i]);
        for (int32_t t = 0; t < nt; t++)
            cr_assert(got_t[t].expert == want_t[t].expert && got_t[t].first == want_t[t].first &&
                          got_t[t].count == want_t[t].count,
                      "case %zu: tile %d = {%d, %d, %d}, want {%d, %d, %d}", ci, t, got_t[t].expert,
                      got_t[t].first, got_t[t].count, want_t[t].expert, want_t[t].first,
                      want_t[t].count);
        gpu_free(dsel);
        gpu_free(ditems);
        gpu_free(dtiles);
        gpu_free(dnt);
        free(sel);
        free(want);
        free(want_t);
        free(got);
        free(got_t);
    }
}

/* Description: rows copied by a device index array (gather with repeats, scatter to distinct
 * rows) and without one (a strided copy); the other rows and the padding untouched. */
Test(executor_cuda_ops, gather_scatter_rows_copy_rows)
{
    gpu_or_skip();
    const int64_t ns[] = {1, 5, 17}, widths[] = {1, 33, 4096};
    for (size_t ni = 0; ni < 3; ni++)
        for (size_t wi = 0; wi < 3; wi++) {
            const int64_t n = ns[ni], width = widths[wi], n_src = n + 3;
            const int64_t ss = width + 1, ds = width + 4;
            const size_t  nsrc = (size_t)(n_src * ss), ndst = (size_t)(n_src * ds);
            float        *src = xmalloc(nsrc * sizeof(float)), *got = xmalloc(ndst * 4);
            int32_t      *rows = xmalloc((size_t)n * sizeof(int32_t));
            uint32_t     *perm = xmalloc((size_t)n_src * sizeof(uint32_t));
            fill_data(src, nsrc);
            float *dsrc = dev_from(src, nsrc * sizeof(float));

            /* Gather: dst row i = src row rows[i], repeats allowed. */
            for (int64_t i = 0; i < n; i++)
                rows[i] = (int32_t)(rng_next() % (uint64_t)n_src);
            int32_t *drows = dev_from(rows, (size_t)n * sizeof(int32_t));
            float   *ddst = dev_poisoned(ndst * sizeof(float));
            cr_assert_eq(gpu_gather_rows(ddst, ds, dsrc, ss, drows, n, width), 0, "%s",
                         gpu_last_error());
            dev_to(got, ddst, ndst * sizeof(float));
            for (int64_t r = 0; r < n_src; r++)
                for (int64_t c = 0; c < ds; c++) {
                    const float *g = &got[r * ds + c];
                    if (r < n && c < width)
                        cr_assert(memcmp(g, &src[rows[r] * ss + c], 4) == 0, "gather row %lld",
                                  (long long)r);
                    else
                        cr_assert(is_poison(g), "gather wrote outside its rows");
                }
            gpu_free(drows);
            gpu_free(ddst);

            /* Gather without rows: dst row i = src row i (a strided copy). */
            ddst = dev_poisoned(ndst * sizeof(float));
            cr_assert_eq(gpu_gather_rows(ddst, ds, dsrc, ss, NULL, n, width), 0, "%s",
                         gpu_last_error());
            dev_to(got, ddst, ndst * sizeof(float));
            for (int64_t r = 0; r < n_src; r++)
                for (int64_t c = 0; c < ds; c++) {
                    const float *g = &got[r * ds + c];
                    if (r < n && c < width)
                        cr_assert(memcmp(g, &src[r * ss + c], 4) == 0, "copy row %lld",
                                  (long long)r);
                    else
                        cr_assert(is_poison(g), "the copy wrote outside its rows");
                }
            gpu_free(ddst);

            /* Scatter: dst row rows[i] = src row i, distinct rows. */
            rng_perm(perm, (uint32_t)n_src);
            for (int64_t i = 0; i < n; i++)
                rows[i] = (int32_t)perm[i];
            drows = dev_from(rows, (size_t)n * sizeof(int32_t));
            ddst = dev_poisoned(ndst * sizeof(float));
            cr_assert_eq(gpu_scatter_rows(ddst, ds, dsrc, ss, drows, n, width), 0, "%s",
                         gpu_last_error());
            dev_to(got, ddst, ndst * sizeof(float));
            for (int64_t r = 0; r < n_src; r++) {
                int64_t from = -1;
                for (int64_t i = 0; i < n; i++)
                    from = rows[i] == r ? i : from;
                for (int64_t c = 0; c < ds; c++) {
                    const float *g = &got[r * ds + c];
                    if (from >= 0 && c < width)
                        cr_assert(memcmp(g, &src[from * ss + c], 4) == 0, "scatter row %lld",
                                  (long long)r);
                    else
                        cr_assert(is_poison(g), "scatter wrote outside its rows");
                }
            }
            gpu_free(drows);
            gpu_free(ddst);
            gpu_free(dsrc);
            free(src);
            free(got);
            free(rows);
            free(perm);
        }
}

/* ------------------------------------------------------------------------------------------ */
/* Arguments                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* Description: bad arguments fail with -1 and a recorded error, launching nothing; empty work
 * succeeds. */
Test(executor_cuda_ops, bad_arguments_fail)
{
    gpu_or_skip();
    float   *f = dev_poisoned(1 << 16);
    int32_t *i32 = dev_poisoned(1024);
    cr_assert_eq(gpu_rmsnorm(f, 8, f, 8, f, 1, 0, 1e-5f), -1, "rmsnorm width 0");
    cr_assert_neq(gpu_last_error()[0], '\0', "no error recorded");
    cr_assert_eq(gpu_rmsnorm(f, 4, f, 8, f, 1, 8, 1e-5f), -1, "rmsnorm y_stride < width");
    cr_assert_eq(gpu_add(NULL, f, f, 4), -1, "add NULL");
    cr_assert_eq(gpu_add(f, f, f, -1), -1, "add n < 0");
    cr_assert_eq(gpu_add_bias(f, 4, f, 2, 8), -1, "add_bias stride < width");
    cr_assert_eq(gpu_scale_rows(f, 4, 2, 8, 2.0f), -1, "scale_rows stride < width");
    cr_assert_eq(gpu_scale_rows(NULL, 8, 2, 8, 2.0f), -1, "scale_rows NULL");
    cr_assert_eq(gpu_swiglu(f, NULL, 4, false), -1, "swiglu NULL");
    cr_assert_eq(gpu_swiglu_oai(f, f, 1, 4, f, NULL, 1, NULL), -1, "swiglu_oai NULL bias");
    cr_assert_eq(gpu_swiglu_oai(f, f, 1, 4, f, f, 0, NULL), -1, "swiglu_oai no bias rows");
    cr_assert_eq(gpu_add_bias_ids(f, 4, f, 0, NULL, 1, 4), -1, "add_bias_ids no bias rows");
    cr_assert_eq(gpu_rope(f, 1, 64, 1, 32, 34, f, false), -1, "rope n_rot > head_dim");
    cr_assert_eq(gpu_rope(f, 1, 16, 1, 32, 32, f, false), -1, "rope tok_stride too small");
    cr_assert_eq(gpu_rmsnorm_q8(f, 48, f + 64, 48, f, 1, 48, 1e-5f, COMMON_GGML_TYPE_Q8_0, f + 128),
                 -1, "rmsnorm_q8 width not a multiple of 32");
    cr_assert_eq(gpu_rmsnorm_q8(f, 64, f + 64, 64, f, 1, 64, 1e-5f, COMMON_GGML_TYPE_Q8_K, f + 128),
                 -1, "rmsnorm_q8 Q8_K width not a multiple of 256");
    cr_assert_eq(gpu_rmsnorm_q8(f, 64, f, 64, f, 1, 64, 1e-5f, COMMON_GGML_TYPE_Q8_0, f + 128), -1,
                 "rmsnorm_q8 in place");
    cr_assert_eq(gpu_rmsnorm_q8(f, 64, f + 64, 64, f, 1, 64, 1e-5f, COMMON_GGML_TYPE_F16, f + 128),
                 -1, "rmsnorm_q8 to f16");
    cr_assert_eq(gpu_rope_qk(f, 64, 1, f, 64, 1, 1, 32, 34, f, false, NULL, NULL, 1e-5f, NULL), -1,
                 "rope_qk n_rot > head_dim");
    cr_assert_eq(gpu_rope_qk(f, 16, 1, f, 64, 1, 1, 32, 32, f, false, NULL, NULL, 1e-5f, NULL), -1,
                 "rope_qk q_stride too small");
    const struct gpu_kv_dst kvd = {.k_cache = (uint16_t *)(void *)f,
                                   .v_cache = (uint16_t *)(void *)f,
                                   .v = f,
                                   .head_dim_v = 32};
    cr_assert_eq(gpu_rope_qk(f, 64, 2, f, 64, 1, 1, 32, 32, f, false, NULL, NULL, 1e-5f, &kvd), -1,
                 "rope_qk storing keys that are not contiguous");
    cr_assert_eq(gpu_kv_store(NULL, (uint16_t *)(void *)f, 8, 8, f, f, 0, 1), -1,
                 "kv_store NULL cache");
    cr_assert_eq(gpu_attention(f, f, (uint16_t *)(void *)f, (uint16_t *)(void *)f, 1, 0, 6, 4, 8, 8,
                               1.0f, 0, f, NULL),
                 -1, "attention n_head %% n_head_kv");
    cr_assert_eq(gpu_attention(f, f, (uint16_t *)(void *)f, (uint16_t *)(void *)f, 1, 0, 4, 0, 8, 8,
                               1.0f, 0, f, NULL),
                 -1, "attention n_head_kv 0");
    cr_assert_eq(gpu_attention(f, f, (uint16_t *)(void *)f, (uint16_t *)(void *)f, 1, 0, 4, 4, 0, 8,
                               1.0f, 0, f, NULL),
                 -1, "attention head_dim_k 0");
    cr_assert_eq(gpu_moe_route(f, NULL, 1, 8, 9, 0, 0, 0, true, 0.0f, i32, f), -1, "route k > E");
    cr_assert_eq(gpu_moe_route(f, NULL, 1, 8, 0, 0, 0, 0, true, 0.0f, i32, f), -1, "route k 0");
    cr_assert_eq(gpu_moe_route(f, NULL, 1, 8, 2, 0, 0, 3, true, 0.0f, i32, f), -1,
                 "route gating 3");
    cr_assert_eq(gpu_moe_route(f, NULL, 1, 8, 2, 3, 1, 0, true, 0.0f, i32, f), -1,
                 "route groups not dividing the experts");
    cr_assert_eq(gpu_moe_route(f, NULL, 1, 8, 2, 4, 4, 0, true, 0.0f, i32, f), -1,
                 "route every group kept");
    cr_assert_eq(gpu_moe_route(f, NULL, 1, 8, 2, 4, 0, 0, true, 0.0f, i32, f), -1,
                 "route no group kept");
    cr_assert_eq(gpu_moe_route(f, NULL, 1, 8, 5, 4, 2, 0, true, 0.0f, i32, f), -1,
                 "route k over the kept groups' experts");
    cr_assert_eq(gpu_moe_combine(f, f, f, 1, 0, 8), -1, "combine k 0");
    cr_assert_eq(gpu_gated_add(f, f, NULL, 1, 8), -1, "gated_add NULL gate");
    cr_assert_eq(gpu_gather_rows(f, 4, f, 8, i32, 1, 8), -1, "gather dst_stride < width");
    cr_assert_eq(gpu_scatter_rows(f, 8, f, 8, NULL, 1, 8), -1, "scatter NULL rows");

    cr_assert_eq(gpu_rmsnorm(f, 8, f, 8, f, 0, 8, 1e-5f), 0, "rmsnorm of no rows");
    cr_assert_eq(gpu_add(f, f, f, 0), 0, "add of nothing");
    cr_assert_eq(gpu_attention(f, f, (uint16_t *)(void *)f, (uint16_t *)(void *)f, 0, 0, 4, 4, 8, 8,
                               1.0f, 0, f, NULL),
                 0, "attention of no tokens");
    cr_assert_eq(gpu_moe_route(f, NULL, 0, 8, 2, 0, 0, 0, true, 0.0f, i32, f), 0,
                 "route no tokens");
    cr_assert_eq(gpu_sync(), 0, "the stream failed: %s", gpu_last_error());
    gpu_free(f);
    gpu_free(i32);
}

/* Description: a graph's kernels run at each launch, not at capture, with the arguments they
 * were queued with, over device memory as it is at the launch: two kernels (an add, then a
 * norm of its output) captured, the input changed before each of two launches, the output each
 * time what the kernels give the new input; a capture made again into the same graph replaces
 * its kernels. */
Test(executor_cuda_ops, graph_kernels_run_at_each_launch_over_memory_as_it_is)
{
    gpu_or_skip();
    if (!gpu_graphs_supported())
        cr_skip_test("%s backend has no graphs: skipped", gpu_backend_name());
    enum { W = 96 };
    float  x[W], w[W], y[W], want[W];
    float *dx = dev_poisoned(sizeof(x)), *dw = dev_poisoned(sizeof(w));
    float *ds = dev_poisoned(sizeof(x)), *dy = dev_poisoned(sizeof(y));
    fill_gauss(w, W, 1.0f);
    cr_assert_eq(gpu_upload(dw, w, sizeof(w)), 0);
    cr_assert_eq(gpu_sync(), 0);
    struct gpu_graph *g = NULL;
    cr_assert_eq(gpu_graph_begin(), 0, "%s", gpu_last_error());
    const int rc = gpu_add(ds, dx, dx, W) < 0 || gpu_rmsnorm(dy, W, ds, W, dw, 1, W, 1e-5f) < 0;
    cr_assert_eq(gpu_graph_end(&g), 0, "%s", gpu_last_error());
    cr_assert_eq(rc, 0, "queueing during the capture: %s", gpu_last_error());
    cr_assert_not_null(g);
    for (int round = 0; round < 3; round++) {
        fill_data(x, W);
        cr_assert_eq(gpu_upload(dx, x, sizeof(x)), 0);
        if (round == 2) { /* captured again into g: the norm alone, of x */
            cr_assert_eq(gpu_graph_begin(), 0, "%s", gpu_last_error());
            const int rc2 = gpu_rmsnorm(dy, W, dx, W, dw, 1, W, 1e-5f);
            cr_assert_eq(gpu_graph_end(&g), 0, "%s", gpu_last_error());
            cr_assert_eq(rc2, 0);
        }
        cr_assert_eq(gpu_graph_launch(g), 0, "%s", gpu_last_error());
        dev_to(y, dy, sizeof(y));
        /* the same kernels launched now, on the same input */
        if (round < 2)
            cr_assert(gpu_add(ds, dx, dx, W) == 0 &&
                      gpu_rmsnorm(dy, W, ds, W, dw, 1, W, 1e-5f) == 0);
        else
            cr_assert_eq(gpu_rmsnorm(dy, W, dx, W, dw, 1, W, 1e-5f), 0);
        dev_to(want, dy, sizeof(want));
        cr_assert(memcmp(y, want, sizeof(y)) == 0,
                  "round %d: the graph's output is not its kernels' over the new input", round);
    }
    gpu_graph_free(g);
    gpu_free(dx);
    gpu_free(dw);
    gpu_free(ds);
    gpu_free(dy);
}

/* The host backend's captures fail where a thread-local CUDA capture would, or would record
 * something other than what runs: an allocation, a free, a host registration, a switch to
 * another device; the capture after them works again. */
Test(executor_cuda_ops, host_captures_fail_as_cuda_would)
{
    if (getenv("SLUICE_GPU_BACKEND") && !strcmp(getenv("SLUICE_GPU_BACKEND"), "host"))
        cr_assert_eq(setenv("SLUICE_GPU_HOST_DEVICES", "2", 1), 0); /* a device to switch to */
    gpu_or_skip();
    if (strcmp(gpu_backend_name(), "HOST") != 0 || !gpu_graphs_supported())
        cr_skip_test("the host backend's rules: skipped on %s", gpu_backend_name());
    const size_t      pg = (size_t)sysconf(_SC_PAGESIZE);
    void             *h = aligned_alloc(pg, pg), *d = gpu_malloc(256);
    struct gpu_graph *g = NULL;
    cr_assert(h && d, "%s", gpu_last_error());
    for (int what = 0; what < 4; what++) {
        cr_assert_eq(gpu_graph_begin(), 0, "%s", gpu_last_error());
        void *q = NULL;
        int   rc = 0;
        if (what == 0)
            rc = (q = gpu_malloc(256)) ? 0 : -1;
        else if (what == 1)
            gpu_free(d);
        else if (what == 2)
            rc = gpu_host_register(h, pg, false);
        else
            rc = gpu_use(1);
        cr_assert_eq(gpu_graph_end(&g), -1, "case %d: the capture did not fail", what);
        cr_assert_null(g);
        if (what != 1)
            cr_assert_eq(rc, -1, "case %d: the call was made", what);
        cr_assert(strstr(gpu_last_error(), "graph capture"), "%s", gpu_last_error());
        if (what == 1)
            d = gpu_malloc(256); /* freed all the same, as cudaFree's memory is */
        cr_assert_not_null(d);
    }
    cr_assert_eq(gpu_graph_begin(), 0, "%s", gpu_last_error());
    cr_assert_eq(gpu_memset(d, 0, 256), 0, "%s", gpu_last_error());
    cr_assert_eq(gpu_graph_end(&g), 0, "the next capture: %s", gpu_last_error());
    gpu_graph_free(g);
    gpu_free(d);
    free(h);
}

/* Pinned host memory (the pool's RAM regions): a mapped range registers, read-only too (a
 * fetcher's pool as the executor daemon maps it); a range overlapping a registration and an
 * unmapped one are refused; after its unregistration a range registers again. The host backend
 * checks what CUDA does. */
Test(executor_cuda_ops, host_memory_registers_as_cuda_allows)
{
    gpu_or_skip();
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t     *p = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    memset(p, 1, 4 * pg);
    cr_assert_eq(gpu_host_register(p, 4 * pg, false), 0, "%s", gpu_last_error());
    cr_assert_eq(gpu_host_register(p + pg, pg, false), -1, "an overlapping range registered");
    cr_assert_neq(gpu_last_error()[0], '\0', "no error recorded");
    gpu_host_unregister(p);
    cr_assert_eq(gpu_host_register(p + pg, pg, false), 0, "%s", gpu_last_error());
    gpu_host_unregister(p + pg);
    cr_assert_eq(mprotect(p, 4 * pg, PROT_READ), 0);
    cr_assert_eq(gpu_host_register(p, 4 * pg, true), 0, "read-only: %s", gpu_last_error());
    gpu_host_unregister(p);
    cr_assert_eq(munmap(p + 2 * pg, 2 * pg), 0);
    cr_assert_eq(gpu_host_register(p, 4 * pg, true), -1, "a range half unmapped registered");
    cr_assert_eq(munmap(p, 2 * pg), 0);
}

/* Uploads queued without a wait (a decode step's inputs): from registered memory they land in
 * stream order before the kernels queued after them, edge sizes included, and the memory may be
 * written again once the stream was synchronised; the host backend refuses an unregistered
 * source, as a misuse that CUDA would hide by copying synchronously. */
Test(executor_cuda_ops, queued_uploads_land_before_the_kernels_after_them)
{
    gpu_or_skip();
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), n_max = 4 * pg / sizeof(float);
    float       *h = aligned_alloc(pg, 4 * pg), *back = malloc(4 * pg);
    float       *d = gpu_malloc(4 * pg), *y = gpu_malloc(4 * pg);
    cr_assert(h && back && d && y, "%s", gpu_last_error());
    cr_assert_eq(gpu_host_register(h, 4 * pg, false), 0, "%s", gpu_last_error());
    static const size_t sizes[] = {1, 31, 32, 33, 255, 256, 257, 1024};
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
            const size_t n = sizes[i] + (size_t)round * (n_max - 1024) / 2; /* up to all of h */
            for (size_t j = 0; j < n; j++)
                h[j] = (float)(j % 977) * 0.5f + (float)round;
            cr_assert_eq(gpu_upload_queued(d, h, n * sizeof(float)), 0, "%s", gpu_last_error());
            /* a kernel queued after the copy reads what it wrote: y = d + d */
            cr_assert_eq(gpu_add(y, d, d, (int64_t)n), 0, "%s", gpu_last_error());
            cr_assert_eq(gpu_download(back, y, n * sizeof(float)), 0, "%s", gpu_last_error());
            for (size_t j = 0; j < n; j++)
                cr_assert_eq(back[j], 2.0f * h[j], "round %d, %zu floats: element %zu", round, n,
                             j);
        }
    cr_assert_eq(gpu_upload_queued(d, h, 0), 0, "an empty copy");
    cr_assert_eq(gpu_sync(), 0, "%s", gpu_last_error());
    gpu_host_unregister(h);
    if (!strcmp(gpu_backend_name(), "HOST")) {
        cr_assert_eq(gpu_upload_queued(d, h, 16), -1, "an unregistered source taken");
        cr_assert(strstr(gpu_last_error(), "not registered"), "%s", gpu_last_error());
        cr_assert_eq(gpu_host_register(h, pg, false), 0, "%s", gpu_last_error());
        cr_assert_eq(gpu_upload_queued(d, h + 1, pg), -1, "a source past its registration taken");
        gpu_host_unregister(h);
    }
    gpu_free(d);
    gpu_free(y);
    free(h);
    free(back);
}

/* ------------------------------------------------------------------------------------------ */
/* Device memory another process fills (common_devmem), as the fetcher's VRAM tier will        */
/* ------------------------------------------------------------------------------------------ */

#define SHARED_ROWS 33
#define SHARED_COLS 257

/* Matrix `seed` of the shared test, rows of SHARED_COLS floats. */
static void shared_matrix(float *w, uint32_t seed)
{
    for (int r = 0; r < SHARED_ROWS; r++)
        for (int c = 0; c < SHARED_COLS; c++)
            w[r * SHARED_COLS + c] = (float)((r * 7 + c * 3 + (int)seed) % 17) - 8.0f;
}

static bool shared_ack(int sock)
{
    char c = 'k';
    return write(sock, &c, 1) == 1;
}

static bool shared_wait_ack(int sock)
{
    char c = 0;
    return read(sock, &c, 1) == 1 && c == 'k';
}

/* The filling process (the fetcher's part): matrix 1 into a piece, its event; then, once the
 * executor's kernels over it are recorded, matrix 2 over it after them, and the event again. */
static int shared_filler(int sock)
{
    if (common_devmem_open(0, NULL) != COMMON_OK)
        return 10;
    size_t                      g = common_devmem_granularity();
    size_t                      bytes = (SHARED_ROWS * SHARED_COLS * sizeof(float) + g - 1) / g * g;
    struct common_devmem_piece *p = NULL;
    struct common_devmem_event *ef = NULL, *ex = NULL;
    uint8_t                    *at = common_devmem_reserve(bytes, NULL);
    static float                w1[SHARED_ROWS * SHARED_COLS], w2[SHARED_ROWS * SHARED_COLS];
    shared_matrix(w1, 1);
    shared_matrix(w2, 2);
    struct common_devmem_handle hp, he, hx;
    uint64_t                    tag;
    if (!at || common_devmem_piece_create(bytes, &p, NULL) != COMMON_OK ||
        common_devmem_piece_map(p, at, NULL) != COMMON_OK ||
        common_devmem_event_create(&ef, NULL) != COMMON_OK ||
        common_devmem_copy_async(at, w1, sizeof(w1), NULL) != COMMON_OK ||
        common_devmem_event_record(ef, NULL) != COMMON_OK ||
        common_devmem_piece_export(p, &hp, NULL) != COMMON_OK ||
        common_devmem_event_export(ef, &he, NULL) != COMMON_OK ||
        common_devmem_handle_send(sock, &hp, 1) != COMMON_OK ||
        common_devmem_handle_send(sock, &he, 2) != COMMON_OK)
        return 11;
    if (common_devmem_handle_recv(sock, &hx, &tag, 30000) != COMMON_OK || tag != 3 ||
        common_devmem_event_import(&hx, &ex, NULL) != COMMON_OK)
        return 12;
    if (!shared_wait_ack(sock)) /* the executor recorded its kernels over matrix 1 */
        return 13;
    if (common_devmem_event_wait(ex, NULL) != COMMON_OK ||
        common_devmem_copy_async(at, w2, sizeof(w2), NULL) != COMMON_OK ||
        common_devmem_event_record(ef, NULL) != COMMON_OK || !shared_ack(sock))
        return 14;
    if (!shared_wait_ack(sock))
        return 15;
    common_devmem_event_destroy(ex);
    common_devmem_event_destroy(ef);
    common_devmem_piece_destroy(p);
    return 0;
}

static void shared_check(const float *y, const float *x, uint32_t seed)
{
    static float w[SHARED_ROWS * SHARED_COLS];
    shared_matrix(w, seed);
    for (int r = 0; r < SHARED_ROWS; r++) {
        double want = 0, scale = 0;
        for (int c = 0; c < SHARED_COLS; c++) {
            want += (double)w[r * SHARED_COLS + c] * (double)x[c];
            scale += fabs((double)w[r * SHARED_COLS + c] * (double)x[c]);
        }
        check_close("shared matvec", (size_t)r, y[r], want, scale, OPS_RTOL);
    }
}

/* Description: a process that is not the executor fills device memory and records an event; the
 * executor maps that memory, its kernels wait for the event (gpu_stream_wait_shared) and read the
 * matrix, and it records its own event after them (gpu_event_record_kernels_shared), after which
 * the filler copies a second matrix over the first: the second product is that of matrix 2. The
 * filler is forked before the device is touched (CUDA does not survive fork). */
Test(executor_cuda_ops, kernels_read_memory_another_process_fills, .timeout = 120)
{
    int         sock = -1;
    const pid_t pid = (pid_t)fixture_fork_peer(shared_filler, &sock);
    cr_assert_geq(pid, 0, "socketpair or fork failed");
    char why[256] = "";
    if (gpu_device_count(why, sizeof(why)) <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cr_skip_test("no device (%s): skipped", why);
    }
    gpu_or_skip();
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_devmem_open(0, &e), COMMON_OK, "%s", e.text);
    size_t g = common_devmem_granularity();
    size_t bytes = (SHARED_ROWS * SHARED_COLS * sizeof(float) + g - 1) / g * g;

    struct common_devmem_handle h;
    uint64_t                    tag;
    struct common_devmem_piece *p;
    struct common_devmem_event *ef, *ex;
    cr_assert_eq(common_devmem_handle_recv(sock, &h, &tag, 30000), COMMON_OK);
    cr_assert_eq(tag, 1);
    cr_assert_eq(common_devmem_piece_import(&h, bytes, &p, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_handle_recv(sock, &h, &tag, 30000), COMMON_OK);
    cr_assert_eq(tag, 2);
    cr_assert_eq(common_devmem_event_import(&h, &ef, &e), COMMON_OK, "%s", e.text);
    float *w = common_devmem_reserve(bytes, &e);
    cr_assert_not_null(w, "%s", e.text);
    cr_assert_eq(common_devmem_piece_map(p, w, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_create(&ex, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_export(ex, &h, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_handle_send(sock, &h, 3), COMMON_OK);
    close(h.fd);

    float x[SHARED_COLS], y[SHARED_ROWS];
    fill_data(x, SHARED_COLS);
    float *dx = dev_from(x, sizeof(x)), *dy = dev_poisoned(sizeof(y));
    for (uint32_t round = 1; round <= 2; round++) {
        cr_assert_eq(gpu_stream_wait_shared(ef), 0, "%s", gpu_last_error());
        cr_assert_eq(gpu_matvec(COMMON_GGML_TYPE_F32, w, SHARED_COLS * sizeof(float), SHARED_ROWS,
                                SHARED_COLS, dx, SHARED_COLS, 1, dy, SHARED_ROWS),
                     0, "%s", gpu_last_error());
        cr_assert_eq(gpu_event_record_kernels_shared(ex), 0, "%s", gpu_last_error());
        dev_to(y, dy, sizeof(y));
        shared_check(y, x, round);
        cr_assert(shared_ack(sock));
        if (round == 1)
            cr_assert(shared_wait_ack(sock), "the filler's second matrix");
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the filler: status %d", st);
    gpu_free(dx);
    gpu_free(dy);
    common_devmem_event_destroy(ex);
    common_devmem_event_destroy(ef);
    common_devmem_piece_destroy(p);
    common_devmem_unreserve(w, bytes);
    close(sock);
}
