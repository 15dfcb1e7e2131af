/* executor/kernels/ref.c - portable scalar reference: dequantize, activation conversion, dot. */
#include "kernels.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels_impl.h"

/* Everything here follows ggml-quants.c (weights) and ggml-cpu's x86 quants.c (activations) in
 * operation order, so that results are bit-identical where llama.cpp's are deterministic. Keep
 * expressions as they are: reordering float operations changes the bytes. This file is compiled
 * without FMA, and C11 mode keeps GCC from contracting a*b+c. */

#define KREF_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KREF_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ------------------------------------------------------------------------------------------ */
/* Conversions and layouts                                                                     */
/* ------------------------------------------------------------------------------------------ */

float executor_fp16_to_fp32(uint16_t h)
{
    return kimpl_fp16_to_fp32(h);
}

uint16_t executor_fp32_to_fp16(float f)
{
    return kimpl_fp32_to_fp16(f);
}

float executor_bf16_to_fp32(uint16_t h)
{
    return kimpl_bf16_to_fp32(h);
}

uint16_t executor_fp32_to_bf16(float f)
{
    return kimpl_fp32_to_bf16(f);
}

struct executor_type_layout executor_type_layout(uint32_t type)
{
    switch (type) {
    case COMMON_GGML_TYPE_F32:
        return (struct executor_type_layout){1, 4};
    case COMMON_GGML_TYPE_F16:
    case COMMON_GGML_TYPE_BF16:
        return (struct executor_type_layout){1, 2};
    case COMMON_GGML_TYPE_Q4_0:
        return (struct executor_type_layout){EXECUTOR_QK, sizeof(struct executor_block_q4_0)};
    case COMMON_GGML_TYPE_Q4_1:
        return (struct executor_type_layout){EXECUTOR_QK, sizeof(struct executor_block_q4_1)};
    case COMMON_GGML_TYPE_Q5_0:
        return (struct executor_type_layout){EXECUTOR_QK, sizeof(struct executor_block_q5_0)};
    case COMMON_GGML_TYPE_Q5_1:
        return (struct executor_type_layout){EXECUTOR_QK, sizeof(struct executor_block_q5_1)};
    case COMMON_GGML_TYPE_Q8_0:
        return (struct executor_type_layout){EXECUTOR_QK, sizeof(struct executor_block_q8_0)};
    case COMMON_GGML_TYPE_MXFP4:
        return (struct executor_type_layout){EXECUTOR_QK, sizeof(struct executor_block_mxfp4)};
    case COMMON_GGML_TYPE_Q8_1:
        return (struct executor_type_layout){EXECUTOR_QK, sizeof(struct executor_block_q8_1)};
    case COMMON_GGML_TYPE_Q2_K:
        return (struct executor_type_layout){EXECUTOR_QK_K, sizeof(struct executor_block_q2_K)};
    case COMMON_GGML_TYPE_Q3_K:
        return (struct executor_type_layout){EXECUTOR_QK_K, sizeof(struct executor_block_q3_K)};
    case COMMON_GGML_TYPE_Q4_K:
        return (struct executor_type_layout){EXECUTOR_QK_K, sizeof(struct executor_block_q4_K)};
    case COMMON_GGML_TYPE_Q5_K:
        return (struct executor_type_layout){EXECUTOR_QK_K, sizeof(struct executor_block_q5_K)};
    case COMMON_GGML_TYPE_Q6_K:
        return (struct executor_type_layout){EXECUTOR_QK_K, sizeof(struct executor_block_q6_K)};
    case COMMON_GGML_TYPE_Q8_K:
        return (struct executor_type_layout){EXECUTOR_QK_K, sizeof(struct executor_block_q8_K)};
    case COMMON_GGML_TYPE_TQ1_0:
        return (struct executor_type_layout){EXECUTOR_QK_K, sizeof(struct executor_block_tq1_0)};
    case COMMON_GGML_TYPE_TQ2_0:
        return (struct executor_type_layout){EXECUTOR_QK_K, sizeof(struct executor_block_tq2_0)};
    case COMMON_GGML_TYPE_I2S_Q128:
        return (struct executor_type_layout){EXECUTOR_I2S_QK128,
                                             sizeof(struct executor_block_i2s_q128)};
    case COMMON_GGML_TYPE_I2S_B32H:
        return (struct executor_type_layout){EXECUTOR_QK, sizeof(struct executor_block_i2s_b32h)};
    case COMMON_GGML_TYPE_I2S_B32F:
        return (struct executor_type_layout){EXECUTOR_QK, sizeof(struct executor_block_i2s_b32f)};
    default:
        return (struct executor_type_layout){0, 0};
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Dequantizers                                                                                */
/* ------------------------------------------------------------------------------------------ */

static void dequant_f32(const void *src, float *y, int64_t n)
{
    memcpy(y, src, (size_t)n * sizeof(float));
}

static void dequant_f16(const void *src, float *y, int64_t n)
{
    const uint16_t *x = src;
    for (int64_t i = 0; i < n; i++)
        y[i] = kimpl_fp16_to_fp32(x[i]);
}

static void dequant_bf16(const void *src, float *y, int64_t n)
{
    const uint16_t *x = src;
    for (int64_t i = 0; i < n; i++)
        y[i] = kimpl_bf16_to_fp32(x[i]);
}

static void dequant_q4_0(const void *src, float *y, int64_t n)
{
    const struct executor_block_q4_0 *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, y += EXECUTOR_QK) {
        const float d = kimpl_fp16_to_fp32(x[i].d);
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            y[j] = ((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + EXECUTOR_QK / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const void *src, float *y, int64_t n)
{
    const struct executor_block_q4_1 *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, y += EXECUTOR_QK) {
        const float d = kimpl_fp16_to_fp32(x[i].d);
        const float m = kimpl_fp16_to_fp32(x[i].m);
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            y[j] = (x[i].qs[j] & 0x0F) * d + m;
            y[j + EXECUTOR_QK / 2] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

static void dequant_q5_0(const void *src, float *y, int64_t n)
{
    const struct executor_block_q5_0 *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, y += EXECUTOR_QK) {
        const float d = kimpl_fp16_to_fp32(x[i].d);
        uint32_t    qh;
        memcpy(&qh, x[i].qh, sizeof(qh));
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            const int xh0 = (int)(((qh >> (j + 0)) << 4) & 0x10);
            const int xh1 = (int)((qh >> (j + 12)) & 0x10);
            y[j] = (((x[i].qs[j] & 0x0F) | xh0) - 16) * d;
            y[j + EXECUTOR_QK / 2] = (((x[i].qs[j] >> 4) | xh1) - 16) * d;
        }
    }
}

static void dequant_q5_1(const void *src, float *y, int64_t n)
{
    const struct executor_block_q5_1 *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, y += EXECUTOR_QK) {
        const float d = kimpl_fp16_to_fp32(x[i].d);
        const float m = kimpl_fp16_to_fp32(x[i].m);
        uint32_t    qh;
        memcpy(&qh, x[i].qh, sizeof(qh));
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            const int xh0 = (int)(((qh >> (j + 0)) << 4) & 0x10);
            const int xh1 = (int)((qh >> (j + 12)) & 0x10);
            y[j] = ((x[i].qs[j] & 0x0F) | xh0) * d + m;
            y[j + EXECUTOR_QK / 2] = ((x[i].qs[j] >> 4) | xh1) * d + m;
        }
    }
}

static void dequant_q8_0(const void *src, float *y, int64_t n)
{
    const struct executor_block_q8_0 *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, y += EXECUTOR_QK) {
        const float d = kimpl_fp16_to_fp32(x[i].d);
        for (int j = 0; j < EXECUTOR_QK; j++)
            y[j] = x[i].qs[j] * d;
    }
}

static void dequant_q8_1(const void *src, float *y, int64_t n)
{
    const struct executor_block_q8_1 *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, y += EXECUTOR_QK) {
        const float d = kimpl_fp16_to_fp32(x[i].d);
        for (int j = 0; j < EXECUTOR_QK; j++)
            y[j] = x[i].qs[j] * d;
    }
}

static void dequant_q2_K(const void *src, float *y, int64_t n)
{
    const struct executor_block_q2_K *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const float    d = kimpl_fp16_to_fp32(x[i].d);
        const float    min = kimpl_fp16_to_fp32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int            is = 0;
        for (int c = 0; c < EXECUTOR_QK_K; c += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    uint8_t     sc = x[i].scales[is++];
                    const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
                }
            }
        }
    }
}

static void dequant_q3_K(const void *src, float *y, int64_t n)
{
    const struct executor_block_q3_K *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const float    d_all = kimpl_fp16_to_fp32(x[i].d);
        const uint8_t *q = x[i].qs;
        const uint8_t *hm = x[i].hmask;
        int8_t         sc[16];
        kimpl_q3_K_scales(x[i].scales, sc);
        uint8_t m = 1;
        int     is = 0;
        for (int c = 0; c < EXECUTOR_QK_K; c += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d_all * (sc[is++] - 32);
                    for (int l = 0; l < 16; l++) {
                        int k = l + 16 * half;
                        *y++ = dl * (((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
                    }
                }
            }
        }
    }
}

static void dequant_q4_K(const void *src, float *y, int64_t n)
{
    const struct executor_block_q4_K *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float    d = kimpl_fp16_to_fp32(x[i].d);
        const float    min = kimpl_fp16_to_fp32(x[i].dmin);
        for (int is = 0; is < 8; is += 2, q += 32) {
            uint8_t sc, m;
            kimpl_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            kimpl_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void dequant_q5_K(const void *src, float *y, int64_t n)
{
    const struct executor_block_q5_K *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const uint8_t *ql = x[i].qs;
        const uint8_t *qh = x[i].qh;
        const float    d = kimpl_fp16_to_fp32(x[i].d);
        const float    min = kimpl_fp16_to_fp32(x[i].dmin);
        uint8_t        u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, ql += 32) {
            uint8_t sc, m;
            kimpl_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            kimpl_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
    }
}

static void dequant_q6_K(const void *src, float *y, int64_t n)
{
    const struct executor_block_q6_K *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const float    d = kimpl_fp16_to_fp32(x[i].d);
        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t  *sc = x[i].scales;
        for (int c = 0; c < EXECUTOR_QK_K; c += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int       is = l / 16;
                const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

static void dequant_q8_K(const void *src, float *y, int64_t n)
{
    const struct executor_block_q8_K *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, y += EXECUTOR_QK_K)
        for (int j = 0; j < EXECUTOR_QK_K; j++)
            y[j] = x[i].d * x[i].qs[j];
}

/* ------------------------------------------------------------------------------------------ */
/* Activation conversion, as llama.cpp's CPU backend does it on x86 (AVX2 builds)              */
/* ------------------------------------------------------------------------------------------ */

/* Q8_0 / Q8_1 activations differ from the weight quantizers above: ggml-cpu's x86
 * quantize_row_q8_0/q8_1 multiply by 127/amax (not 1/d) and round half to even (not away from
 * zero). We do the same so activations match llama.cpp's on x86 byte for byte. */
static void act_q8_0(const float *x, void *dst, int64_t n)
{
    struct executor_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float amax = 0.0f;
        for (int j = 0; j < EXECUTOR_QK; j++)
            amax = KREF_MAX(amax, fabsf(x[j]));
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[i].d = kimpl_fp32_to_fp16(d);
        for (int j = 0; j < EXECUTOR_QK; j++) {
            int v = kimpl_nearest_int(x[j] * id);
            y[i].qs[j] = (int8_t)KREF_MAX(-128, KREF_MIN(127, v));
        }
    }
}

static void act_q8_1(const float *x, void *dst, int64_t n)
{
    struct executor_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float amax = 0.0f;
        for (int j = 0; j < EXECUTOR_QK; j++)
            amax = KREF_MAX(amax, fabsf(x[j]));
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int         sum = 0;
        y[i].d = kimpl_fp32_to_fp16(d);
        for (int j = 0; j < EXECUTOR_QK; j++) {
            int v = kimpl_nearest_int(x[j] * id);
            y[i].qs[j] = (int8_t)KREF_MAX(-128, KREF_MIN(127, v));
            sum += v;
        }
        y[i].s = kimpl_fp32_to_fp16(d * (float)sum);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Dot products (ggml_vec_dot_*_generic: integer sums per block, then scaled)                 */
/* ------------------------------------------------------------------------------------------ */

static float dot_f32(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    double       sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(x[i] * y[i]);
    return (float)sum;
}

static float dot_f16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    double          sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(kimpl_fp16_to_fp32(x[i]) * kimpl_fp16_to_fp32(y[i]));
    return (float)sum;
}

static float dot_bf16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    double          sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(kimpl_bf16_to_fp32(x[i]) * kimpl_bf16_to_fp32(y[i]));
    return (float)sum;
}

/* MXFP4 x Q8_0 as ggml's generic kernel: integer sums of the two halves, scaled per block. */
static float dot_mxfp4(int64_t n, const void *w, const void *a)
{
    const struct executor_block_mxfp4 *x = w;
    const struct executor_block_q8_0  *y = a;
    float                              sumf = 0;
    for (int64_t ib = 0; ib < n / EXECUTOR_QK; ib++) {
        const float d = kimpl_fp16_to_fp32(y[ib].d) * kimpl_e8m0_half(x[ib].e);
        int         sumi1 = 0, sumi2 = 0;
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            sumi1 += y[ib].qs[j] * kimpl_mxfp4_values[x[ib].qs[j] & 0x0F];
            sumi2 += y[ib].qs[j + EXECUTOR_QK / 2] * kimpl_mxfp4_values[x[ib].qs[j] >> 4];
        }
        sumf += d * (float)(sumi1 + sumi2);
    }
    return sumf;
}

/* The 256 weights of a TQ1_0 block in element order, -1..1 (see struct executor_block_tq1_0). */
static void ref_tq1_0_unpack(const struct executor_block_tq1_0 *x, int8_t q[EXECUTOR_QK_K])
{
    for (int k = 0; k < 5; k++)
        for (int m = 0; m < 32; m++)
            q[32 * k + m] = (int8_t)(kimpl_tq1_trit(x->qs[m], k) - 1);
    for (int k = 0; k < 5; k++)
        for (int m = 0; m < 16; m++)
            q[160 + 16 * k + m] = (int8_t)(kimpl_tq1_trit(x->qs[32 + m], k) - 1);
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 4; j++)
            q[240 + 4 * k + j] = (int8_t)(kimpl_tq1_trit(x->qh[j], k) - 1);
}

/* The 256 weights of a TQ2_0 block in element order, -1..2 (see struct executor_block_tq2_0). */
static void ref_tq2_0_unpack(const struct executor_block_tq2_0 *x, int8_t q[EXECUTOR_QK_K])
{
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int m = 0; m < 32; m++)
                q[128 * h + 32 * k + m] = (int8_t)(((x->qs[32 * h + m] >> (2 * k)) & 3) - 1);
}

static void dequant_tq1_0(const void *src, float *y, int64_t n)
{
    const struct executor_block_tq1_0 *x = src;
    int8_t                             q[EXECUTOR_QK_K];
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, y += EXECUTOR_QK_K) {
        const float d = kimpl_fp16_to_fp32(x[i].d);
        ref_tq1_0_unpack(&x[i], q);
        for (int j = 0; j < EXECUTOR_QK_K; j++)
            y[j] = (float)q[j] * d;
    }
}

static void dequant_tq2_0(const void *src, float *y, int64_t n)
{
    const struct executor_block_tq2_0 *x = src;
    int8_t                             q[EXECUTOR_QK_K];
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, y += EXECUTOR_QK_K) {
        const float d = kimpl_fp16_to_fp32(x[i].d);
        ref_tq2_0_unpack(&x[i], q);
        for (int j = 0; j < EXECUTOR_QK_K; j++)
            y[j] = (float)q[j] * d;
    }
}

/* The 128 weights of an I2S_Q128 block in element order, -1..2 (see struct
 * executor_block_i2s_q128). */
static void ref_i2s_q128_unpack(const struct executor_block_i2s_q128 *x, int8_t *q)
{
    for (int g = 0; g < 4; g++)
        for (int m = 0; m < 32; m++)
            q[32 * g + m] = (int8_t)(((x->qs[m] >> (6 - 2 * g)) & 3) - 1);
}

/* The 32 weights of an I2S_B32H/B32F block's codes in element order, -1..2. */
static void ref_i2s_b32_unpack(const uint8_t qs[EXECUTOR_QK / 4], int8_t q[EXECUTOR_QK])
{
    for (int l = 0; l < 4; l++)
        for (int k = 0; k < EXECUTOR_QK / 4; k++)
            q[4 * k + l] = (int8_t)(((qs[k] >> (2 * l)) & 3) - 1);
}

static void dequant_i2s_q128(const void *src, float *y, int64_t n)
{
    const struct executor_block_i2s_q128 *x = src;
    int8_t                                q[EXECUTOR_I2S_QK128];
    for (int64_t i = 0; i < n / EXECUTOR_I2S_QK128; i++, y += EXECUTOR_I2S_QK128) {
        ref_i2s_q128_unpack(&x[i], q);
        for (int j = 0; j < EXECUTOR_I2S_QK128; j++)
            y[j] = (float)q[j];
    }
}

static void dequant_i2s_b32h(const void *src, float *y, int64_t n)
{
    const struct executor_block_i2s_b32h *x = src;
    int8_t                                q[EXECUTOR_QK];
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, y += EXECUTOR_QK) {
        const float d = kimpl_fp16_to_fp32(x[i].d);
        ref_i2s_b32_unpack(x[i].qs, q);
        for (int j = 0; j < EXECUTOR_QK; j++)
            y[j] = (float)q[j] * d;
    }
}

static void dequant_i2s_b32f(const void *src, float *y, int64_t n)
{
    const struct executor_block_i2s_b32f *x = src;
    int8_t                                q[EXECUTOR_QK];
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, y += EXECUTOR_QK) {
        const float d = kimpl_i2s_b32f_scale(&x[i]);
        ref_i2s_b32_unpack(x[i].qs, q);
        for (int j = 0; j < EXECUTOR_QK; j++)
            y[j] = (float)q[j] * d;
    }
}

static void dequant_mxfp4(const void *src, float *y, int64_t n)
{
    const struct executor_block_mxfp4 *x = src;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, y += EXECUTOR_QK) {
        const float d = kimpl_e8m0_half(x[i].e);
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            y[j] = (float)kimpl_mxfp4_values[x[i].qs[j] & 0x0F] * d;
            y[j + EXECUTOR_QK / 2] = (float)kimpl_mxfp4_values[x[i].qs[j] >> 4] * d;
        }
    }
}

static float dot_q4_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q4_0 *x = w;
    const struct executor_block_q8_0 *y = a;
    float                             sumf = 0;
    for (int64_t ib = 0; ib < n / EXECUTOR_QK; ib++) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            sumi0 += ((x[ib].qs[j] & 0x0F) - 8) * y[ib].qs[j];
            sumi1 += ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + EXECUTOR_QK / 2];
        }
        sumf += (float)(sumi0 + sumi1) * kimpl_fp16_to_fp32(x[ib].d) * kimpl_fp16_to_fp32(y[ib].d);
    }
    return sumf;
}

static float dot_q4_1(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q4_1 *x = w;
    const struct executor_block_q8_1 *y = a;
    float                             sumf = 0;
    for (int64_t ib = 0; ib < n / EXECUTOR_QK; ib++) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            sumi0 += (x[ib].qs[j] & 0x0F) * y[ib].qs[j];
            sumi1 += (x[ib].qs[j] >> 4) * y[ib].qs[j + EXECUTOR_QK / 2];
        }
        sumf +=
            (kimpl_fp16_to_fp32(x[ib].d) * kimpl_fp16_to_fp32(y[ib].d)) * (float)(sumi0 + sumi1) +
            kimpl_fp16_to_fp32(x[ib].m) * kimpl_fp16_to_fp32(y[ib].s);
    }
    return sumf;
}

static float dot_q5_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q5_0 *x = w;
    const struct executor_block_q8_0 *y = a;
    float                             sumf = 0;
    for (int64_t ib = 0; ib < n / EXECUTOR_QK; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            const int xh0 = (int)(((qh >> (j + 0)) << 4) & 0x10);
            const int xh1 = (int)((qh >> (j + 12)) & 0x10);
            sumi0 += (((x[ib].qs[j] & 0x0F) | xh0) - 16) * y[ib].qs[j];
            sumi1 += (((x[ib].qs[j] >> 4) | xh1) - 16) * y[ib].qs[j + EXECUTOR_QK / 2];
        }
        sumf +=
            (kimpl_fp16_to_fp32(x[ib].d) * kimpl_fp16_to_fp32(y[ib].d)) * (float)(sumi0 + sumi1);
    }
    return sumf;
}

static float dot_q5_1(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q5_1 *x = w;
    const struct executor_block_q8_1 *y = a;
    float                             sumf = 0;
    for (int64_t ib = 0; ib < n / EXECUTOR_QK; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < EXECUTOR_QK / 2; j++) {
            const int xh0 = (int)(((qh >> (j + 0)) << 4) & 0x10);
            const int xh1 = (int)((qh >> (j + 12)) & 0x10);
            sumi0 += ((x[ib].qs[j] & 0x0F) | xh0) * y[ib].qs[j];
            sumi1 += ((x[ib].qs[j] >> 4) | xh1) * y[ib].qs[j + EXECUTOR_QK / 2];
        }
        sumf +=
            (kimpl_fp16_to_fp32(x[ib].d) * kimpl_fp16_to_fp32(y[ib].d)) * (float)(sumi0 + sumi1) +
            kimpl_fp16_to_fp32(x[ib].m) * kimpl_fp16_to_fp32(y[ib].s);
    }
    return sumf;
}

static float dot_q8_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q8_0 *x = w;
    const struct executor_block_q8_0 *y = a;
    float                             sumf = 0;
    for (int64_t ib = 0; ib < n / EXECUTOR_QK; ib++) {
        int sumi = 0;
        for (int j = 0; j < EXECUTOR_QK; j++)
            sumi += x[ib].qs[j] * y[ib].qs[j];
        sumf += (float)sumi * (kimpl_fp16_to_fp32(x[ib].d) * kimpl_fp16_to_fp32(y[ib].d));
    }
    return sumf;
}

static float dot_q2_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q2_K *x = w;
    const struct executor_block_q8_K *y = a;
    float                             sumf = 0;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const uint8_t *q2 = x[i].qs;
        const int8_t  *q8 = y[i].qs;
        int            summs = 0;
        for (int j = 0; j < 16; j++)
            summs += y[i].bsums[j] * (x[i].scales[j] >> 4);
        const float dall = y[i].d * kimpl_fp16_to_fp32(x[i].d);
        const float dmin = y[i].d * kimpl_fp16_to_fp32(x[i].dmin);
        int         isum = 0, is = 0;
        for (int c = 0; c < EXECUTOR_QK_K / 128; c++, q2 += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    int d = x[i].scales[is++] & 0xF, s = 0;
                    for (int l = 0; l < 16; l++)
                        s += q8[l] * ((q2[l + 16 * half] >> shift) & 3);
                    isum += d * s;
                    q8 += 16;
                }
            }
        }
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    return sumf;
}

static float dot_q3_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q3_K *x = w;
    const struct executor_block_q8_K *y = a;
    float                             sumf = 0;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const uint8_t *q3 = x[i].qs;
        const uint8_t *hm = x[i].hmask;
        const int8_t  *q8 = y[i].qs;
        int8_t         sc[16];
        kimpl_q3_K_scales(x[i].scales, sc);
        uint8_t m = 1;
        int     isum = 0, is = 0;
        for (int c = 0; c < EXECUTOR_QK_K / 128; c++, q3 += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int half = 0; half < 2; half++) {
                    int s = 0;
                    for (int l = 0; l < 16; l++) {
                        int k = l + 16 * half;
                        s += q8[l] * (((q3[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
                    }
                    isum += (sc[is++] - 32) * s;
                    q8 += 16;
                }
            }
        }
        sumf += kimpl_fp16_to_fp32(x[i].d) * y[i].d * (float)isum;
    }
    return sumf;
}

static float dot_q4_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q4_K *x = w;
    const struct executor_block_q8_K *y = a;
    float                             sumf = 0;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const uint8_t *q4 = x[i].qs;
        const int8_t  *q8 = y[i].qs;
        int            isum = 0, msum = 0;
        for (int is = 0; is < 8; is += 2, q4 += 32, q8 += 64) {
            uint8_t sc0, m0, sc1, m1;
            kimpl_scale_min_k4(is + 0, x[i].scales, &sc0, &m0);
            kimpl_scale_min_k4(is + 1, x[i].scales, &sc1, &m1);
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (q4[l] & 0xF) * q8[l];
                s1 += (q4[l] >> 4) * q8[l + 32];
            }
            isum += sc0 * s0 + sc1 * s1;
            msum += m0 * (y[i].bsums[2 * is + 0] + y[i].bsums[2 * is + 1]) +
                    m1 * (y[i].bsums[2 * is + 2] + y[i].bsums[2 * is + 3]);
        }
        const float d = kimpl_fp16_to_fp32(x[i].d) * y[i].d;
        const float dmin = kimpl_fp16_to_fp32(x[i].dmin) * y[i].d;
        sumf += d * (float)isum - dmin * (float)msum;
    }
    return sumf;
}

static float dot_q5_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q5_K *x = w;
    const struct executor_block_q8_K *y = a;
    float                             sumf = 0;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const uint8_t *ql = x[i].qs;
        const uint8_t *qh = x[i].qh;
        const int8_t  *q8 = y[i].qs;
        int            isum = 0, msum = 0;
        uint8_t        u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, ql += 32, q8 += 64) {
            uint8_t sc0, m0, sc1, m1;
            kimpl_scale_min_k4(is + 0, x[i].scales, &sc0, &m0);
            kimpl_scale_min_k4(is + 1, x[i].scales, &sc1, &m1);
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) * q8[l];
                s1 += ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) * q8[l + 32];
            }
            isum += sc0 * s0 + sc1 * s1;
            msum += m0 * (y[i].bsums[2 * is + 0] + y[i].bsums[2 * is + 1]) +
                    m1 * (y[i].bsums[2 * is + 2] + y[i].bsums[2 * is + 3]);
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
        const float d = kimpl_fp16_to_fp32(x[i].d) * y[i].d;
        const float dmin = kimpl_fp16_to_fp32(x[i].dmin) * y[i].d;
        sumf += d * (float)isum - dmin * (float)msum;
    }
    return sumf;
}

static float dot_q6_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q6_K *x = w;
    const struct executor_block_q8_K *y = a;
    float                             sumf = 0;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t  *sc = x[i].scales;
        const int8_t  *q8 = y[i].qs;
        int            isum = 0;
        for (int c = 0; c < EXECUTOR_QK_K; c += 128, ql += 64, qh += 32, sc += 8, q8 += 128) {
            int s[8] = {0};
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                s[is + 0] += q1 * q8[l + 0];
                s[is + 2] += q2 * q8[l + 32];
                s[is + 4] += q3 * q8[l + 64];
                s[is + 6] += q4 * q8[l + 96];
            }
            for (int j = 0; j < 8; j++)
                isum += sc[j] * s[j];
        }
        sumf += kimpl_fp16_to_fp32(x[i].d) * y[i].d * (float)isum;
    }
    return sumf;
}

/* Ternary x Q8_K (ggml_vec_dot_tq{1,2}_0_q8_K_generic): the exact integer sum of a block, then
 * one float multiply-add by d_w * d_a. */
/* The ternary dots give the bits of llama.cpp's x86 CPU backend (its AVX2 kernels, built with
 * FMA: what a user of llama.cpp on x86 runs), not of ggml's generic loop: 8 int32 lanes, lane k
 * holding the unsigned quants (q + 1) times the activations of elements 32g + 4k .. 32g + 4k + 3
 * of every 32-element group g, minus the activations of group k (Q8_K bsums 2k and 2k + 1); each
 * block scales the lanes by d = d_a * d_w with one fused multiply-add per lane, and the lanes are
 * summed at the end as (l0 + l4 + (l2 + l6)) + (l1 + l5 + (l3 + l7)) (ggml's hsum_float_8). */
static void ref_ternary_lanes(const int8_t q[EXECUTOR_QK_K], const struct executor_block_q8_K *y,
                              float d, float acc[8])
{
    int32_t lane[8];
    for (int k = 0; k < 8; k++)
        lane[k] = -(y->bsums[2 * k] + y->bsums[2 * k + 1]);
    for (int e = 0; e < EXECUTOR_QK_K; e++)
        lane[(e % 32) / 4] += (q[e] + 1) * y->qs[e];
    for (int k = 0; k < 8; k++)
        acc[k] = fmaf((float)lane[k], d, acc[k]);
}

static float ref_ternary_hsum(const float acc[8])
{
    const float r0 = acc[4] + acc[0], r1 = acc[5] + acc[1];
    const float r2 = acc[6] + acc[2], r3 = acc[7] + acc[3];
    const float s0 = r0 + r2, s1 = r1 + r3;
    return s0 + s1;
}

static float dot_tq1_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_tq1_0 *x = w;
    const struct executor_block_q8_K  *y = a;
    float                              acc[8] = {0};
    int8_t                             q[EXECUTOR_QK_K];
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        ref_tq1_0_unpack(&x[i], q);
        ref_ternary_lanes(q, &y[i], y[i].d * kimpl_fp16_to_fp32(x[i].d), acc);
    }
    return ref_ternary_hsum(acc);
}

static float dot_tq2_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_tq2_0 *x = w;
    const struct executor_block_q8_K  *y = a;
    float                              acc[8] = {0};
    int8_t                             q[EXECUTOR_QK_K];
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++) {
        ref_tq2_0_unpack(&x[i], q);
        ref_ternary_lanes(q, &y[i], y[i].d * kimpl_fp16_to_fp32(x[i].d), acc);
    }
    return ref_ternary_hsum(acc);
}

/* I2_S x Q8_0: the exact integer sum of each 32 elements (one activation block), then per block
 * p = (float)isum * d_a (Q128, whose scale the caller applies) or p = ((float)isum * d_a) * d_w,
 * added to sumf in block order. One rounding per operation, each in its own statement so that no
 * compiler fuses a multiply and an add: the SIMD kernels make the same p and add them in the same
 * order, so they give these bits with gcc and clang alike. */
static float dot_i2s_q128(int64_t n, const void *w, const void *a)
{
    const struct executor_block_i2s_q128 *x = w;
    const struct executor_block_q8_0     *y = a;
    float                                 sumf = 0.0f;
    int8_t                                q[EXECUTOR_I2S_QK128];
    for (int64_t i = 0; i < n / EXECUTOR_I2S_QK128; i++) {
        ref_i2s_q128_unpack(&x[i], q);
        for (int g = 0; g < 4; g++) {
            const struct executor_block_q8_0 *yg = &y[4 * i + g];
            int                               isum = 0;
            for (int j = 0; j < EXECUTOR_QK; j++)
                isum += q[32 * g + j] * yg->qs[j];
            const float p = (float)isum * kimpl_fp16_to_fp32(yg->d);
            sumf += p;
        }
    }
    return sumf;
}

/* One 32-element block of either block-32 layout (its 8 bytes of codes and its scale d_w as a
 * float) against Q8_0 block y, added to *sumf: ((float)isum * d_a) * d_w. */
static void ref_i2s_b32_block(const uint8_t qs[8], float dw, const struct executor_block_q8_0 *y,
                              float *sumf)
{
    int8_t q[EXECUTOR_QK];
    ref_i2s_b32_unpack(qs, q);
    int isum = 0;
    for (int j = 0; j < EXECUTOR_QK; j++)
        isum += q[j] * y->qs[j];
    const float t = (float)isum * kimpl_fp16_to_fp32(y->d);
    const float p = t * dw;
    *sumf += p;
}

static float dot_i2s_b32h(int64_t n, const void *w, const void *a)
{
    const struct executor_block_i2s_b32h *x = w;
    const struct executor_block_q8_0     *y = a;
    float                                 sumf = 0.0f;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++)
        ref_i2s_b32_block(x[i].qs, kimpl_fp16_to_fp32(x[i].d), &y[i], &sumf);
    return sumf;
}

static float dot_i2s_b32f(int64_t n, const void *w, const void *a)
{
    const struct executor_block_i2s_b32f *x = w;
    const struct executor_block_q8_0     *y = a;
    float                                 sumf = 0.0f;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++)
        ref_i2s_b32_block(x[i].qs, kimpl_i2s_b32f_scale(&x[i]), &y[i], &sumf);
    return sumf;
}

/* ------------------------------------------------------------------------------------------ */
/* Tables and public entry points                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef void (*ref_dequant_fn)(const void *src, float *y, int64_t n);

static ref_dequant_fn ref_dequantizer(uint32_t type)
{
    switch (type) {
    case COMMON_GGML_TYPE_F32:
        return dequant_f32;
    case COMMON_GGML_TYPE_F16:
        return dequant_f16;
    case COMMON_GGML_TYPE_BF16:
        return dequant_bf16;
    case COMMON_GGML_TYPE_Q4_0:
        return dequant_q4_0;
    case COMMON_GGML_TYPE_Q4_1:
        return dequant_q4_1;
    case COMMON_GGML_TYPE_Q5_0:
        return dequant_q5_0;
    case COMMON_GGML_TYPE_Q5_1:
        return dequant_q5_1;
    case COMMON_GGML_TYPE_Q8_0:
        return dequant_q8_0;
    case COMMON_GGML_TYPE_Q8_1:
        return dequant_q8_1;
    case COMMON_GGML_TYPE_Q2_K:
        return dequant_q2_K;
    case COMMON_GGML_TYPE_Q3_K:
        return dequant_q3_K;
    case COMMON_GGML_TYPE_Q4_K:
        return dequant_q4_K;
    case COMMON_GGML_TYPE_Q5_K:
        return dequant_q5_K;
    case COMMON_GGML_TYPE_Q6_K:
        return dequant_q6_K;
    case COMMON_GGML_TYPE_Q8_K:
        return dequant_q8_K;
    case COMMON_GGML_TYPE_MXFP4:
        return dequant_mxfp4;
    case COMMON_GGML_TYPE_TQ1_0:
        return dequant_tq1_0;
    case COMMON_GGML_TYPE_TQ2_0:
        return dequant_tq2_0;
    case COMMON_GGML_TYPE_I2S_Q128:
        return dequant_i2s_q128;
    case COMMON_GGML_TYPE_I2S_B32H:
        return dequant_i2s_b32h;
    case COMMON_GGML_TYPE_I2S_B32F:
        return dequant_i2s_b32f;
    default:
        return NULL;
    }
}

static void wsum_f16(int64_t n, int64_t k, const uint16_t *x, size_t x_stride, const float *a,
                     size_t a_stride, int64_t m, float *y, size_t y_stride)
{
    for (int64_t i = 0; i < k; i++) {
        const uint16_t *xi =
            (const uint16_t *)(const void *)((const char *)x + (size_t)i * x_stride);
        for (int64_t j = 0; j < m; j++) {
            const float aj = a[(size_t)j * a_stride + (size_t)i];
            float      *yj = y + (size_t)j * y_stride;
            for (int64_t d = 0; d < n; d++) {
                const float p = aj * kimpl_fp16_to_fp32(xi[d]); /* two statements: no FMA */
                yj[d] = yj[d] + p;
            }
        }
    }
}

void executor_kernels_fill_ref(struct executor_kernel_set *ks)
{
    ks->wsum_f16 = wsum_f16;
    ks->vec_dot[COMMON_GGML_TYPE_F32] = dot_f32;
    ks->vec_dot[COMMON_GGML_TYPE_F16] = dot_f16;
    ks->vec_dot[COMMON_GGML_TYPE_BF16] = dot_bf16;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_0] = dot_q4_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_1] = dot_q4_1;
    ks->vec_dot[COMMON_GGML_TYPE_Q5_0] = dot_q5_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q5_1] = dot_q5_1;
    ks->vec_dot[COMMON_GGML_TYPE_Q8_0] = dot_q8_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q2_K] = dot_q2_K;
    ks->vec_dot[COMMON_GGML_TYPE_Q3_K] = dot_q3_K;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_K] = dot_q4_K;
    ks->vec_dot[COMMON_GGML_TYPE_Q5_K] = dot_q5_K;
    ks->vec_dot[COMMON_GGML_TYPE_Q6_K] = dot_q6_K;
    ks->vec_dot[COMMON_GGML_TYPE_MXFP4] = dot_mxfp4;
    ks->vec_dot[COMMON_GGML_TYPE_TQ1_0] = dot_tq1_0;
    ks->vec_dot[COMMON_GGML_TYPE_TQ2_0] = dot_tq2_0;
    ks->vec_dot[COMMON_GGML_TYPE_I2S_Q128] = dot_i2s_q128;
    ks->vec_dot[COMMON_GGML_TYPE_I2S_B32H] = dot_i2s_b32h;
    ks->vec_dot[COMMON_GGML_TYPE_I2S_B32F] = dot_i2s_b32f;

    ks->quantize_act[COMMON_GGML_TYPE_F32] = executor_ref_quantizer(COMMON_GGML_TYPE_F32);
    ks->quantize_act[COMMON_GGML_TYPE_F16] = executor_ref_quantizer(COMMON_GGML_TYPE_F16);
    ks->quantize_act[COMMON_GGML_TYPE_BF16] = executor_ref_quantizer(COMMON_GGML_TYPE_BF16);
    ks->quantize_act[COMMON_GGML_TYPE_Q8_0] = act_q8_0;
    ks->quantize_act[COMMON_GGML_TYPE_Q8_1] = act_q8_1;
    /* x86 ggml uses the weight quantizer here */
    ks->quantize_act[COMMON_GGML_TYPE_Q8_K] = executor_ref_quantizer(COMMON_GGML_TYPE_Q8_K);
}

int executor_kernels_check(uint32_t type, int64_t n)
{
    struct executor_type_layout l = executor_type_layout(type);
    if (l.blck == 0 || n < 0 || n % l.blck != 0)
        return COMMON_EINVAL;
    return 0;
}

int executor_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    ref_dequant_fn fn = ref_dequantizer(type);
    if (!fn || executor_kernels_check(type, n) < 0 || (n > 0 && (!src || !dst)))
        return COMMON_EINVAL;
    if (n > 0)
        fn(src, dst, n);
    return 0;
}

uint32_t executor_vec_dot_type(uint32_t type)
{
    switch (type) {
    case COMMON_GGML_TYPE_Q4_0:
    case COMMON_GGML_TYPE_Q5_0:
    case COMMON_GGML_TYPE_Q8_0:
    case COMMON_GGML_TYPE_MXFP4:
    case COMMON_GGML_TYPE_I2S_Q128:
    case COMMON_GGML_TYPE_I2S_B32H:
    case COMMON_GGML_TYPE_I2S_B32F:
        return COMMON_GGML_TYPE_Q8_0;
    case COMMON_GGML_TYPE_Q4_1:
    case COMMON_GGML_TYPE_Q5_1:
        return COMMON_GGML_TYPE_Q8_1;
    case COMMON_GGML_TYPE_Q2_K:
    case COMMON_GGML_TYPE_Q3_K:
    case COMMON_GGML_TYPE_Q4_K:
    case COMMON_GGML_TYPE_Q5_K:
    case COMMON_GGML_TYPE_Q6_K:
    case COMMON_GGML_TYPE_TQ1_0:
    case COMMON_GGML_TYPE_TQ2_0:
        return COMMON_GGML_TYPE_Q8_K;
    case COMMON_GGML_TYPE_F16:
        return COMMON_GGML_TYPE_F16;
    case COMMON_GGML_TYPE_BF16:
        return COMMON_GGML_TYPE_BF16;
    default:
        return COMMON_GGML_TYPE_F32;
    }
}

bool executor_type_is_supported(uint32_t type)
{
    switch (type) {
    case COMMON_GGML_TYPE_F32:
    case COMMON_GGML_TYPE_F16:
    case COMMON_GGML_TYPE_BF16:
    case COMMON_GGML_TYPE_Q4_0:
    case COMMON_GGML_TYPE_Q4_1:
    case COMMON_GGML_TYPE_Q5_0:
    case COMMON_GGML_TYPE_Q5_1:
    case COMMON_GGML_TYPE_Q8_0:
    case COMMON_GGML_TYPE_Q2_K:
    case COMMON_GGML_TYPE_Q3_K:
    case COMMON_GGML_TYPE_Q4_K:
    case COMMON_GGML_TYPE_Q5_K:
    case COMMON_GGML_TYPE_Q6_K:
    case COMMON_GGML_TYPE_MXFP4:
    case COMMON_GGML_TYPE_TQ1_0:
    case COMMON_GGML_TYPE_TQ2_0:
    case COMMON_GGML_TYPE_I2S_Q128:
    case COMMON_GGML_TYPE_I2S_B32H:
    case COMMON_GGML_TYPE_I2S_B32F:
        return true;
    default:
        return false;
    }
}

/* Checks a weight type and length for the activation entry points. */
static int ref_check_weight(uint32_t weight_type, int64_t n)
{
    if (!executor_type_is_supported(weight_type))
        return COMMON_EINVAL;
    if (executor_kernels_check(weight_type, n) < 0 ||
        executor_kernels_check(executor_vec_dot_type(weight_type), n) < 0)
        return COMMON_EINVAL;
    return 0;
}

int executor_quantize_act_ref(uint32_t weight_type, const float *x, void *dst, int64_t n)
{
    if (ref_check_weight(weight_type, n) < 0 || (n > 0 && (!x || !dst)))
        return COMMON_EINVAL;
    struct executor_kernel_set ks = {0};
    executor_kernels_fill_ref(&ks);
    if (n > 0)
        ks.quantize_act[executor_vec_dot_type(weight_type)](x, dst, n);
    return 0;
}

int executor_wsum_f16_ref(int64_t n, int64_t k, const uint16_t *x, size_t x_stride, const float *a,
                          size_t a_stride, int64_t m, float *y, size_t y_stride)
{
    const int rc = executor_wsum_check(n, k, x, a_stride, a, m, y, y_stride);
    if (rc > 0)
        wsum_f16(n, k, x, x_stride, a, a_stride, m, y, y_stride);
    return rc < 0 ? rc : 0;
}

int executor_wsum_check(int64_t n, int64_t k, const uint16_t *x, size_t a_stride, const float *a,
                        int64_t m, const float *y, size_t y_stride)
{
    if (n < 0 || k < 0 || m < 0 || (m > 1 && (a_stride < (size_t)k || y_stride < (size_t)n)))
        return COMMON_EINVAL;
    if (n == 0 || k == 0 || m == 0)
        return 0;
    return !x || !a || !y ? COMMON_EINVAL : 1;
}

float executor_vec_dot_ref(uint32_t type, int64_t n, const void *w_row, const void *act)
{
    if (ref_check_weight(type, n) < 0 || (n > 0 && (!w_row || !act)))
        return NAN;
    if (n == 0)
        return 0.0f;
    struct executor_kernel_set ks = {0};
    executor_kernels_fill_ref(&ks);
    return ks.vec_dot[type](n, w_row, act);
}
