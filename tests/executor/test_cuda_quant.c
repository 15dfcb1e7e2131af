/* tests/executor/test_cuda_quant.c - the CUDA weight kernels (executor/cuda/quant.cu) against the
 * scalar reference: dequantization bit for bit, matvec and the f16 matmul in double precision, at
 * edge sizes; skipped, saying so, without a CUDA device. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#define CUDA_TEST_SEED 0x5DEECE66D1234567ull
#include "cuda_test.h"
#include "kernels/kernels.h"

/* Tolerances. A matvec in f32 against the double dot of the same dequantized weights and the same
 * activations: each output within QT_MV_RTOL of the sum of |w * x| of its terms, and
 * ||y - ref|| / ||ref|| below QT_MV_RTOL over a call's outputs when there are at least
 * QT_NORM_MIN of them (one dot may cancel to near zero, and then only the first bound means
 * anything). The f16 matmul: exact f16 products summed in f32, QT_GEMM_RTOL likewise. */
#define QT_MV_RTOL   1e-5
#define QT_GEMM_RTOL 1e-3
#define QT_NORM_MIN  32
#define QT_MAX_ROWS  257 /* the most rows of a tested matrix (quantized once, used in part) */

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* The weight types of quant.cu. */
static const uint32_t g_types[] = {
    COMMON_GGML_TYPE_F32,     COMMON_GGML_TYPE_F16,      COMMON_GGML_TYPE_BF16,
    COMMON_GGML_TYPE_Q4_0,    COMMON_GGML_TYPE_Q4_1,     COMMON_GGML_TYPE_Q5_0,
    COMMON_GGML_TYPE_Q5_1,    COMMON_GGML_TYPE_Q8_0,     COMMON_GGML_TYPE_Q2_K,
    COMMON_GGML_TYPE_Q3_K,    COMMON_GGML_TYPE_Q4_K,     COMMON_GGML_TYPE_Q5_K,
    COMMON_GGML_TYPE_Q6_K,    COMMON_GGML_TYPE_MXFP4,    COMMON_GGML_TYPE_TQ1_0,
    COMMON_GGML_TYPE_TQ2_0,   COMMON_GGML_TYPE_I2S_Q128, COMMON_GGML_TYPE_I2S_B32H,
    COMMON_GGML_TYPE_I2S_B32F};
#define N_TYPES (sizeof(g_types) / sizeof(g_types[0]))

static const char *type_name(uint32_t type)
{
    return common_ggml_type_get(type)->name;
}

static size_t row_size(uint32_t type, int64_t cols)
{
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    cr_assert_not_null(ti, "type %u unknown", type);
    return (size_t)(cols / ti->blck) * ti->type_size;
}

/* Column counts for a type: one block (32, 128 or 256), 256, 512 and 4096 + 256; float types add
 * ragged counts (a tail past the last 32, rows not 16-byte aligned). Returns the count. */
static int test_cols(uint32_t type, int64_t *out)
{
    const uint32_t blck = common_ggml_type_get(type)->blck;
    int            k = 0;
    if (blck != 256)
        out[k++] = blck > 32 ? blck : 32;
    out[k++] = 256;
    out[k++] = 512;
    out[k++] = 4096 + 256;
    if (blck == 1) {
        out[k++] = 33;
        out[k++] = 100;
    }
    return k;
}

/* A matrix of `rows` x `cols` random weights quantized to `type` row by row (*wq, row_bytes
 * apart) and dequantized again by the reference (*wd, rows x cols floats). */
static void make_weights(uint32_t type, int64_t rows, int64_t cols, uint8_t **wq, float **wd)
{
    const size_t rb = row_size(type, cols);
    float       *src = xmalloc((size_t)(rows * cols) * sizeof(float));
    *wq = xmalloc((size_t)rows * rb);
    *wd = xmalloc((size_t)(rows * cols) * sizeof(float));
    fill_data(src, (size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++) {
        cr_assert_eq(executor_quantize_row_ref(type, src + r * cols, *wq + (size_t)r * rb, cols), 0,
                     "quantizing %s", type_name(type));
        cr_assert_eq(executor_dequantize_row(type, *wq + (size_t)r * rb, *wd + r * cols, cols), 0,
                     "dequantizing %s", type_name(type));
    }
    free(src);
}

/* Three experts of `rows` x `cols` random weights of `type` in one device buffer, eb = rows * rb
 * + 64 bytes apart (0x7f bytes between them); each one's dequantized weights in wd[e]. */
struct qt_experts {
    size_t rb, eb;
    float *wd[3];
    void  *dw;
};

static void experts_make(uint32_t type, int64_t rows, int64_t cols, struct qt_experts *x)
{
    x->rb = row_size(type, cols);
    x->eb = (size_t)rows * x->rb + 64;
    uint8_t *all = xmalloc(3 * x->eb);
    memset(all, 0x7f, 3 * x->eb);
    for (int e = 0; e < 3; e++) {
        uint8_t *wq;
        make_weights(type, rows, cols, &wq, &x->wd[e]);
        memcpy(all + (size_t)e * x->eb, wq, (size_t)rows * x->rb);
        free(wq);
    }
    x->dw = dev_from(all, 3 * x->eb);
    free(all);
}

static void experts_free(struct qt_experts *x)
{
    for (int e = 0; e < 3; e++)
        free(x->wd[e]);
    gpu_free(x->dw);
}

/* Checks n x rows outputs (y_stride apart in y) against ref and mag (the sums of |w * x|, both
 * n x rows), that every output was written and that the padding up to y_stride was not. Returns
 * ||y - ref|| / ||ref||. */
static double check_outputs(const char *what, const float *y, int64_t y_stride, const double *ref,
                            const double *mag, int64_t n, int64_t rows, double rtol)
{
    double err2 = 0.0, ref2 = 0.0;
    for (int64_t t = 0; t < n; t++) {
        for (int64_t r = 0; r < rows; r++) {
            const float  got = y[t * y_stride + r];
            const double want = ref[t * rows + r], scale = mag[t * rows + r];
            cr_assert(isfinite(got), "%s: y[%lld][%lld] not written (or not finite)", what,
                      (long long)t, (long long)r);
            cr_assert(fabs((double)got - want) <= rtol * scale + 1e-30,
                      "%s: y[%lld][%lld] = %.9g, want %.9g (sum |w x| %.3g)", what, (long long)t,
                      (long long)r, (double)got, want, scale);
            err2 += ((double)got - want) * ((double)got - want);
            ref2 += want * want;
        }
        for (int64_t r = rows; r < y_stride; r++)
            cr_assert(is_poison(&y[t * y_stride + r]), "%s: padding y[%lld][%lld] written", what,
                      (long long)t, (long long)r);
    }
    const double rel = sqrt(err2 / (ref2 > 0 ? ref2 : 1.0));
    cr_assert(n * rows < QT_NORM_MIN || rel <= rtol, "%s: ||y - ref|| / ||ref|| = %.3g > %.1g",
              what, rel, rtol);
    return rel;
}

/* The double products (and sums of |w x|) of `rows` weight rows with one activation row. */
static void dot_reference(const float *w, int64_t rows, int64_t cols, const float *x, double *ref,
                          double *mag)
{
    for (int64_t r = 0; r < rows; r++) {
        double s = 0.0, m = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            const double p = (double)w[r * cols + c] * (double)x[c];
            s += p;
            m += fabs(p);
        }
        ref[r] = s;
        mag[r] = m;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Types and arguments                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* Description: the supported types are the seventeen of gpu.h; other types and bad sizes fail with
 * -1 and a recorded error, launching nothing. */
Test(executor_cuda_quant, rejects_unsupported_types_and_bad_sizes)
{
    gpu_or_skip();
    for (size_t i = 0; i < N_TYPES; i++)
        cr_assert(gpu_type_supported(g_types[i]), "%s", type_name(g_types[i]));
    const uint32_t others[] = {COMMON_GGML_TYPE_Q8_1, COMMON_GGML_TYPE_Q8_K, COMMON_GGML_TYPE_I2_S,
                               COMMON_GGML_TYPE_COUNT};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
        cr_assert(!gpu_type_supported(others[i]), "type %u", others[i]);

    float *d = dev_poisoned(1 << 16);
    cr_assert_eq(gpu_matvec(COMMON_GGML_TYPE_Q8_K, d, 292, 1, 256, d, 256, 1, d, 1), -1);
    cr_assert(strlen(gpu_last_error()) > 0);
    cr_assert_eq(gpu_matvec(COMMON_GGML_TYPE_Q4_0, d, 18, 1, 32, d, 32, 0, d, 1), -1, "n = 0");
    cr_assert_eq(gpu_matvec(COMMON_GGML_TYPE_Q4_0, d, 18, 1, 32, d, 32, GPU_MATVEC_MAX_N + 1, d, 1),
                 -1, "n too large");
    cr_assert_eq(gpu_matvec(COMMON_GGML_TYPE_Q4_0, d, 36, 1, 48, d, 48, 1, d, 1), -1,
                 "cols not a multiple of the block");
    cr_assert_eq(gpu_matvec(COMMON_GGML_TYPE_Q4_K, d, 143, 1, 256, d, 256, 1, d, 1), -1,
                 "row_bytes short of a row");
    cr_assert_eq(gpu_matvec(COMMON_GGML_TYPE_F32, d, 128, 4, 32, d, 16, 2, d, 4), -1,
                 "x_stride < cols");
    cr_assert_eq(gpu_matvec_ids(COMMON_GGML_TYPE_Q8_0, d, 34, 34, 2, 32, (const int32_t *)d, 1, d,
                                32, 1, d, 2),
                 -1, "expert_bytes short of the rows");
    cr_assert_eq(gpu_matvec_ids(COMMON_GGML_TYPE_Q8_0, d, 34, 34, 1, 32, (const int32_t *)d, 1, d,
                                32, 0, d, 1),
                 -1, "x_div = 0");
    cr_assert_eq(gpu_dequant_rows(COMMON_GGML_TYPE_Q8_K, d, 292, 256, NULL, 1, d, 256, false), -1);
    cr_assert_eq(gpu_dequant_rows(COMMON_GGML_TYPE_Q3_K, d, 109, 256, NULL, 1, d, 256, false), -1,
                 "Q3_K: row_bytes short of a row");
    cr_assert_eq(gpu_gemm_f16((const uint16_t *)d, 1, 48, (const uint16_t *)d, 1, d, 1), -1,
                 "cols not a multiple of 32");
    cr_assert_eq(gpu_gemm_f16((const uint16_t *)d + 1, 1, 32, (const uint16_t *)d, 1, d, 1), -1,
                 "w16 misaligned");
    /* Nothing to do is no error. */
    cr_assert_eq(gpu_matvec(COMMON_GGML_TYPE_Q4_0, d, 18, 0, 32, d, 32, 1, d, 1), 0);
    cr_assert_eq(gpu_gemm_f16((const uint16_t *)d, 0, 32, (const uint16_t *)d, 5, d, 1), 0);
    cr_assert_eq(gpu_sync(), 0, "%s", gpu_last_error());
    gpu_free(d);
}

/* ------------------------------------------------------------------------------------------ */
/* Dequantization                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Description: gpu_dequant_rows gives executor_dequantize_row's floats bit for bit (f16 out: their
 * executor_fp32_to_fp16), for all rows and for rows picked by ids, with aligned and unaligned
 * output strides; the padding between output rows stays untouched. */
Test(executor_cuda_quant, dequant_rows_match_reference_bits)
{
    gpu_or_skip();
    const int64_t rows = 33;
    const int32_t ids[] = {5, 0, 32, 5, 17, 31};
    const int64_t n_ids = (int64_t)(sizeof(ids) / sizeof(ids[0]));
    int32_t      *d_ids = dev_from(ids, sizeof(ids));
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        int64_t        cols_list[8];
        const int      n_cols = test_cols(type, cols_list);
        for (int ci = 0; ci < n_cols; ci++) {
            const int64_t cols = cols_list[ci];
            const size_t  rb = row_size(type, cols);
            uint8_t      *wq;
            float        *wd;
            make_weights(type, rows, cols, &wq, &wd);
            void *dw = dev_from(wq, (size_t)rows * rb);
            for (int v = 0; v < 8; v++) {
                const bool    use_ids = v & 1, f16 = v & 2;
                const int64_t n_out = use_ids ? n_ids : rows;
                const int64_t os = cols + ((v & 4) ? 3 : 8); /* unaligned, aligned */
                const size_t  esz = f16 ? 2 : 4;
                const size_t  bytes = (size_t)(n_out * os) * esz;
                void         *dout = dev_poisoned(bytes);
                uint8_t      *out = xmalloc(bytes);
                cr_assert_eq(gpu_dequant_rows(type, dw, rb, cols, use_ids ? d_ids : NULL, n_out,
                                              dout, os, f16),
                             0, "%s: %s", type_name(type), gpu_last_error());
                dev_to(out, dout, bytes);
                for (int64_t i = 0; i < n_out; i++) {
                    const float *want = wd + (use_ids ? ids[i] : i) * cols;
                    for (int64_t c = 0; c < os; c++) {
                        const uint8_t *got = out + (size_t)(i * os + c) * esz;
                        if (c >= cols) {
                            cr_assert(got[0] == CUDA_TEST_POISON &&
                                          got[esz - 1] == CUDA_TEST_POISON,
                                      "%s cols=%lld: padding of row %lld written", type_name(type),
                                      (long long)cols, (long long)i);
                            continue;
                        }
                        if (f16) {
                            uint16_t h;
                            memcpy(&h, got, 2);
                            cr_assert_eq(h, executor_fp32_to_fp16(want[c]),
                                         "%s cols=%lld ids=%d: row %lld col %lld: f16 %#x, want "
                                         "%#x (%.9g)",
                                         type_name(type), (long long)cols, (int)use_ids,
                                         (long long)i, (long long)c, h,
                                         executor_fp32_to_fp16(want[c]), (double)want[c]);
                        } else {
                            float f;
                            memcpy(&f, got, 4);
                            cr_assert(memcmp(&f, &want[c], 4) == 0,
                                      "%s cols=%lld ids=%d: row %lld col %lld: %.9g, want %.9g",
                                      type_name(type), (long long)cols, (int)use_ids, (long long)i,
                                      (long long)c, (double)f, (double)want[c]);
                        }
                    }
                }
                gpu_free(dout);
                free(out);
            }
            gpu_free(dw);
            free(wq);
            free(wd);
        }
    }
    gpu_free(d_ids);
}

/* ------------------------------------------------------------------------------------------ */
/* Matvec                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* How one gpu_matvec call of a case lays out its activations: n rows, the first at x + x_off
 * floats, x_stride apart (x_off 1 and odd strides take the unaligned loads). */
struct qt_layout {
    int64_t n, x_off, x_pad; /* x_stride = cols + x_pad */
};

/* Description: gpu_matvec against the double dot of the reference's dequantized weights, for
 * every type at 1..257 rows (warp and block edges), one block to 4352 columns, 1, 2, 3 and 8
 * activation rows, aligned and unaligned activations; every output written, no padding. */
Test(executor_cuda_quant, matvec_matches_reference, .timeout = 600)
{
    gpu_or_skip();
    static const int64_t          rows_list[] = {1, 31, 32, 33, 255, 256, 257};
    static const struct qt_layout layouts[] = {
        {1, 0, 0}, {1, 1, 0}, {2, 0, 3}, {3, 0, 4}, {8, 0, 0}};
    const int64_t nmax = GPU_MATVEC_MAX_N;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        int64_t        cols_list[8];
        const int      n_cols = test_cols(type, cols_list);
        double         worst = 0.0;
        for (int ci = 0; ci < n_cols; ci++) {
            const int64_t cols = cols_list[ci];
            const size_t  rb = row_size(type, cols);
            uint8_t      *wq;
            float        *wd;
            make_weights(type, QT_MAX_ROWS, cols, &wq, &wd);
            float *x = xmalloc((size_t)(nmax * cols) * sizeof(float));
            fill_data(x, (size_t)(nmax * cols));
            /* ref and mag of every (activation row, weight row) pair. */
            double *ref = xmalloc((size_t)(nmax * QT_MAX_ROWS) * sizeof(double));
            double *mag = xmalloc((size_t)(nmax * QT_MAX_ROWS) * sizeof(double));
            for (int64_t t = 0; t < nmax; t++)
                dot_reference(wd, QT_MAX_ROWS, cols, x + t * cols, ref + t * QT_MAX_ROWS,
                              mag + t * QT_MAX_ROWS);
            void *dw = dev_from(wq, (size_t)QT_MAX_ROWS * rb);
            for (size_t li = 0; li < sizeof(layouts) / sizeof(layouts[0]); li++) {
                const struct qt_layout *l = &layouts[li];
                const int64_t           xs = cols + l->x_pad;
                const size_t            nx = (size_t)(l->x_off + l->n * xs);
                float                  *xh = xmalloc(nx * sizeof(float));
                for (size_t i = 0; i < nx; i++)
                    xh[i] = NAN;
                for (int64_t t = 0; t < l->n; t++)
                    memcpy(xh + l->x_off + t * xs, x + t * cols, (size_t)cols * sizeof(float));
                float *dx = dev_from(xh, nx * sizeof(float));
                for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++) {
                    const int64_t rows = rows_list[ri], ys = rows + 5;
                    const size_t  ny = (size_t)(l->n * ys);
                    float        *dy = dev_poisoned(ny * sizeof(float));
                    float        *y = xmalloc(ny * sizeof(float));
                    cr_assert_eq(
                        gpu_matvec(type, dw, rb, rows, cols, dx + l->x_off, xs, l->n, dy, ys), 0,
                        "%s: %s", type_name(type), gpu_last_error());
                    dev_to(y, dy, ny * sizeof(float));
                    /* ref rows are QT_MAX_ROWS apart: compare through a packed copy. */
                    double *rp = xmalloc((size_t)(l->n * rows) * sizeof(double));
                    double *mp = xmalloc((size_t)(l->n * rows) * sizeof(double));
                    for (int64_t t = 0; t < l->n; t++)
                        for (int64_t r = 0; r < rows; r++) {
                            rp[t * rows + r] = ref[t * QT_MAX_ROWS + r];
                            mp[t * rows + r] = mag[t * QT_MAX_ROWS + r];
                        }
                    char what[160];
                    snprintf(what, sizeof(what), "matvec %s rows=%lld cols=%lld n=%lld x_off=%lld",
                             type_name(type), (long long)rows, (long long)cols, (long long)l->n,
                             (long long)l->x_off);
                    const double rel = check_outputs(what, y, ys, rp, mp, l->n, rows, QT_MV_RTOL);
                    if (l->n * rows >= QT_NORM_MIN && rel > worst)
                        worst = rel;
                    free(rp);
                    free(mp);
                    free(y);
                    gpu_free(dy);
                }
                gpu_free(dx);
                free(xh);
            }
            gpu_free(dw);
            free(wq);
            free(wd);
            free(x);
            free(ref);
            free(mag);
        }
        cr_log_info("matvec %s: worst ||y - ref|| / ||ref|| %.3g", type_name(type), worst);
    }
}

/* Description: gpu_matvec_ids over three experts (ids 2, 0, 2, 1 read from device memory, experts
 * padded apart), activation rows shared by x_div items (1 and 2), against the double reference;
 * every output written, no padding. */
Test(executor_cuda_quant, matvec_ids_matches_reference)
{
    gpu_or_skip();
    static const int64_t rows_list[] = {1, 33, 257};
    static const int32_t ids[] = {2, 0, 2, 1};
    const int64_t        n_items = (int64_t)(sizeof(ids) / sizeof(ids[0]));
    int32_t             *d_ids = dev_from(ids, sizeof(ids));
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        const int64_t  cols_list[] = {256, 1024 + 256};
        for (size_t ci = 0; ci < sizeof(cols_list) / sizeof(cols_list[0]); ci++) {
            for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++) {
                const int64_t     cols = cols_list[ci], rows = rows_list[ri];
                struct qt_experts ex;
                experts_make(type, rows, cols, &ex);
                const size_t  rb = ex.rb, eb = ex.eb;
                float *const *wd = ex.wd;
                void         *dw = ex.dw;
                const int64_t xs = cols + 4, ys = rows + 3;
                float        *x = xmalloc((size_t)(n_items * xs) * sizeof(float));
                fill_data(x, (size_t)(n_items * xs));
                float *dx = dev_from(x, (size_t)(n_items * xs) * sizeof(float));
                for (int64_t x_div = 1; x_div <= 2; x_div++) {
                    const size_t ny = (size_t)(n_items * ys);
                    float       *dy = dev_poisoned(ny * sizeof(float));
                    float       *y = xmalloc(ny * sizeof(float));
                    cr_assert_eq(gpu_matvec_ids(type, dw, eb, rb, rows, cols, d_ids, n_items, dx,
                                                xs, x_div, dy, ys),
                                 0, "%s: %s", type_name(type), gpu_last_error());
                    dev_to(y, dy, ny * sizeof(float));
                    double *ref = xmalloc((size_t)(n_items * rows) * sizeof(double));
                    double *mag = xmalloc((size_t)(n_items * rows) * sizeof(double));
                    for (int64_t i = 0; i < n_items; i++) {
                        const float *w = wd[ids[i]], *xr = x + (i / x_div) * xs;
                        for (int64_t r = 0; r < rows; r++) {
                            double s = 0.0, m = 0.0;
                            for (int64_t c = 0; c < cols; c++) {
                                const double p = (double)w[r * cols + c] * (double)xr[c];
                                s += p;
                                m += fabs(p);
                            }
                            ref[i * rows + r] = s;
                            mag[i * rows + r] = m;
                        }
                    }
                    char what[160];
                    snprintf(what, sizeof(what), "matvec_ids %s rows=%lld cols=%lld x_div=%lld",
                             type_name(type), (long long)rows, (long long)cols, (long long)x_div);
                    (void)check_outputs(what, y, ys, ref, mag, n_items, rows, QT_MV_RTOL);
                    free(ref);
                    free(mag);
                    free(y);
                    gpu_free(dy);
                }
                free(x);
                experts_free(&ex);
                gpu_free(dx);
            }
        }
    }
    gpu_free(d_ids);
}

/* ------------------------------------------------------------------------------------------ */
/* The int8 matvec over q8 images                                                              */
/* ------------------------------------------------------------------------------------------ */

/* n activation rows of x (cols each, contiguous) as the CPU rounds them for weights of `type`
 * (executor_quantize_act, expanded), into xr; and their q8 image made on the device into *dq8. */
static void q8_activations(uint32_t type, const float *x, int64_t n, int64_t cols, float *xr,
                           void **dq8)
{
    const uint32_t vdt = executor_vec_dot_type(type);
    uint8_t       *q = xmalloc(executor_act_row_size(type, cols));
    for (int64_t t = 0; t < n; t++) {
        cr_assert_eq(executor_quantize_act(type, x + t * cols, q, cols), 0);
        cr_assert_eq(executor_dequantize_row(vdt, q, xr + t * cols, cols), 0);
    }
    free(q);
    float *dx = dev_from(x, (size_t)(n * cols) * sizeof(float));
    *dq8 = dev_poisoned((size_t)n * gpu_q8_row_bytes(cols));
    cr_assert_eq(gpu_act_q8(vdt, dx, cols, n, cols, *dq8), 0, "gpu_act_q8: %s", gpu_last_error());
    gpu_free(dx);
}

/* The double dots (and sums of |w x|) of `rows` weight rows of wd with n activation rows. */
static void q8_reference(const float *wd, int64_t rows, const float *xr, int64_t n, int64_t cols,
                         double *ref, double *mag)
{
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double sum = 0.0, m = 0.0;
            for (int64_t c = 0; c < cols; c++) {
                const double p = (double)wd[r * cols + c] * (double)xr[t * cols + c];
                sum += p;
                m += fabs(p);
            }
            ref[t * rows + r] = sum;
            mag[t * rows + r] = m;
        }
}

/* Description: gpu_matvec_q8 against the double dot of the reference's dequantized weights with
 * the activations the CPU quantizes (gpu_act_q8 makes their image on the device), for every
 * quantized type at 1..257 rows, one block to 4352 columns, 1, 2, 3 and 8 activation rows;
 * every output written, no padding. The float types are refused. */
Test(executor_cuda_quant, matvec_q8_matches_reference, .timeout = 600)
{
    gpu_or_skip();
    static const int64_t rows_list[] = {1, 31, 32, 33, 255, 256, 257};
    static const int64_t n_list[] = {1, 2, 3, 8};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        if (!gpu_matvec_q8_supported(type)) {
            float y_host[1];
            cr_assert_eq(gpu_matvec_q8(type, g_types, 128, 1, 32, g_types, 1, y_host, 1), -1,
                         "%s: no int8 path, refused", type_name(type));
            continue;
        }
        int64_t   cols_list[8];
        const int n_cols = test_cols(type, cols_list);
        double    worst = 0.0;
        for (int ci = 0; ci < n_cols; ci++) {
            const int64_t cols = cols_list[ci], nmax = GPU_MATVEC_MAX_N;
            const size_t  rb = row_size(type, cols);
            uint8_t      *wq;
            float        *wd;
            make_weights(type, QT_MAX_ROWS, cols, &wq, &wd);
            float *x = xmalloc((size_t)(nmax * cols) * sizeof(float));
            float *xr = xmalloc((size_t)(nmax * cols) * sizeof(float));
            fill_data(x, (size_t)(nmax * cols));
            void *dq8;
            q8_activations(type, x, nmax, cols, xr, &dq8);
            void *dw = dev_from(wq, (size_t)QT_MAX_ROWS * rb);
            for (size_t ni = 0; ni < sizeof(n_list) / sizeof(n_list[0]); ni++)
                for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++) {
                    const int64_t n = n_list[ni], rows = rows_list[ri], ys = rows + 5;
                    const size_t  ny = (size_t)(n * ys);
                    float        *dy = dev_poisoned(ny * sizeof(float));
                    float        *y = xmalloc(ny * sizeof(float));
                    double       *ref = xmalloc((size_t)(n * rows) * sizeof(double));
                    double       *mag = xmalloc((size_t)(n * rows) * sizeof(double));
                    cr_assert_eq(gpu_matvec_q8(type, dw, rb, rows, cols, dq8, n, dy, ys), 0,
                                 "%s: %s", type_name(type), gpu_last_error());
                    dev_to(y, dy, ny * sizeof(float));
                    q8_reference(wd, rows, xr, n, cols, ref, mag);
                    char what[160];
                    snprintf(what, sizeof(what), "matvec_q8 %s rows=%lld cols=%lld n=%lld",
                             type_name(type), (long long)rows, (long long)cols, (long long)n);
                    const double rel = check_outputs(what, y, ys, ref, mag, n, rows, QT_MV_RTOL);
                    if (n * rows >= QT_NORM_MIN && rel > worst)
                        worst = rel;
                    free(ref);
                    free(mag);
                    free(y);
                    gpu_free(dy);
                }
            gpu_free(dw);
            gpu_free(dq8);
            free(wq);
            free(wd);
            free(x);
            free(xr);
        }
        cr_log_info("matvec_q8 %s: worst ||y - ref|| / ||ref|| %.3g", type_name(type), worst);
    }
}

/* Description: gpu_matvec_ids_q8 over three experts (ids 2, 0, 2, 1 in device memory, experts
 * padded apart), image rows shared by x_div items (1 and 2), against the double reference. */
Test(executor_cuda_quant, matvec_ids_q8_matches_reference)
{
    gpu_or_skip();
    static const int64_t rows_list[] = {1, 33, 257};
    static const int32_t ids[] = {2, 0, 2, 1};
    const int64_t        n_items = (int64_t)(sizeof(ids) / sizeof(ids[0]));
    int32_t             *d_ids = dev_from(ids, sizeof(ids));
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        if (!gpu_matvec_q8_supported(type))
            continue;
        const int64_t cols_list[] = {256, 1024 + 256};
        for (size_t ci = 0; ci < sizeof(cols_list) / sizeof(cols_list[0]); ci++)
            for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++) {
                const int64_t     cols = cols_list[ci], rows = rows_list[ri];
                struct qt_experts ex;
                experts_make(type, rows, cols, &ex);
                const size_t  rb = ex.rb, eb = ex.eb;
                float *const *wd = ex.wd;
                void         *dw = ex.dw;
                float        *x = xmalloc((size_t)(n_items * cols) * sizeof(float));
                float        *xr = xmalloc((size_t)(n_items * cols) * sizeof(float));
                fill_data(x, (size_t)(n_items * cols));
                void *dq8;
                q8_activations(type, x, n_items, cols, xr, &dq8);
                for (int64_t x_div = 1; x_div <= 2; x_div++) {
                    const int64_t ys = rows + 3;
                    const size_t  ny = (size_t)(n_items * ys);
                    float        *dy = dev_poisoned(ny * sizeof(float));
                    float        *y = xmalloc(ny * sizeof(float));
                    double       *ref = xmalloc((size_t)(n_items * rows) * sizeof(double));
                    double       *mag = xmalloc((size_t)(n_items * rows) * sizeof(double));
                    cr_assert_eq(gpu_matvec_ids_q8(type, dw, eb, rb, rows, cols, d_ids, n_items,
                                                   dq8, x_div, dy, ys),
                                 0, "%s: %s", type_name(type), gpu_last_error());
                    dev_to(y, dy, ny * sizeof(float));
                    for (int64_t i = 0; i < n_items; i++)
                        q8_reference(wd[ids[i]], rows, xr + (i / x_div) * cols, 1, cols,
                                     ref + i * rows, mag + i * rows);
                    char what[160];
                    snprintf(what, sizeof(what), "matvec_ids_q8 %s rows=%lld cols=%lld x_div=%lld",
                             type_name(type), (long long)rows, (long long)cols, (long long)x_div);
                    (void)check_outputs(what, y, ys, ref, mag, n_items, rows, QT_MV_RTOL);
                    free(ref);
                    free(mag);
                    free(y);
                    gpu_free(dy);
                }
                free(x);
                free(xr);
                experts_free(&ex);
                gpu_free(dq8);
            }
    }
    gpu_free(d_ids);
}

/* Description: the fused forms of the int8 matvec give bit for bit what they stand for:
 * GPU_MV_ADD y + (the plain products), GPU_MV_GLU gpu_swiglu of the gate and up products, and
 * gpu_matvec_ids_glu_q8 the same per item (x_div 2), for every quantized type at edge row
 * counts and 1, 2, 3 and 8 activation rows. */
Test(executor_cuda_quant, fused_matvec_q8_equals_its_parts, .timeout = 300)
{
    gpu_or_skip();
    static const int64_t rows_list[] = {1, 33, 257};
    static const int64_t n_list[] = {1, 2, 3, 8};
    static const int32_t ids[] = {2, 0, 2, 1};
    int32_t             *d_ids = dev_from(ids, sizeof(ids));
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        if (!gpu_matvec_q8_supported(type))
            continue;
        const int64_t cols = common_ggml_type_get(type)->blck >= 128 ? 512 : 96;
        for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++) {
            const int64_t     rows = rows_list[ri], ys = rows + 2, nmax = GPU_MATVEC_MAX_N;
            struct qt_experts ex; /* gate: expert 0 (or by id), up: expert 1 */
            experts_make(type, rows, cols, &ex);
            const uint8_t *wg = ex.dw, *wu = (const uint8_t *)ex.dw + ex.eb;
            float         *x = xmalloc((size_t)(nmax * cols) * sizeof(float));
            float         *xr = xmalloc((size_t)(nmax * cols) * sizeof(float));
            fill_data(x, (size_t)(nmax * cols));
            void *dq8;
            q8_activations(type, x, nmax, cols, xr, &dq8);
            const size_t ny = (size_t)(nmax * ys);
            float       *base = xmalloc(ny * sizeof(float));
            fill_data(base, ny);
            float *a = xmalloc(ny * sizeof(float)), *b = xmalloc(ny * sizeof(float));
            float *dg = dev_poisoned(ny * sizeof(float)), *du = dev_poisoned(ny * sizeof(float));
            float *dy = dev_poisoned(ny * sizeof(float));
            for (size_t ni = 0; ni < sizeof(n_list) / sizeof(n_list[0]); ni++) {
                const int64_t n = n_list[ni];
                /* ADD: base + products against the products, added here */
                cr_assert_eq(gpu_matvec_q8(type, wg, ex.rb, rows, cols, dq8, n, dg, ys), 0, "%s",
                             gpu_last_error());
                cr_assert_eq(gpu_upload(dy, base, ny * sizeof(float)), 0);
                cr_assert_eq(
                    gpu_matvec_q8_op(GPU_MV_ADD, type, wg, NULL, ex.rb, rows, cols, dq8, n, dy, ys),
                    0, "%s", gpu_last_error());
                dev_to(a, dg, ny * sizeof(float));
                dev_to(b, dy, ny * sizeof(float));
                for (int64_t t = 0; t < n; t++)
                    for (int64_t r = 0; r < rows; r++) {
                        const float want = base[t * ys + r] + a[t * ys + r];
                        cr_assert(memcmp(&want, &b[t * ys + r], sizeof(float)) == 0,
                                  "add %s rows %lld n %lld: y[%lld][%lld] %.9g, want %.9g",
                                  type_name(type), (long long)rows, (long long)n, (long long)t,
                                  (long long)r, (double)b[t * ys + r], (double)want);
                    }
                /* GLU: gate, up, gpu_swiglu against the fused form */
                cr_assert_eq(gpu_matvec_q8(type, wu, ex.rb, rows, cols, dq8, n, du, ys), 0);
                cr_assert_eq(gpu_swiglu(dg, du, (int64_t)ny, false), 0);
                cr_assert_eq(gpu_memset(dy, 0xff, ny * sizeof(float)), 0);
                cr_assert_eq(
                    gpu_matvec_q8_op(GPU_MV_GLU, type, wg, wu, ex.rb, rows, cols, dq8, n, dy, ys),
                    0, "%s", gpu_last_error());
                dev_to(a, dg, ny * sizeof(float));
                dev_to(b, dy, ny * sizeof(float));
                for (int64_t t = 0; t < n; t++)
                    for (int64_t r = 0; r < rows; r++)
                        cr_assert(isfinite(b[t * ys + r]) &&
                                      memcmp(&a[t * ys + r], &b[t * ys + r], sizeof(float)) == 0,
                                  "glu %s rows %lld n %lld: y[%lld][%lld] %.9g, want %.9g",
                                  type_name(type), (long long)rows, (long long)n, (long long)t,
                                  (long long)r, (double)b[t * ys + r], (double)a[t * ys + r]);
            }
            /* ids: items of experts 2, 0, 2, 1, gate from ex and up from a second set */
            const int64_t     n_items = 4;
            struct qt_experts ux;
            experts_make(type, rows, cols, &ux);
            cr_assert_eq(gpu_matvec_ids_q8(type, ex.dw, ex.eb, ex.rb, rows, cols, d_ids, n_items,
                                           dq8, 2, dg, ys),
                         0, "%s", gpu_last_error());
            cr_assert_eq(gpu_matvec_ids_q8(type, ux.dw, ux.eb, ux.rb, rows, cols, d_ids, n_items,
                                           dq8, 2, du, ys),
                         0, "%s", gpu_last_error());
            cr_assert_eq(gpu_swiglu(dg, du, n_items * ys, false), 0);
            cr_assert_eq(gpu_memset(dy, 0xff, ny * sizeof(float)), 0);
            cr_assert_eq(gpu_matvec_ids_glu_q8(type, ex.dw, ux.dw, ex.eb, ex.rb, rows, cols, d_ids,
                                               n_items, dq8, 2, dy, ys),
                         0, "%s", gpu_last_error());
            dev_to(a, dg, ny * sizeof(float));
            dev_to(b, dy, ny * sizeof(float));
            for (int64_t i = 0; i < n_items; i++)
                for (int64_t r = 0; r < rows; r++)
                    cr_assert(isfinite(b[i * ys + r]) &&
                                  memcmp(&a[i * ys + r], &b[i * ys + r], sizeof(float)) == 0,
                              "ids glu %s rows %lld: item %lld row %lld %.9g, want %.9g",
                              type_name(type), (long long)rows, (long long)i, (long long)r,
                              (double)b[i * ys + r], (double)a[i * ys + r]);
            experts_free(&ux);
            free(base);
            free(a);
            free(b);
            gpu_free(dg);
            gpu_free(du);
            gpu_free(dy);
            gpu_free(dq8);
            free(x);
            free(xr);
            experts_free(&ex);
        }
    }
    gpu_free(d_ids);
}

/* Description: gpu_matvec_q8_cat of two and three matrices of other row counts (257, 33, 1 and
 * 31) over one activation row gives each matrix's gpu_matvec_q8, bit for bit, and writes nothing
 * past each matrix's rows; bad arguments are refused. */
Test(executor_cuda_quant, matvec_q8_cat_equals_each_product, .timeout = 300)
{
    gpu_or_skip();
    static const int64_t sets[2][3] = {{257, 33, 1}, {31, 257, 0}};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        if (!gpu_matvec_q8_supported(type))
            continue;
        const int64_t     cols = common_ggml_type_get(type)->blck >= 128 ? 512 : 96, R = 257;
        struct qt_experts ex;
        experts_make(type, R, cols, &ex);
        float *x = xmalloc((size_t)cols * sizeof(float)), *xr = xmalloc((size_t)cols * 4);
        fill_data(x, (size_t)cols);
        void *dq8;
        q8_activations(type, x, 1, cols, xr, &dq8);
        const size_t ny = (size_t)R + 4;
        float       *a = xmalloc(ny * 4), *b = xmalloc(ny * 4);
        for (size_t si = 0; si < 2; si++) {
            const void *w[GPU_CAT_MAX];
            float      *y[GPU_CAT_MAX], *ys[GPU_CAT_MAX];
            int64_t     rows[GPU_CAT_MAX];
            int         n_mat = 0;
            for (int i = 0; i < GPU_CAT_MAX && sets[si][i]; i++, n_mat++) {
                w[i] = (const uint8_t *)ex.dw + (size_t)i * ex.eb;
                rows[i] = sets[si][i];
                y[i] = dev_poisoned(ny * 4);
                ys[i] = dev_poisoned(ny * 4);
                cr_assert_eq(gpu_matvec_q8(type, w[i], ex.rb, rows[i], cols, dq8, 1, ys[i], 0), 0,
                             "%s", gpu_last_error());
            }
            cr_assert_eq(gpu_matvec_q8_cat(type, n_mat, w, rows, ex.rb, cols, dq8, y), 0, "%s: %s",
                         type_name(type), gpu_last_error());
            for (int i = 0; i < n_mat; i++) {
                dev_to(a, ys[i], ny * 4);
                dev_to(b, y[i], ny * 4);
                for (int64_t r = 0; r < rows[i]; r++)
                    cr_assert(isfinite(b[r]) && memcmp(&a[r], &b[r], sizeof(float)) == 0,
                              "%s, matrix %d of %d (%lld rows): row %lld %.9g, want %.9g",
                              type_name(type), i, n_mat, (long long)rows[i], (long long)r,
                              (double)b[r], (double)a[r]);
                for (size_t r = (size_t)rows[i]; r < ny; r++)
                    cr_assert(is_poison(&b[r]), "%s: matrix %d written past its rows",
                              type_name(type), i);
                gpu_free(y[i]);
                gpu_free(ys[i]);
            }
        }
        const void *w1[1] = {ex.dw};
        int64_t     r0[1] = {0};
        float      *y1[1] = {(float *)dq8};
        cr_assert_eq(gpu_matvec_q8_cat(type, 1, w1, r0, ex.rb, cols, dq8, y1), -1, "0 rows");
        cr_assert_eq(gpu_matvec_q8_cat(type, GPU_CAT_MAX + 1, w1, r0, ex.rb, cols, dq8, y1), -1,
                     "too many matrices");
        free(a);
        free(b);
        free(x);
        free(xr);
        gpu_free(dq8);
        experts_free(&ex);
    }
}

/* Description: gpu_matvec_ids_combine_q8 adds to each token's row of x what gpu_matvec_ids_q8
 * of its k items and then gpu_moe_combine add, bit for bit: 1, 3 and 16 tokens (16: the most a
 * decode step takes, with k = 8 only), k of 1, 2, 5 and 8, experts picked at random (repeats
 * included), rows 1, 33 and 257; bad arguments refused. */
Test(executor_cuda_quant, matvec_ids_combine_q8_equals_down_then_combine, .timeout = 300)
{
    gpu_or_skip();
    static const int64_t rows_list[] = {1, 33, 257};
    static const int32_t k_list[] = {1, 2, 5, 8};
    static const int64_t t_list[] = {1, 3, 16};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        if (!gpu_matvec_q8_supported(type))
            continue;
        const int64_t cols = common_ggml_type_get(type)->blck >= 128 ? 512 : 96;
        for (size_t ri = 0; ri < 3; ri++)
            for (size_t ki = 0; ki < 4; ki++)
                for (size_t tj = 0; tj < 3; tj++) {
                    const int64_t rows = rows_list[ri], xs = rows + 3, T = t_list[tj];
                    const int32_t k = k_list[ki];
                    if (T == 16 && k != 8)
                        continue;
                    const int64_t     items = T * k;
                    struct qt_experts ex;
                    experts_make(type, rows, cols, &ex);
                    float *a = xmalloc((size_t)(items * cols) * sizeof(float));
                    float *ar = xmalloc((size_t)(items * cols) * sizeof(float));
                    fill_data(a, (size_t)(items * cols));
                    void *dq8;
                    q8_activations(type, a, items, cols, ar, &dq8);
                    int32_t *ids = xmalloc((size_t)items * sizeof(int32_t));
                    float   *sw = xmalloc((size_t)items * sizeof(float));
                    for (int64_t i = 0; i < items; i++) {
                        ids[i] = (int32_t)(rng_next() % 3);
                        sw[i] = rng_uniform();
                    }
                    float *x = xmalloc((size_t)(T * xs) * sizeof(float));
                    fill_data(x, (size_t)(T * xs));
                    int32_t *d_ids = dev_from(ids, (size_t)items * sizeof(int32_t));
                    float   *d_sw = dev_from(sw, (size_t)items * sizeof(float));
                    float   *dy = dev_poisoned((size_t)(items * rows) * sizeof(float));
                    float   *dx1 = dev_from(x, (size_t)(T * xs) * sizeof(float));
                    float   *dx2 = dev_from(x, (size_t)(T * xs) * sizeof(float));
                    cr_assert_eq(gpu_matvec_ids_q8(type, ex.dw, ex.eb, ex.rb, rows, cols, d_ids,
                                                   items, dq8, 1, dy, rows),
                                 0, "%s", gpu_last_error());
                    /* gpu_moe_combine's rows are n_embd wide, contiguous: one token at a time */
                    for (int64_t t = 0; t < T; t++)
                        cr_assert_eq(gpu_moe_combine(dx1 + t * xs, dy + t * k * rows, d_sw + t * k,
                                                     1, (uint32_t)k, (uint32_t)rows),
                                     0, "%s", gpu_last_error());
                    cr_assert_eq(gpu_matvec_ids_combine_q8(type, ex.dw, ex.eb, ex.rb, rows, cols,
                                                           d_ids, d_sw, T, k, dq8, dx2, xs),
                                 0, "%s: %s", type_name(type), gpu_last_error());
                    float *g1 = xmalloc((size_t)(T * xs) * 4), *g2 = xmalloc((size_t)(T * xs) * 4);
                    dev_to(g1, dx1, (size_t)(T * xs) * 4);
                    dev_to(g2, dx2, (size_t)(T * xs) * 4);
                    for (int64_t i = 0; i < T * xs; i++)
                        cr_assert(memcmp(&g1[i], &g2[i], sizeof(float)) == 0,
                                  "%s rows %lld k %d tokens %lld: x[%lld] %.9g, want %.9g",
                                  type_name(type), (long long)rows, k, (long long)T, (long long)i,
                                  (double)g2[i], (double)g1[i]);
                    cr_assert_eq(gpu_matvec_ids_combine_q8(type, ex.dw, ex.eb, ex.rb, rows, cols,
                                                           d_ids, d_sw, T, 0, dq8, dx2, xs),
                                 -1, "k 0");
                    void *ps[] = {d_ids, d_sw, dy, dx1, dx2, dq8};
                    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
                        gpu_free(ps[i]);
                    free(a);
                    free(ar);
                    free(ids);
                    free(sw);
                    free(x);
                    free(g1);
                    free(g2);
                    experts_free(&ex);
                }
    }
}

/* Description: gpu_matvec_groups_q8 over three experts (padded apart): groups of 1, 3, 8 and 5
 * activation rows in a scrambled order, each into its own rows of y, against the double
 * reference; every row a group names written, the others (and the padding) not. */
Test(executor_cuda_quant, matvec_groups_q8_matches_reference)
{
    gpu_or_skip();
    static const int64_t rows_list[] = {1, 33, 257};
    static const int32_t sizes[] = {1, 3, 8, 5}, experts[] = {2, 0, 2, 1};
    const int64_t        n_groups = 4, n_x = 17, n_y = 20;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        if (!gpu_matvec_q8_supported(type))
            continue;
        const int64_t cols_list[] = {256, 1024 + 256};
        for (size_t ci = 0; ci < sizeof(cols_list) / sizeof(cols_list[0]); ci++)
            for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++) {
                const int64_t     cols = cols_list[ci], rows = rows_list[ri], ys = rows + 3;
                struct qt_experts ex;
                experts_make(type, rows, cols, &ex);
                const size_t  rb = ex.rb, eb = ex.eb;
                float *const *wd = ex.wd;
                void         *dw = ex.dw;
                float        *x = xmalloc((size_t)(n_x * cols) * sizeof(float));
                float        *xr = xmalloc((size_t)(n_x * cols) * sizeof(float));
                fill_data(x, (size_t)(n_x * cols));
                void *dq8;
                q8_activations(type, x, n_x, cols, xr, &dq8);
                /* Group k's rows: x rows (5k + 3t) % n_x, y rows (7k + 2t + 1) % n_y; distinct
                 * y rows over all groups (17 of the 20), and the rest never named. */
                struct gpu_group g[4];
                bool             named[20] = {false};
                int32_t          next_y = 0;
                for (int64_t k = 0; k < n_groups; k++) {
                    g[k].expert = experts[k];
                    g[k].n = sizes[k];
                    for (int t = 0; t < GPU_GROUP_MAX; t++) {
                        g[k].x_row[t] = (int32_t)((5 * k + 3 * t) % n_x);
                        g[k].y_row[t] = t < sizes[k] ? (next_y * 7 + 3) % (int32_t)n_y : -1;
                        if (t < sizes[k])
                            named[g[k].y_row[t]] = true, next_y++;
                    }
                }
                struct gpu_group *dg = dev_from(g, sizeof(g));
                const size_t      ny = (size_t)(n_y * ys);
                float            *dy = dev_poisoned(ny * sizeof(float));
                float            *y = xmalloc(ny * sizeof(float));
                cr_assert_eq(
                    gpu_matvec_groups_q8(type, dw, eb, rb, rows, cols, dg, n_groups, dq8, dy, ys),
                    0, "%s: %s", type_name(type), gpu_last_error());
                dev_to(y, dy, ny * sizeof(float));
                double *ref = xmalloc((size_t)rows * sizeof(double));
                double *mag = xmalloc((size_t)rows * sizeof(double));
                for (int64_t k = 0; k < n_groups; k++)
                    for (int t = 0; t < g[k].n; t++) {
                        q8_reference(wd[g[k].expert], rows, xr + g[k].x_row[t] * cols, 1, cols, ref,
                                     mag);
                        char what[160];
                        snprintf(what, sizeof(what),
                                 "matvec_groups_q8 %s rows=%lld cols=%lld group %lld row %d",
                                 type_name(type), (long long)rows, (long long)cols, (long long)k,
                                 t);
                        (void)check_outputs(what, y + (int64_t)g[k].y_row[t] * ys, ys, ref, mag, 1,
                                            rows, QT_MV_RTOL);
                    }
                for (int64_t r = 0; r < n_y; r++)
                    for (int64_t i = 0; !named[r] && i < ys; i++)
                        cr_assert(is_poison(&y[r * ys + i]), "%s: row %lld, no group's, written",
                                  type_name(type), (long long)r);
                free(ref);
                free(mag);
                free(y);
                gpu_free(dy);
                gpu_free(dg);
                free(x);
                free(xr);
                experts_free(&ex);
                gpu_free(dq8);
            }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* f16 conversion and the tensor-core matmul                                                   */
/* ------------------------------------------------------------------------------------------ */

/* Description: gpu_f32_to_f16 rounds as executor_fp32_to_fp16, bit for bit, including overflow to
 * inf, subnormal halves and signed zeros, from strided rows into packed ones. */
Test(executor_cuda_quant, f32_to_f16_matches_reference_bits)
{
    gpu_or_skip();
    static const int64_t n_list[] = {1, 3, 17};
    static const int64_t cols_list[] = {1, 31, 32, 4096 + 3};
    static const float   special[] = {70000.0f, -65520.0f, 65519.0f,      1e-6f,        -3e-8f,
                                      0.0f,     -0.0f,     6.1035156e-5f, 2.9802322e-8f};
    for (size_t ni = 0; ni < sizeof(n_list) / sizeof(n_list[0]); ni++)
        for (size_t ci = 0; ci < sizeof(cols_list) / sizeof(cols_list[0]); ci++) {
            const int64_t n = n_list[ni], cols = cols_list[ci], xs = cols + 5;
            const size_t  nx = (size_t)(n * xs), no = (size_t)(n * cols);
            float        *x = xmalloc(nx * sizeof(float));
            uint16_t     *out = xmalloc(no * sizeof(uint16_t));
            fill_data(x, nx);
            for (size_t i = 0; i < sizeof(special) / sizeof(special[0]) && i < nx; i++)
                x[(i * 7919) % nx] = special[i];
            float    *dx = dev_from(x, nx * sizeof(float));
            uint16_t *dout = dev_poisoned(no * sizeof(uint16_t) + 64);
            cr_assert_eq(gpu_f32_to_f16(dx, xs, n, cols, dout), 0, "%s", gpu_last_error());
            dev_to(out, dout, no * sizeof(uint16_t));
            for (int64_t t = 0; t < n; t++)
                for (int64_t c = 0; c < cols; c++) {
                    const float    v = x[t * xs + c];
                    const uint16_t want = executor_fp32_to_fp16(v);
                    cr_assert_eq(out[t * cols + c], want,
                                 "n=%lld cols=%lld [%lld][%lld]: %.9g -> %#x, want %#x",
                                 (long long)n, (long long)cols, (long long)t, (long long)c,
                                 (double)v, out[t * cols + c], want);
                }
            uint16_t tail[32];
            cr_assert_eq(gpu_download(tail, dout + no, sizeof(tail)), 0, "%s", gpu_last_error());
            for (size_t i = 0; i < 32; i++)
                cr_assert_eq(tail[i], 0xffffu, "written past n * cols");
            gpu_free(dx);
            gpu_free(dout);
            free(x);
            free(out);
        }
}

/* gpu_gemm_f16 of random f16 inputs against their double product (see below). */
static void gemm_f16_case(int64_t rows, int64_t cols, int64_t n)
{
    const int64_t ys = rows + 3;
    const size_t  nw = (size_t)(rows * cols), nxx = (size_t)(n * cols);
    float        *wf = xmalloc(nw * sizeof(float)), *xf = xmalloc(nxx * sizeof(float));
    uint16_t     *w16 = xmalloc(nw * 2), *x16 = xmalloc(nxx * 2);
    fill_data(wf, nw);
    fill_data(xf, nxx);
    for (size_t i = 0; i < nw; i++) {
        w16[i] = executor_fp32_to_fp16(wf[i]);
        wf[i] = executor_fp16_to_fp32(w16[i]);
    }
    for (size_t i = 0; i < nxx; i++) {
        x16[i] = executor_fp32_to_fp16(xf[i]);
        xf[i] = executor_fp16_to_fp32(x16[i]);
    }
    double *ref = xmalloc((size_t)(n * rows) * sizeof(double));
    double *mag = xmalloc((size_t)(n * rows) * sizeof(double));
    for (int64_t t = 0; t < n; t++)
        dot_reference(wf, rows, cols, xf + t * cols, ref + t * rows, mag + t * rows);
    uint16_t    *dw = dev_from(w16, nw * 2), *dx = dev_from(x16, nxx * 2);
    const size_t ny = (size_t)(n * ys);
    float       *dy = dev_poisoned(ny * sizeof(float));
    float       *y = xmalloc(ny * sizeof(float));
    cr_assert_eq(gpu_gemm_f16(dw, rows, cols, dx, n, dy, ys), 0, "%s", gpu_last_error());
    dev_to(y, dy, ny * sizeof(float));
    char what[128];
    snprintf(what, sizeof(what), "gemm_f16 rows=%lld cols=%lld n=%lld", (long long)rows,
             (long long)cols, (long long)n);
    (void)check_outputs(what, y, ys, ref, mag, n, rows, QT_GEMM_RTOL);
    gpu_free(dw);
    gpu_free(dx);
    gpu_free(dy);
    free(wf);
    free(xf);
    free(w16);
    free(x16);
    free(ref);
    free(mag);
    free(y);
}

/* Description: gpu_gemm_f16 against the double product of the same f16 inputs, with partial tiles
 * in rows and tokens, one to sixteen steps of 32 columns, y_stride > rows; every output written,
 * no padding. Then products big enough for the tile of 128 tokens (at least 264 such blocks),
 * with partial tiles. */
Test(executor_cuda_quant, gemm_f16_matches_reference, .timeout = 300)
{
    gpu_or_skip();
    static const int64_t rows_list[] = {1, 33, 64, 257};
    static const int64_t n_list[] = {1, 17, 64, 130};
    static const int64_t cols_list[] = {32, 96, 512};
    for (size_t ci = 0; ci < sizeof(cols_list) / sizeof(cols_list[0]); ci++)
        for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++)
            for (size_t ni = 0; ni < sizeof(n_list) / sizeof(n_list[0]); ni++)
                gemm_f16_case(rows_list[ri], cols_list[ci], n_list[ni]);
    gemm_f16_case(16900, 64, 130);
    gemm_f16_case(33800 + 5, 96, 100);
    gemm_f16_case(4225, 32, 1000);
}

/* The f16 values of a type's dequantized weights (what gpu_gemm_q's tiles hold) and of the
 * activations, in place, with their f16 images of the activations in x16. */
static void round_f16(float *w, size_t nw, float *x, uint16_t *x16, size_t nx)
{
    for (size_t i = 0; i < nw; i++)
        w[i] = executor_fp16_to_fp32(executor_fp32_to_fp16(w[i]));
    for (size_t i = 0; i < nx; i++) {
        x16[i] = executor_fp32_to_fp16(x[i]);
        x[i] = executor_fp16_to_fp32(x16[i]);
    }
}

/* Description: gpu_gemm_q (the matmul that decodes quantized weights itself) for every quantized
 * type against the double product of the f16-rounded dequantized weights and f16 activations:
 * partial tiles in rows (1, 127, 128, 129, 257) and tokens (1, 17, 63, 64, 65, 130), one block to
 * several super-blocks of columns, y_stride > rows; every output written, no padding. */
Test(executor_cuda_quant, gemm_q_matches_reference, .timeout = 600)
{
    gpu_or_skip();
    static const int64_t rows_list[] = {1, 127, 128, 129, 257};
    static const int64_t n_list[] = {1, 17, 63, 64, 65, 130};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        if (!gpu_matvec_q8_supported(type))
            continue;
        const uint32_t blck = common_ggml_type_get(type)->blck;
        const int64_t  cols_list[] = {blck > 32 ? blck : 32, 1280};
        for (size_t ci = 0; ci < 2; ci++) {
            const int64_t cols = cols_list[ci];
            uint8_t      *wq;
            float        *wd;
            make_weights(type, QT_MAX_ROWS, cols, &wq, &wd);
            const size_t rb = row_size(type, cols);
            void        *dw = dev_from(wq, (size_t)QT_MAX_ROWS * rb);
            const size_t nxx = (size_t)(130 * cols);
            float       *xf = xmalloc(nxx * sizeof(float));
            uint16_t    *x16 = xmalloc(nxx * 2);
            fill_data(xf, nxx);
            round_f16(wd, (size_t)(QT_MAX_ROWS * cols), xf, x16, nxx);
            uint16_t *dx = dev_from(x16, nxx * 2);
            for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++)
                for (size_t ni = 0; ni < sizeof(n_list) / sizeof(n_list[0]); ni++) {
                    const int64_t rows = rows_list[ri], n = n_list[ni], ys = rows + 3;
                    double       *ref = xmalloc((size_t)(n * rows) * sizeof(double));
                    double       *mag = xmalloc((size_t)(n * rows) * sizeof(double));
                    for (int64_t t = 0; t < n; t++)
                        dot_reference(wd, rows, cols, xf + t * cols, ref + t * rows,
                                      mag + t * rows);
                    const size_t ny = (size_t)(n * ys);
                    float       *dy = dev_poisoned(ny * sizeof(float));
                    float       *y = xmalloc(ny * sizeof(float));
                    cr_assert_eq(
                        gpu_gemm_q(type, dw, 0, rb, rows, cols, dx, n, NULL, 0, NULL, 1, dy, ys), 0,
                        "%s: %s", type_name(type), gpu_last_error());
                    dev_to(y, dy, ny * sizeof(float));
                    char what[128];
                    snprintf(what, sizeof(what), "gemm_q %s rows=%lld cols=%lld n=%lld",
                             type_name(type), (long long)rows, (long long)cols, (long long)n);
                    (void)check_outputs(what, y, ys, ref, mag, n, rows, QT_GEMM_RTOL);
                    gpu_free(dy);
                    free(y);
                    free(ref);
                    free(mag);
                }
            gpu_free(dx);
            gpu_free(dw);
            free(xf);
            free(x16);
            free(wq);
            free(wd);
        }
    }
}

/* Description: gpu_gemm_q by tiles over three experts (padded apart), their number in device
 * memory (gpu_gemm_q_used: four of six launched, the last two garbage): tiles of 5, 32 (full), 1
 * and 20 items of experts 2, 0, 2, 1, each item's activation row item / 3, against the double
 * reference; every row an item names written, the others (and the padding) not. */
Test(executor_cuda_quant, gemm_q_tiles_match_reference, .timeout = 300)
{
    gpu_or_skip();
    static const int64_t            rows_list[] = {1, 129, 257};
    static const struct gpu_mm_tile tiles[] = {
        {2, 0, 5}, {0, 5, GPU_MM_TILE}, {2, 5 + GPU_MM_TILE, 1}, {1, 6 + GPU_MM_TILE, 20}};
    enum { N_ITEMS = 26 + GPU_MM_TILE, N_Y = N_ITEMS + 9, X_DIV = 3 };
    const int64_t n_x = N_Y / X_DIV + 1;
    int32_t       items[N_ITEMS];
    bool          named[N_Y] = {false};
    for (int32_t i = 0; i < N_ITEMS; i++) { /* distinct rows of y, scrambled */
        items[i] = (i * 37 + 5) % N_Y;
        cr_assert(!named[items[i]]);
        named[items[i]] = true;
    }
    int32_t *d_items = dev_from(items, sizeof(items));
    /* two tiles past the four that a sort made: they would write row 0 and read far away */
    struct gpu_mm_tile all[6];
    memcpy(all, tiles, sizeof(tiles));
    all[4] = (struct gpu_mm_tile){1, 0, GPU_MM_TILE};
    all[5] = (struct gpu_mm_tile){1 << 20, 1 << 20, GPU_MM_TILE};
    const int32_t       used = 4;
    struct gpu_mm_tile *d_tiles = dev_from(all, sizeof(all));
    int32_t            *d_used = dev_from(&used, sizeof(used));
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = g_types[ti];
        if (!gpu_matvec_q8_supported(type))
            continue;
        const int64_t cols = 512;
        for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++) {
            const int64_t     rows = rows_list[ri], ys = rows + 3;
            struct qt_experts ex;
            experts_make(type, rows, cols, &ex);
            const size_t nxx = (size_t)(n_x * cols);
            float       *xf = xmalloc(nxx * sizeof(float));
            uint16_t    *x16 = xmalloc(nxx * 2);
            fill_data(xf, nxx);
            for (int e = 0; e < 3; e++)
                round_f16(ex.wd[e], (size_t)(rows * cols), NULL, NULL, 0);
            round_f16(NULL, 0, xf, x16, nxx);
            uint16_t    *dx = dev_from(x16, nxx * 2);
            const size_t ny = (size_t)(N_Y * ys);
            float       *dy = dev_poisoned(ny * sizeof(float));
            float       *y = xmalloc(ny * sizeof(float));
            /* gpu_gemm_q_used: four tiles made of six launched (the last two are garbage) */
            cr_assert_eq(gpu_gemm_q_used(type, ex.dw, ex.eb, ex.rb, rows, cols, dx, d_tiles, 6,
                                         d_used, d_items, X_DIV, dy, ys),
                         0, "%s: %s", type_name(type), gpu_last_error());
            dev_to(y, dy, ny * sizeof(float));
            double *ref = xmalloc((size_t)rows * sizeof(double));
            double *mag = xmalloc((size_t)rows * sizeof(double));
            for (size_t k = 0; k < 4; k++)
                for (int32_t j = 0; j < tiles[k].count; j++) {
                    const int32_t it = items[tiles[k].first + j];
                    dot_reference(ex.wd[tiles[k].expert], rows, cols, xf + (it / X_DIV) * cols, ref,
                                  mag);
                    char what[160];
                    snprintf(what, sizeof(what), "gemm_q tiles %s rows=%lld tile %zu item %d",
                             type_name(type), (long long)rows, k, j);
                    (void)check_outputs(what, y + (int64_t)it * ys, ys, ref, mag, 1, rows,
                                        QT_GEMM_RTOL);
                }
            for (int64_t r = 0; r < N_Y; r++)
                for (int64_t i = 0; !named[r] && i < ys; i++)
                    cr_assert(is_poison(&y[r * ys + i]), "%s: row %lld, no item's, written",
                              type_name(type), (long long)r);
            free(ref);
            free(mag);
            free(y);
            gpu_free(dy);
            gpu_free(dx);
            free(xf);
            free(x16);
            experts_free(&ex);
        }
    }
    gpu_free(d_items);
    gpu_free(d_tiles);
    gpu_free(d_used);
}
