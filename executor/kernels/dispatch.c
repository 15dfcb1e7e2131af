/* executor/kernels/dispatch.c - picks the kernel set for this CPU and routes every kernel call to
 * it. */
#include "kernels.h"

#include <math.h>
#include <pthread.h>

#include "kernels_impl.h"

#define DISPATCH_N_ISA      3
#define DISPATCH_TILE_BYTES (24u * 1024u)  /* weight bytes per matmul tile: about L1d */
#define DISPATCH_GEMM_BYTES (256u * 1024u) /* weight bytes per gemm tile: a part of L2 */

/* Process singleton: CPU features, filled once by dispatch_init() (through pthread_once, so the
 * first kernel call or executor_kernels_init() fills it); read-only after. */
static struct executor_cpu_features g_cpu;

/* Process singleton: one kernel table per ISA (slower sets fill the gaps of faster ones), built
 * by dispatch_init(); read-only after. */
static struct executor_kernel_set g_sets[DISPATCH_N_ISA];

/* Process singleton: the kernel set in use. Written by dispatch_init() and
 * executor_kernels_select(), which callers run while no kernel runs. */
static enum executor_isa g_active_isa;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static bool dispatch_isa_available(const struct executor_cpu_features *f, enum executor_isa isa)
{
    switch (isa) {
    case EXECUTOR_ISA_REF:
        return true;
    case EXECUTOR_ISA_AVX2:
        return f->avx2 && f->fma && f->f16c;
    case EXECUTOR_ISA_AVX512:
        return f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512dq && f->avx512bw &&
               f->avx512vl && f->avx512vnni;
    }
    return false;
}

/* Builds `dst` as `base` overridden by `fill`; a gemv or gemm inherited from `base` is dropped
 * where `fill` replaced the vec_dot of its type, so they and vec_dot always agree bit for bit. */
static void dispatch_derive(struct executor_kernel_set *dst, const struct executor_kernel_set *base,
                            void (*fill)(struct executor_kernel_set *))
{
    *dst = *base;
    for (int t = 0; t < COMMON_GGML_TYPE_COUNT; t++) {
        dst->gemv[t] = NULL;
        dst->gemm[t] = NULL;
    }
    fill(dst);
    for (int t = 0; t < COMMON_GGML_TYPE_COUNT; t++) {
        if (!dst->gemv[t] && dst->vec_dot[t] == base->vec_dot[t])
            dst->gemv[t] = base->gemv[t];
        if (!dst->gemm[t] && dst->vec_dot[t] == base->vec_dot[t])
            dst->gemm[t] = base->gemm[t];
    }
}

static void dispatch_init(void)
{
    executor_cpu_detect(&g_cpu);
    executor_kernels_fill_ref(&g_sets[EXECUTOR_ISA_REF]);
    dispatch_derive(&g_sets[EXECUTOR_ISA_AVX2], &g_sets[EXECUTOR_ISA_REF],
                    executor_kernels_fill_avx2);
    dispatch_derive(&g_sets[EXECUTOR_ISA_AVX512], &g_sets[EXECUTOR_ISA_AVX2],
                    executor_kernels_fill_avx512);

    g_active_isa = EXECUTOR_ISA_REF;
    if (dispatch_isa_available(&g_cpu, EXECUTOR_ISA_AVX2))
        g_active_isa = EXECUTOR_ISA_AVX2;
    if (dispatch_isa_available(&g_cpu, EXECUTOR_ISA_AVX512))
        g_active_isa = EXECUTOR_ISA_AVX512;
}

static inline const struct executor_kernel_set *dispatch_active(void)
{
    pthread_once(&g_once, dispatch_init);
    return &g_sets[g_active_isa];
}

void executor_kernels_init(void)
{
    pthread_once(&g_once, dispatch_init);
}

const struct executor_cpu_features *executor_cpu_features(void)
{
    pthread_once(&g_once, dispatch_init);
    return &g_cpu;
}

int executor_kernels_select(enum executor_isa isa)
{
    pthread_once(&g_once, dispatch_init);
    if ((unsigned)isa >= DISPATCH_N_ISA || !dispatch_isa_available(&g_cpu, isa))
        return COMMON_ENOTSUP;
    g_active_isa = isa;
    return 0;
}

enum executor_isa executor_kernels_active(void)
{
    pthread_once(&g_once, dispatch_init);
    return g_active_isa;
}

const char *executor_isa_name(enum executor_isa isa)
{
    switch (isa) {
    case EXECUTOR_ISA_REF:
        return "ref";
    case EXECUTOR_ISA_AVX2:
        return "avx2";
    case EXECUTOR_ISA_AVX512:
        return "avx512";
    }
    return "unknown";
}

/* 0 when weights of `type` and n elements can go through the dot kernels. */
static int dispatch_check(uint32_t type, int64_t n)
{
    if (!executor_type_is_supported(type) || executor_kernels_check(type, n) < 0 ||
        executor_kernels_check(executor_vec_dot_type(type), n) < 0)
        return COMMON_EINVAL;
    return 0;
}

/* Bytes of n elements of `type` (valid type and n, checked by the caller). */
static size_t dispatch_row_size(uint32_t type, int64_t n)
{
    struct executor_type_layout l = executor_type_layout(type);
    return (size_t)(n / l.blck) * l.type_size;
}

size_t executor_act_row_size(uint32_t weight_type, int64_t n)
{
    if (dispatch_check(weight_type, n) < 0)
        return 0;
    return dispatch_row_size(executor_vec_dot_type(weight_type), n);
}

int executor_quantize_act(uint32_t weight_type, const float *x, void *dst, int64_t n)
{
    if (dispatch_check(weight_type, n) < 0 || (n > 0 && (!x || !dst)))
        return COMMON_EINVAL;
    if (n > 0)
        dispatch_active()->quantize_act[executor_vec_dot_type(weight_type)](x, dst, n);
    return 0;
}

float executor_vec_dot(uint32_t type, int64_t n, const void *w_row, const void *act)
{
    if (dispatch_check(type, n) < 0 || (n > 0 && (!w_row || !act)))
        return NAN;
    if (n == 0)
        return 0.0f;
    return dispatch_active()->vec_dot[type](n, w_row, act);
}

/* Validates the arguments shared by matvec and matmul. */
static int dispatch_check_matrix(uint32_t type, int64_t n_cols, const void *w, size_t row_bytes,
                                 int64_t row0, int64_t row1, const void *act, const float *y)
{
    if (dispatch_check(type, n_cols) < 0 || row0 < 0 || row1 < row0)
        return COMMON_EINVAL;
    if (row_bytes < dispatch_row_size(type, n_cols))
        return COMMON_EINVAL;
    if (row1 > row0 && (!w || !act || !y))
        return COMMON_EINVAL;
    return 0;
}

int executor_matvec(uint32_t type, int64_t n_cols, const void *w, size_t row_bytes, int64_t row0,
                    int64_t row1, const void *act, float *y)
{
    if (dispatch_check_matrix(type, n_cols, w, row_bytes, row0, row1, act, y) < 0)
        return COMMON_EINVAL;
    if (n_cols == 0) {
        for (int64_t r = row0; r < row1; r++)
            y[r] = 0.0f;
        return 0;
    }
    const struct executor_kernel_set *ks = dispatch_active();
    const char                       *row = (const char *)w + (size_t)row0 * row_bytes;
    if (ks->gemv[type]) {
        ks->gemv[type](n_cols, row, row_bytes, row1 - row0, act, y + row0);
        return 0;
    }
    const executor_vec_dot_fn fn = ks->vec_dot[type];
    for (int64_t r = row0; r < row1; r++, row += row_bytes)
        y[r] = fn(n_cols, row, act);
    return 0;
}

int executor_wsum_f16(int64_t n, int64_t k, const uint16_t *x, size_t x_stride, const float *a,
                      size_t a_stride, int64_t m, float *y, size_t y_stride)
{
    const int rc = executor_wsum_check(n, k, x, a_stride, a, m, y, y_stride);
    if (rc > 0)
        dispatch_active()->wsum_f16(n, k, x, x_stride, a, a_stride, m, y, y_stride);
    return rc < 0 ? rc : 0;
}

int executor_matmul(uint32_t type, int64_t n_cols, const void *w, size_t row_bytes, int64_t row0,
                    int64_t row1, const void *act, size_t act_stride, int64_t n_act, float *y,
                    size_t y_stride)
{
    if (dispatch_check_matrix(type, n_cols, w, row_bytes, row0, row1, act, y) < 0 || n_act < 0)
        return COMMON_EINVAL;
    if (n_act > 1 && (act_stride < executor_act_row_size(type, n_cols) || y_stride < (size_t)row1))
        return COMMON_EINVAL;
    if (n_act == 0 || row1 == row0)
        return 0;
    if (n_cols == 0) {
        for (int64_t j = 0; j < n_act; j++)
            for (int64_t r = row0; r < row1; r++)
                y[(size_t)j * y_stride + (size_t)r] = 0.0f;
        return 0;
    }
    const struct executor_kernel_set *ks = dispatch_active();
    const executor_vec_dot_fn         fn = ks->vec_dot[type];
    const executor_gemv_fn            gemv = ks->gemv[type];
    if (ks->gemm[type]) {
        int64_t gt = (int64_t)(DISPATCH_GEMM_BYTES / row_bytes);
        if (gt < 1)
            gt = 1;
        for (int64_t r0 = row0; r0 < row1; r0 += gt) {
            const int64_t r1 = r0 + gt < row1 ? r0 + gt : row1;
            ks->gemm[type](n_cols, (const char *)w + (size_t)r0 * row_bytes, row_bytes, r1 - r0,
                           act, act_stride, n_act, y + r0, y_stride);
        }
        return 0;
    }
    int64_t tile = (int64_t)(DISPATCH_TILE_BYTES / row_bytes);
    if (tile < 1)
        tile = 1;
    for (int64_t r0 = row0; r0 < row1; r0 += tile) {
        const int64_t r1 = r0 + tile < row1 ? r0 + tile : row1;
        for (int64_t j = 0; j < n_act; j++) {
            const void *a = (const char *)act + (size_t)j * act_stride;
            float      *yj = y + (size_t)j * y_stride;
            const char *wrow = (const char *)w + (size_t)r0 * row_bytes;
            if (gemv) {
                gemv(n_cols, wrow, row_bytes, r1 - r0, a, yj + r0);
                continue;
            }
            for (int64_t r = r0; r < r1; r++, wrow += row_bytes)
                yj[r] = fn(n_cols, wrow, a);
        }
    }
    return 0;
}
