/* executor/kernels/quant_ref.c - the weight quantizers (ggml's quantize_row_*_ref), scalar. */
#include "kernels.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels_impl.h"

/* Everything here follows ggml-quants.c (quantize_row_*_ref) in operation order, so that the
 * bytes are identical to llama.cpp's. Keep expressions as they are: reordering float operations
 * changes the bytes. This file is compiled without FMA, and C11 mode keeps GCC from contracting
 * a*b+c. */

#define KREF_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define KREF_MAX(a, b)     ((a) > (b) ? (a) : (b))
#define KREF_GROUP_MAX_EPS 1e-15f

/* ------------------------------------------------------------------------------------------ */
/* Weight quantizers (ggml quantize_row_*_ref)                                                 */
/* ------------------------------------------------------------------------------------------ */

static void quantize_f16(const float *x, void *dst, int64_t n)
{
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++)
        y[i] = kimpl_fp32_to_fp16(x[i]);
}

static void quantize_bf16(const float *x, void *dst, int64_t n)
{
    uint16_t *y = dst;
    for (int64_t i = 0; i < n; i++)
        y[i] = kimpl_fp32_to_bf16(x[i]);
}

static void quantize_f32(const float *x, void *dst, int64_t n)
{
    memcpy(dst, x, (size_t)n * sizeof(float));
}

/* The nibble whose doubled e2m1 value times e is nearest x (first on ties), as ggml. */
static uint8_t mxfp4_best_index(float x, float e)
{
    int   best = 0;
    float best_err = fabsf((float)kimpl_mxfp4_values[0] * e - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)kimpl_mxfp4_values[i] * e - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return (uint8_t)best;
}

/* MXFP4 as ggml's quantize_row_mxfp4_ref: exponent floor(log2(amax)) - 2 (+127), nearest value. */
static void quantize_mxfp4(const float *x, void *dst, int64_t n)
{
    struct executor_block_mxfp4 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float amax = 0.0f;
        for (int j = 0; j < EXECUTOR_QK; j++)
            amax = amax < fabsf(x[j]) ? fabsf(x[j]) : amax;
        const uint8_t e = amax > 0.0f ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float   d = kimpl_e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < EXECUTOR_QK / 2; j++)
            y[i].qs[j] = (uint8_t)(mxfp4_best_index(x[j], d) |
                                   mxfp4_best_index(x[j + EXECUTOR_QK / 2], d) << 4);
    }
}

static void quantize_q4_0(const float *x, void *dst, int64_t n)
{
    struct executor_block_q4_0 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < EXECUTOR_QK; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kimpl_fp32_to_fp16(d);
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            const float   x0 = x[j] * id;
            const float   x1 = x[EXECUTOR_QK / 2 + j] * id;
            const uint8_t xi0 = (uint8_t)KREF_MIN(15, (int8_t)(x0 + 8.5f));
            const uint8_t xi1 = (uint8_t)KREF_MIN(15, (int8_t)(x1 + 8.5f));
            y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

static void quantize_q4_1(const float *x, void *dst, int64_t n)
{
    struct executor_block_q4_1 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < EXECUTOR_QK; j++) {
            if (x[j] < min)
                min = x[j];
            if (x[j] > max)
                max = x[j];
        }
        const float d = (max - min) / ((1 << 4) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kimpl_fp32_to_fp16(d);
        y[i].m = kimpl_fp32_to_fp16(min);
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            const float   x0 = (x[j] - min) * id;
            const float   x1 = (x[EXECUTOR_QK / 2 + j] - min) * id;
            const uint8_t xi0 = (uint8_t)KREF_MIN(15, (int8_t)(x0 + 0.5f));
            const uint8_t xi1 = (uint8_t)KREF_MIN(15, (int8_t)(x1 + 0.5f));
            y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

static void quantize_q5_0(const float *x, void *dst, int64_t n)
{
    struct executor_block_q5_0 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < EXECUTOR_QK; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kimpl_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            const float   x0 = x[j] * id;
            const float   x1 = x[EXECUTOR_QK / 2 + j] * id;
            const uint8_t xi0 = (uint8_t)KREF_MIN(31, (int8_t)(x0 + 16.5f));
            const uint8_t xi1 = (uint8_t)KREF_MIN(31, (int8_t)(x1 + 16.5f));
            y[i].qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
            qh |= ((xi1 & 0x10u) >> 4) << (j + EXECUTOR_QK / 2);
        }
        memcpy(y[i].qh, &qh, sizeof(qh));
    }
}

static void quantize_q5_1(const float *x, void *dst, int64_t n)
{
    struct executor_block_q5_1 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < EXECUTOR_QK; j++) {
            if (x[j] < min)
                min = x[j];
            if (x[j] > max)
                max = x[j];
        }
        const float d = (max - min) / ((1 << 5) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kimpl_fp32_to_fp16(d);
        y[i].m = kimpl_fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            const float   x0 = (x[j] - min) * id;
            const float   x1 = (x[EXECUTOR_QK / 2 + j] - min) * id;
            const uint8_t xi0 = (uint8_t)(x0 + 0.5f);
            const uint8_t xi1 = (uint8_t)(x1 + 0.5f);
            y[i].qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
            qh |= ((xi1 & 0x10u) >> 4) << (j + EXECUTOR_QK / 2);
        }
        memcpy(y[i].qh, &qh, sizeof(qh));
    }
}

static void quantize_q8_0(const float *x, void *dst, int64_t n)
{
    struct executor_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float amax = 0.0f;
        for (int j = 0; j < EXECUTOR_QK; j++)
            amax = KREF_MAX(amax, fabsf(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kimpl_fp32_to_fp16(d);
        for (int j = 0; j < EXECUTOR_QK; j++)
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void quantize_q8_1(const float *x, void *dst, int64_t n)
{
    struct executor_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float amax = 0.0f;
        for (int j = 0; j < EXECUTOR_QK; j++)
            amax = KREF_MAX(amax, fabsf(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = kimpl_fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            y[i].qs[EXECUTOR_QK / 2 + j] = (int8_t)roundf(x[EXECUTOR_QK / 2 + j] * id);
            sum += y[i].qs[j] + y[i].qs[EXECUTOR_QK / 2 + j];
        }
        y[i].s = kimpl_fp32_to_fp16((float)sum * d);
    }
}

/* The value of largest magnitude among x[0..n) (the first one on ties); *amax gets |value|. */
static float kref_signed_absmax(int n, const float *x, float *amax)
{
    float max = 0;
    *amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > *amax) {
            *amax = ax;
            max = x[i];
        }
    }
    return max;
}

static void quantize_q8_K(const float *x, void *dst, int64_t n)
{
    struct executor_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, x += EXECUTOR_QK_K) {
        float amax = 0;
        float max = kref_signed_absmax(EXECUTOR_QK_K, x, &amax);
        if (!amax) {
            /* ggml leaves bsums unwritten here; they are multiplied by d = 0 anyway. */
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < EXECUTOR_QK_K; j++) {
            const int v = kimpl_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)KREF_MIN(127, v);
        }
        for (int j = 0; j < EXECUTOR_QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

/* Search of a scale and a min for n values in [0, nmax] (ggml make_qkx2_quants). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              bool use_mad)
{
    float min = x[0];
    float max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++)
            L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = kimpl_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)KREF_MAX(0, KREF_MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = kimpl_nearest_int(iscale * (x[i] - min));
            l = KREF_MAX(0, KREF_MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; i++)
                    L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Symmetric scale search for n values in [-nmax, nmax-1], weights x^2 (ggml make_qx_quants with
 * rmse_type 1 and no quant weights). L gets values + nmax. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L)
{
    float amax = 0;
    float max = kref_signed_absmax(n, x, &amax);
    if (amax < KREF_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++)
            L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = kimpl_nearest_int(iscale * x[i]);
        l = KREF_MAX(-nmax, KREF_MIN(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = kimpl_nearest_int(iscale * x[i]);
            l = KREF_MAX(-nmax, KREF_MIN(nmax - 1, l));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = kimpl_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + KREF_MAX(-nmax, KREF_MIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K scale search with iterative refinement (ggml make_q3_quants, do_rmse = true). */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L)
{
    float amax = 0;
    float max = kref_signed_absmax(n, x, &amax);
    if (amax < KREF_GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++)
            L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = kimpl_nearest_int(iscale * x[i]);
        l = KREF_MAX(-nmax, KREF_MIN(nmax - 1, l));
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int   new_l = kimpl_nearest_int(x[i] * sl2 / slx);
                new_l = KREF_MAX(-nmax, KREF_MIN(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static void quantize_q2_K(const float *x, void *dst, int64_t n)
{
    struct executor_block_q2_K *y = dst;
    uint8_t                     L[EXECUTOR_QK_K], Laux[16];
    float                       weights[16], mins[EXECUTOR_QK_K / 16], scales[EXECUTOR_QK_K / 16];
    const float                 q4scale = 15.f;

    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, x += EXECUTOR_QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < EXECUTOR_QK_K / 16; j++) {
            for (int l = 0; l < 16; l++)
                weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale)
                max_scale = scales[j];
            if (mins[j] > max_min)
                max_min = mins[j];
        }
        if (max_scale > 0) {
            float iscale = q4scale / max_scale;
            for (int j = 0; j < EXECUTOR_QK_K / 16; j++)
                y[i].scales[j] = (uint8_t)kimpl_nearest_int(iscale * scales[j]);
            y[i].d = kimpl_fp32_to_fp16(max_scale / q4scale);
        } else {
            for (int j = 0; j < EXECUTOR_QK_K / 16; j++)
                y[i].scales[j] = 0;
            y[i].d = kimpl_fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            float iscale = q4scale / max_min;
            for (int j = 0; j < EXECUTOR_QK_K / 16; j++) {
                int l = kimpl_nearest_int(iscale * mins[j]);
                y[i].scales[j] |= (uint8_t)(l << 4);
            }
            y[i].dmin = kimpl_fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = kimpl_fp32_to_fp16(0.f);
        }
        for (int j = 0; j < EXECUTOR_QK_K / 16; j++) {
            const float d = kimpl_fp16_to_fp32(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d)
                continue;
            const float dm = kimpl_fp16_to_fp32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                int l = kimpl_nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)KREF_MAX(0, KREF_MIN(3, l));
            }
        }
        for (int j = 0; j < EXECUTOR_QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) |
                                               (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

static void quantize_q3_K(const float *x, void *dst, int64_t n)
{
    struct executor_block_q3_K *y = dst;
    int8_t                      L[EXECUTOR_QK_K];
    float                       scales[EXECUTOR_QK_K / 16];

    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, x += EXECUTOR_QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < EXECUTOR_QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, sizeof(y[i].scales));
        if (max_scale) {
            float iscale = -32.f / max_scale;
            for (int j = 0; j < EXECUTOR_QK_K / 16; j++) {
                int8_t l = (int8_t)kimpl_nearest_int(iscale * scales[j]);
                l = (int8_t)(KREF_MAX(-32, KREF_MIN(31, l)) + 32);
                if (j < 8)
                    y[i].scales[j] = (uint8_t)(l & 0xF);
                else
                    y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                l = (int8_t)(l >> 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
            }
            y[i].d = kimpl_fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = kimpl_fp32_to_fp16(0.f);
        }
        int8_t sc[16];
        kimpl_q3_K_scales(y[i].scales, sc);
        for (int j = 0; j < EXECUTOR_QK_K / 16; j++) {
            float d = kimpl_fp16_to_fp32(y[i].d) * (sc[j] - 32);
            if (!d)
                continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = kimpl_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(KREF_MAX(-4, KREF_MIN(3, l)) + 4);
            }
        }
        memset(y[i].hmask, 0, sizeof(y[i].hmask));
        int     m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < EXECUTOR_QK_K; j++) {
            if (L[j] > 3) {
                y[i].hmask[m] |= hm;
                L[j] = (int8_t)(L[j] - 4);
            }
            if (++m == EXECUTOR_QK_K / 8) {
                m = 0;
                hm = (uint8_t)(hm << 1);
            }
        }
        for (int j = 0; j < EXECUTOR_QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) |
                                               (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per-32 scales and mins packed in 12 bytes. */
static void quantize_k_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                              uint8_t packed[EXECUTOR_K_SCALE_BYTES], uint16_t *d_out,
                              uint16_t *dmin_out)
{
    uint8_t Laux[32];
    float   weights[32], mins[EXECUTOR_QK_K / 32], scales[EXECUTOR_QK_K / 32];
    float   max_scale = 0, max_min = 0;
    for (int j = 0; j < EXECUTOR_QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < EXECUTOR_QK_K / 32; j++) {
        uint8_t ls = (uint8_t)kimpl_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)kimpl_nearest_int(inv_min * mins[j]);
        ls = KREF_MIN(63, ls);
        lm = KREF_MIN(63, lm);
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
            packed[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = kimpl_fp32_to_fp16(max_scale / 63.f);
    *dmin_out = kimpl_fp32_to_fp16(max_min / 63.f);

    for (int j = 0; j < EXECUTOR_QK_K / 32; j++) {
        uint8_t sc, m;
        kimpl_scale_min_k4(j, packed, &sc, &m);
        const float d = kimpl_fp16_to_fp32(*d_out) * sc;
        if (!d)
            continue;
        const float dm = kimpl_fp16_to_fp32(*dmin_out) * m;
        for (int ii = 0; ii < 32; ii++) {
            int l = kimpl_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)KREF_MAX(0, KREF_MIN(nmax, l));
        }
    }
}

/* nstep: steps of the scale search of each 32 (ggml's 20); 0 = each 32's min and max alone. */
static void quantize_q4_K_steps(const float *x, void *dst, int64_t n, int nstep)
{
    struct executor_block_q4_K *y = dst;
    uint8_t                     L[EXECUTOR_QK_K];
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, x += EXECUTOR_QK_K) {
        quantize_k_scales(x, 15, -1.f, nstep, L, y[i].scales, &y[i].d, &y[i].dmin);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < EXECUTOR_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void quantize_q5_K_steps(const float *x, void *dst, int64_t n, int nstep)
{
    struct executor_block_q5_K *y = dst;
    uint8_t                     L[EXECUTOR_QK_K];
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, x += EXECUTOR_QK_K) {
        quantize_k_scales(x, 31, -0.5f, nstep, L, y[i].scales, &y[i].d, &y[i].dmin);
        uint8_t *qh = y[i].qh;
        uint8_t *ql = y[i].qs;
        memset(qh, 0, EXECUTOR_QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int c = 0; c < EXECUTOR_QK_K; c += 64, ql += 32) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[c + j];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                int l2 = L[c + j + 32];
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

static void quantize_q4_K(const float *x, void *dst, int64_t n)
{
    quantize_q4_K_steps(x, dst, n, 20);
}

static void quantize_q5_K(const float *x, void *dst, int64_t n)
{
    quantize_q5_K_steps(x, dst, n, 15);
}

static void quantize_q4_K_quick(const float *x, void *dst, int64_t n)
{
    quantize_q4_K_steps(x, dst, n, 0);
}

static void quantize_q5_K_quick(const float *x, void *dst, int64_t n)
{
    quantize_q5_K_steps(x, dst, n, 0);
}

static void quantize_q6_K(const float *x, void *dst, int64_t n)
{
    struct executor_block_q6_K *y = dst;
    int8_t                      L[EXECUTOR_QK_K];
    float                       scales[EXECUTOR_QK_K / 16];
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, x += EXECUTOR_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < EXECUTOR_QK_K / 16; ib++) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < KREF_GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = kimpl_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < EXECUTOR_QK_K / 16; ib++)
            y[i].scales[ib] = (int8_t)KREF_MIN(127, kimpl_nearest_int(iscale * scales[ib]));
        for (int j = 0; j < EXECUTOR_QK_K / 16; j++) {
            float d = kimpl_fp16_to_fp32(y[i].d) * y[i].scales[j];
            if (!d)
                continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = kimpl_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(KREF_MAX(-32, KREF_MIN(31, l)) + 32);
            }
        }
        uint8_t *ql = y[i].ql;
        uint8_t *qh = y[i].qh;
        for (int j = 0; j < EXECUTOR_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l + 0] & 0xF;
                const uint8_t q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF;
                const uint8_t q4 = L[j + l + 96] & 0xF;
                ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

/* A weight scaled by id as a trit: -1, 0, 1 -> 0, 1, 2, rounding half away from zero (lroundf). */
static inline uint8_t quant_trit(float x, float id)
{
    return (uint8_t)(lroundf(x * id) + 1);
}

/* n_trits (4 or 5) weights x[0], x[step], .. (the first most significant, missing low trits 0)
 * as a TQ1_0 byte: ceil(v * 256 / 243) of their base-3 value v. Arithmetic in uint8_t, as ggml's.
 */
static uint8_t quant_tq1_byte(const float *x, size_t step, float id, int n_trits)
{
    uint8_t v = 0;
    for (int k = 0; k < 5; k++)
        v = (uint8_t)(v * 3 + (k < n_trits ? quant_trit(x[(size_t)k * step], id) : 0));
    return (uint8_t)(((uint16_t)v * 256 + (243 - 1)) / 243);
}

/* The block's absmax, rounded to fp16 as the scale d; *id = 1/absmax (0 for an all-zero block). */
static uint16_t quant_ternary_scale(const float *x, float *id)
{
    float amax = 0.0f;
    for (int j = 0; j < EXECUTOR_QK_K; j++)
        amax = KREF_MAX(amax, fabsf(x[j]));
    *id = amax ? 1.0f / amax : 0.0f;
    return kimpl_fp32_to_fp16(amax);
}

/* TQ1_0 as ggml's quantize_row_tq1_0_ref (layout: struct executor_block_tq1_0). */
static void quantize_tq1_0(const float *x, void *dst, int64_t n)
{
    struct executor_block_tq1_0 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, x += EXECUTOR_QK_K) {
        float id;
        y[i].d = quant_ternary_scale(x, &id);
        for (int m = 0; m < 32; m++)
            y[i].qs[m] = quant_tq1_byte(x + m, 32, id, 5);
        for (int m = 0; m < 16; m++)
            y[i].qs[32 + m] = quant_tq1_byte(x + 160 + m, 16, id, 5);
        for (int j = 0; j < 4; j++)
            y[i].qh[j] = quant_tq1_byte(x + 240 + j, 4, id, 4);
    }
}

/* TQ2_0 as ggml's quantize_row_tq2_0_ref (layout: struct executor_block_tq2_0). */
static void quantize_tq2_0(const float *x, void *dst, int64_t n)
{
    struct executor_block_tq2_0 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, x += EXECUTOR_QK_K) {
        float id;
        y[i].d = quant_ternary_scale(x, &id);
        for (int h = 0; h < 2; h++)
            for (int m = 0; m < 32; m++) {
                uint8_t q = 0;
                for (int k = 0; k < 4; k++)
                    q = (uint8_t)(q + ((quant_trit(x[128 * h + 32 * k + m], id) & 3) << (2 * k)));
                y[i].qs[32 * h + m] = q;
            }
    }
}

/* I2_S codes (no ggml counterpart; the kernel-only layouts of kernels_impl.h). A value v already
 * divided by the block scale becomes clamp(lroundf(v), -1, 1) + 1: code 2 from +0.5 up, 0 from
 * -0.5 down, else 1 (NaN too, where lroundf has no defined result). */
static inline uint8_t quant_i2s_code(float v)
{
    return v >= 0.5f ? 2 : v <= -0.5f ? 0 : 1;
}

/* Q128's input is the ternary values themselves: +-0.5 stay 0. */
static inline uint8_t quant_i2s_q128_code(float v)
{
    return v > 0.5f ? 2 : v < -0.5f ? 0 : 1;
}

/* I2S_Q128 from values that are already ternary (-1, 0, +1 round-trip exactly; no scale is
 * stored): element j of a block goes to byte j % 32 at shift 6 - 2 * (j / 32). */
static void quantize_i2s_q128(const float *x, void *dst, int64_t n)
{
    struct executor_block_i2s_q128 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_I2S_QK128; i++, x += EXECUTOR_I2S_QK128)
        for (int m = 0; m < 32; m++) {
            uint8_t q = 0;
            for (int g = 0; g < 4; g++)
                q = (uint8_t)(q | quant_i2s_q128_code(x[32 * g + m]) << (6 - 2 * g));
            y[i].qs[m] = q;
        }
}

/* The 32 codes of a block-32 I2_S layout, x scaled by id; element j to byte j / 4, shift
 * 2 * (j % 4). */
static void quant_i2s_b32_codes(const float *x, float id, uint8_t qs[EXECUTOR_QK / 4])
{
    for (int k = 0; k < EXECUTOR_QK / 4; k++) {
        uint8_t q = 0;
        for (int l = 0; l < 4; l++)
            q = (uint8_t)(q | quant_i2s_code(x[4 * k + l] * id) << (2 * l));
        qs[k] = q;
    }
}

static float quant_i2s_absmax(const float *x)
{
    float amax = 0.0f;
    for (int j = 0; j < EXECUTOR_QK; j++)
        amax = KREF_MAX(amax, fabsf(x[j]));
    return amax;
}

/* I2S_B32H: d = the block's absmax as f16; codes of x / d (1 / d of the stored half), so t * s
 * with t ternary and s a half round-trips exactly. */
static void quantize_i2s_b32h(const float *x, void *dst, int64_t n)
{
    struct executor_block_i2s_b32h *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        y[i].d = kimpl_fp32_to_fp16(quant_i2s_absmax(x));
        const float d = kimpl_fp16_to_fp32(y[i].d);
        quant_i2s_b32_codes(x, d != 0.0f ? 1.0f / d : 0.0f, y[i].qs);
    }
}

/* I2S_B32F: the same with the absmax itself as an f32 scale. */
static void quantize_i2s_b32f(const float *x, void *dst, int64_t n)
{
    struct executor_block_i2s_b32f *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        const float d = quant_i2s_absmax(x);
        memcpy(y[i].d, &d, sizeof(d));
        quant_i2s_b32_codes(x, d != 0.0f ? 1.0f / d : 0.0f, y[i].qs);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* By type, and the public entry point                                                         */
/* ------------------------------------------------------------------------------------------ */

/* Weight quantizer by type; NULL when there is none. */
executor_quantize_fn executor_ref_quantizer(uint32_t type)
{
    switch (type) {
    case COMMON_GGML_TYPE_F32:
        return quantize_f32;
    case COMMON_GGML_TYPE_F16:
        return quantize_f16;
    case COMMON_GGML_TYPE_BF16:
        return quantize_bf16;
    case COMMON_GGML_TYPE_Q4_0:
        return quantize_q4_0;
    case COMMON_GGML_TYPE_Q4_1:
        return quantize_q4_1;
    case COMMON_GGML_TYPE_Q5_0:
        return quantize_q5_0;
    case COMMON_GGML_TYPE_Q5_1:
        return quantize_q5_1;
    case COMMON_GGML_TYPE_Q8_0:
        return quantize_q8_0;
    case COMMON_GGML_TYPE_Q8_1:
        return quantize_q8_1;
    case COMMON_GGML_TYPE_Q2_K:
        return quantize_q2_K;
    case COMMON_GGML_TYPE_Q3_K:
        return quantize_q3_K;
    case COMMON_GGML_TYPE_Q4_K:
        return quantize_q4_K;
    case COMMON_GGML_TYPE_Q5_K:
        return quantize_q5_K;
    case COMMON_GGML_TYPE_Q6_K:
        return quantize_q6_K;
    case COMMON_GGML_TYPE_Q8_K:
        return quantize_q8_K;
    case COMMON_GGML_TYPE_MXFP4:
        return quantize_mxfp4;
    case COMMON_GGML_TYPE_TQ1_0:
        return quantize_tq1_0;
    case COMMON_GGML_TYPE_TQ2_0:
        return quantize_tq2_0;
    case COMMON_GGML_TYPE_I2S_Q128:
        return quantize_i2s_q128;
    case COMMON_GGML_TYPE_I2S_B32H:
        return quantize_i2s_b32h;
    case COMMON_GGML_TYPE_I2S_B32F:
        return quantize_i2s_b32f;
    default:
        return NULL;
    }
}

int executor_quantize_row_quick(uint32_t type, const float *src, void *dst, int64_t n)
{
    if (type != COMMON_GGML_TYPE_Q4_K && type != COMMON_GGML_TYPE_Q5_K)
        return executor_quantize_row_ref(type, src, dst, n);
    if (executor_kernels_check(type, n) < 0 || (n > 0 && (!src || !dst)))
        return COMMON_EINVAL;
    if (n > 0)
        (type == COMMON_GGML_TYPE_Q4_K ? quantize_q4_K_quick : quantize_q5_K_quick)(src, dst, n);
    return 0;
}

int executor_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n)
{
    executor_quantize_fn fn = executor_ref_quantizer(type);
    if (!fn || executor_kernels_check(type, n) < 0 || (n > 0 && (!src || !dst)))
        return COMMON_EINVAL;
    if (n > 0)
        fn(src, dst, n);
    return 0;
}
