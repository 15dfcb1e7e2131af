/* executor/kv.h - private to executor/: the KV cache of one sequence (f16 or q8_0). */
#ifndef EXECUTOR_KV_H
#define EXECUTOR_KV_H

/* Not for use outside executor/: other folders go through executor_ctx in executor.h. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "executor.h"

/* Layouts (as llama.cpp's CPU path without flash attention):
 * - K: (layer, cell, n_head_kv * head_dim_k) rows, f16 or q8_0 blocks;
 * - V f16: transposed, (layer, kv_head, head_dim_v, cell), so one output element of attention is
 *   one f16 dot product over positions;
 * - V q8_0: (layer, cell, n_head_kv * head_dim_v) rows of q8_0 blocks;
 * a layer has cap[layer] cells, position p in cell p % cap[layer] (none for a layer whose KV
 * is on a device: the layout's kv_layers);
 * - latent attention (v_in_k): no V; the values are the first head_dim_v elements of K. */
struct executor_kv {
    enum common_cache_type type;
    uint32_t               n_layer, n_ctx, n_head_kv, head_dim_k, head_dim_v;
    size_t                 k_pos_bytes;  /* bytes of one position's K row (all kv heads) */
    size_t                 k_head_bytes; /* bytes of one kv head inside a K row */
    size_t                 v_pos_bytes;  /* q8_0: bytes of one position's V row */
    size_t                 v_head_bytes; /* q8_0: bytes of one kv head inside a V row */
    uint8_t               *k;            /* owned: n_layer * n_ctx * k_pos_bytes */
    uint8_t               *v;            /* owned: n_layer * n_ctx * n_head_kv * head_dim_v
                                            elements (f16 or q8_0); unused with v_in_k */
    bool      v_in_k;                    /* latent attention: V is the head of the K row */
    uint32_t *cap; /* owned: (n_layer) positions kept; position p is in cell p % cap (a ring
                      for sliding layers, n_ctx otherwise) */
    size_t *k_off; /* owned: (n_layer) byte offset of each layer's K cells */
    size_t *v_off; /* owned: (n_layer) byte offset of each layer's V */
};

/* Allocates a zeroed cache of the sizes in `lay` (common_ctx_layout_compute() for the model's
 * hyper-parameters `hp`). Returns 0 or COMMON_ENOMEM. */
int  executor_kv_init(struct executor_kv *kv, const struct common_ctx_layout *lay,
                      const struct common_hparams *hp);
void executor_kv_fini(struct executor_kv *kv);

/* Stores one position's K (n_head_kv * head_dim_k floats) and V. */
void executor_kv_store(struct executor_kv *kv, uint32_t layer, uint32_t pos, const float *k,
                       const float *v);

/* K rows of kv head `h` of `layer`: cell c's head starts at k_base + c * k_pos_bytes. */
static inline const uint8_t *executor_kv_k_base(const struct executor_kv *kv, uint32_t layer,
                                                uint32_t h)
{
    return kv->k + kv->k_off[layer] + (size_t)h * kv->k_head_bytes;
}

/* f16 V: row d (0..head_dim_v) of kv head h holds the layer's cells, cap[layer] * 2 bytes
 * apart. */
static inline const uint8_t *executor_kv_vt_base(const struct executor_kv *kv, uint32_t layer,
                                                 uint32_t h)
{
    return kv->v + kv->v_off[layer] + (size_t)h * kv->head_dim_v * kv->cap[layer] * 2u;
}

/* q8_0 V: the blocks of kv head h at position p. */
static inline const uint8_t *executor_kv_v_row(const struct executor_kv *kv, uint32_t layer,
                                               uint32_t pos, uint32_t h)
{
    return kv->v + kv->v_off[layer] + (size_t)(pos % kv->cap[layer]) * kv->v_pos_bytes +
           (size_t)h * kv->v_head_bytes;
}

#endif /* EXECUTOR_KV_H */
