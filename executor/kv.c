/* executor/kv.c - the KV cache of one sequence: allocation and storing one position. */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

int executor_kv_init(struct executor_kv *kv, const struct common_ctx_layout *lay,
                     const struct common_hparams *hp)
{
    memset(kv, 0, sizeof(*kv));
    kv->type = lay->cache_type;
    kv->n_layer = hp->n_layer;
    kv->n_ctx = lay->n_ctx;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim_k = hp->head_dim_k;
    kv->head_dim_v = hp->head_dim_v;
    kv->k_head_bytes = (size_t)lay->kv_k_head_bytes;
    kv->k_pos_bytes = kv->k_head_bytes * kv->n_head_kv;
    kv->v_head_bytes = (size_t)lay->kv_v_head_bytes;
    kv->v_pos_bytes = kv->v_head_bytes * kv->n_head_kv;
    kv->v_in_k = hp->n_lora_kv != 0;
    kv->cap = calloc(hp->n_layer, sizeof(*kv->cap));
    kv->k_off = calloc(hp->n_layer, sizeof(*kv->k_off));
    kv->v_off = calloc(hp->n_layer, sizeof(*kv->v_off));
    kv->k = calloc(lay->kv_k_bytes ? (size_t)lay->kv_k_bytes : 1, 1);
    kv->v = calloc(lay->kv_v_bytes ? (size_t)lay->kv_v_bytes : 1, 1);
    if (!kv->k || !kv->v || !kv->cap || !kv->k_off || !kv->v_off) {
        executor_kv_fini(kv);
        return COMMON_ENOMEM;
    }
    /* Each layer's cells one after the other: the sizes add up to the layout's. */
    size_t ko = 0, vo = 0;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        /* A layer on a device keeps its KV there: no cells here. */
        kv->cap[il] =
            il < lay->kv_layers ? common_kv_layer_positions(hp, lay->n_ctx, lay->n_batch, il) : 0;
        kv->k_off[il] = ko;
        kv->v_off[il] = vo;
        ko += (size_t)kv->cap[il] * kv->k_pos_bytes;
        if (kv->v_in_k)
            continue;
        vo += kv->type == COMMON_CACHE_F16
                  ? (size_t)kv->cap[il] * kv->n_head_kv * kv->head_dim_v * 2u
                  : (size_t)kv->cap[il] * kv->v_pos_bytes;
    }
    return 0;
}

void executor_kv_fini(struct executor_kv *kv)
{
    if (!kv)
        return;
    free(kv->k);
    free(kv->v);
    free(kv->cap);
    free(kv->k_off);
    free(kv->v_off);
    kv->k = NULL;
    kv->v = NULL;
    kv->cap = NULL;
    kv->k_off = kv->v_off = NULL;
}

void executor_kv_store(struct executor_kv *kv, uint32_t layer, uint32_t pos, const float *k,
                       const float *v)
{
    const uint32_t cell = pos % kv->cap[layer];
    uint8_t       *krow = kv->k + kv->k_off[layer] + (size_t)cell * kv->k_pos_bytes;
    uint32_t       nk = kv->n_head_kv * kv->head_dim_k;
    if (kv->type == COMMON_CACHE_F16) {
        uint16_t *kh = (uint16_t *)krow;
        for (uint32_t i = 0; i < nk; i++)
            kh[i] = executor_fp32_to_fp16(k[i]);
        for (uint32_t h = 0; !kv->v_in_k && h < kv->n_head_kv; h++) {
            uint16_t *vt = (uint16_t *)(void *)(kv->v + kv->v_off[layer] +
                                                (size_t)h * kv->head_dim_v * kv->cap[layer] * 2u);
            for (uint32_t d = 0; d < kv->head_dim_v; d++)
                vt[(size_t)d * kv->cap[layer] + cell] =
                    executor_fp32_to_fp16(v[(size_t)h * kv->head_dim_v + d]);
        }
        return;
    }
    /* q8_0 rows, made like llama.cpp's f32 -> q8_0 copy (the activation quantizer). */
    executor_quantize_act(COMMON_GGML_TYPE_Q8_0, k, krow, nk);
    if (kv->v_in_k)
        return;
    uint8_t *vrow = kv->v + kv->v_off[layer] + (size_t)cell * kv->v_pos_bytes;
    executor_quantize_act(COMMON_GGML_TYPE_Q8_0, v, vrow, (int64_t)kv->n_head_kv * kv->head_dim_v);
}
