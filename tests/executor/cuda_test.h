/* tests/executor/cuda_test.h - what the device kernel suites (test_cuda_*.c) share: a seeded
 * random source, device buffers poisoned before use (all-ones bytes: NaN floats), and the skip
 * without a device. ctest runs each suite on the CUDA device (skipped without one) and, as
 * <suite>_host, on the host backend (executor/gpu_host.c). Define CUDA_TEST_SEED before
 * including it. */
#ifndef TESTS_EXECUTOR_CUDA_TEST_H
#define TESTS_EXECUTOR_CUDA_TEST_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpu.h"

#define CUDA_TEST_POISON 0xffu /* gpu_memset byte of outputs: all-ones floats are NaN */

static uint64_t t_rng = CUDA_TEST_SEED;

static inline uint64_t rng_next(void)
{
    uint64_t z = (t_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline float rng_uniform(void)
{
    return (float)((double)(rng_next() >> 11) * 0x1p-53);
}

static inline float rng_gauss(void)
{
    float u1 = rng_uniform(), u2 = rng_uniform();
    if (u1 < 1e-12f)
        u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* Gaussian data whose scale changes every 64 elements, with rare outliers. */
static inline void fill_data(float *x, size_t n)
{
    float scale = 1.0f;
    for (size_t i = 0; i < n; i++) {
        if (i % 64 == 0)
            scale = 0.01f + 2.0f * rng_uniform();
        x[i] = scale * rng_gauss();
        if (rng_next() % 97 == 0)
            x[i] *= 6.0f;
    }
}

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert_not_null(p, "malloc(%zu)", bytes);
    return p;
}

static inline bool is_poison(const void *p)
{
    uint32_t u;
    memcpy(&u, p, sizeof(u));
    return u == 0xffffffffu;
}

/* Skips the test without a device, else selects device 0. */
static inline void gpu_or_skip(void)
{
    char why[256] = "";
    if (gpu_device_count(why, sizeof(why)) <= 0)
        cr_skip_test("no device (%s; SLUICE_GPU_BACKEND=host runs these on the host backend): "
                     "skipped",
                     why);
    struct gpu_info info;
    cr_assert_eq(gpu_select(0, &info, why, sizeof(why)), 0, "gpu_select(0): %s", why);
}

/* Device memory of `bytes`, every byte CUDA_TEST_POISON. */
static inline void *dev_poisoned(size_t bytes)
{
    void *p = gpu_malloc(bytes ? bytes : 1);
    cr_assert_not_null(p, "gpu_malloc(%zu): %s", bytes, gpu_last_error());
    cr_assert_eq(gpu_memset(p, (int)CUDA_TEST_POISON, bytes ? bytes : 1), 0, "gpu_memset: %s",
                 gpu_last_error());
    return p;
}

/* Device copy of `bytes` of host memory. */
static inline void *dev_from(const void *host, size_t bytes)
{
    void *p = dev_poisoned(bytes);
    cr_assert_eq(gpu_upload(p, host, bytes), 0, "gpu_upload: %s", gpu_last_error());
    return p;
}

/* Waits for the queued kernels (failing on a kernel error), then copies device memory back. */
static inline void dev_to(void *host, const void *dev, size_t bytes)
{
    cr_assert_eq(gpu_sync(), 0, "a kernel failed: %s", gpu_last_error());
    cr_assert_eq(gpu_download(host, dev, bytes), 0, "gpu_download: %s", gpu_last_error());
}

#endif /* TESTS_EXECUTOR_CUDA_TEST_H */
