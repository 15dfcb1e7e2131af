/* executor/kernels/kernels.h - private to executor/: quantize, dequantize and dot kernels. */
#ifndef EXECUTOR_KERNELS_KERNELS_H
#define EXECUTOR_KERNELS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "executor.h"

/* fp16 / bf16 conversions (IEEE half, round to nearest even; bf16 rounds to nearest even). */
float    executor_fp16_to_fp32(uint16_t h);
uint16_t executor_fp32_to_fp16(float f);
float    executor_bf16_to_fp32(uint16_t h);
uint16_t executor_fp32_to_bf16(float f);

/* True when the kernels can dequantize and dot-multiply weights of `type`. */
bool executor_type_is_supported(uint32_t type);

/* Quantizes `n` floats (a multiple of the type's block size) into `dst` with the reference
 * algorithm (byte-identical to llama.cpp's quantize_row_*_ref for F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_1, Q8_K, TQ1_0, TQ2_0; a valid quantization for the K-quants). The I2_S layouts
 * (no llama.cpp counterpart): I2S_Q128 takes the ternary values themselves (code 2 above 0.5, 0
 * below -0.5, else 1; no scale), I2S_B32H/B32F scale each 32 by d = absmax (f16 / f32) and store
 * clamp(lroundf(x / d), -1, 1) + 1. Returns 0 or COMMON_EINVAL. */
int executor_quantize_row_ref(uint32_t type, const float *src, void *dst, int64_t n);

/* As executor_quantize_row_ref, except that Q4_K and Q5_K take each 32's scale and min from its
 * minimum and maximum, without the error search (about ten times faster, a coarser but valid
 * quantization): for large benchmark models of random weights. */
int executor_quantize_row_quick(uint32_t type, const float *src, void *dst, int64_t n);

/* Expands `n` elements of a row of `type` into floats. Returns 0 or COMMON_EINVAL. */
int executor_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);

/* The type llama.cpp converts activations to before a dot product with weights of `type`
 * (Q8_0 for Q4_0/Q5_0/Q8_0/MXFP4 and the I2_S layouts, Q8_1 for Q4_1/Q5_1, Q8_K for K-quants and
 * TQ1_0/TQ2_0, F16 for F16, BF16 for BF16, F32 for F32). */
uint32_t executor_vec_dot_type(uint32_t type);

/* Converts `n` activations to executor_vec_dot_type(type) into `dst` (the active kernel set).
 * Returns 0 or COMMON_EINVAL. */
int executor_quantize_act(uint32_t weight_type, const float *x, void *dst, int64_t n);

/* Dot product of one weight row of `type` with activations already converted by
 * executor_quantize_act(type, ...), both of `n` elements (active kernel set). I2S_Q128 rows carry
 * no scale: the caller multiplies the result by the tensor's scale. */
float executor_vec_dot(uint32_t type, int64_t n, const void *w_row, const void *act);

/* Same, always with the scalar reference; for tests. */
float executor_vec_dot_ref(uint32_t type, int64_t n, const void *w_row, const void *act);
int   executor_quantize_act_ref(uint32_t weight_type, const float *x, void *dst, int64_t n);

/* Notes common to the functions above and below:
 * - `n` (or `n_cols`) must be >= 0 and a multiple of the block size of both the weight type and
 *   its activation type (32 for Q4_0..Q8_0, I2S_B32H/B32F, 128 for I2S_Q128, 256 for K-quants,
 *   TQ1_0 and TQ2_0); anything else is COMMON_EINVAL (executor_vec_dot and executor_vec_dot_ref
 *   return NAN instead). Nothing reads past n.
 * - Weight rows must be 2-byte aligned (4 for F32), activation buffers 4-byte aligned, as GGUF
 *   data (32-byte aligned offsets, even block sizes) and malloc'd buffers are.
 * - Every kernel is pure: thread-safe on distinct outputs once executor_kernels_init() ran.
 * - Activations of Q8_0/Q8_1 are made as llama.cpp's x86 CPU backend makes them (scale 127/amax,
 *   round half to even), which differs from the weight quantizer quantize_row_q8_0_ref
 *   (1/d, round half away from zero); both are byte-identical to their llama.cpp counterparts. */

/* Bytes that executor_quantize_act(weight_type, ...) writes for `n` activations, or 0 when the
 * type is unsupported or n is not a valid length. */
size_t executor_act_row_size(uint32_t weight_type, int64_t n);

/* Matrix-vector product over a row range, with the active kernel set:
 *   y[r] = dot(row r, act)  for row0 <= r < row1,
 * where row r starts at (const char *)w + r * row_bytes and holds n_cols elements of `type`, and
 * `act` holds n_cols activations converted by executor_quantize_act(type, ...). `y` is the whole
 * output vector (indexed by absolute row), so threads can split [0, n_rows) into disjoint ranges
 * and share w, act and y. row_bytes must be at least the row size of n_cols elements.
 * Returns 0, or COMMON_EINVAL (unsupported type, bad n_cols, row0 > row1, negative rows, short
 * row_bytes, NULL pointers with a non-empty range). */
int executor_matvec(uint32_t type, int64_t n_cols, const void *w, size_t row_bytes, int64_t row0,
                    int64_t row1, const void *act, float *y);

/* Matrix times several activation vectors (prefill), with the active kernel set:
 *   y[j * y_stride + r] = dot(row r, act_j)  for row0 <= r < row1, 0 <= j < n_act,
 * where act_j starts at (const char *)act + j * act_stride (bytes; at least
 * executor_act_row_size(type, n_cols)) and y_stride counts floats (>= row1). Rows are processed
 * in tiles that stay in L1/L2 while every activation passes over them, so each weight byte is
 * read from memory once. Same returns as executor_matvec() (also COMMON_EINVAL for n_act < 0 or
 * a short act_stride / y_stride). */
int executor_matmul(uint32_t type, int64_t n_cols, const void *w, size_t row_bytes, int64_t row0,
                    int64_t row1, const void *act, size_t act_stride, int64_t n_act, float *y,
                    size_t y_stride);

/* Weighted sums of F16 rows, added to m output rows (the values of latent attention, where every
 * head of a token reads the same cached rows):
 *   y[j * y_stride + d] += sum over i = 0, 1, .. k-1 of a[j * a_stride + i] * x_i[d]
 * for 0 <= j < m, 0 <= d < n, with row x_i at (const char *)x + i * x_stride (n halves). Each
 * product is rounded to f32 before its sum and the sums run in order of i, so every kernel set
 * gives the bits of the scalar loop `y += a * x`. Returns 0, or COMMON_EINVAL (negative sizes,
 * a_stride < k or y_stride < n with m > 1, NULL pointers with work to do). */
int executor_wsum_f16(int64_t n, int64_t k, const uint16_t *x, size_t x_stride, const float *a,
                      size_t a_stride, int64_t m, float *y, size_t y_stride);

/* Same, always with the scalar reference; for tests. */
int executor_wsum_f16_ref(int64_t n, int64_t k, const uint16_t *x, size_t x_stride, const float *a,
                          size_t a_stride, int64_t m, float *y, size_t y_stride);

#endif /* EXECUTOR_KERNELS_KERNELS_H */
