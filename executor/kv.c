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
    kv->k = calloc(lay->kv_k_bytes ? (size_t)lay->kv_k_bytes : 1, 1);
    kv->v = calloc(lay->kv_v_bytes ? (size_t)lay->kv_v_bytes : 1, 1);
    if (!kv->k || !kv->v) {
        executor_kv_fini(kv);
        return COMMON_ENOMEM;
    }
    return 0;
}

void executor_kv_fini(struct executor_kv *kv)
{
    if (!kv)
        return;
    free(kv->k);
    free(kv->v);
    kv->k = NULL;
    kv->v = NULL;
}

void executor_kv_store(struct executor_kv *kv, uint32_t layer, uint32_t pos, const float *k,
                       const float *v)
{
    uint8_t *krow = kv->k + ((size_t)layer * kv->n_ctx + pos) * kv->k_pos_bytes;
    uint32_t nk = kv->n_head_kv * kv->head_dim_k;
    if (kv->type == COMMON_CACHE_F16) {
        uint16_t *kh = (uint16_t *)krow;
        for (uint32_t i = 0; i < nk; i++)
            kh[i] = executor_fp32_to_fp16(k[i]);
        for (uint32_t h = 0; !kv->v_in_k && h < kv->n_head_kv; h++) {
            uint16_t *vt = (uint16_t *)(void *)(kv->v + (((size_t)layer * kv->n_head_kv + h) *
                                                         kv->head_dim_v) *
                                                            kv->n_ctx * 2u);
            for (uint32_t d = 0; d < kv->head_dim_v; d++)
                vt[(size_t)d * kv->n_ctx + pos] =
                    executor_fp32_to_fp16(v[(size_t)h * kv->head_dim_v + d]);
        }
        return;
    }
    /* q8_0 rows, made like llama.cpp's f32 -> q8_0 copy (the activation quantizer). */
    executor_quantize_act(COMMON_GGML_TYPE_Q8_0, k, krow, nk);
    if (kv->v_in_k)
        return;
    uint8_t *vrow = kv->v + ((size_t)layer * kv->n_ctx + pos) * kv->v_pos_bytes;
    executor_quantize_act(COMMON_GGML_TYPE_Q8_0, v, vrow, (int64_t)kv->n_head_kv * kv->head_dim_v);
}
