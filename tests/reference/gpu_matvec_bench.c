/* tests/reference/gpu_matvec_bench.c - times the CUDA weight kernels (executor/cuda/quant.cu) on
 * one device: gpu_matvec with 1 and 4 activation rows, and prefill's path (gpu_dequant_rows to
 * f16, gpu_f32_to_f16, gpu_gemm_f16 on 512 tokens), for every supported type on 4096 x 4096 and
 * 14336 x 4096 (rows x cols) matrices of random weights. Prints the GB/s of weight bytes read by
 * the matvec (what decode is bound by) and the TFLOP/s of the matmul. Each timing is 50 calls
 * after a warm-up, between gpu_sync() and clock_gettime(); the matvec cycles through copies of the
 * matrix that together exceed the L2 cache, so its weights come from device memory as in decode.
 *
 * A program, not a test (it needs a GPU; CI never runs it). Build it after a CUDA build of the
 * project in BUILD (cmake -S . -B BUILD -DSLUICE_CUDA=ON && cmake --build BUILD), from the
 * repository root, linking as the tests do:
 *   cc -std=c11 -O2 -D_GNU_SOURCE -I executor -I common -I proto \
 *      tests/reference/gpu_matvec_bench.c BUILD/executor/libexecutor_core.a \
 *      BUILD/executor/libexecutor_cuda.a BUILD/proto/libproto.a BUILD/common/libcommon.a \
 *      /usr/local/cuda/lib64/libcudart_static.a -lstdc++ -lpthread -ldl -lrt -lm \
 *      -o /tmp/gpu_matvec_bench
 * Run: /tmp/gpu_matvec_bench [device] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "cuda/gpu.h"
#include "kernels/kernels.h"

#define BENCH_REPS       50
#define BENCH_TOKENS     512          /* prefill batch of the matmul */
#define BENCH_L2_SPAN    (256u << 20) /* bytes of matrix copies the matvec cycles through */
#define BENCH_MAX_COPIES 32
#define BENCH_TILE_ROWS  16 /* rows quantized for real, then repeated */

static uint64_t g_rng = 0x853c49e6748fea9bull; /* process singleton: the data's generator */

static float rng_gauss(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        u[i] = (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
    }
    return (float)(sqrt(-2.0 * log(u[0] + 1e-300)) * cos(6.283185307179586 * u[1]));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static void *dev_alloc(size_t bytes)
{
    void *p = gpu_malloc(bytes);
    if (!p) {
        fprintf(stderr, "gpu_malloc(%zu): %s\n", bytes, gpu_last_error());
        exit(1);
    }
    return p;
}

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "%s failed: %s\n", what, gpu_last_error());
        exit(1);
    }
}

/* Seconds per call of `fn(arg, i)` over BENCH_REPS calls after one warm-up call. */
static double time_calls(int (*fn)(void *arg, int i), void *arg, const char *what)
{
    check(fn(arg, 0), what);
    check(gpu_sync(), what);
    const double t0 = now_s();
    for (int i = 0; i < BENCH_REPS; i++)
        check(fn(arg, i + 1), what);
    check(gpu_sync(), what);
    return (now_s() - t0) / BENCH_REPS;
}

struct bench_case {
    uint32_t  type;
    int64_t   rows, cols, n;
    size_t    row_bytes, bytes;    /* one row, one copy of the matrix */
    int       n_copies;            /* copies of the matrix the matvec cycles through */
    void     *w[BENCH_MAX_COPIES]; /* owned: device copies */
    float    *x, *y;               /* owned: device activations (BENCH_TOKENS rows), outputs */
    void     *q8;                  /* owned: the q8 image of the first GPU_MATVEC_MAX_N rows */
    uint16_t *w16, *x16;           /* owned: device f16 weights and activations of the matmul */
};

static int call_matvec(void *arg, int i)
{
    struct bench_case *c = arg;
    return gpu_matvec(c->type, c->w[i % c->n_copies], c->row_bytes, c->rows, c->cols, c->x, c->cols,
                      c->n, c->y, c->rows);
}

static int call_matvec_q8(void *arg, int i)
{
    struct bench_case *c = arg;
    return gpu_matvec_q8(c->type, c->w[i % c->n_copies], c->row_bytes, c->rows, c->cols, c->q8,
                         c->n, c->y, c->rows);
}

static int call_act_q8(void *arg, int i)
{
    struct bench_case *c = arg;
    (void)i;
    return gpu_act_q8(executor_vec_dot_type(c->type), c->x, c->cols, 1, c->cols, c->q8);
}

static int call_dequant(void *arg, int i)
{
    struct bench_case *c = arg;
    return gpu_dequant_rows(c->type, c->w[i % c->n_copies], c->row_bytes, c->cols, NULL, c->rows,
                            c->w16, c->cols, true);
}

static int call_convert(void *arg, int i)
{
    struct bench_case *c = arg;
    (void)i;
    return gpu_f32_to_f16(c->x, c->cols, BENCH_TOKENS, c->cols, c->x16);
}

static int call_gemm(void *arg, int i)
{
    struct bench_case *c = arg;
    (void)i;
    return gpu_gemm_f16(c->w16, c->rows, c->cols, c->x16, BENCH_TOKENS, c->y, c->rows);
}

static void bench_one(uint32_t type, int64_t rows, int64_t cols)
{
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    struct bench_case                   c = {.type = type, .rows = rows, .cols = cols};
    c.row_bytes = (size_t)(cols / ti->blck) * ti->type_size;
    c.bytes = c.row_bytes * (size_t)rows;
    c.n_copies = (int)((BENCH_L2_SPAN + c.bytes - 1) / c.bytes);
    if (c.n_copies > BENCH_MAX_COPIES)
        c.n_copies = BENCH_MAX_COPIES;

    /* BENCH_TILE_ROWS rows of Gaussian weights, quantized and repeated down the matrix. */
    float   *src = xmalloc((size_t)(BENCH_TILE_ROWS * cols) * sizeof(float));
    uint8_t *host = xmalloc(c.bytes);
    for (int64_t i = 0; i < BENCH_TILE_ROWS * cols; i++)
        src[i] = 0.02f * rng_gauss();
    for (int64_t r = 0; r < BENCH_TILE_ROWS; r++)
        if (executor_quantize_row_ref(type, src + r * cols, host + (size_t)r * c.row_bytes, cols) !=
            0) {
            fprintf(stderr, "cannot quantize to %s\n", ti->name);
            exit(1);
        }
    for (int64_t r = BENCH_TILE_ROWS; r < rows; r++)
        memcpy(host + (size_t)r * c.row_bytes, host + (size_t)(r % BENCH_TILE_ROWS) * c.row_bytes,
               c.row_bytes);
    for (int k = 0; k < c.n_copies; k++) {
        c.w[k] = dev_alloc(c.bytes);
        check(gpu_upload(c.w[k], host, c.bytes), "upload");
    }
    float *xh = xmalloc((size_t)(BENCH_TOKENS * cols) * sizeof(float));
    for (int64_t i = 0; i < BENCH_TOKENS * cols; i++)
        xh[i] = rng_gauss();
    c.x = dev_alloc((size_t)(BENCH_TOKENS * cols) * sizeof(float));
    check(gpu_upload(c.x, xh, (size_t)(BENCH_TOKENS * cols) * sizeof(float)), "upload");
    c.y = dev_alloc((size_t)(BENCH_TOKENS * rows) * sizeof(float));
    c.w16 = dev_alloc((size_t)(rows * cols) * sizeof(uint16_t));
    c.x16 = dev_alloc((size_t)(BENCH_TOKENS * cols) * sizeof(uint16_t));

    double gbs[2], gbq[2] = {0, 0}, t_act = 0;
    for (int k = 0; k < 2; k++) {
        c.n = k == 0 ? 1 : 4;
        gbs[k] = (double)c.bytes / time_calls(call_matvec, &c, "gpu_matvec") * 1e-9;
    }
    if (gpu_matvec_q8_supported(type)) {
        c.q8 = dev_alloc(GPU_MATVEC_MAX_N * gpu_q8_row_bytes(cols));
        check(gpu_act_q8(executor_vec_dot_type(type), c.x, cols, GPU_MATVEC_MAX_N, cols, c.q8),
              "gpu_act_q8");
        for (int k = 0; k < 2; k++) {
            c.n = k == 0 ? 1 : 4;
            gbq[k] = (double)c.bytes / time_calls(call_matvec_q8, &c, "gpu_matvec_q8") * 1e-9;
        }
        t_act = time_calls(call_act_q8, &c, "gpu_act_q8");
    }
    const double t_dq = time_calls(call_dequant, &c, "gpu_dequant_rows");
    const double t_cv = time_calls(call_convert, &c, "gpu_f32_to_f16");
    const double t_mm = time_calls(call_gemm, &c, "gpu_gemm_f16");
    const double flop = 2.0 * (double)rows * (double)cols * BENCH_TOKENS;
    printf("%-5s %5lld x %5lld %6.1f MiB  matvec f32 x: n=1 %6.1f n=4 %6.1f GB/s  int8 x: n=1 "
           "%6.1f n=4 %6.1f GB/s, act_q8 %5.1f us  dequant->f16 %6.3f ms  gemm %6.3f ms "
           "%5.1f TFLOP/s, prefill path %5.1f\n",
           ti->name, (long long)rows, (long long)cols, (double)c.bytes / 1048576.0, gbs[0], gbs[1],
           gbq[0], gbq[1], t_act * 1e6, t_dq * 1e3, t_mm * 1e3, flop / t_mm * 1e-12,
           flop / (t_dq + t_cv + t_mm) * 1e-12);
    fflush(stdout);

    for (int k = 0; k < c.n_copies; k++)
        gpu_free(c.w[k]);
    gpu_free(c.x);
    gpu_free(c.q8);
    gpu_free(c.y);
    gpu_free(c.w16);
    gpu_free(c.x16);
    free(src);
    free(host);
    free(xh);
}

int main(int argc, char **argv)
{
    static const uint32_t types[] = {
        COMMON_GGML_TYPE_F32,  COMMON_GGML_TYPE_F16,  COMMON_GGML_TYPE_BF16, COMMON_GGML_TYPE_Q8_0,
        COMMON_GGML_TYPE_Q4_0, COMMON_GGML_TYPE_Q4_1, COMMON_GGML_TYPE_Q5_0, COMMON_GGML_TYPE_Q5_1,
        COMMON_GGML_TYPE_Q4_K, COMMON_GGML_TYPE_Q5_K, COMMON_GGML_TYPE_Q6_K};
    static const int64_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
    const int            dev = argc > 1 ? atoi(argv[1]) : 0;
    char                 why[256] = "";
    struct gpu_info      info;
    if (gpu_device_count(why, sizeof(why)) <= 0) {
        fprintf(stderr, "no CUDA device: %s\n", why);
        return 1;
    }
    if (gpu_select(dev, &info, why, sizeof(why)) != 0) {
        fprintf(stderr, "gpu_select(%d): %s\n", dev, why);
        return 1;
    }
    printf("%s (sm_%d%d, %d SMs, %.1f GiB)\n", info.name, info.cc_major, info.cc_minor, info.n_sm,
           (double)info.total_bytes / 1073741824.0);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
            bench_one(types[t], shapes[s][0], shapes[s][1]);
    return 0;
}
