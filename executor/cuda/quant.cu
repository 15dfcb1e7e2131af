/* executor/cuda/quant.cu - weight kernels: dequantize rows, matvec (plain and by expert ids),
 * f32 -> f16 and the tensor-core f16 matmul of prefill. */
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <mma.h>
#include <stdint.h>

#include <type_traits>

#include "common.h"
#include "gpu_impl.cuh"

/* Every weight type is read in chunks of 32 elements: a block of Q4_0 .. Q8_0, sub-block c % 8 of
 * super-block c / 8 for the K-quants, 32 consecutive values of F32/F16/BF16. Four lanes share a
 * chunk: lane s (0..3) takes elements 4s..4s+3 (the "low four") and 16+4s..16+4s+3 (the "high
 * four"), the two runs that one 4-byte word of nibbles holds in Q4_0's layout. The layouts and
 * formulas are those of executor/kernels/ref.c (ggml's): keep them in step.
 *
 * Blocks are 10, 12, 18, 20, 22, 24, 32, 34, 54, 66, 84, 110, 144, 176 or 210 bytes, so only 2-byte
 * alignment holds for every block start (weight rows are 2-byte aligned, as on the CPU): quantized
 * data is read with 16-bit loads, 32-bit words put together from two, except by the A4 kernels,
 * picked where the block size is a multiple of 4 (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, I2S_Q128, I2S_B32F)
 * and the rows are 4-byte aligned, which read words. MXFP4's blocks (17 bytes) start anywhere: they
 * are read a byte at a time. */

#define QK            32  /* elements per chunk, and per block of Q4_0 .. Q8_0 */
#define MV_WARPS      4   /* warps per matvec block */
#define DQ_THREADS    256 /* threads per dequantize block */
#define CV_THREADS    256 /* threads per f32 -> f16 block */
#define GRID_Y_MAX    65535
#define MAGIC_F       8388608.0f /* 2^23: a float with 0x4b000000 | b in its bits is 2^23 + b */
#define MAGIC_U       0x4b000000u
#define NIBBLES       0x0f0f0f0fu
#define BYTE_LOW_BITS 0x01010101u

/* ---- per-type layout ------------------------------------------------------------------------ */

/* blck: elements per block; bytes: per block; has_min: value = d * q + m (else d * q); split: the
 * low four and the high four have their own scale (Q6_K: one per 16 elements); flt: the chunk's
 * values are the weights themselves (F32, F16, BF16). */
template <int T> struct qtype;
#define QTYPE(t, bl, by, mn, sp, fl)                                                               \
    template <> struct qtype<t> {                                                                  \
        static constexpr int  blck = bl, bytes = by;                                               \
        static constexpr bool has_min = mn, split = sp, flt = fl;                                  \
    }
QTYPE(COMMON_GGML_TYPE_F32, 1, 4, false, false, true);
QTYPE(COMMON_GGML_TYPE_F16, 1, 2, false, false, true);
QTYPE(COMMON_GGML_TYPE_BF16, 1, 2, false, false, true);
QTYPE(COMMON_GGML_TYPE_Q4_0, 32, 18, false, false, false);
QTYPE(COMMON_GGML_TYPE_Q4_1, 32, 20, true, false, false);
QTYPE(COMMON_GGML_TYPE_Q5_0, 32, 22, false, false, false);
QTYPE(COMMON_GGML_TYPE_Q5_1, 32, 24, true, false, false);
QTYPE(COMMON_GGML_TYPE_Q8_0, 32, 34, false, false, false);
QTYPE(COMMON_GGML_TYPE_Q2_K, 256, 84, true, true, false);
QTYPE(COMMON_GGML_TYPE_Q3_K, 256, 110, false, true, false);
QTYPE(COMMON_GGML_TYPE_Q4_K, 256, 144, true, false, false);
QTYPE(COMMON_GGML_TYPE_Q5_K, 256, 176, true, false, false);
QTYPE(COMMON_GGML_TYPE_Q6_K, 256, 210, false, true, false);
QTYPE(COMMON_GGML_TYPE_MXFP4, 32, 17, false, false, false);
QTYPE(COMMON_GGML_TYPE_TQ1_0, 256, 54, false, false, false);
QTYPE(COMMON_GGML_TYPE_TQ2_0, 256, 66, false, false, false);
QTYPE(COMMON_GGML_TYPE_I2S_Q128, 128, 32, false, false, false);
QTYPE(COMMON_GGML_TYPE_I2S_B32H, 32, 10, false, false, false);
QTYPE(COMMON_GGML_TYPE_I2S_B32F, 32, 12, false, false, false);
#undef QTYPE

/* Q2_K's low and high four have a min each too (m0, m1; wq8's m and m1). */
template <int T> static constexpr __host__ __device__ bool split_min()
{
    return T == COMMON_GGML_TYPE_Q2_K;
}

/* One lane's eight elements of a chunk: q[0..3] are elements 4s..4s+3, q[4..7] 16+4s..16+4s+3.
 * Quantized types: q holds small integers exactly and element i is d * q[i] (+ m) with d0/m0 for
 * the low four, d1/m1 for the high four (equal unless split). Float types: q holds the values. */
struct sub8 {
    float q[8];
    float d0, d1, m0, m1;
};

/* ---- loads and bit tricks -------------------------------------------------------------------- */

static __device__ __forceinline__ uint32_t ld16(const uint8_t *p)
{
    return __ldg(reinterpret_cast<const unsigned short *>(p));
}

/* A little-endian 32-bit word at a 2-byte aligned address. */
static __device__ __forceinline__ uint32_t ld32(const uint8_t *p)
{
    return ld16(p) | (ld16(p + 2) << 16);
}

/* A little-endian 32-bit word at any address (MXFP4's 17-byte blocks): four byte loads. */
static __device__ __forceinline__ uint32_t ld32u(const uint8_t *p)
{
    return static_cast<uint32_t>(__ldg(p)) | static_cast<uint32_t>(__ldg(p + 1)) << 8 |
           static_cast<uint32_t>(__ldg(p + 2)) << 16 | static_cast<uint32_t>(__ldg(p + 3)) << 24;
}

/* The same where a4 says the address is 4-byte aligned: one load. */
static __device__ __forceinline__ uint32_t ld32a(const uint8_t *p, bool a4)
{
    return a4 ? __ldg(reinterpret_cast<const unsigned int *>(p)) : ld32(p);
}

static __device__ __forceinline__ float f16_to_f32(uint32_t h)
{
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

static __device__ __forceinline__ float bf16_to_f32(uint32_t h)
{
    return __uint_as_float(h << 16);
}

/* Byte k of v, an unsigned 0..255, minus `off`, as an exact float: the byte goes into the
 * mantissa of 2^23 (one PRMT) and one add takes 2^23 + off away, cheaper than an int-to-float
 * conversion. */
static __device__ __forceinline__ float byte_f(uint32_t v, int k, float off)
{
    return __uint_as_float(__byte_perm(v, MAGIC_U, 0x7440u | static_cast<uint32_t>(k))) -
           (MAGIC_F + off);
}

/* Bits 0..3 of b into bit 0 of bytes 0..3 (the four shifted copies do not overlap). */
static __device__ __forceinline__ uint32_t spread4(uint32_t b)
{
    return ((b & 0xfu) * 0x00204081u) & BYTE_LOW_BITS;
}

/* The low four from the bytes of lo, the high four from hi, each minus off. */
static __device__ __forceinline__ void bytes8(sub8 &o, uint32_t lo, uint32_t hi, float off)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o.q[i] = byte_f(lo, i, off);
        o.q[4 + i] = byte_f(hi, i, off);
    }
}

/* Scale j (0..7) and min j of a Q4_K/Q5_K block's 12 packed bytes at q (ggml's
 * get_scale_min_k4). */
static __device__ __forceinline__ void scale_min_k4(const uint8_t *q, bool a4, int j, uint32_t &sc,
                                                    uint32_t &m)
{
    const uint32_t a = ld32a(q, a4), b = ld32a(q + 4, a4), c = ld32a(q + 8, a4); /* bytes 0-3.. */
    const int      sh = 8 * (j & 3);
    if (j < 4) {
        sc = (a >> sh) & 63;
        m = (b >> sh) & 63;
    } else {
        sc = ((c >> sh) & 0xf) | (((a >> sh) >> 6 & 3) << 4);
        m = ((c >> sh) >> 4 & 0xf) | (((b >> sh) >> 6 & 3) << 4);
    }
}

/* ---- chunk decoders: lane s's eight elements of chunk c of a row ---------------------------- */

template <int T>
static __device__ __forceinline__ void decode8(const uint8_t *row, int64_t c, int s, sub8 &o,
                                               bool a4);

/* Float types: the runs are 16 (F32) or 8 (F16/BF16) bytes, read whole where aligned. */
template <>
__device__ __forceinline__ void decode8<COMMON_GGML_TYPE_F32>(const uint8_t *row, int64_t c, int s,
                                                              sub8 &o, bool /* a4 */)
{
    const float *p = reinterpret_cast<const float *>(row) + c * QK + 4 * s;
    if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
        const float4 a = __ldg(reinterpret_cast<const float4 *>(p));
        const float4 b = __ldg(reinterpret_cast<const float4 *>(p + 16));
        o.q[0] = a.x, o.q[1] = a.y, o.q[2] = a.z, o.q[3] = a.w;
        o.q[4] = b.x, o.q[5] = b.y, o.q[6] = b.z, o.q[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o.q[i] = __ldg(p + i);
            o.q[4 + i] = __ldg(p + 16 + i);
        }
    }
}

/* The eight 16-bit values of lane s in chunk c of an F16/BF16 row. */
static __device__ __forceinline__ void halves8(const uint8_t *row, int64_t c, int s, uint32_t h[8])
{
    const unsigned short *p = reinterpret_cast<const unsigned short *>(row) + c * QK + 4 * s;
    if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
        const uint2 a = __ldg(reinterpret_cast<const uint2 *>(p));
        const uint2 b = __ldg(reinterpret_cast<const uint2 *>(p + 16));
        h[0] = a.x & 0xffff, h[1] = a.x >> 16, h[2] = a.y & 0xffff, h[3] = a.y >> 16;
        h[4] = b.x & 0xffff, h[5] = b.x >> 16, h[6] = b.y & 0xffff, h[7] = b.y >> 16;
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            h[i] = __ldg(p + i);
            h[4 + i] = __ldg(p + 16 + i);
        }
    }
}

template <>
__device__ __forceinline__ void decode8<COMMON_GGML_TYPE_F16>(const uint8_t *row, int64_t c, int s,
                                                              sub8 &o, bool /* a4 */)
{
    uint32_t h[8];
    halves8(row, c, s, h);
#pragma unroll
    for (int i = 0; i < 8; i++)
        o.q[i] = f16_to_f32(h[i]);
}

template <>
__device__ __forceinline__ void decode8<COMMON_GGML_TYPE_BF16>(const uint8_t *row, int64_t c, int s,
                                                               sub8 &o, bool /* a4 */)
{
    uint32_t h[8];
    halves8(row, c, s, h);
#pragma unroll
    for (int i = 0; i < 8; i++)
        o.q[i] = bf16_to_f32(h[i]);
}

/* One lane's eight quants of a chunk of a quantized type, as two words of bytes: lo holds
 * elements 4s..4s+3, hi 16+4s..16+4s+3, each byte the stored quant (unsigned; Q8_0's signed),
 * with the scales of the low and high four (d0, d1: equal unless split) and the min (has_min:
 * value = d * q + m). The value of a byte q is d * (q - qoff<T>()) (+ m). */
struct wq8 {
    uint32_t lo, hi;
    float    d0, d1, m;
    float    m1; /* split_min: the high four's min (m the low four's) */
};

template <int T> static constexpr __host__ __device__ int qoff()
{
    return T == COMMON_GGML_TYPE_Q4_0                                   ? 8
           : T == COMMON_GGML_TYPE_Q3_K                                 ? 4
           : T == COMMON_GGML_TYPE_Q5_0                                 ? 16
           : T == COMMON_GGML_TYPE_Q6_K                                 ? 32
           : T == COMMON_GGML_TYPE_TQ1_0 || T == COMMON_GGML_TYPE_TQ2_0 ? 1
           : T == COMMON_GGML_TYPE_I2S_Q128 || T == COMMON_GGML_TYPE_I2S_B32H ||
                   T == COMMON_GGML_TYPE_I2S_B32F
               ? 1
               : 0;
}

template <int T>
static __device__ __forceinline__ void decodeq(const uint8_t *row, int64_t c, int s, wq8 &o,
                                               bool a4);

/* Q4_0 (18 bytes): d, qs[16]; element j in the low nibble of qs[j], j + 16 in the high. Value
 * (q - 8) * d. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q4_0>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool /* a4 */)
{
    const uint8_t *b = row + c * 18;
    const uint32_t qs = ld32(b + 2 + 4 * s);
    o.d0 = o.d1 = f16_to_f32(ld16(b));
    o.m = 0.0f;
    o.lo = qs & NIBBLES;
    o.hi = (qs >> 4) & NIBBLES;
}

/* Q4_1 (20 bytes): d, m, qs[16] as Q4_0. Value q * d + m. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q4_1>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool a4)
{
    const uint8_t *b = row + c * 20;
    const uint32_t dm = ld32a(b, a4), qs = ld32a(b + 4 + 4 * s, a4);
    o.d0 = o.d1 = f16_to_f32(dm & 0xffff);
    o.m = f16_to_f32(dm >> 16);
    o.lo = qs & NIBBLES;
    o.hi = (qs >> 4) & NIBBLES;
}

/* Q5_0 (22 bytes): d, qh (bit j: 5th bit of element j), qs[16] as Q4_0. Value (q - 16) * d. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q5_0>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool /* a4 */)
{
    const uint8_t *b = row + c * 22;
    const uint32_t qh = ld32(b + 2);
    const uint32_t qs = ld32(b + 6 + 4 * s);
    o.d0 = o.d1 = f16_to_f32(ld16(b));
    o.m = 0.0f;
    o.lo = (qs & NIBBLES) | spread4(qh >> (4 * s)) << 4;
    o.hi = ((qs >> 4) & NIBBLES) | spread4(qh >> (16 + 4 * s)) << 4;
}

/* Q5_1 (24 bytes): d, m, qh, qs[16] as Q5_0. Value q * d + m. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q5_1>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool a4)
{
    const uint8_t *b = row + c * 24;
    const uint32_t dm = ld32a(b, a4), qh = ld32a(b + 4, a4), qs = ld32a(b + 8 + 4 * s, a4);
    o.d0 = o.d1 = f16_to_f32(dm & 0xffff);
    o.m = f16_to_f32(dm >> 16);
    o.lo = (qs & NIBBLES) | spread4(qh >> (4 * s)) << 4;
    o.hi = ((qs >> 4) & NIBBLES) | spread4(qh >> (16 + 4 * s)) << 4;
}

/* Q8_0 (34 bytes): d, qs[32] signed. Value q * d. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q8_0>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool /* a4 */)
{
    const uint8_t *b = row + c * 34;
    o.lo = ld32(b + 2 + 4 * s);
    o.hi = ld32(b + 18 + 4 * s);
    o.d0 = o.d1 = f16_to_f32(ld16(b));
    o.m = 0.0f;
}

/* Four nibbles (bytes of v, 0..15) through MXFP4's table of doubled e2m1 values {0, 1, 2, 3, 4,
 * 6, 8, 12, then the same negated}, as four signed bytes: byte_perm picks each byte from the
 * positive half by the nibble's low three bits, and from the negative half where bit 3 is set. */
static __device__ __forceinline__ uint32_t mxfp4_bytes(uint32_t v)
{
    const uint32_t s = v & 0x07070707u;
    const uint32_t sel = (s & 0x7u) | (s >> 4 & 0x70u) | (s >> 8 & 0x700u) | (s >> 12 & 0x7000u);
    const uint32_t pos = __byte_perm(0x03020100u, 0x0c080604u, sel);
    const uint32_t neg = __byte_perm(0xfdfeff00u, 0xf4f8fafcu, sel);
    const uint32_t m = (v >> 3 & 0x01010101u) * 0xffu; /* 0xff where the sign bit is set */
    return (pos & ~m) | (neg & m);
}

/* MXFP4 (17 bytes): e (E8M0), qs[16]; element j in the low nibble of qs[j], j + 16 in the high.
 * Value table[q] * 2^(e - 128) (the table doubled, the scale halved, as the CPU's
 * kimpl_e8m0_half: subnormal for e < 2). Blocks at any address: byte loads. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_MXFP4>(const uint8_t *row, int64_t c,
                                                                int s, wq8 &o, bool /* a4 */)
{
    const uint8_t *b = row + c * 17;
    const uint32_t e = __ldg(b), qs = ld32u(b + 1 + 4 * s);
    o.d0 = o.d1 = __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
    o.m = 0.0f;
    o.lo = mxfp4_bytes(qs & NIBBLES);
    o.hi = mxfp4_bytes((qs >> 4) & NIBBLES);
}

/* Q2_K (84 bytes): scales[16] (per 16 elements: the scale in the low nibble, the min in the
 * high), qs[64], d, dmin. Chunk j (0..7) lies in half h = j / 4 (128 elements): its element l
 * (< 16) is bits 2k, 2k + 1 (k = j % 4) of qs[32h + l] with scales[8h + 2k], element 16 + l those
 * of qs[32h + 16 + l] with scales[8h + 2k + 1]; value (d * sc) * q - dmin * m. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q2_K>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool a4)
{
    const uint8_t *b = row + (c >> 3) * 84;
    const int      j = static_cast<int>(c & 7), h = j >> 2, k = j & 3;
    const uint8_t *qs = b + 16 + 32 * h + 4 * s;
    const uint32_t lo = ld32a(qs, a4), hi = ld32a(qs + 16, a4), dm = ld32a(b + 80, a4);
    const uint32_t sc = ld16(b + 8 * h + 2 * k); /* the low four's byte, then the high four's */
    const float    d = f16_to_f32(dm & 0xffff), dmin = f16_to_f32(dm >> 16);
    o.d0 = __fmul_rn(d, static_cast<float>(sc & 0xf));
    o.d1 = __fmul_rn(d, static_cast<float>(sc >> 8 & 0xf));
    o.m = -__fmul_rn(dmin, static_cast<float>(sc >> 4 & 0xf));
    o.m1 = -__fmul_rn(dmin, static_cast<float>(sc >> 12 & 0xf));
    o.lo = (lo >> (2 * k)) & 0x03030303u;
    o.hi = (hi >> (2 * k)) & 0x03030303u;
}

/* Q3_K (110 bytes): hmask[32], qs[64], scales[12] (16 six-bit, packed), d. Chunk j as Q2_K's:
 * element l takes bits 2k, 2k + 1 of qs[32h + l] and bit 4h + k of hmask[l] (16 + l: of
 * qs[32h + 16 + l] and hmask[16 + l]), the scales 8h + 2k and 8h + 2k + 1; the byte q = the two
 * bits + 4 * the hmask bit, value (d * (scale - 32)) * (q - 4). */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q3_K>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool /* a4 */)
{
    const uint8_t *b = row + (c >> 3) * 110;
    const int      j = static_cast<int>(c & 7), h = j >> 2, k = j & 3;
    const uint8_t *qs = b + 32 + 32 * h + 4 * s;
    const uint32_t lo = ld32(qs), hi = ld32(qs + 16);
    const uint32_t hlo = ld32(b + 4 * s), hhi = ld32(b + 16 + 4 * s);
    const float    d = f16_to_f32(ld16(b + 108));
    /* Scales t = 8h + 2k and t + 1 (kimpl_q3_K_scales): their low four bits are the low (h = 0)
     * or high (h = 1) nibbles of scales[2k], scales[2k + 1], their top two bits bits 2(t >> 2)
     * of scales[8 + (t & 3)] and the byte after it: two 16-bit loads (fewer registers than a
     * byte load per part). */
    const uint32_t w = ld16(b + 96 + 2 * k), u = ld16(b + 104 + 2 * (k & 1));
    const uint32_t sc = ((w >> (4 * h)) & 0x0f0fu) | ((u >> (2 * (2 * h + (k >> 1)))) & 0x0303u)
                                                         << 4;
    o.d0 = __fmul_rn(d, static_cast<float>(static_cast<int>(sc & 0xffu) - 32));
    o.d1 = __fmul_rn(d, static_cast<float>(static_cast<int>(sc >> 8) - 32));
    o.m = 0.0f;
    o.lo = ((lo >> (2 * k)) & 0x03030303u) | ((hlo >> (4 * h + k)) & BYTE_LOW_BITS) << 2;
    o.hi = ((hi >> (2 * k)) & 0x03030303u) | ((hhi >> (4 * h + k)) & BYTE_LOW_BITS) << 2;
}

/* Q4_K (144 bytes): d, dmin, scales[12], qs[128]. Sub-block j (0..7) of 32: element l is the low
 * (j even) or high (j odd) nibble of qs[32 (j / 2) + l]; value (d * sc_j) * q - dmin * m_j. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q4_K>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool a4)
{
    const uint8_t *b = row + (c >> 3) * 144;
    const int      j = static_cast<int>(c & 7);
    const uint8_t *qs = b + 16 + 32 * (j >> 1) + 4 * s;
    const int      sh = 4 * (j & 1);
    const uint32_t lo = ld32a(qs, a4), hi = ld32a(qs + 16, a4), dm = ld32a(b, a4);
    uint32_t       sc, m;
    scale_min_k4(b + 4, a4, j, sc, m);
    o.d0 = o.d1 = __fmul_rn(f16_to_f32(dm & 0xffff), static_cast<float>(sc));
    o.m = -__fmul_rn(f16_to_f32(dm >> 16), static_cast<float>(m));
    o.lo = (lo >> sh) & NIBBLES;
    o.hi = (hi >> sh) & NIBBLES;
}

/* Q5_K (176 bytes): d, dmin, scales[12], qh[32], qs[128]. As Q4_K, plus 16 when bit j of qh[l] is
 * set. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q5_K>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool a4)
{
    const uint8_t *b = row + (c >> 3) * 176;
    const int      j = static_cast<int>(c & 7);
    const uint8_t *qs = b + 48 + 32 * (j >> 1) + 4 * s;
    const uint8_t *qh = b + 16 + 4 * s;
    const int      sh = 4 * (j & 1);
    const uint32_t lo = ld32a(qs, a4), hi = ld32a(qs + 16, a4), dm = ld32a(b, a4);
    const uint32_t hlo = ld32a(qh, a4), hhi = ld32a(qh + 16, a4);
    uint32_t       sc, m;
    scale_min_k4(b + 4, a4, j, sc, m);
    o.d0 = o.d1 = __fmul_rn(f16_to_f32(dm & 0xffff), static_cast<float>(sc));
    o.m = -__fmul_rn(f16_to_f32(dm >> 16), static_cast<float>(m));
    o.lo = ((lo >> sh) & NIBBLES) | ((hlo >> j) & BYTE_LOW_BITS) << 4;
    o.hi = ((hi >> sh) & NIBBLES) | ((hhi >> j) & BYTE_LOW_BITS) << 4;
}

/* Q6_K (210 bytes): ql[128], qh[64], scales[16] (signed), d. Sub-block j = 4h + k lies in half h
 * (128 elements): element l takes nibble (k < 2 low, else high) of ql[64h + 32 (k & 1) + l], bits
 * 2k, 2k+1 of qh[32h + l] above it, and scale[8h + 2k + l / 16]; value (d * scale) * (q - 32). */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_Q6_K>(const uint8_t *row, int64_t c, int s,
                                                               wq8 &o, bool /* a4 */)
{
    const uint8_t *b = row + (c >> 3) * 210;
    const int      j = static_cast<int>(c & 7);
    const int      h = j >> 2, k = j & 3;
    const uint8_t *ql = b + 64 * h + 32 * (k & 1) + 4 * s;
    const uint8_t *qh = b + 128 + 32 * h + 4 * s;
    const int      sh = 4 * (k >> 1);
    const uint32_t lo = ld32(ql), hi = ld32(ql + 16);
    const uint32_t hlo = ld32(qh), hhi = ld32(qh + 16);
    const uint32_t sc = ld16(b + 192 + 8 * h + 2 * k); /* the scales of the low and high four */
    const float    d = f16_to_f32(ld16(b + 208));
    o.d0 = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(sc & 0xff)));
    o.d1 = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(sc >> 8)));
    o.m = 0.0f;
    o.lo = ((lo >> sh) & NIBBLES) | ((hlo >> (2 * k)) & 0x03030303u) << 4;
    o.hi = ((hi >> sh) & NIBBLES) | ((hhi >> (2 * k)) & 0x03030303u) << 4;
}

/* TQ1_0 (54 bytes): qs[48], qh[4], d; five trits a byte of qs, four of qh, base 3 scaled to a
 * byte: trit k of byte b is ((b * 3^k mod 256) * 3) >> 8. Element 32k + m is trit k of qs[m]
 * (k < 5, m < 32), 160 + 16k + m trit k of qs[32 + m] (m < 16), 240 + 4k + j trit k of qh[j].
 * Value (t - 1) * d. */
static __device__ __forceinline__ uint32_t tq1_trits(uint32_t b, int k)
{
    const uint32_t p = k == 0 ? 1u : k == 1 ? 3u : k == 2 ? 9u : k == 3 ? 27u : 81u;
    /* each byte times 3^k mod 256: even and odd bytes apart in 16-bit lanes (no carry across) */
    const uint32_t q =
        ((b & 0x00ff00ffu) * p & 0x00ff00ffu) | ((b >> 8 & 0x00ff00ffu) * p & 0x00ff00ffu) << 8;
    /* (q * 3) >> 8 = (q >= 86) + (q >= 171) */
    return (__vcmpgeu4(q, 0x56565656u) & BYTE_LOW_BITS) +
           (__vcmpgeu4(q, 0xababababu) & BYTE_LOW_BITS);
}

template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_TQ1_0>(const uint8_t *row, int64_t c,
                                                                int s, wq8 &o, bool /* a4 */)
{
    const uint8_t *b = row + (c >> 3) * 54;
    const int      j = static_cast<int>(c & 7);
    o.d0 = o.d1 = f16_to_f32(ld16(b + 52));
    o.m = 0.0f;
    if (j < 5) {
        o.lo = tq1_trits(ld32(b + 4 * s), j);
        o.hi = tq1_trits(ld32(b + 16 + 4 * s), j);
    } else {
        /* chunks 5, 6: trits 2j - 10 and 2j - 9 of qs[32 + 4s ..]; chunk 7: trit 4 of them, then
         * trit s of the four qh bytes */
        const uint32_t w = ld32(b + 32 + 4 * s);
        o.lo = tq1_trits(w, 2 * j - 10);
        o.hi = j < 7 ? tq1_trits(w, 2 * j - 9) : tq1_trits(ld32(b + 48), s);
    }
}

/* TQ2_0 (66 bytes): qs[64], d. Element 128h + 32k + m is bits 2k..2k+1 of qs[32h + m]. Value
 * (q - 1) * d. */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_TQ2_0>(const uint8_t *row, int64_t c,
                                                                int s, wq8 &o, bool /* a4 */)
{
    const uint8_t *b = row + (c >> 3) * 66;
    const int      j = static_cast<int>(c & 7);
    const uint8_t *qs = b + 32 * (j >> 2) + 4 * s;
    const int      sh = 2 * (j & 3);
    o.d0 = o.d1 = f16_to_f32(ld16(b + 64));
    o.m = 0.0f;
    o.lo = (ld32(qs) >> sh) & 0x03030303u;
    o.hi = (ld32(qs + 16) >> sh) & 0x03030303u;
}

/* I2_S (BitNet b1.58), three layouts of 2-bit codes c, weight (c - 1) * d (docs/kernels.md).
 * I2S_Q128 (32 bytes a 128): element 32g + m at bits 6 - 2g of byte m, no scale (d = 1: the
 * tensor's scale multiplies the products, struct gpu_mat's scale). */
template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_I2S_Q128>(const uint8_t *row, int64_t c,
                                                                   int s, wq8 &o, bool a4)
{
    const uint8_t *b = row + (c >> 2) * 32;
    const int      sh = 6 - 2 * static_cast<int>(c & 3);
    o.d0 = o.d1 = 1.0f;
    o.m = 0.0f;
    o.lo = (ld32a(b + 4 * s, a4) >> sh) & 0x03030303u;
    o.hi = (ld32a(b + 16 + 4 * s, a4) >> sh) & 0x03030303u;
}

/* The four 2-bit codes of byte v (element 4k + l at bits 2l) into bytes 0..3. */
static __device__ __forceinline__ uint32_t codes4(uint32_t v)
{
    return (v | v << 6 | v << 12 | v << 18) & 0x03030303u;
}

/* I2S_B32H (10 bytes a 32): element j at bits 2 (j % 4) of byte j / 4, then an f16 scale; so lane
 * s's low four are byte s, its high four byte 4 + s. I2S_B32F (12): an f32 scale instead. */
template <int T>
static __device__ __forceinline__ void decode_i2s_b32(const uint8_t *row, int64_t c, int s, wq8 &o,
                                                      bool a4)
{
    const uint8_t *b = row + c * qtype<T>::bytes;
    const uint32_t w = ld32a(b, a4), w2 = ld32a(b + 4, a4); /* codes bytes 0..3, 4..7 */
    o.lo = codes4((w >> (8 * s)) & 0xffu);
    o.hi = codes4((w2 >> (8 * s)) & 0xffu);
    o.d0 = o.d1 = T == COMMON_GGML_TYPE_I2S_B32H ? f16_to_f32(ld16(b + 8))
                                                 : __uint_as_float(ld32a(b + 8, a4));
    o.m = 0.0f;
}

template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_I2S_B32H>(const uint8_t *row, int64_t c,
                                                                   int s, wq8 &o, bool a4)
{
    decode_i2s_b32<COMMON_GGML_TYPE_I2S_B32H>(row, c, s, o, a4);
}

template <>
__device__ __forceinline__ void decodeq<COMMON_GGML_TYPE_I2S_B32F>(const uint8_t *row, int64_t c,
                                                                   int s, wq8 &o, bool a4)
{
    decode_i2s_b32<COMMON_GGML_TYPE_I2S_B32F>(row, c, s, o, a4);
}

/* The quantized types' decode8: their words as exact floats (Q8_0's signed bytes read biased by
 * 128). */
#define DECODE8_Q(T)                                                                               \
    template <>                                                                                    \
    __device__ __forceinline__ void decode8<T>(const uint8_t *row, int64_t c, int s, sub8 &o,      \
                                               bool a4)                                            \
    {                                                                                              \
        wq8 w;                                                                                     \
        decodeq<T>(row, c, s, w, a4);                                                              \
        o.d0 = w.d0, o.d1 = w.d1, o.m0 = w.m, o.m1 = split_min<T>() ? w.m1 : w.m;                  \
        if (T == COMMON_GGML_TYPE_Q8_0 || T == COMMON_GGML_TYPE_MXFP4)                             \
            bytes8(o, w.lo ^ 0x80808080u, w.hi ^ 0x80808080u, 128.0f);                             \
        else                                                                                       \
            bytes8(o, w.lo, w.hi, static_cast<float>(qoff<T>()));                                  \
    }
DECODE8_Q(COMMON_GGML_TYPE_Q4_0)
DECODE8_Q(COMMON_GGML_TYPE_Q4_1)
DECODE8_Q(COMMON_GGML_TYPE_Q5_0)
DECODE8_Q(COMMON_GGML_TYPE_Q5_1)
DECODE8_Q(COMMON_GGML_TYPE_Q8_0)
DECODE8_Q(COMMON_GGML_TYPE_Q2_K)
DECODE8_Q(COMMON_GGML_TYPE_Q3_K)
DECODE8_Q(COMMON_GGML_TYPE_Q4_K)
DECODE8_Q(COMMON_GGML_TYPE_Q5_K)
DECODE8_Q(COMMON_GGML_TYPE_Q6_K)
DECODE8_Q(COMMON_GGML_TYPE_MXFP4)
DECODE8_Q(COMMON_GGML_TYPE_TQ1_0)
DECODE8_Q(COMMON_GGML_TYPE_TQ2_0)
DECODE8_Q(COMMON_GGML_TYPE_I2S_Q128)
DECODE8_Q(COMMON_GGML_TYPE_I2S_B32H)
DECODE8_Q(COMMON_GGML_TYPE_I2S_B32F)
#undef DECODE8_Q

/* Element i (0..7) of a decoded chunk with ref.c's rounding: one product (and one sum), never
 * fused. */
template <int T> static __device__ __forceinline__ float exact_value(const sub8 &o, int i)
{
    if (qtype<T>::flt)
        return o.q[i];
    const float v = __fmul_rn(i < 4 ? o.d0 : o.d1, o.q[i]);
    return qtype<T>::has_min ? __fadd_rn(v, i < 4 ? o.m0 : o.m1) : v;
}

/* One element of a float-type row (the tail past the last whole chunk). */
template <int T> static __device__ __forceinline__ float float_elem(const uint8_t *row, int64_t e)
{
    if (T == COMMON_GGML_TYPE_F32)
        return __ldg(reinterpret_cast<const float *>(row) + e);
    const uint32_t h = __ldg(reinterpret_cast<const unsigned short *>(row) + e);
    return T == COMMON_GGML_TYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* ---- dequantize rows ------------------------------------------------------------------------- */

/* Thread u of a row: u < 4 * chunks takes lane u % 4 of chunk u / 4; float types give each element
 * of the tail (cols % 32) a thread of its own. grid.y strides over the output rows. A4: blocks are
 * 4-byte aligned. */
template <int T, bool F16, bool A4>
__global__ void __launch_bounds__(DQ_THREADS)
    k_dequant(const uint8_t *__restrict__ w, size_t row_bytes, int64_t cols,
              const int32_t *__restrict__ ids, int64_t n_rows, void *__restrict__ out,
              int64_t out_stride)
{
    const int64_t nch = cols / QK;
    const int64_t u = static_cast<int64_t>(blockIdx.x) * DQ_THREADS + threadIdx.x;
    if (u >= 4 * nch + cols % QK)
        return;
    for (int64_t i = blockIdx.y; i < n_rows; i += gridDim.y) {
        const int64_t  src = ids ? static_cast<int64_t>(__ldg(ids + i)) : i;
        const uint8_t *row = w + src * static_cast<int64_t>(row_bytes);
        const int64_t  o0 = i * out_stride;
        if (u >= 4 * nch) { /* float types only */
            const int64_t e = nch * QK + (u - 4 * nch);
            const float   v = float_elem<T>(row, e);
            if (F16)
                static_cast<__half *>(out)[o0 + e] = __float2half_rn(v);
            else
                static_cast<float *>(out)[o0 + e] = v;
            continue;
        }
        const int64_t c = u >> 2;
        const int     s = static_cast<int>(u & 3);
        sub8          d;
        decode8<T>(row, c, s, d, A4);
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = exact_value<T>(d, k);
        const int64_t e = o0 + c * QK + 4 * s; /* the low four; the high four at e + 16 */
        if (F16) {
            __half *p = static_cast<__half *>(out) + e;
            if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
                __half2 h[4] = {__floats2half2_rn(v[0], v[1]), __floats2half2_rn(v[2], v[3]),
                                __floats2half2_rn(v[4], v[5]), __floats2half2_rn(v[6], v[7])};
                uint2   a, b;
                a.x = *reinterpret_cast<uint32_t *>(&h[0]);
                a.y = *reinterpret_cast<uint32_t *>(&h[1]);
                b.x = *reinterpret_cast<uint32_t *>(&h[2]);
                b.y = *reinterpret_cast<uint32_t *>(&h[3]);
                *reinterpret_cast<uint2 *>(p) = a;
                *reinterpret_cast<uint2 *>(p + 16) = b;
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    p[k] = __float2half_rn(v[k]);
                    p[16 + k] = __float2half_rn(v[4 + k]);
                }
            }
        } else {
            float *p = static_cast<float *>(out) + e;
            if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
                *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
                *reinterpret_cast<float4 *>(p + 16) = make_float4(v[4], v[5], v[6], v[7]);
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    p[k] = v[k];
                    p[16 + k] = v[4 + k];
                }
            }
        }
    }
}

/* ---- matvec ---------------------------------------------------------------------------------- */

/* Four floats of an activation row; vec: the address is 16-byte aligned. */
static __device__ __forceinline__ void load_x4(const float *p, bool vec, float v[4])
{
    if (vec) {
        const float4 a = __ldg(reinterpret_cast<const float4 *>(p));
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = __ldg(p + i);
    }
}

/* The sums of a matvec block: every lane ends with its warp's sums (shuffles), lane r * N + t
 * keeping (r, t); the warps' meet through `part` in a fixed order. Thread i < R * N gets the
 * total of (i / N, i % N) in *out and true. Every thread of the block calls it. */
template <int R, int N>
static __device__ __forceinline__ bool mv_block_sum(const float (&acc)[R][N],
                                                    float (&part)[MV_WARPS][R * N], float *out)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float     mine = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < N; t++) {
            float v = acc[r][t];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == r * N + t)
                mine = v;
        }
    if (lane < R * N)
        part[warp][lane] = mine;
    __syncthreads();
    if (threadIdx.x >= R * N)
        return false;
    float v = part[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < MV_WARPS; k++)
        v += part[k][threadIdx.x];
    *out = v;
    return true;
}

/* Weight rows per matvec block; each activation load serves them all. Four, except two for one
 * activation row of the float types and Q6_K (measured on an H100 at 4096 and 14336 x 4096: four
 * gave the block types 5-15% more GB/s, the others 5-15% less). */
template <int T, int N> static constexpr __host__ __device__ int mv_rows()
{
    return N == 1 && (qtype<T>::flt || T == COMMON_GGML_TYPE_Q6_K) ? 2 : 4;
}

/* y[t * y_stride + r] = row r . x row t for N activation rows. A block takes mv_rows<T, N>()
 * weight rows; its MV_WARPS warps split the columns: warp w, lane l takes lane l % 4 of chunks
 * 8 w + l / 4, then 8 MV_WARPS further each step, keeping mv_rows * N partial sums in registers.
 * Each decoded weight serves N activation rows, each activation load mv_rows weight rows. The
 * sums meet in a shuffle reduction per warp, then across warps through shared memory in a fixed
 * order. A4: blocks are 4-byte aligned. IDS: grid.y strides over the items of gpu_matvec_ids
 * (N = 1), each with its own expert, activation row and output; without it, n_items is 1. */
template <int T, int N, bool IDS, bool A4>
__global__ void __launch_bounds__(MV_WARPS * 32)
    k_matvec(const uint8_t *__restrict__ w, size_t row_bytes, size_t expert_bytes, int64_t rows,
             int64_t cols, const int32_t *__restrict__ ids, int64_t n_items,
             const float *__restrict__ x, int64_t x_stride, int64_t x_div, float *__restrict__ y,
             int64_t y_stride)
{
    constexpr int    R = mv_rows<T, N>();
    __shared__ float part[MV_WARPS][R * N]; /* each warp's sums */
    const int        lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int        s = lane & 3;
    const int64_t    row0 = static_cast<int64_t>(blockIdx.x) * R; /* < rows (the grid's size) */
    const int64_t    nch = cols / QK;
    for (int64_t item = IDS ? blockIdx.y : 0; item < n_items; item += gridDim.y) {
        const uint8_t *wb = w;
        const float   *xb = x;
        float         *yb = y;
        if (IDS) {
            wb += static_cast<int64_t>(__ldg(ids + item)) * static_cast<int64_t>(expert_bytes);
            xb += item / x_div * x_stride;
            yb += item * y_stride;
        }
        const uint8_t *wr[R];
#pragma unroll
        for (int r = 0; r < R; r++) /* rows past the end repeat the last (never stored) */
            wr[r] = wb + min(row0 + r, rows - 1) * static_cast<int64_t>(row_bytes);
        const bool xvec =
            (reinterpret_cast<uintptr_t>(xb) & 15) == 0 && (N == 1 || (x_stride & 3) == 0);
        float acc[R][N];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < N; t++)
                acc[r][t] = 0.0f;

#pragma unroll 1
        for (int64_t c = warp * 8 + (lane >> 2); c < nch; c += 8 * MV_WARPS) {
            sub8 d[R];
#pragma unroll
            for (int r = 0; r < R; r++)
                decode8<T>(wr[r], c, s, d[r], A4);
#pragma unroll
            for (int t = 0; t < N; t++) {
                const float *xp = xb + t * x_stride + c * QK + 4 * s;
                float        xl[4], xh[4];
                load_x4(xp, xvec, xl);
                load_x4(xp + 16, xvec, xh);
                float xs = 0.0f, xsl = 0.0f, xsh = 0.0f;
                if (split_min<T>()) {
                    xsl = (xl[0] + xl[1]) + (xl[2] + xl[3]);
                    xsh = (xh[0] + xh[1]) + (xh[2] + xh[3]);
                } else if (qtype<T>::has_min) {
                    xs = (xl[0] + xl[1]) + (xl[2] + xl[3]) + ((xh[0] + xh[1]) + (xh[2] + xh[3]));
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float dl = d[r].q[0] * xl[0], dh = d[r].q[4] * xh[0];
#pragma unroll
                    for (int i = 1; i < 4; i++) {
                        dl = fmaf(d[r].q[i], xl[i], dl);
                        dh = fmaf(d[r].q[4 + i], xh[i], dh);
                    }
                    float a = acc[r][t];
                    if (qtype<T>::flt)
                        a += dl + dh;
                    else if (qtype<T>::split)
                        a = fmaf(d[r].d1, dh, fmaf(d[r].d0, dl, a));
                    else
                        a = fmaf(d[r].d0, dl + dh, a);
                    if (split_min<T>())
                        a = fmaf(d[r].m1, xsh, fmaf(d[r].m0, xsl, a));
                    else if (qtype<T>::has_min)
                        a = fmaf(d[r].m0, xs, a);
                    acc[r][t] = a;
                }
            }
        }
        if (qtype<T>::flt) { /* the tail past the last whole chunk */
            for (int64_t e = nch * QK + threadIdx.x; e < cols; e += MV_WARPS * 32) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float v = float_elem<T>(wr[r], e);
#pragma unroll
                    for (int t = 0; t < N; t++)
                        acc[r][t] = fmaf(v, __ldg(xb + t * x_stride + e), acc[r][t]);
                }
            }
        }

        float v;
        if (mv_block_sum<R, N>(acc, part, &v)) {
            const int64_t r = row0 + threadIdx.x / N;
            if (r < rows)
                yb[(threadIdx.x % N) * y_stride + r] = v;
        }
        __syncthreads(); /* part is written again for the next item */
    }
}

/* ---- int8 matvec ----------------------------------------------------------------------------- */

/* Blocks of the int8 matvec an SM holds at least (at most 64 registers a thread): enough warps
 * in flight to cover the latency of the weight loads. Half for groups (8 activation rows of
 * scattered addresses, up to 128 registers, no spills). */
#define MVQ_MIN_BLOCKS 8

/* Weight rows per int8 matvec block. */
template <int T, int N> static constexpr __host__ __device__ int mvq_rows()
{
    /* the split types' decoders (Q6_K, Q3_K, Q2_K: two scales a chunk) need the registers: at 4
     * rows ptxas spills their N = 2 and GLU kernels */
    return N <= 2 && !qtype<T>::split ? 4 : 2;
}

/* k_matvec over a q8 image (gpu.h): lane s of a chunk takes the weight's quant words (decodeq)
 * and the activations' int8 words at the same places, one dp4a per word; the offset (qoff) and
 * the min come from the activations' sums over the same four values (a dp4a with ones, shared by
 * the block's rows). Per chunk: y += dx * (d * (dot - off * sum) + m * sum), in f32 (split: the
 * low and high four with their own d). Layout of the work and of the reduction as k_matvec's. */
/* What k_matvec_q8's items are: the one product of gpu_matvec_q8 (N activation rows), an
 * expert each (gpu_matvec_ids_q8, N = 1), a group of up to N rows sharing an expert
 * (gpu_matvec_groups_q8), several matrices over one row (gpu_matvec_q8_cat), or a token's k
 * experts in turn, their products combined into its row of y (gpu_matvec_ids_combine_q8). */
enum { MVQ_PLAIN, MVQ_IDS, MVQ_GROUPS, MVQ_CAT, MVQ_COMBINE };

/* MVQ_CAT: the products of n matrices (up to GPU_CAT_MAX) of one type and row length over the
 * same activation row, one launch: blocks first[i] .. first[i + 1] - 1 take matrix i (rows[i]
 * rows at w[i], into y[i]). MVQ_COMBINE: n_items tokens of k items each (item t * k + j:
 * expert ids[item] over activation row item), weights sel_w[item]. */
struct mvq_cat {
    const uint8_t *w[GPU_CAT_MAX];
    float         *y[GPU_CAT_MAX];
    int64_t        rows[GPU_CAT_MAX];
    unsigned       first[GPU_CAT_MAX + 1];
    int            n;
    int            k;
    const float   *sel_w;
};

/* GLU: the block's R rows of w (gate) and the same R rows of w2 (up), of the same layout, and
 * y = silu(gate) * up (gpu_silu_mul); else add: y += the product instead of y =. */
template <int T, int N, int MODE, bool A4, bool GLU>
__global__ void __launch_bounds__(MV_WARPS * 32,
                                  MODE == MVQ_GROUPS ? MVQ_MIN_BLOCKS / 2 : MVQ_MIN_BLOCKS)
    k_matvec_q8(const uint8_t *__restrict__ w, const uint8_t *__restrict__ w2, size_t row_bytes,
                size_t expert_bytes, int64_t rows, int64_t cols, const int32_t *__restrict__ ids,
                const struct gpu_group *__restrict__ groups, int64_t n_items,
                const uint8_t *__restrict__ q8, int64_t              x_div, float *__restrict__ y,
                int64_t y_stride, bool add, const mvq_cat cat = mvq_cat())
{
    constexpr int    R = GLU ? mvq_rows<T, N>() / 2 : mvq_rows<T, N>(); /* output rows a block */
    constexpr int    RR = GLU ? 2 * R : R;                              /* weight rows it reads */
    constexpr int    OFF = qoff<T>();
    constexpr bool   SUMS = OFF != 0 || qtype<T>::has_min;
    __shared__ float part[MV_WARPS][RR * N];
    __shared__ float glu[GLU ? RR * N : 1];
    const int        lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int        s = lane & 3;
    /* MVQ_CAT: the block's matrix, the last whose blocks start at or before it; picked with
     * constant indices, so that the parameter arrays stay out of local memory */
    int64_t        nrows = rows;
    const uint8_t *wm = w;
    float         *ym = y;
    unsigned       first = 0;
    if (MODE == MVQ_CAT) {
#pragma unroll
        for (int i = 0; i < GPU_CAT_MAX; i++)
            if (i < cat.n && blockIdx.x >= cat.first[i]) {
                nrows = cat.rows[i];
                wm = cat.w[i];
                ym = cat.y[i];
                first = cat.first[i];
            }
    }
    const int64_t    row0 = static_cast<int64_t>(blockIdx.x - first) * R;
    const int64_t    nch = cols / QK;
    const int64_t    xrb = static_cast<int64_t>(gpu_q8_row_bytes(cols));
    const int        k_each = MODE == MVQ_COMBINE ? cat.k : 1; /* items of a token */
    float            comb = 0.0f; /* MVQ_COMBINE: the token's weighted sum so far (threads < R) */
    for (int64_t outer = MODE != MVQ_PLAIN ? blockIdx.y : 0, step = 0; outer < n_items;) {
        const int64_t  item = MODE == MVQ_COMBINE ? outer * k_each + step : outer;
        const uint8_t *wb = wm, *wb2 = w2, *xr[N]; /* the activation rows */
        float         *yb = ym;
        int            n_act = N;
        if (MODE == MVQ_IDS || MODE == MVQ_COMBINE) {
            const int64_t off =
                static_cast<int64_t>(__ldg(ids + item)) * static_cast<int64_t>(expert_bytes);
            wb += off;
            if (GLU)
                wb2 += off;
            xr[0] = q8 + item / x_div * xrb;
            if (MODE == MVQ_IDS) /* MVQ_COMBINE writes row `outer` of y */
                yb += item * y_stride;
        } else if (MODE == MVQ_GROUPS) {
            const struct gpu_group *g = groups + item;
            wb += static_cast<int64_t>(__ldg(&g->expert)) * static_cast<int64_t>(expert_bytes);
            n_act = __ldg(&g->n);
#pragma unroll
            for (int t = 0; t < N; t++) /* rows past n repeat the first (never stored) */
                xr[t] = q8 + static_cast<int64_t>(__ldg(&g->x_row[t < n_act ? t : 0])) * xrb;
        } else {
#pragma unroll
            for (int t = 0; t < N; t++)
                xr[t] = q8 + t * xrb;
        }
        const uint8_t *wr[RR];
#pragma unroll
        for (int r = 0; r < R; r++) {
            wr[r] = wb + min(row0 + r, nrows - 1) * static_cast<int64_t>(row_bytes);
            if (GLU)
                wr[R + r] = wb2 + min(row0 + r, nrows - 1) * static_cast<int64_t>(row_bytes);
        }
        float acc[RR][N];
#pragma unroll
        for (int r = 0; r < RR; r++)
#pragma unroll
            for (int t = 0; t < N; t++)
                acc[r][t] = 0.0f;

#pragma unroll 1
        for (int64_t c = warp * 8 + (lane >> 2); c < nch; c += 8 * MV_WARPS) {
            wq8 d[RR];
#pragma unroll
            for (int r = 0; r < RR; r++)
                decodeq<T>(wr[r], c, s, d[r], A4);
#pragma unroll
            for (int t = 0; t < N; t++) {
                const uint8_t *xp = xr[t];
                const int      xl = __ldg(reinterpret_cast<const int *>(xp + c * QK + 4 * s));
                const int      xh = __ldg(reinterpret_cast<const int *>(xp + c * QK + 16 + 4 * s));
                const float    dx = __ldg(reinterpret_cast<const float *>(xp + cols) + c);
                int            sl = 0, sh = 0;
                if (SUMS) {
                    sl = __dp4a(xl, 0x01010101, 0);
                    sh = __dp4a(xh, 0x01010101, 0);
                }
#pragma unroll
                for (int r = 0; r < RR; r++) {
                    const int il = __dp4a(static_cast<int>(d[r].lo), xl, 0);
                    const int ih = __dp4a(static_cast<int>(d[r].hi), xh, 0);
                    float     v;
                    if (qtype<T>::split)
                        v = fmaf(d[r].d0, static_cast<float>(il - OFF * sl),
                                 d[r].d1 * static_cast<float>(ih - OFF * sh));
                    else
                        v = d[r].d0 * static_cast<float>(il + ih - OFF * (sl + sh));
                    if (split_min<T>())
                        v = fmaf(d[r].m, static_cast<float>(sl),
                                 fmaf(d[r].m1, static_cast<float>(sh), v));
                    else if (qtype<T>::has_min)
                        v = fmaf(d[r].m, static_cast<float>(sl + sh), v);
                    acc[r][t] = fmaf(dx, v, acc[r][t]);
                }
            }
        }

        /* Thread i < RR * N sums (i / N, i % N): with GLU, up's (r, t) is gate's + R * N. */
        float      v;
        const bool mine = mv_block_sum<RR, N>(acc, part, &v);
        if (GLU) {
            if (mine)
                glu[threadIdx.x] = v;
            __syncthreads();
            if (threadIdx.x < R * N)
                v = gpu_silu_mul(glu[threadIdx.x], glu[threadIdx.x + R * N]);
        }
        if (MODE == MVQ_COMBINE && threadIdx.x < R) {
            /* ops_moe_combine_kernel's arithmetic: w_0 y_0, then + w_j y_j, then + x */
            const float wv = __fmul_rn(__ldg(cat.sel_w + item), v);
            comb = step == 0 ? wv : __fadd_rn(comb, wv);
            const int64_t r = row0 + threadIdx.x;
            if (step == k_each - 1 && r < nrows) {
                float *out = y + outer * y_stride + r;
                *out = __fadd_rn(comb, *out);
            }
        } else if (MODE != MVQ_COMBINE && threadIdx.x < R * N) {
            const int64_t r = row0 + threadIdx.x / N;
            const int     t = static_cast<int>(threadIdx.x % N);
            if (r < nrows && t < n_act) {
                const int64_t yr =
                    MODE == MVQ_GROUPS ? static_cast<int64_t>(__ldg(&groups[item].y_row[t])) : t;
                float *out = yb + yr * y_stride + r;
                *out = !GLU && add ? *out + v : v;
            }
        }
        __syncthreads();
        if (++step == k_each) {
            step = 0;
            outer += gridDim.y;
        }
    }
}

/* ---- f32 -> f16 ------------------------------------------------------------------------------ */

static __global__ void __launch_bounds__(CV_THREADS)
    k_f32_to_f16(const float *__restrict__ x, int64_t x_stride, int64_t n, int64_t cols,
                 __half *__restrict__ out)
{
    const int64_t total = n * cols;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * CV_THREADS + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * CV_THREADS) {
        const int64_t t = i / cols, c = i - t * cols;
        out[i] = __float2half_rn(__ldg(x + t * x_stride + c));
    }
}

/* ---- tensor-core matmul ---------------------------------------------------------------------- */

/* Block tile: BM activation rows (tokens; 64, or 128 for big products) x GM_BN weight rows, GM_BK
 * columns per step, through a GM_STAGES-deep cp.async ring in shared memory (rows padded to
 * GM_LDS halves so that the fragment loads hit distinct banks). Eight warps in 2 x 4, each
 * (BM / 2) x 32 (BM / 32 x 2 fragments of 16 x 16 x 16, f32 accumulators). Rows past the end load
 * as zeros; the tile goes out through shared memory, where the guards and any y_stride are
 * handled. BM = 128 needs more than 48 KiB of shared memory: dynamic, opted in once. */
#define GM_BN      128
#define GM_BK      32
#define GM_STAGES  3
#define GM_LDS     (GM_BK + 8)
#define GM_LDC     (GM_BN + 4)
#define GM_THREADS 256
#define GM_BIG_MIN 264 /* blocks of 128 tokens from which the bigger tile is taken (2 per SM) */

template <int BM> struct gemm_tiles {
    __half a[GM_STAGES][BM][GM_LDS];    /* activations: [token][column] */
    __half b[GM_STAGES][GM_BN][GM_LDS]; /* weights: [row][column] */
};
template <int BM> union gemm_smem {
    gemm_tiles<BM> t;
    float          c[BM][GM_LDC]; /* the finished tile: [token][row] */
};
static_assert(sizeof(gemm_smem<64>) <= 48 * 1024, "gemm tiles exceed static shared memory");

/* Queues the copies of step k0's tiles into stage st (16 bytes each, zeros past the ends). */
template <int BM>
static __device__ __forceinline__ void gemm_load(gemm_smem<BM> &sm, int st, const __half *w,
                                                 int64_t rows, const __half *x, int64_t n,
                                                 int64_t cols, int64_t r0, int64_t t0, int64_t k0)
{
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < BM * 4 / GM_THREADS; i++) { /* BM rows x 4 pieces */
        const int     idx = tid + i * GM_THREADS;
        const int     row = idx >> 2, ch = idx & 3;
        const bool    in = t0 + row < n;
        const __half *src = in ? x + (t0 + row) * cols + k0 + ch * 8 : x;
        __pipeline_memcpy_async(&sm.t.a[st][row][ch * 8], src, 16, in ? 0 : 16);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) { /* 128 rows x 4 pieces: two each */
        const int     idx = tid + i * GM_THREADS;
        const int     row = idx >> 2, ch = idx & 3;
        const bool    in = r0 + row < rows;
        const __half *src = in ? w + (r0 + row) * cols + k0 + ch * 8 : w;
        __pipeline_memcpy_async(&sm.t.b[st][row][ch * 8], src, 16, in ? 0 : 16);
    }
}

/* One GM_BK-column step of a warp's (FM x 2 fragment) tile: the A fragments (activations, rows
 * wm..) and B fragments (weights, rows wn..) of the step's tiles, multiplied into acc. */
template <int FM>
static __device__ __forceinline__ void
gemm_mma(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[FM][2],
         const __half (*a)[GM_LDS], const __half (*b)[GM_LDS], int wm, int wn)
{
    using namespace nvcuda;
#pragma unroll
    for (int kk = 0; kk < GM_BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[FM];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
        for (int i = 0; i < FM; i++)
            wmma::load_matrix_sync(fa[i], &a[wm + 16 * i][kk], GM_LDS);
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::load_matrix_sync(fb[j], &b[wn + 16 * j][kk], GM_LDS);
#pragma unroll
        for (int i = 0; i < FM; i++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
}

/* A warp's accumulators into its corner of the finished tile c ([token][row], GM_LDC apart). */
template <int FM>
static __device__ __forceinline__ void gemm_acc_store(
    const nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[FM][2],
    float (*c)[GM_LDC], int wm, int wn)
{
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            nvcuda::wmma::store_matrix_sync(&c[wm + 16 * i][wn + 16 * j], acc[i][j], GM_LDC,
                                            nvcuda::wmma::mem_row_major);
}

template <int BM>
static __global__ void __launch_bounds__(GM_THREADS)
    k_gemm_f16(const __half *__restrict__ w, int64_t rows, int64_t cols,
               const __half *__restrict__ x, int64_t n, float *__restrict__ y, int64_t y_stride)
{
    using namespace nvcuda;
    constexpr int     FM = BM / 32;
    extern __shared__ __align__(128) unsigned char gm_raw[];
    gemm_smem<BM>                                 &sm = *reinterpret_cast<gemm_smem<BM> *>(gm_raw);
    const int64_t                                  r0 = static_cast<int64_t>(blockIdx.x) * GM_BN;
    const int64_t                                  t0 = static_cast<int64_t>(blockIdx.y) * BM;
    const int                                      warp = threadIdx.x >> 5;
    const int     wm = (warp >> 2) * (BM / 2), wn = (warp & 3) * 32; /* the warp's tile corner */
    const int64_t nk = cols / GM_BK;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][2];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);

#pragma unroll
    for (int st = 0; st < GM_STAGES - 1; st++) {
        if (st < nk)
            gemm_load<BM>(sm, st, w, rows, x, n, cols, r0, t0, st * GM_BK);
        __pipeline_commit();
    }
    for (int64_t kt = 0; kt < nk; kt++) {
        /* Step kt's copies are done (this thread's), then everyone's are, and everyone is past
         * step kt - 1, whose stage the next copies overwrite. */
        __pipeline_wait_prior(GM_STAGES - 2);
        __syncthreads();
        const int64_t next = kt + GM_STAGES - 1;
        if (next < nk)
            gemm_load<BM>(sm, static_cast<int>(next % GM_STAGES), w, rows, x, n, cols, r0, t0,
                          next * GM_BK);
        __pipeline_commit();
        const int st = static_cast<int>(kt % GM_STAGES);
        gemm_mma<FM>(acc, sm.t.a[st], sm.t.b[st], wm, wn);
    }
    __pipeline_wait_prior(0);
    __syncthreads(); /* the tiles are dead: their memory takes the result */
    gemm_acc_store<FM>(acc, sm.c, wm, wn);
    __syncthreads();
    for (int idx = threadIdx.x; idx < BM * GM_BN; idx += GM_THREADS) {
        const int     tt = idx / GM_BN, rr = idx % GM_BN;
        const int64_t t = t0 + tt, r = r0 + rr;
        if (t < n && r < rows)
            y[t * y_stride + r] = sm.c[tt][rr];
    }
}

/* ---- tensor-core matmul from quantized weights ------------------------------------------------
 */

/* As k_gemm_f16, with the weight tile decoded from the quantized rows in the kernel: each k-step
 * is one chunk of 32 columns, whose 128 rows x 4 lanes decode8 tasks the 256 threads share (two
 * each), rounded to f16 into shared memory. Two stages: the activations of step k + 1 copy
 * (cp.async) and its weights load while step k's fragments multiply. BM activation rows per
 * block (64 dense, GPU_MM_TILE by tiles); warps 2 x 4, each (BM / 2) x 32. TILES: blockIdx.y is a
 * tile of gathered activation rows of one expert (gpu_gemm_q). */
#define GQ_STAGES 2

template <int BM> struct gemmq_tiles {
    __half a[GQ_STAGES][BM][GM_LDS];
    __half b[GQ_STAGES][GM_BN][GM_LDS];
};
template <int BM> union gemmq_smem {
    gemmq_tiles<BM> t;
    float           c[BM][GM_LDC];
};

/* The f16 values of one decoded lane into row `row` of a weight tile (zeros past the end). */
template <int T>
static __device__ __forceinline__ void gemmq_put(__half (*b)[GM_LDS], int row, int s, const sub8 &d,
                                                 bool in)
{
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        v[k] = in ? exact_value<T>(d, k) : 0.0f;
    __half2 *lo = reinterpret_cast<__half2 *>(&b[row][4 * s]);
    __half2 *hi = reinterpret_cast<__half2 *>(&b[row][16 + 4 * s]);
    lo[0] = __floats2half2_rn(v[0], v[1]);
    lo[1] = __floats2half2_rn(v[2], v[3]);
    hi[0] = __floats2half2_rn(v[4], v[5]);
    hi[1] = __floats2half2_rn(v[6], v[7]);
}

template <int T, bool A4, int BM, bool TILES>
__global__ void __launch_bounds__(GM_THREADS)
    k_gemm_q(const uint8_t *__restrict__ w, size_t expert_bytes, size_t row_bytes, int64_t rows,
             int64_t cols, const __half *__restrict__ x, int64_t n,
             const struct gpu_mm_tile *__restrict__ tiles, const int32_t *__restrict__ n_used,
             const int32_t *__restrict__ items, int32_t x_div, float *__restrict__ y,
             int64_t y_stride)
{
    using namespace nvcuda;
    constexpr int FM = BM / 32; /* fragments per warp down the tokens */
    if (TILES && n_used && static_cast<int32_t>(blockIdx.y) >= __ldg(n_used))
        return; /* a tile the sort did not make */
    __shared__ __align__(128) gemmq_smem<BM> sm;
    __shared__ int64_t xrow[BM], yrow[BM]; /* the block's activation and output rows (-1: none) */
    const int64_t      r0 = static_cast<int64_t>(blockIdx.x) * GM_BN;
    const int          warp = threadIdx.x >> 5, tid = threadIdx.x;
    const int          wm = (warp >> 2) * (BM / 2), wn = (warp & 3) * 32;
    const int64_t      nk = cols / QK;
    const uint8_t     *wbase = w;
    if (TILES) {
        const struct gpu_mm_tile tl = tiles[blockIdx.y];
        wbase = w + static_cast<int64_t>(tl.expert) * static_cast<int64_t>(expert_bytes);
        for (int i = tid; i < BM; i += GM_THREADS) {
            const int32_t it = i < tl.count ? __ldg(items + tl.first + i) : -1;
            xrow[i] = it < 0 ? -1 : it / x_div;
            yrow[i] = it;
        }
    } else {
        const int64_t t0 = static_cast<int64_t>(blockIdx.y) * BM;
        for (int i = tid; i < BM; i += GM_THREADS) {
            xrow[i] = t0 + i < n ? t0 + i : -1;
            yrow[i] = xrow[i];
        }
    }
    __syncthreads();

    /* this thread's two weight tasks: rows wr[i] of the tile, lane ws[i] */
    int            wr[2], ws[2];
    bool           win[2];
    const uint8_t *wrow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int idx = tid + i * GM_THREADS;
        wr[i] = idx >> 2;
        ws[i] = idx & 3;
        win[i] = r0 + wr[i] < rows;
        wrow[i] = wbase + (win[i] ? (r0 + wr[i]) : 0) * static_cast<int64_t>(row_bytes);
    }
    auto load_a = [&](int st, int64_t kt) {
        for (int idx = tid; idx < BM * 4; idx += GM_THREADS) {
            const int     row = idx >> 2, ch = idx & 3;
            const int64_t xr = xrow[row];
            const __half *src = xr >= 0 ? x + xr * cols + kt * QK + ch * 8 : x;
            __pipeline_memcpy_async(&sm.t.a[st][row][ch * 8], src, 16, xr >= 0 ? 0 : 16);
        }
        __pipeline_commit();
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][2];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);

    sub8 dw[2];
    load_a(0, 0);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        decode8<T>(wrow[i], 0, ws[i], dw[i], A4);
        gemmq_put<T>(sm.t.b[0], wr[i], ws[i], dw[i], win[i]);
    }
    for (int64_t kt = 0; kt < nk; kt++) {
        const int st = static_cast<int>(kt & 1);
        /* Step kt's tiles are in (this thread's copies waited for, everyone's stores behind the
         * barrier), and everyone is past step kt - 1, whose stage the next step fills. */
        __pipeline_wait_prior(0);
        __syncthreads();
        const bool more = kt + 1 < nk;
        if (more) {
            load_a(st ^ 1, kt + 1);
#pragma unroll
            for (int i = 0; i < 2; i++)
                decode8<T>(wrow[i], kt + 1, ws[i], dw[i], A4);
        }
        gemm_mma<FM>(acc, sm.t.a[st], sm.t.b[st], wm, wn);
        if (more)
#pragma unroll
            for (int i = 0; i < 2; i++)
                gemmq_put<T>(sm.t.b[st ^ 1], wr[i], ws[i], dw[i], win[i]);
    }
    __syncthreads(); /* the tiles are dead: their memory takes the result */
    gemm_acc_store<FM>(acc, sm.c, wm, wn);
    __syncthreads();
    for (int idx = threadIdx.x; idx < BM * GM_BN; idx += GM_THREADS) {
        const int     tt = idx / GM_BN, rr = idx % GM_BN;
        const int64_t yr = yrow[tt], r = r0 + rr;
        if (yr >= 0 && r < rows)
            y[yr * y_stride + r] = sm.c[tt][rr];
    }
}

/* ---- host side ------------------------------------------------------------------------------- */

template <int T> struct type_tag {
    static constexpr int value = T;
};

/* Calls f(type_tag<T>()) for a quantized type (gpu_matvec_q8_supported); -1 (recorded)
 * otherwise. */
template <class F> static int with_qtype(uint32_t type, const char *what, F &&f)
{
    switch (type) {
    case COMMON_GGML_TYPE_Q4_0:
        return f(type_tag<COMMON_GGML_TYPE_Q4_0>());
    case COMMON_GGML_TYPE_Q4_1:
        return f(type_tag<COMMON_GGML_TYPE_Q4_1>());
    case COMMON_GGML_TYPE_Q5_0:
        return f(type_tag<COMMON_GGML_TYPE_Q5_0>());
    case COMMON_GGML_TYPE_Q5_1:
        return f(type_tag<COMMON_GGML_TYPE_Q5_1>());
    case COMMON_GGML_TYPE_Q8_0:
        return f(type_tag<COMMON_GGML_TYPE_Q8_0>());
    case COMMON_GGML_TYPE_Q2_K:
        return f(type_tag<COMMON_GGML_TYPE_Q2_K>());
    case COMMON_GGML_TYPE_Q3_K:
        return f(type_tag<COMMON_GGML_TYPE_Q3_K>());
    case COMMON_GGML_TYPE_Q4_K:
        return f(type_tag<COMMON_GGML_TYPE_Q4_K>());
    case COMMON_GGML_TYPE_Q5_K:
        return f(type_tag<COMMON_GGML_TYPE_Q5_K>());
    case COMMON_GGML_TYPE_Q6_K:
        return f(type_tag<COMMON_GGML_TYPE_Q6_K>());
    case COMMON_GGML_TYPE_MXFP4:
        return f(type_tag<COMMON_GGML_TYPE_MXFP4>());
    case COMMON_GGML_TYPE_TQ1_0:
        return f(type_tag<COMMON_GGML_TYPE_TQ1_0>());
    case COMMON_GGML_TYPE_TQ2_0:
        return f(type_tag<COMMON_GGML_TYPE_TQ2_0>());
    case COMMON_GGML_TYPE_I2S_Q128:
        return f(type_tag<COMMON_GGML_TYPE_I2S_Q128>());
    case COMMON_GGML_TYPE_I2S_B32H:
        return f(type_tag<COMMON_GGML_TYPE_I2S_B32H>());
    case COMMON_GGML_TYPE_I2S_B32F:
        return f(type_tag<COMMON_GGML_TYPE_I2S_B32F>());
    default:
        return gpu_record(cudaErrorInvalidValue, what);
    }
}

/* with_qtype, and the float types: every type of gpu_type_supported. */
template <class F> static int with_type(uint32_t type, const char *what, F &&f)
{
    switch (type) {
    case COMMON_GGML_TYPE_F32:
        return f(type_tag<COMMON_GGML_TYPE_F32>());
    case COMMON_GGML_TYPE_F16:
        return f(type_tag<COMMON_GGML_TYPE_F16>());
    case COMMON_GGML_TYPE_BF16:
        return f(type_tag<COMMON_GGML_TYPE_BF16>());
    default:
        return with_qtype(type, what, static_cast<F &&>(f));
    }
}

/* Calls f(std::true_type()) when a4 holds and the blocks of T can be 4-byte aligned (their size is
 * a multiple of 4), else f(std::false_type()): kernels read such blocks with 32-bit loads. */
template <int T, class F> static void with_a4(bool a4, F &&f)
{
    if constexpr (!qtype<T>::flt && qtype<T>::bytes % 4 == 0) {
        if (a4) {
            f(std::true_type());
            return;
        }
    }
    f(std::false_type());
}

/* Whether every block of the rows at w (row_bytes apart, experts expert_bytes apart) is 4-byte
 * aligned. */
static bool blocks_a4(const void *w, size_t row_bytes, size_t expert_bytes)
{
    return (reinterpret_cast<uintptr_t>(w) & 3) == 0 && (row_bytes & 3) == 0 &&
           (expert_bytes & 3) == 0;
}

/* Whether cols fits `type` and row_bytes holds a row of it. */
template <int T> static bool row_fits(int64_t cols, size_t row_bytes)
{
    return cols >= 0 && cols % qtype<T>::blck == 0 &&
           static_cast<uint64_t>(cols / qtype<T>::blck) * qtype<T>::bytes <= row_bytes;
}

static int bad(const char *what)
{
    return gpu_record(cudaErrorInvalidValue, what);
}

bool cuda_type_supported(uint32_t type)
{
    return gpu_type_implemented(type);
}

int cuda_dequant_rows(uint32_t type, const void *w, size_t row_bytes, int64_t cols,
                      const int32_t *ids, int64_t n_rows, void *out, int64_t out_stride,
                      bool out_f16)
{
    static const char what[] = "gpu_dequant_rows: unsupported type or bad arguments";
    return with_type(type, what, [&](auto tag) -> int {
        constexpr int T = decltype(tag)::value;
        if (!row_fits<T>(cols, row_bytes) || n_rows < 0 || (n_rows > 1 && out_stride < cols))
            return bad(what);
        if (n_rows == 0 || cols == 0)
            return 0;
        if (!w || !out)
            return bad(what);
        const int64_t  units = 4 * (cols / QK) + cols % QK;
        const dim3     grid(gpu_blocks(units, DQ_THREADS),
                            static_cast<unsigned>(n_rows < GRID_Y_MAX ? n_rows : GRID_Y_MAX));
        const uint8_t *wb = static_cast<const uint8_t *>(w);
        with_a4<T>(blocks_a4(w, row_bytes, 0), [&](auto a4) {
            constexpr bool A4 = decltype(a4)::value;
            if (out_f16)
                k_dequant<T, true, A4><<<grid, DQ_THREADS, 0, gpu_stream()>>>(
                    wb, row_bytes, cols, ids, n_rows, out, out_stride);
            else
                k_dequant<T, false, A4><<<grid, DQ_THREADS, 0, gpu_stream()>>>(
                    wb, row_bytes, cols, ids, n_rows, out, out_stride);
        });
        return GPU_LAUNCHED("k_dequant");
    });
}

template <int T, int N>
static void launch_matvec(const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                          const float *x, int64_t x_stride, float *y, int64_t y_stride)
{
    const unsigned blocks = gpu_blocks(rows, mv_rows<T, N>());
    with_a4<T>(blocks_a4(w, row_bytes, 0), [&](auto a4) {
        k_matvec<T, N, false, decltype(a4)::value><<<blocks, MV_WARPS * 32, 0, gpu_stream()>>>(
            static_cast<const uint8_t *>(w), row_bytes, 0, rows, cols, nullptr, 1, x, x_stride, 1,
            y, y_stride);
    });
}

int cuda_matvec(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride)
{
    static const char what[] = "gpu_matvec: unsupported type or bad arguments";
    return with_type(type, what, [&](auto tag) -> int {
        constexpr int T = decltype(tag)::value;
        if (!row_fits<T>(cols, row_bytes) || rows < 0 || n < 1 || n > GPU_MATVEC_MAX_N ||
            (n > 1 && (x_stride < cols || y_stride < rows)))
            return bad(what);
        if (rows == 0)
            return 0;
        if (!w || !x || !y)
            return bad(what);
        /* n (1..GPU_MATVEC_MAX_N, checked above) picks the instance. */
        using launch_fn = void (*)(const void *, size_t, int64_t, int64_t, const float *, int64_t,
                                   float *, int64_t);
        static constexpr launch_fn launch[GPU_MATVEC_MAX_N] = {
            launch_matvec<T, 1>, launch_matvec<T, 2>, launch_matvec<T, 3>, launch_matvec<T, 4>,
            launch_matvec<T, 5>, launch_matvec<T, 6>, launch_matvec<T, 7>, launch_matvec<T, 8>};
        launch[n - 1](w, row_bytes, rows, cols, x, x_stride, y, y_stride);
        return GPU_LAUNCHED("k_matvec");
    });
}

int cuda_matvec_ids(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                    int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items, const float *x,
                    int64_t x_stride, int64_t x_div, float *y, int64_t y_stride)
{
    static const char what[] = "gpu_matvec_ids: unsupported type or bad arguments";
    return with_type(type, what, [&](auto tag) -> int {
        constexpr int T = decltype(tag)::value;
        if (!row_fits<T>(cols, row_bytes) || rows < 0 || n_items < 0 || x_div < 1 ||
            static_cast<uint64_t>(rows) * row_bytes > expert_bytes ||
            (n_items > x_div && x_stride < cols) || (n_items > 1 && y_stride < rows))
            return bad(what);
        if (rows == 0 || n_items == 0)
            return 0;
        if (!w || !ids || !x || !y)
            return bad(what);
        const dim3 grid(gpu_blocks(rows, mv_rows<T, 1>()),
                        static_cast<unsigned>(n_items < GRID_Y_MAX ? n_items : GRID_Y_MAX));
        with_a4<T>(blocks_a4(w, row_bytes, expert_bytes), [&](auto a4) {
            k_matvec<T, 1, true, decltype(a4)::value><<<grid, MV_WARPS * 32, 0, gpu_stream()>>>(
                static_cast<const uint8_t *>(w), row_bytes, expert_bytes, rows, cols, ids, n_items,
                x, x_stride, x_div, y, y_stride);
        });
        return GPU_LAUNCHED("k_matvec_ids");
    });
}

template <int T, int N, bool GLU>
static void launch_matvec_q8(const void *w, const void *w2, size_t row_bytes, int64_t rows,
                             int64_t cols, const uint8_t *q8, float *y, int64_t y_stride, bool add)
{
    constexpr int  R = GLU ? mvq_rows<T, N>() / 2 : mvq_rows<T, N>();
    const unsigned blocks = gpu_blocks(rows, R);
    const bool     a4 = blocks_a4(w, row_bytes, 0) && (!GLU || blocks_a4(w2, row_bytes, 0));
    with_a4<T>(a4, [&](auto a) {
        k_matvec_q8<T, N, MVQ_PLAIN, decltype(a)::value, GLU>
            <<<blocks, MV_WARPS * 32, 0, gpu_stream()>>>(
                static_cast<const uint8_t *>(w), static_cast<const uint8_t *>(w2), row_bytes, 0,
                rows, cols, nullptr, nullptr, 1, q8, 1, y, y_stride, add);
    });
}

/* A q8 image must be 4-byte aligned (its words are read whole). */
static bool q8_ok(const void *q8)
{
    return (reinterpret_cast<uintptr_t>(q8) & 3) == 0;
}

int cuda_matvec_q8(int op, uint32_t type, const void *w, const void *w2, size_t row_bytes,
                   int64_t rows, int64_t cols, const void *q8, int64_t n, float *y,
                   int64_t y_stride)
{
    static const char what[] = "gpu_matvec_q8: unsupported type or bad arguments";
    return with_qtype(type, what, [&](auto tag) -> int {
        constexpr int T = decltype(tag)::value;
        if (!row_fits<T>(cols, row_bytes) || rows < 0 || n < 1 || n > GPU_MATVEC_MAX_N ||
            (n > 1 && y_stride < rows) || op < GPU_MV_SET || op > GPU_MV_GLU)
            return bad(what);
        if (rows == 0 || cols == 0)
            return rows == 0 ? 0 : bad(what);
        if (!w || !q8 || !y || !q8_ok(q8) || (op == GPU_MV_GLU && !w2))
            return bad(what);
        using launch_fn = void (*)(const void *, const void *, size_t, int64_t, int64_t,
                                   const uint8_t *, float *, int64_t, bool);
        static constexpr launch_fn plain[GPU_MATVEC_MAX_N] = {
            launch_matvec_q8<T, 1, false>, launch_matvec_q8<T, 2, false>,
            launch_matvec_q8<T, 3, false>, launch_matvec_q8<T, 4, false>,
            launch_matvec_q8<T, 5, false>, launch_matvec_q8<T, 6, false>,
            launch_matvec_q8<T, 7, false>, launch_matvec_q8<T, 8, false>};
        static constexpr launch_fn glu[GPU_MATVEC_MAX_N] = {
            launch_matvec_q8<T, 1, true>, launch_matvec_q8<T, 2, true>,
            launch_matvec_q8<T, 3, true>, launch_matvec_q8<T, 4, true>,
            launch_matvec_q8<T, 5, true>, launch_matvec_q8<T, 6, true>,
            launch_matvec_q8<T, 7, true>, launch_matvec_q8<T, 8, true>};
        (op == GPU_MV_GLU ? glu : plain)[n - 1](w, w2, row_bytes, rows, cols,
                                                static_cast<const uint8_t *>(q8), y, y_stride,
                                                op == GPU_MV_ADD);
        return GPU_LAUNCHED("k_matvec_q8");
    });
}

int cuda_matvec_q8_cat(uint32_t type, int n_mat, const void *const *w, const int64_t *rows,
                       size_t row_bytes, int64_t cols, const void *q8, float *const *y)
{
    static const char what[] = "gpu_matvec_q8_cat: unsupported type or bad arguments";
    return with_qtype(type, what, [&](auto tag) -> int {
        constexpr int T = decltype(tag)::value;
        constexpr int R = mvq_rows<T, 1>();
        if (!row_fits<T>(cols, row_bytes) || cols == 0 || n_mat < 1 || n_mat > GPU_CAT_MAX || !w ||
            !rows || !y || !q8 || !q8_ok(q8))
            return bad(what);
        mvq_cat  cat = {};
        bool     a4 = true;
        uint64_t blocks = 0;
        cat.n = n_mat;
        for (int i = 0; i < n_mat; i++) {
            if (!w[i] || !y[i] || rows[i] < 1)
                return bad(what);
            cat.w[i] = static_cast<const uint8_t *>(w[i]);
            cat.y[i] = y[i];
            cat.rows[i] = rows[i];
            cat.first[i] = static_cast<unsigned>(blocks);
            blocks += gpu_blocks(rows[i], R);
            a4 = a4 && blocks_a4(w[i], row_bytes, 0);
        }
        if (blocks > INT32_MAX)
            return bad(what);
        cat.first[n_mat] = static_cast<unsigned>(blocks);
        with_a4<T>(a4, [&](auto a) {
            k_matvec_q8<T, 1, MVQ_CAT, decltype(a)::value, false>
                <<<static_cast<unsigned>(blocks), MV_WARPS * 32, 0, gpu_stream()>>>(
                    cat.w[0], nullptr, row_bytes, 0, rows[0], cols, nullptr, nullptr, 1,
                    static_cast<const uint8_t *>(q8), 1, cat.y[0], 0, false, cat);
        });
        return GPU_LAUNCHED("k_matvec_q8_cat");
    });
}

int cuda_matvec_ids_q8(uint32_t type, const void *w, const void *w2, size_t expert_bytes,
                       size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                       int64_t n_items, const void *q8, int64_t x_div, float *y, int64_t y_stride)
{
    static const char what[] = "gpu_matvec_ids_q8: unsupported type or bad arguments";
    return with_qtype(type, what, [&](auto tag) -> int {
        constexpr int T = decltype(tag)::value;
        if (!row_fits<T>(cols, row_bytes) || rows < 0 || n_items < 0 || x_div < 1 ||
            static_cast<uint64_t>(rows) * row_bytes > expert_bytes ||
            (n_items > 1 && y_stride < rows))
            return bad(what);
        if (rows == 0 || n_items == 0)
            return 0;
        if (cols == 0 || !w || !ids || !q8 || !y || !q8_ok(q8))
            return bad(what);
        const unsigned rows_y = static_cast<unsigned>(n_items < GRID_Y_MAX ? n_items : GRID_Y_MAX);
        const bool     a4 = blocks_a4(w, row_bytes, expert_bytes) &&
                        (!w2 || blocks_a4(w2, row_bytes, expert_bytes));
        with_a4<T>(a4, [&](auto a) {
            const uint8_t *wb = static_cast<const uint8_t *>(w),
                          *wb2 = static_cast<const uint8_t *>(w2);
            const uint8_t *xq = static_cast<const uint8_t *>(q8);
            if (w2)
                k_matvec_q8<T, 1, MVQ_IDS, decltype(a)::value, true>
                    <<<dim3(gpu_blocks(rows, mvq_rows<T, 1>() / 2), rows_y), MV_WARPS * 32, 0,
                       gpu_stream()>>>(wb, wb2, row_bytes, expert_bytes, rows, cols, ids, nullptr,
                                       n_items, xq, x_div, y, y_stride, false);
            else
                k_matvec_q8<T, 1, MVQ_IDS, decltype(a)::value, false>
                    <<<dim3(gpu_blocks(rows, mvq_rows<T, 1>()), rows_y), MV_WARPS * 32, 0,
                       gpu_stream()>>>(wb, nullptr, row_bytes, expert_bytes, rows, cols, ids,
                                       nullptr, n_items, xq, x_div, y, y_stride, false);
        });
        return GPU_LAUNCHED("k_matvec_ids_q8");
    });
}

int cuda_matvec_ids_combine_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                               int64_t rows, int64_t cols, const int32_t *ids, const float *sel_w,
                               int64_t n_tok, int32_t k, const void *q8, float *x, int64_t x_stride)
{
    static const char what[] = "gpu_matvec_ids_combine_q8: unsupported type or bad arguments";
    return with_qtype(type, what, [&](auto tag) -> int {
        constexpr int T = decltype(tag)::value;
        if (!row_fits<T>(cols, row_bytes) || rows < 0 || n_tok < 0 || k < 1 ||
            static_cast<uint64_t>(rows) * row_bytes > expert_bytes ||
            (n_tok > 1 && x_stride < rows))
            return bad(what);
        if (rows == 0 || n_tok == 0)
            return 0;
        if (cols == 0 || !w || !ids || !sel_w || !q8 || !x || !q8_ok(q8))
            return bad(what);
        mvq_cat ex = {};
        ex.k = k;
        ex.sel_w = sel_w;
        const dim3 grid(gpu_blocks(rows, mvq_rows<T, 1>()),
                        static_cast<unsigned>(n_tok < GRID_Y_MAX ? n_tok : GRID_Y_MAX));
        with_a4<T>(blocks_a4(w, row_bytes, expert_bytes), [&](auto a) {
            k_matvec_q8<T, 1, MVQ_COMBINE, decltype(a)::value, false>
                <<<grid, MV_WARPS * 32, 0, gpu_stream()>>>(
                    static_cast<const uint8_t *>(w), nullptr, row_bytes, expert_bytes, rows, cols,
                    ids, nullptr, n_tok, static_cast<const uint8_t *>(q8), 1, x, x_stride, false,
                    ex);
        });
        return GPU_LAUNCHED("k_matvec_ids_combine_q8");
    });
}

int cuda_matvec_groups_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                          int64_t rows, int64_t cols, const struct gpu_group *groups,
                          int64_t n_groups, const void *q8, float *y, int64_t y_stride)
{
    static const char what[] = "gpu_matvec_groups_q8: unsupported type or bad arguments";
    return with_qtype(type, what, [&](auto tag) -> int {
        constexpr int T = decltype(tag)::value;
        if (!row_fits<T>(cols, row_bytes) || rows < 0 || n_groups < 0 ||
            static_cast<uint64_t>(rows) * row_bytes > expert_bytes || y_stride < rows)
            return bad(what);
        if (rows == 0 || n_groups == 0)
            return 0;
        if (cols == 0 || !w || !groups || !q8 || !y || !q8_ok(q8))
            return bad(what);
        const dim3 grid(gpu_blocks(rows, mvq_rows<T, GPU_GROUP_MAX>()),
                        static_cast<unsigned>(n_groups < GRID_Y_MAX ? n_groups : GRID_Y_MAX));
        with_a4<T>(blocks_a4(w, row_bytes, expert_bytes), [&](auto a4) {
            k_matvec_q8<T, GPU_GROUP_MAX, MVQ_GROUPS, decltype(a4)::value, false>
                <<<grid, MV_WARPS * 32, 0, gpu_stream()>>>(
                    static_cast<const uint8_t *>(w), nullptr, row_bytes, expert_bytes, rows, cols,
                    nullptr, groups, n_groups, static_cast<const uint8_t *>(q8), 1, y, y_stride,
                    false);
        });
        return GPU_LAUNCHED("k_matvec_groups_q8");
    });
}

int cuda_f32_to_f16(const float *x, int64_t x_stride, int64_t n, int64_t cols, uint16_t *out)
{
    if (n < 0 || cols < 0 || (n > 1 && x_stride < cols))
        return bad("gpu_f32_to_f16: bad arguments");
    if (n == 0 || cols == 0)
        return 0;
    if (!x || !out)
        return bad("gpu_f32_to_f16: bad arguments");
    const int64_t  total = n * cols;
    const unsigned blocks = gpu_blocks(total < (1ll << 26) ? total : (1ll << 26), CV_THREADS);
    k_f32_to_f16<<<blocks, CV_THREADS, 0, gpu_stream()>>>(x, x_stride, n, cols,
                                                          reinterpret_cast<__half *>(out));
    return GPU_LAUNCHED("k_f32_to_f16");
}

int cuda_gemm_f16(const uint16_t *w16, int64_t rows, int64_t cols, const uint16_t *x16, int64_t n,
                  float *y, int64_t y_stride)
{
    static const char what[] =
        "gpu_gemm_f16: bad arguments (cols a multiple of 32, inputs 16-byte aligned)";
    if (rows < 0 || n < 0 || cols < 0 || cols % GM_BK != 0 || (n > 1 && y_stride < rows))
        return bad(what);
    if (rows == 0 || n == 0)
        return 0;
    if (!w16 || !x16 || !y || (reinterpret_cast<uintptr_t>(w16) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(x16) & 15) != 0 || (n + 63) / 64 > GRID_Y_MAX)
        return bad(what);
    const auto *wh = reinterpret_cast<const __half *>(w16);
    const auto *xh = reinterpret_cast<const __half *>(x16);
    /* 128 tokens a block where that still gives two blocks an SM (the FFN products of a
     * prefill), else 64. */
    if (static_cast<int64_t>(gpu_blocks(rows, GM_BN)) * gpu_blocks(n, 128) >= GM_BIG_MIN) {
        static unsigned opted; /* a bit per device: the attribute is the device's */
        const unsigned  me = 1u << gpu_current_device();
        if (!(opted & me)) {
            if (gpu_record(cudaFuncSetAttribute(k_gemm_f16<128>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(sizeof(gemm_smem<128>))),
                           "k_gemm_f16 shared memory") < 0)
                return -1;
            opted |= me;
        }
        const dim3 grid(gpu_blocks(rows, GM_BN), gpu_blocks(n, 128));
        k_gemm_f16<128><<<grid, GM_THREADS, sizeof(gemm_smem<128>), gpu_stream()>>>(
            wh, rows, cols, xh, n, y, y_stride);
    } else {
        const dim3 grid(gpu_blocks(rows, GM_BN), gpu_blocks(n, 64));
        k_gemm_f16<64><<<grid, GM_THREADS, sizeof(gemm_smem<64>), gpu_stream()>>>(
            wh, rows, cols, xh, n, y, y_stride);
    }
    return GPU_LAUNCHED("k_gemm_f16");
}

int cuda_gemm_q(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes, int64_t rows,
                int64_t cols, const uint16_t *x16, int64_t n, const struct gpu_mm_tile *tiles,
                int64_t n_tiles, const int32_t *n_used, const int32_t *items, int32_t x_div,
                float *y, int64_t y_stride)
{
    static const char what[] = "gpu_gemm_q: unsupported type or bad arguments";
    return with_qtype(type, what, [&](auto tag) -> int {
        constexpr int T = decltype(tag)::value;
        const bool    by_tiles = tiles != nullptr;
        if (!row_fits<T>(cols, row_bytes) || cols % QK != 0 || rows < 0 || n < 0 || n_tiles < 0 ||
            (by_tiles && (x_div < 1 || !items)) || y_stride < rows ||
            (by_tiles && static_cast<uint64_t>(rows) * row_bytes > expert_bytes))
            return bad(what);
        const int64_t blocks_y = by_tiles ? n_tiles : (n + 63) / 64;
        if (rows == 0 || blocks_y == 0)
            return 0;
        if (cols == 0 || !w || !x16 || !y || (reinterpret_cast<uintptr_t>(x16) & 15) != 0 ||
            blocks_y > GRID_Y_MAX)
            return bad(what);
        const dim3   grid(gpu_blocks(rows, GM_BN), static_cast<unsigned>(blocks_y));
        const size_t eb = by_tiles ? expert_bytes : 0;
        with_a4<T>(blocks_a4(w, row_bytes, eb), [&](auto a4) {
            constexpr bool A4 = decltype(a4)::value;
            const auto    *wq = static_cast<const uint8_t *>(w);
            const auto    *xh = reinterpret_cast<const __half *>(x16);
            if (by_tiles)
                k_gemm_q<T, A4, GPU_MM_TILE, true><<<grid, GM_THREADS, 0, gpu_stream()>>>(
                    wq, expert_bytes, row_bytes, rows, cols, xh, n, tiles, n_used, items, x_div, y,
                    y_stride);
            else
                k_gemm_q<T, A4, 64, false><<<grid, GM_THREADS, 0, gpu_stream()>>>(
                    wq, 0, row_bytes, rows, cols, xh, n, nullptr, nullptr, nullptr, 1, y, y_stride);
        });
        return GPU_LAUNCHED("k_gemm_q");
    });
}
