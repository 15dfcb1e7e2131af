/* executor/kernels/kernels.h - quantize, dequantize and dot-product kernels for every weight type. */
#ifndef EXECUTOR_KERNELS_KERNELS_H
#define EXECUTOR_KERNELS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CPU features that pick the kernel set. */
struct executor_cpu_features {
    bool avx2;
    bool fma;
    bool f16c;
    bool avx512f;
    bool avx512bw;
    bool avx512vl;
    bool avx512vnni;
    bool avx512bf16;
};

/* Kernel sets, from slowest to fastest. */
enum executor_isa {
    EXECUTOR_ISA_REF = 0, /* portable scalar reference (kernels/ref.c) */
    EXECUTOR_ISA_AVX2,    /* AVX2 + FMA + F16C (kernels/avx2.c) */
    EXECUTOR_ISA_AVX512,  /* AVX-512 F/BW/VL (+VNNI where present) (kernels/avx512.c) */
};

/* Detects the CPU once and selects the fastest supported kernel set (process singleton; call
 * before threads start; later calls are no-ops). */
void executor_kernels_init(void);
/* Features found by executor_kernels_init(). */
const struct executor_cpu_features *executor_cpu_features(void);
/* Forces a kernel set (tests, benchmarks, --isa flag). Returns 0, or COMMON_ENOTSUP when the CPU
 * lacks it. Not thread-safe: call while no kernel runs. */
int executor_kernels_select(enum executor_isa isa);
enum executor_isa executor_kernels_active(void);
const char       *executor_isa_name(enum executor_isa isa);

/* fp16 / bf16 conversions (IEEE half, round to nearest even; bf16 rounds to nearest even). */
float    executor_fp16_to_fp32(uint16_t h);
uint16_t executor_fp32_to_fp16(float f);
float    executor_bf16_to_fp32(uint16_t h);
uint16_t executor_fp32_to_bf16(float f);

/* True when the kernels can dequantize and dot-multiply weights of `type`. */
bool executor_type_is_supported(uint32_t type);

/* Quantizes `n` floats (a multiple of the type's block size) into `dst` with the reference
 * algorithm (byte-identical to llama.cpp's quantize_row_*_ref for F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_1, Q8_K; a valid quantization for the K-quants). Returns 0 or COMMON_EINVAL. */
int executor_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n);

/* Expands `n` elements of a row of `type` into floats. Returns 0 or COMMON_EINVAL. */
int executor_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);

/* The type llama.cpp converts activations to before a dot product with weights of `type`
 * (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for K-quants, F16 for F16, BF16 for BF16,
 * F32 for F32). */
uint32_t executor_vec_dot_type(uint32_t type);

/* Converts `n` activations to executor_vec_dot_type(type) into `dst` (the active kernel set).
 * Returns 0 or COMMON_EINVAL. */
int executor_quantize_act(uint32_t weight_type, const float *x, void *dst, int64_t n);

/* Dot product of one weight row of `type` with activations already converted by
 * executor_quantize_act(type, ...), both of `n` elements (active kernel set). */
float executor_vec_dot(uint32_t type, int64_t n, const void *w_row, const void *act);

/* Same, always with the scalar reference; for tests. */
float executor_vec_dot_ref(uint32_t type, int64_t n, const void *w_row, const void *act);
int   executor_quantize_act_ref(uint32_t weight_type, const float *x, void *dst, int64_t n);

#endif /* EXECUTOR_KERNELS_KERNELS_H */
