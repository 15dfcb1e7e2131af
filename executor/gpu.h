/* executor/gpu.h - private to executor/: the layers of a sequence that run on a CUDA device
 * (-ngl), for forward.c. The kernels are cuda/gpu.h's; this is the forward pass over them. */
#ifndef EXECUTOR_GPU_H
#define EXECUTOR_GPU_H

/* Not for use outside executor/: other folders set executor_ctx_opts.n_gpu_layers. */

#include "forward_impl.h"

struct executor_gpu;

/* Why `m` cannot run on the GPU (a line for the user), or NULL when it can: the architectures
 * and weight types the CUDA path implements. */
const char *executor_gpu_unsupported(const struct executor_model *m, char *buf, size_t len);

/* One sequence's device side: an f16 KV cache of n_ctx positions for the device's layers and
 * the scratch of n_batch tokens, over `shared` weights (borrowed; NULL = made for this ctx alone
 * from n_layers and dev). Returns 0 or a negative common_err with the message in e. */
int  executor_gpu_create(const struct executor_model *m, const struct executor_gpu_weights *shared,
                         int32_t n_layers, int32_t dev, uint32_t n_ctx, uint32_t n_batch,
                         struct executor_gpu **out, struct common_errmsg *e);
void executor_gpu_destroy(struct executor_gpu *g);

/* First layer on the device (n_layer when none). */
uint32_t executor_gpu_first_layer(const struct executor_gpu *g);
/* Layers on the device, plus one for the head (llama.cpp's count); the device's name. */
int32_t executor_gpu_layers(const struct executor_gpu *g, char *name, size_t len);
/* One line: the device, the layers on it and the device memory they take. */
void executor_gpu_describe(const struct executor_gpu *g, char *buf, size_t len);

/* The device layers for the n rows of c->x (positions p0.., their rope table in c->rope), then
 * the head: on the device when it is there (logits of every row when all, else of the last
 * one, into `logits` when not NULL; returns 1), else x is copied back into c->x for the CPU's
 * head (returns 0). COMMON_EDEVICE when the device failed (its state, the KV cache included, is
 * then lost; message in e), another negative common_err otherwise. */
int executor_gpu_forward(struct executor_gpu *g, struct executor_ctx *c, uint32_t n, uint32_t p0,
                         float *logits, bool all, struct common_errmsg *e);

#endif /* EXECUTOR_GPU_H */
