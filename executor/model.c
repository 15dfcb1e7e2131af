/* executor/model.c - a model ready to run: checks what the forward pass supports, builds views. */
#include "model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static int model_apply_scale(struct executor_model *m, int64_t scale, struct executor_mat *out,
                             struct common_errmsg *e);

/* Bytes an I2_S layout may differ from its expected size (padding, Microsoft's 32-byte tail). */
#define MODEL_I2S_TOLERANCE 128u

/* abs(a - b). */
static uint64_t model_absdiff(uint64_t a, uint64_t b)
{
    return a > b ? a - b : b - a;
}

/* The sibling of I2_S tensor `t` with one scale per 32-element block ("blk.0.attn_q.scales" for
 * "blk.0.attn_q.weight", F32 or F16): its index, or -1 when none has that many elements. */
static int64_t model_i2s_sibling(const struct common_gguf *g, const struct common_gguf_tensor *t,
                                 uint64_t nel)
{
    char         name[160];
    const size_t len = strlen(t->name);
    if (len < 7 || len >= sizeof(name) - 8 || strcmp(t->name + len - 7, ".weight") != 0)
        return -1;
    snprintf(name, sizeof(name), "%.*s.scales", (int)(len - 7), t->name);
    const struct common_gguf_tensor *s = common_gguf_tensor_find(g, name);
    if (!s || (s->type != COMMON_GGML_TYPE_F32 && s->type != COMMON_GGML_TYPE_F16) ||
        s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3] != nel / 32)
        return -1;
    return (int64_t)(s - common_gguf_tensor_at(g, 0));
}

/* The layout of an I2_S tensor (seed 003's three). The bytes up to the next tensor (t->size)
 * tell it: Microsoft's (2-bit codes in 128-element groups, one f32 scale after them: n / 4 + 32
 * bytes), 32-element blocks of codes and an inline f16 scale (n / 32 * 10), or 32-element blocks
 * of codes (n / 4) beside a sibling tensor of block scales. Each within MODEL_I2S_TOLERANCE bytes
 * (the inline layout, read in place, never short of its size; the others' codes are all there, as
 * the parser checked); a sibling of the right size decides for the split layout (its codes take as
 * many bytes as Microsoft's), otherwise the nearer of the two others (Microsoft's on a tie, as the
 * seed orders them). Returns the kernel type (I2S_Q128, I2S_B32H, or I2S_B32F for the split
 * layout, with *sib its scales), or a negative error with a message. */
static int model_i2s_layout(const struct common_gguf *g, const struct common_gguf_tensor *t,
                            int64_t *sib, struct common_errmsg *e)
{
    const uint64_t nel = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    const uint64_t need_q = (nel + 255) / 256 * 64, need_s = (nel + 31) / 32 * 8;
    const uint64_t need_i = (nel + 31) / 32 * 10, avail = t->size;
    const uint64_t dq = model_absdiff(avail, need_q), di = model_absdiff(avail, need_i);
    *sib = model_i2s_sibling(g, t, nel);
    if (*sib >= 0 && model_absdiff(avail, need_s) <= MODEL_I2S_TOLERANCE)
        return COMMON_GGML_TYPE_I2S_B32F;
    if (dq <= MODEL_I2S_TOLERANCE && dq <= di) {
        if (t->ne[0] % 128 != 0)
            return common_errmsg_set(e, COMMON_ENOTSUP,
                                     "tensor '%s': i2_s in Microsoft's layout needs rows of a "
                                     "multiple of 128 elements, not %llu",
                                     t->name, (unsigned long long)t->ne[0]);
        return COMMON_GGML_TYPE_I2S_Q128;
    }
    if (di <= MODEL_I2S_TOLERANCE && avail >= need_i)
        return COMMON_GGML_TYPE_I2S_B32H;
    return common_errmsg_set(e, COMMON_ECORRUPT,
                             "tensor '%s': %llu bytes of i2_s fit no layout (Microsoft's %llu, "
                             "inline f16 scales %llu, split scales %llu%s; +-%u allowed)",
                             t->name, (unsigned long long)avail, (unsigned long long)need_q,
                             (unsigned long long)need_i, (unsigned long long)need_s,
                             *sib >= 0 ? "" : " with no '.scales' sibling", MODEL_I2S_TOLERANCE);
}

/* The tensor scale of an I2_S tensor `t` in Microsoft's layout: the f32 after its codes, or 1
 * when the data stops at the codes. 0 (with a message) when it is not a finite non-zero number. */
static float model_i2s_tail_scale(const struct common_gguf_tensor *t, const void *data,
                                  struct common_errmsg *e)
{
    const uint64_t nel = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float          scale = 1.0f;
    if (t->size >= nel / 4 + 4)
        memcpy(&scale, (const uint8_t *)data + nel / 4, 4);
    if (!isfinite(scale) || scale == 0.0f) {
        common_errmsg_set(e, COMMON_ECORRUPT, "tensor '%s': i2_s tensor scale %g after the codes",
                          t->name, (double)scale);
        return 0.0f;
    }
    return scale;
}

/* An I2_S tensor as the kernels read it (model_i2s_layout): Microsoft's layout and the inline
 * one in place, the split layout rebuilt once with f32 scales inline (m->bufs). */
static int model_i2s(struct executor_model *m, const struct common_gguf_tensor *t, const void *data,
                     struct executor_mat *out, struct common_errmsg *e)
{
    const struct common_gguf *g = m->desc->gguf;
    const uint64_t            rows = (uint64_t)out->rows, blocks = (uint64_t)out->cols / 32;
    int64_t                   sib;
    int                       rc = model_i2s_layout(g, t, &sib, e);
    if (rc < 0)
        return rc;
    out->type = (uint32_t)rc;
    out->data = data;
    if (rc == COMMON_GGML_TYPE_I2S_Q128) {
        out->row_bytes = (size_t)out->cols / 4;
        out->out_scale = model_i2s_tail_scale(t, data, e);
        return out->out_scale != 0.0f ? 0 : COMMON_ECORRUPT;
    }
    if (rc == COMMON_GGML_TYPE_I2S_B32H) {
        out->row_bytes = (size_t)blocks * 10;
        return 0;
    }
    const struct common_gguf_tensor *st = common_gguf_tensor_at(g, (uint64_t)sib);
    const void                      *sd;
    if ((rc = m->w->ops->tensor(m->w->impl, (uint64_t)sib, &sd)) < 0)
        return common_errmsg_set(e, rc, "tensor '%s': weight source failed", st->name);
    void **bufs = realloc(m->bufs, (m->n_bufs + 1) * sizeof(*bufs));
    if (!bufs)
        return COMMON_ENOMEM;
    m->bufs = bufs;
    uint8_t *b = malloc((size_t)(rows * blocks * 12));
    if (!b)
        return COMMON_ENOMEM;
    m->bufs[m->n_bufs++] = b;
    const uint8_t *codes = data;
    for (uint64_t i = 0; i < rows * blocks; i++) {
        float d;
        if (st->type == COMMON_GGML_TYPE_F32) {
            memcpy(&d, (const uint8_t *)sd + i * 4, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const uint8_t *)sd + i * 2, 2);
            d = executor_fp16_to_fp32(h);
        }
        memcpy(b + i * 12, codes + i * 8, 8);
        memcpy(b + i * 12 + 8, &d, 4);
    }
    out->data = b;
    out->row_bytes = (size_t)blocks * 12;
    return 0;
}

/* Resolves tensor `index` into a matrix view; checks the kernels can multiply it. `scale` is the
 * index of bitnet's per-tensor output scale ({1}), or -1. */
static int model_mat_scaled(struct executor_model *m, int64_t index, int64_t scale,
                            struct executor_mat *out, struct common_errmsg *e)
{
    const struct common_model       *d = m->desc;
    struct executor_weights         *w = m->w;
    const struct common_gguf_tensor *t = common_gguf_tensor_at(d->gguf, (uint64_t)index);
    memset(out, 0, sizeof(*out));
    if (t->type == COMMON_GGML_TYPE_I2_S) {
        int rc = w->ops->tensor(w->impl, (uint64_t)index, &out->data);
        if (rc < 0)
            return common_errmsg_set(e, rc, "tensor '%s': weight source failed", t->name);
        out->cols = (int64_t)t->ne[0];
        out->rows = (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        if ((rc = model_i2s(m, t, out->data, out, e)) < 0)
            return rc;
        return model_apply_scale(m, scale, out, e);
    }
    if (!executor_type_is_supported(t->type) ||
        executor_act_row_size(t->type, (int64_t)t->ne[0]) == 0) {
        const struct common_ggml_type_info *ti = common_ggml_type_get(t->type);
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "tensor '%s': weight type %s with rows of %llu elements is not "
                                 "supported by the executor kernels",
                                 t->name, ti ? ti->name : "unknown", (unsigned long long)t->ne[0]);
    }
    int rc = w->ops->tensor(w->impl, (uint64_t)index, &out->data);
    if (rc < 0)
        return common_errmsg_set(e, rc, "tensor '%s': weight source failed", t->name);
    /* A 3-D tensor (attn_k_b, attn_v_b) is ne2 matrices of ne1 rows, one after the other. */
    out->type = t->type;
    out->cols = (int64_t)t->ne[0];
    out->rows = (int64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    out->row_bytes = out->rows ? (size_t)(t->size / (uint64_t)out->rows) : 0;
    return model_apply_scale(m, scale, out, e);
}

static int model_mat(struct executor_model *m, int64_t index, struct executor_mat *out,
                     struct common_errmsg *e)
{
    return model_mat_scaled(m, index, -1, out, e);
}

/* Expands 1-D tensor `index` of `n` elements to a malloc'd f32 array (*out NULL when absent). */
static int model_vec(struct executor_model *m, int64_t index, uint64_t n, const float **out,
                     struct common_errmsg *e)
{
    *out = NULL;
    if (index < 0)
        return 0;
    const struct common_gguf_tensor *t = common_gguf_tensor_at(m->desc->gguf, (uint64_t)index);
    const void                      *data;
    if (t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] != n)
        return common_errmsg_set(e, COMMON_ECORRUPT, "tensor '%s' should hold %llu elements",
                                 t->name, (unsigned long long)n);
    int rc = m->w->ops->tensor(m->w->impl, (uint64_t)index, &data);
    if (rc < 0)
        return common_errmsg_set(e, rc, "tensor '%s': weight source failed", t->name);
    /* f32 is used in place: the resident bytes stay for the model's life and are counted in its
     * plan, a copy would not be (gpt-oss's expert biases alone are 27 MiB at 54 layers). */
    if (t->type == COMMON_GGML_TYPE_F32 && (uintptr_t)data % sizeof(float) == 0) {
        *out = data;
        return 0;
    }
    float **vecs = realloc(m->vecs, (m->n_vecs + 1) * sizeof(*vecs));
    if (!vecs)
        return COMMON_ENOMEM;
    m->vecs = vecs;
    float *v = malloc((size_t)n * sizeof(*v));
    if (!v)
        return COMMON_ENOMEM;
    if (executor_dequantize_row(t->type, data, v, (int64_t)n) < 0) {
        free(v);
        const struct common_ggml_type_info *ti = common_ggml_type_get(t->type);
        return common_errmsg_set(e, COMMON_ENOTSUP, "tensor '%s': type %s is not supported",
                                 t->name, ti ? ti->name : "unknown");
    }
    m->vecs[m->n_vecs++] = v;
    *out = v;
    return 0;
}

/* Multiplies out->out_scale by bitnet's per-tensor scale tensor `scale` ({1}; -1 = none). */
static int model_apply_scale(struct executor_model *m, int64_t scale, struct executor_mat *out,
                             struct common_errmsg *e)
{
    const float *s;
    int          rc = model_vec(m, scale, 1, &s, e);
    if (rc < 0 || !s)
        return rc;
    if (!isfinite(s[0]))
        return common_errmsg_set(e, COMMON_ECORRUPT, "tensor '%s' is not finite",
                                 common_gguf_tensor_at(m->desc->gguf, (uint64_t)scale)->name);
    out->out_scale = out->out_scale != 0.0f ? out->out_scale * s[0] : s[0];
    return 0;
}

/* The latent attention's tensors of layer il (deepseek2). */
static int model_layer_mla(struct executor_model *m, uint32_t il, struct common_errmsg *e)
{
    const struct common_model       *d = m->desc;
    const struct common_hparams     *hp = &d->hp;
    const struct common_model_layer *L = &d->layers[il];
    struct executor_layer_w         *lw = &m->layers[il];
    int                              rc;
    if (hp->n_lora_q) {
        if ((rc = model_mat(m, L->tensor[COMMON_ROLE_ATTN_Q_A], &lw->wq_a, e)) ||
            (rc = model_mat(m, L->tensor[COMMON_ROLE_ATTN_Q_B], &lw->wq_b, e)) ||
            (rc = model_vec(m, L->tensor[COMMON_ROLE_ATTN_Q_A_NORM], hp->n_lora_q, &lw->q_a_norm,
                            e)))
            return rc;
    } else if ((rc = model_mat(m, L->tensor[COMMON_ROLE_ATTN_Q], &lw->wq, e))) {
        return rc;
    }
    if ((rc = model_mat(m, L->tensor[COMMON_ROLE_ATTN_KV_A_MQA], &lw->wkv_a, e)) ||
        (rc = model_mat(m, L->tensor[COMMON_ROLE_ATTN_K_B], &lw->wk_b, e)) ||
        (rc = model_mat(m, L->tensor[COMMON_ROLE_ATTN_V_B], &lw->wv_b, e)) ||
        (rc =
             model_vec(m, L->tensor[COMMON_ROLE_ATTN_KV_A_NORM], hp->n_lora_kv, &lw->kv_a_norm, e)))
        return rc;
    return 0;
}

/* A dense FFN streamed as expert 0 of layer il: the geometry of its three parts as the kernels
 * read them (I2_S in place only: the split layout needs rebuilding), their output scales. */
static int model_layer_streamed_ffn(struct executor_model *m, uint32_t il, struct common_errmsg *e)
{
    const struct common_model          *d = m->desc;
    const struct common_model_layer    *L = &d->layers[il];
    struct executor_layer_w            *lw = &m->layers[il];
    static const enum common_layer_role scales[COMMON_EXPERT_PART_COUNT] = {
        COMMON_ROLE_FFN_GATE_SCALE, COMMON_ROLE_FFN_UP_SCALE, COMMON_ROLE_FFN_DOWN_SCALE};
    int rc;
    for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        const struct common_gguf_tensor *t =
            common_gguf_tensor_at(d->gguf, (uint64_t)L->tensor[COMMON_ROLE_FFN_GATE_EXPS + p]);
        struct executor_mat v = {.rows = (int64_t)t->ne[1], .cols = (int64_t)t->ne[0]};
        uint32_t            type = t->type;
        v.row_bytes = v.rows ? (size_t)(t->size / t->ne[1]) : 0;
        if (t->type == COMMON_GGML_TYPE_I2_S) {
            int64_t sib;
            if ((rc = model_i2s_layout(d->gguf, t, &sib, e)) < 0)
                return rc;
            if (rc == COMMON_GGML_TYPE_I2S_B32F)
                return common_errmsg_set(e, COMMON_ENOTSUP,
                                         "tensor '%s': i2_s with a '.scales' sibling cannot be "
                                         "streamed (it is rebuilt in memory); run without "
                                         "--ram-budget",
                                         t->name);
            type = (uint32_t)rc;
            v.row_bytes = (size_t)v.cols / (rc == COMMON_GGML_TYPE_I2S_Q128 ? 4 : 32) *
                          (rc == COMMON_GGML_TYPE_I2S_Q128 ? 1 : 10);
            lw->exp_tail[p] =
                rc == COMMON_GGML_TYPE_I2S_Q128 && t->size >= t->ne[0] * t->ne[1] / 4 + 4
                    ? t->ne[0] * t->ne[1] / 4
                    : 0;
        } else if (!executor_type_is_supported(type) || executor_act_row_size(type, v.cols) == 0) {
            const struct common_ggml_type_info *ti = common_ggml_type_get(type);
            return common_errmsg_set(e, COMMON_ENOTSUP,
                                     "tensor '%s': weight type %s with rows of %llu elements is "
                                     "not supported by the executor kernels",
                                     t->name, ti ? ti->name : "unknown",
                                     (unsigned long long)v.cols);
        }
        if ((rc = model_apply_scale(m, L->tensor[scales[p]], &v, e)) < 0)
            return rc;
        lw->exp[p] = (struct executor_expert_geom){
            .type = type, .rows = v.rows, .cols = v.cols, .row_bytes = v.row_bytes};
        lw->exp_scale[p] = v.out_scale;
    }
    lw->ffn_streamed = true;
    return 0;
}

static int model_layer(struct executor_model *m, uint32_t il, struct common_errmsg *e)
{
    const struct common_model       *d = m->desc;
    const struct common_hparams     *hp = &d->hp;
    const struct common_model_layer *L = &d->layers[il];
    struct executor_layer_w         *lw = &m->layers[il];
    uint64_t                         qd = (uint64_t)hp->n_head * hp->head_dim_k;
    uint64_t                         kd = (uint64_t)hp->n_head_kv * hp->head_dim_k;
    uint64_t                         vd = (uint64_t)hp->n_head_kv * hp->head_dim_v;
    int                              rc;
    /* q/k norms weigh one head (qwen3) or the whole projection (olmoe): the description
     * checked which of the two the architecture has. */
    const int64_t iqn = L->tensor[COMMON_ROLE_ATTN_Q_NORM],
                  ikn = L->tensor[COMMON_ROLE_ATTN_K_NORM];
    lw->q_norm_n = iqn >= 0 ? (uint32_t)common_gguf_tensor_at(d->gguf, (uint64_t)iqn)->ne[0] : 0;
    lw->k_norm_n = ikn >= 0 ? (uint32_t)common_gguf_tensor_at(d->gguf, (uint64_t)ikn)->ne[0] : 0;
    if ((rc = model_vec(m, L->tensor[COMMON_ROLE_ATTN_NORM], hp->n_embd, &lw->attn_norm, e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_FFN_NORM], hp->n_embd, &lw->ffn_norm, e)) ||
        (rc = model_vec(m, iqn, lw->q_norm_n, &lw->q_norm, e)) ||
        (rc = model_vec(m, ikn, lw->k_norm_n, &lw->k_norm, e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_ATTN_Q_BIAS], qd, &lw->bq, e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_ATTN_K_BIAS], kd, &lw->bk, e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_ATTN_V_BIAS], vd, &lw->bv, e)))
        return rc;
    if (hp->n_lora_kv) {
        if ((rc = model_layer_mla(m, il, e)))
            return rc;
    } else if ((rc = model_mat_scaled(m, L->tensor[COMMON_ROLE_ATTN_Q],
                                      L->tensor[COMMON_ROLE_ATTN_Q_SCALE], &lw->wq, e)) ||
               (rc = model_mat_scaled(m, L->tensor[COMMON_ROLE_ATTN_K],
                                      L->tensor[COMMON_ROLE_ATTN_K_SCALE], &lw->wk, e)) ||
               (rc = model_mat_scaled(m, L->tensor[COMMON_ROLE_ATTN_V],
                                      L->tensor[COMMON_ROLE_ATTN_V_SCALE], &lw->wv, e))) {
        return rc;
    }
    if (hp->sub_norms &&
        ((rc = model_vec(m, L->tensor[COMMON_ROLE_ATTN_SUB_NORM],
                         (uint64_t)hp->n_head * hp->head_dim_v, &lw->attn_sub_norm, e)) ||
         (rc = model_vec(m, L->tensor[COMMON_ROLE_FFN_SUB_NORM], hp->n_ff, &lw->ffn_sub_norm, e))))
        return rc;
    if ((rc = model_mat_scaled(m, L->tensor[COMMON_ROLE_ATTN_OUT],
                               L->tensor[COMMON_ROLE_ATTN_OUT_SCALE], &lw->wo, e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_ATTN_OUT_BIAS], hp->n_embd, &lw->bo, e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_ATTN_SINKS], hp->n_head, &lw->sinks, e)))
        return rc;
    lw->swa = common_hparams_layer_is_swa(hp, il);
    if (d->ffn_streamed)
        return model_layer_streamed_ffn(m, il, e);
    if (!common_model_layer_is_moe(d, il)) {
        if ((rc = model_mat_scaled(m, L->tensor[COMMON_ROLE_FFN_GATE],
                                   L->tensor[COMMON_ROLE_FFN_GATE_SCALE], &lw->gate, e)) ||
            (rc = model_mat_scaled(m, L->tensor[COMMON_ROLE_FFN_UP],
                                   L->tensor[COMMON_ROLE_FFN_UP_SCALE], &lw->up, e)) ||
            (rc = model_mat_scaled(m, L->tensor[COMMON_ROLE_FFN_DOWN],
                                   L->tensor[COMMON_ROLE_FFN_DOWN_SCALE], &lw->down, e)))
            return rc;
        return 0;
    }
    if ((rc = model_mat(m, L->tensor[COMMON_ROLE_FFN_GATE_INP], &lw->gate_inp, e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_FFN_EXP_PROBS_B], hp->n_expert, &lw->exp_probs_b,
                        e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_FFN_GATE_INP_BIAS], hp->n_expert, &lw->gate_inp_b,
                        e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_FFN_GATE_EXPS_BIAS],
                        (uint64_t)hp->n_ff_exp * hp->n_expert, &lw->gate_exps_b, e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_FFN_UP_EXPS_BIAS],
                        (uint64_t)hp->n_ff_exp * hp->n_expert, &lw->up_exps_b, e)) ||
        (rc = model_vec(m, L->tensor[COMMON_ROLE_FFN_DOWN_EXPS_BIAS],
                        (uint64_t)hp->n_embd * hp->n_expert, &lw->down_exps_b, e)))
        return rc;
    if (L->tensor[COMMON_ROLE_FFN_UP_SHEXP] >= 0 &&
        ((rc = model_mat(m, L->tensor[COMMON_ROLE_FFN_GATE_SHEXP], &lw->sh_gate, e)) ||
         (rc = model_mat(m, L->tensor[COMMON_ROLE_FFN_UP_SHEXP], &lw->sh_up, e)) ||
         (rc = model_mat(m, L->tensor[COMMON_ROLE_FFN_DOWN_SHEXP], &lw->sh_down, e))))
        return rc;
    if (L->tensor[COMMON_ROLE_FFN_GATE_INP_SHEXP] >= 0 &&
        (rc = model_mat(m, L->tensor[COMMON_ROLE_FFN_GATE_INP_SHEXP], &lw->sh_gate_inp, e)))
        return rc;
    for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        struct common_span s;
        if ((rc = common_model_expert_span(d, il, 0, (enum common_expert_part)p, &s)) < 0)
            return common_errmsg_set(e, rc, "blk.%u: no expert geometry", il);
        const struct common_gguf_tensor *t =
            common_gguf_tensor_at(d->gguf, (uint64_t)L->tensor[COMMON_ROLE_FFN_GATE_EXPS + p]);
        if (!executor_type_is_supported(s.type) ||
            executor_act_row_size(s.type, (int64_t)s.cols) == 0) {
            const struct common_ggml_type_info *ti = common_ggml_type_get(s.type);
            return common_errmsg_set(e, COMMON_ENOTSUP,
                                     "tensor '%s': weight type %s with rows of %llu elements is "
                                     "not supported by the executor kernels",
                                     t->name, ti ? ti->name : "unknown",
                                     (unsigned long long)s.cols);
        }
        lw->exp[p].type = s.type;
        lw->exp[p].rows = (int64_t)s.rows;
        lw->exp[p].cols = (int64_t)s.cols;
        lw->exp[p].row_bytes = s.rows ? (size_t)(s.size / s.rows) : 0;
    }
    return 0;
}

int executor_model_create(const struct common_model *desc, struct executor_weights *w,
                          struct executor_model **out, struct common_errmsg *e)
{
    /* Every architecture of the description's table runs here (common/model.c). */
    const struct common_hparams *hp = &desc->hp;
    if (hp->n_rot > hp->head_dim_k || hp->n_rot % 2 != 0)
        return common_errmsg_set(e, COMMON_ENOTSUP, "rope.dimension_count %u is not supported",
                                 hp->n_rot);
    struct executor_model *m = calloc(1, sizeof(*m));
    if (!m)
        return COMMON_ENOMEM;
    m->desc = desc;
    m->w = w;
    m->layers = calloc(hp->n_layer, sizeof(*m->layers));
    int rc = COMMON_ENOMEM;
    if (!m->layers)
        goto out_destroy;
    if ((rc = model_mat(m, desc->global[COMMON_GROLE_TOKEN_EMBD], &m->tok_embd, e)) < 0)
        goto out_destroy;
    if (desc->global[COMMON_GROLE_OUTPUT] >= 0) {
        if ((rc = model_mat(m, desc->global[COMMON_GROLE_OUTPUT], &m->output, e)) < 0)
            goto out_destroy;
    } else {
        m->output = m->tok_embd; /* tied head */
    }
    if ((rc = model_vec(m, desc->global[COMMON_GROLE_OUTPUT_NORM], hp->n_embd, &m->output_norm,
                        e)) < 0 ||
        (rc = model_vec(m, desc->global[COMMON_GROLE_ROPE_FREQS], hp->n_rot / 2, &m->rope_freqs,
                        e)) < 0)
        goto out_destroy;
    for (uint32_t il = 0; il < hp->n_layer; il++)
        if ((rc = model_layer(m, il, e)) < 0)
            goto out_destroy;
    *out = m;
    return 0;

out_destroy:
    executor_model_destroy(m);
    return rc;
}

int executor_model_open(const char *path, const struct executor_model_opts *o,
                        struct executor_model **out, struct common_errmsg *e)
{
    struct executor_model_opts def = {0};
    if (!o)
        o = &def;
    struct common_gguf *g = NULL;
    int                 rc = common_gguf_open(path, NULL, &g, e);
    if (rc < 0)
        return rc;
    struct common_model *desc = calloc(1, sizeof(*desc));
    if (!desc) {
        common_gguf_close(g);
        return COMMON_ENOMEM;
    }
    if ((rc = common_model_init(desc, g, e)) < 0) {
        free(desc);
        common_gguf_close(g);
        return rc;
    }
    struct executor_weights     *w = NULL;
    struct executor_weights_opts wo = {.populate = o->populate, .read_span = o->read_span};
    if (o->weights == EXECUTOR_WEIGHTS_PREAD)
        rc = executor_weights_pread_create(desc, &wo, &w, e);
    else
        rc = executor_weights_mmap_create(desc, &wo, &w, e);
    if (rc < 0) {
        common_model_fini(desc);
        free(desc);
        common_gguf_close(g);
        return rc;
    }
    struct executor_model *m = NULL;
    if ((rc = executor_model_create(desc, w, &m, e)) < 0) {
        executor_weights_destroy(w);
        common_model_fini(desc);
        free(desc);
        common_gguf_close(g);
        return rc;
    }
    m->own_desc = desc;
    m->own_gguf = g;
    m->owns = true;
    *out = m;
    return 0;
}

void executor_model_destroy(struct executor_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_vecs; i++)
        free(m->vecs[i]);
    free(m->vecs);
    for (size_t i = 0; i < m->n_bufs; i++)
        free(m->bufs[i]);
    free(m->bufs);
    free(m->layers);
    if (m->owns) {
        executor_weights_destroy(m->w);
        common_model_fini(m->own_desc);
        free(m->own_desc);
        common_gguf_close(m->own_gguf);
    }
    free(m);
}

const struct common_model *executor_model_desc(const struct executor_model *m)
{
    return m->desc;
}

const struct common_hparams *executor_model_hparams(const struct executor_model *m)
{
    return &m->desc->hp;
}

struct executor_weights *executor_model_weights(const struct executor_model *m)
{
    return m->w;
}
