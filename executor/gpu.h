/* executor/gpu.h - private to executor/: the layers of a sequence that run on a CUDA device
 * (-ngl), for forward.c. The kernels are cuda/gpu.h's; this is the forward pass over them. */
#ifndef EXECUTOR_GPU_H
#define EXECUTOR_GPU_H

/* Not for use outside executor/: other folders set executor_ctx_opts.n_gpu_layers. */

#include "forward_impl.h"

struct executor_gpu;

/* Why `m` cannot run on the GPU (a line for the user), or NULL when it can: the architectures
 * and weight types the CUDA path implements; the MoE of the first n_cpu_moe layers runs on the
 * CPU (--n-cpu-moe) and is not asked about. */
const char *executor_gpu_unsupported(const struct executor_model *m, int32_t n_cpu_moe, char *buf,
                                     size_t len);

/* One sequence's device side: a KV cache of n_ctx positions for the device's layers (f16, or
 * q8_0 as pl->cache_type says) and
 * the scratch of n_batch tokens, over `shared` weights (borrowed; NULL = made for this ctx alone
 * as pl places them). Returns 0 or a negative common_err with the message in e. */
int  executor_gpu_create(const struct executor_model *m, const struct executor_gpu_weights *shared,
                         const struct executor_gpu_place *pl, uint32_t n_ctx, uint32_t n_batch,
                         struct executor_gpu **out, struct common_errmsg *e);
void executor_gpu_destroy(struct executor_gpu *g);

/* The device's KV cache is q8_0 (--cache-type q8_0 and head dims of multiples of 32). */
bool executor_gpu_kv_q8(const struct executor_gpu *g);

/* First layer of g's parts, the CPU device's included (the layers before it are the CPU's own
 * pass, executor/forward.c). */
uint32_t executor_gpu_first_layer(const struct executor_gpu *g);
/* Bytes of the KV caches of g's parts. */
uint64_t executor_gpu_kv_bytes(const struct executor_gpu *g);
/* The layers on devices (not the CPU device's): their KV is not in RAM. */
uint32_t executor_gpu_device_layers(const struct executor_gpu *g);
/* Layers on the devices, plus one for the head (llama.cpp's count); the devices' names. The
 * CPU device's part is not counted. */
int32_t executor_gpu_layers(const struct executor_gpu *g, char *name, size_t len);
/* A line per device: the device, the layers on it and the device memory they take. */
void executor_gpu_describe(const struct executor_gpu *g, char *buf, size_t len);
/* The bandwidth of g's first device (executor_ctx_gpu_membw). */
double executor_gpu_membw(const struct executor_gpu *g, size_t bytes);
/* Steps run as g's graph (executor_ctx_gpu_graph_steps). */
uint64_t executor_gpu_graph_steps(const struct executor_gpu *g);
/* The expert pool of g's weights (executor_ctx_gpu_pool_stats). */
void executor_gpu_pool_stats(const struct executor_gpu *g, struct executor_gpu_pool_stats *out);

/* The device layers for the n rows of c->x (positions p0.., their rope table in c->rope), then
 * the head: on the device when it is there (logits of every row when all, else of the last
 * one, into `logits` when not NULL; returns 1), else x is copied back into c->x for the CPU's
 * head (returns 0). COMMON_EDEVICE when the device failed (its state, the KV cache included, is
 * then lost; message in e), another negative common_err otherwise. */
int executor_gpu_forward(struct executor_gpu *g, struct executor_ctx *c, uint32_t n, uint32_t p0,
                         float *logits, bool all, struct common_errmsg *e);

/* One sequence of a device batch: rows [row, row + n) of the batch, at positions p0.. of the
 * KV cache of g (a context over the same device weights). */
struct executor_gpu_member {
    struct executor_gpu *g;
    uint32_t             row, n, p0;
};

/* The device layers for the n rows of c->x (their rope tables in c->rope), the n_mb members
 * each attending over its own cache; g lends its scratch (it need not be a member). Then the
 * head of rows out_rows[0..n_out) into `logits` (n_out rows) when it is on the device (returns
 * 1), else x goes back into c->x (returns 0). Every kernel computes a row independently of the
 * others (below GPU_GEMM_MIN_N rows: matvec), so a member gets what it gets alone when the
 * batch has fewer rows than that. Errors as executor_gpu_forward. */
int executor_gpu_forward_members(struct executor_gpu *g, const struct executor_gpu_member *mb,
                                 uint32_t n_mb, struct executor_ctx *c, uint32_t n,
                                 const uint32_t *out_rows, uint32_t n_out, float *logits,
                                 struct common_errmsg *e);
/* Batches of at most this many rows go through the matvec kernels, each row computed
 * independently of the others. */
#define EXECUTOR_GPU_ROW_EXACT 16
/* Whether a and b hold their layers in the same device weights (so they may share a step). */
bool executor_gpu_same_weights(const struct executor_gpu *a, const struct executor_gpu *b);

#endif /* EXECUTOR_GPU_H */
