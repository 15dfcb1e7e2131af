/* executor/forward.c - the forward pass of one sequence: batches, attention, dense FFN, logits. */
#include "forward_impl.h"

#include "cuda/gpu.h"
#include "gpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Small numeric helpers (llama.cpp CPU semantics)                                             */
/* ------------------------------------------------------------------------------------------ */

/* One YaRN correction dimension (ggml_rope_yarn_corr_dim). */
static float fwd_yarn_corr_dim(uint32_t n_dims, uint32_t n_ctx_orig, float n_rot, float base)
{
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) /
           (2.0f * logf(base));
}

/* cos/sin table of one position as ggml's rope cache: theta starts at pos and is multiplied by
 * base^(-2/n_rot) in float for each pair. With YaRN (ext_factor != 0) each pair mixes the
 * interpolated and the extrapolated angle by a ramp over the correction dimensions and the
 * magnitude is corrected; attn_factor scales both (1 without YaRN). */
static void fwd_rope_table(float *cs, uint32_t pos, const struct common_hparams *hp,
                           const float *freq_factors)
{
    const uint32_t n_rot = hp->n_rot;
    const float    theta_scale = powf(hp->rope_freq_base, -2.0f / (float)n_rot);
    const float    ext = hp->yarn_ext_factor;
    float          corr[2] = {0.0f, 0.0f};
    float          mscale = hp->yarn_attn_factor;
    if (ext != 0.0f) {
        const float lo = floorf(
            fwd_yarn_corr_dim(n_rot, hp->n_ctx_orig_yarn, hp->yarn_beta_fast, hp->rope_freq_base));
        const float hi = ceilf(
            fwd_yarn_corr_dim(n_rot, hp->n_ctx_orig_yarn, hp->yarn_beta_slow, hp->rope_freq_base));
        corr[0] = lo > 0.0f ? lo : 0.0f;
        corr[1] = hi < (float)(n_rot - 1) ? hi : (float)(n_rot - 1);
        mscale *= 1.0f + 0.1f * logf(1.0f / hp->rope_freq_scale);
    }
    float theta = (float)pos;
    for (uint32_t i = 0; i < n_rot / 2; i++) {
        const float ff = freq_factors ? freq_factors[i] : 1.0f;
        const float extrap = theta / ff;
        const float interp = hp->rope_freq_scale * extrap;
        float       th = interp;
        if (ext != 0.0f) {
            const float y = ((float)(2 * i / 2) - corr[0]) /
                            (corr[1] - corr[0] > 0.001f ? corr[1] - corr[0] : 0.001f);
            const float ramp = (1.0f - (y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y)) * ext;
            th = interp * (1.0f - ramp) + extrap * ramp;
        }
        cs[2 * i] = cosf(th) * mscale;
        cs[2 * i + 1] = sinf(th) * mscale;
        theta *= theta_scale;
    }
}

/* Rotates the first n_rot dims of each of n_heads heads of width head_dim. Normal mode rotates
 * adjacent pairs (2i, 2i+1); NeoX rotates (i, i + n_rot/2). */
static void fwd_rope_apply(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot,
                           const float *cs, bool neox)
{
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        for (uint32_t i = 0; i < n_rot / 2; i++) {
            const uint32_t a = neox ? i : 2 * i;
            const uint32_t b = neox ? i + n_rot / 2 : 2 * i + 1;
            const float    c = cs[2 * i];
            const float    s = cs[2 * i + 1];
            const float    x0 = x[a];
            const float    x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Parallel building blocks                                                                    */
/* ------------------------------------------------------------------------------------------ */

static void fwd_mm_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    (void)ith;
    const struct fwd_mm_job *job = arg;
    for (int k = 0; k < job->n; k++) {
        int64_t r0 = i0 > job->start[k] ? i0 : job->start[k];
        int64_t r1 = i1 < job->start[k + 1] ? i1 : job->start[k + 1];
        if (r0 >= r1)
            continue;
        const struct fwd_mm *t = &job->t[k];
        r0 -= job->start[k];
        r1 -= job->start[k];
        if (t->n_act == 1)
            executor_matvec(t->type, t->cols, t->w, t->row_bytes, r0, r1, t->act, t->y);
        else
            executor_matmul(t->type, t->cols, t->w, t->row_bytes, r0, r1, t->act, t->act_stride,
                            t->n_act, t->y, t->y_stride);
        /* As llama.cpp's ggml_mul by a {1} scale tensor after the product. */
        for (int64_t j = 0; t->out_scale != 0.0f && j < t->n_act; j++)
            for (int64_t r = r0; r < r1; r++)
                t->y[(size_t)j * t->y_stride + (size_t)r] *= t->out_scale;
    }
}

void executor_fwd_mm_run(struct executor_ctx *c, struct fwd_mm_job *job)
{
    job->start[0] = 0;
    for (int k = 0; k < job->n; k++)
        job->start[k + 1] = job->start[k] + job->t[k].rows;
    int64_t total = job->start[job->n];
    int64_t chunk = total / ((int64_t)c->nth * 8);
    if (chunk < FWD_MIN_CHUNK)
        chunk = FWD_MIN_CHUNK;
    executor_threadpool_for(c->pool, total, c->nth == 1 ? total : chunk, fwd_mm_piece, job);
}

struct fwd_quant_job {
    uint32_t     type; /* weight type whose vec_dot type the rows are converted to */
    const float *x;
    size_t       x_stride; /* floats */
    int64_t      cols;
    uint8_t     *dst;
    size_t       dst_stride; /* bytes */
};

static void fwd_quant_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    (void)ith;
    const struct fwd_quant_job *j = arg;
    for (int64_t t = i0; t < i1; t++)
        executor_quantize_act(j->type, j->x + (size_t)t * j->x_stride,
                              j->dst + (size_t)t * j->dst_stride, j->cols);
}

/* Converts n rows of x to the activation type of weights of `type` into act slot `slot`;
 * returns the row stride in bytes. */
size_t executor_fwd_quantize(struct executor_ctx *c, int slot, uint32_t type, const float *x,
                             size_t x_stride, int64_t n, int64_t cols)
{
    struct fwd_quant_job j = {.type = type,
                              .x = x,
                              .x_stride = x_stride,
                              .cols = cols,
                              .dst = c->act[slot],
                              .dst_stride = executor_act_row_size(type, cols)};
    if (n >= 8)
        executor_threadpool_for(c->pool, n, 0, fwd_quant_piece, &j);
    else
        fwd_quant_piece(&j, 0, n, 0);
    return j.dst_stride;
}

/* ------------------------------------------------------------------------------------------ */
/* Attention                                                                                   */
/* ------------------------------------------------------------------------------------------ */

struct fwd_att_job {
    struct executor_ctx *c;
    uint32_t             il;
    float                scale;
    uint32_t             group; /* heads per item of fwd_att_mla_piece */
};

/* One (token, head) pair per item: scores against the cached K of positions 0..pos, softmax,
 * weighted sum of the cached V. With an f16 cache this is llama.cpp's non-flash path: Q is
 * rounded to f16 for the K dot, the probabilities to f16 for the V dot. */
static void fwd_att_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    const struct fwd_att_job    *j = arg;
    struct executor_ctx         *c = j->c;
    const struct common_hparams *hp = &c->m->desc->hp;
    const uint32_t               hk = hp->head_dim_k, hv = hp->head_dim_v;
    const uint32_t               gqa = hp->n_head / hp->n_head_kv;
    float                       *scores = c->th_scores + (size_t)ith * c->n_ctx;
    uint16_t                    *p16 = c->th_p16 + (size_t)ith * c->n_ctx;
    uint8_t                     *qb = c->th_q + (size_t)ith * c->th_q_bytes;
    for (int64_t it = i0; it < i1; it++) {
        const uint32_t t = (uint32_t)(it / hp->n_head), h = (uint32_t)(it % hp->n_head);
        const uint32_t kvh = h / gqa;
        const struct executor_layer_w *lw = &c->m->layers[j->il];
        const struct executor_kv      *kv = c->rows[t].kv;
        /* A sliding layer sees the last n_swa positions (the query's own included): the range
         * below, which shifts the K rows and V columns read. */
        const uint32_t last = c->rows[t].pos + 1;
        const uint32_t p_lo = lw->swa && last > hp->n_swa ? last - hp->n_swa : 0;
        const uint32_t n_kv = last - p_lo;
        const float   *qv = c->q + (size_t)t * hp->n_head * hk + (size_t)h * hk;
        float         *out = c->att + (size_t)t * hp->n_head * hv + (size_t)h * hv;
        /* The positions p_lo .. last-1 sit in cells from p_lo % cap on, wrapping once at most
         * in a sliding layer's ring: segment a to the ring's end, then segment b from cell 0. */
        const uint32_t cap = kv->cap[j->il], c0 = p_lo % cap;
        const uint32_t len_a = n_kv < cap - c0 ? n_kv : cap - c0, len_b = n_kv - len_a;
        const uint8_t *kbase = executor_kv_k_base(kv, j->il, kvh);
        const size_t   kpb = kv->k_pos_bytes;
        if (kv->type == COMMON_CACHE_F16) {
            uint16_t *q16 = (uint16_t *)(void *)qb;
            for (uint32_t i = 0; i < hk; i++)
                q16[i] = executor_fp32_to_fp16(qv[i]);
        } else {
            executor_quantize_act(COMMON_GGML_TYPE_Q8_0, qv, qb, hk);
        }
        const uint32_t kt =
            kv->type == COMMON_CACHE_F16 ? COMMON_GGML_TYPE_F16 : COMMON_GGML_TYPE_Q8_0;
        executor_matvec(kt, hk, kbase + (size_t)c0 * kpb, kpb, 0, len_a, qb, scores);
        if (len_b)
            executor_matvec(kt, hk, kbase, kpb, 0, len_b, qb, scores + len_a);
        for (uint32_t i = 0; i < n_kv; i++)
            scores[i] *= j->scale;
        if (lw->sinks)
            fwd_softmax_sink(scores, n_kv, lw->sinks[h]);
        else
            fwd_softmax(scores, n_kv);
        float *vrow = c->th_v + (size_t)ith * hv;
        if (kv->v_in_k) {
            /* Latent attention: the values are the head of each cached K row. */
            memset(out, 0, hv * sizeof(*out));
            for (uint32_t pos = 0; pos < n_kv; pos++) {
                const uint8_t *krow = kbase + (size_t)((p_lo + pos) % cap) * kpb;
                float          pw = scores[pos];
                if (kv->type == COMMON_CACHE_F16) {
                    pw = executor_fp16_to_fp32(executor_fp32_to_fp16(pw));
                    executor_dequantize_row(COMMON_GGML_TYPE_F16, krow, vrow, hv);
                } else {
                    executor_dequantize_row(COMMON_GGML_TYPE_Q8_0, krow, vrow, hv);
                }
                for (uint32_t d = 0; d < hv; d++)
                    out[d] += pw * vrow[d];
            }
        } else if (kv->type == COMMON_CACHE_F16) {
            for (uint32_t i = 0; i < n_kv; i++)
                p16[i] = executor_fp32_to_fp16(scores[i]);
            const uint8_t *vt = executor_kv_vt_base(kv, j->il, kvh);
            executor_matvec(COMMON_GGML_TYPE_F16, len_a, vt + (size_t)c0 * 2u, (size_t)cap * 2u, 0,
                            hv, p16, out);
            if (len_b) {
                executor_matvec(COMMON_GGML_TYPE_F16, len_b, vt, (size_t)cap * 2u, 0, hv,
                                p16 + len_a, vrow);
                for (uint32_t d = 0; d < hv; d++)
                    out[d] = out[d] + vrow[d];
            }
        } else {
            memset(out, 0, hv * sizeof(*out));
            for (uint32_t pos = 0; pos < n_kv; pos++) {
                executor_dequantize_row(COMMON_GGML_TYPE_Q8_0,
                                        executor_kv_v_row(kv, j->il, p_lo + pos, kvh), vrow, hv);
                for (uint32_t d = 0; d < hv; d++)
                    out[d] += scores[pos] * vrow[d];
            }
        }
    }
}

/* The KQ scale: the model's (deepseek2 derives it from YaRN), else 1 / sqrt(head_dim_k). */
static float fwd_attn_scale(const struct common_hparams *hp)
{
    return hp->attn_scale != 0.0f ? hp->attn_scale : 1.0f / sqrtf((float)hp->head_dim_k);
}

/* Latent attention (one cached row per position, shared by every head): one item is a token and
 * a group of j->group heads, whose queries pass over each cached row together (their scores as
 * one matmul, their values as one weighted sum of the rows), so a row is read and converted once
 * per group instead of once per head. The arithmetic per head is fwd_att_piece's. */
static void fwd_att_mla_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    const struct fwd_att_job    *j = arg;
    struct executor_ctx         *c = j->c;
    const struct common_hparams *hp = &c->m->desc->hp;
    const uint32_t               hk = hp->head_dim_k, hv = hp->head_dim_v, H = hp->n_head;
    const uint32_t               n_grp = (H + j->group - 1) / j->group;
    const size_t                 sst = c->n_ctx, qst = c->th_q_bytes;
    float                       *scores = c->th_scores + (size_t)ith * c->att_heads * sst;
    uint8_t                     *qb = c->th_q + (size_t)ith * c->att_heads * qst;
    float                       *vrow = c->th_v + (size_t)ith * hv;
    for (int64_t it = i0; it < i1; it++) {
        const uint32_t t = (uint32_t)(it / n_grp), h0 = (uint32_t)(it % n_grp) * j->group;
        const struct executor_kv *kv = c->rows[t].kv;
        const bool                f16 = kv->type == COMMON_CACHE_F16;
        const uint32_t            kt = f16 ? COMMON_GGML_TYPE_F16 : COMMON_GGML_TYPE_Q8_0;
        const uint32_t            nh = H - h0 < j->group ? H - h0 : j->group;
        const uint32_t            n_kv = c->rows[t].pos + 1, cap = kv->cap[j->il];
        const uint32_t            len_a = n_kv < cap ? n_kv : cap, len_b = n_kv - len_a;
        const uint8_t            *kbase = executor_kv_k_base(kv, j->il, 0);
        const size_t              kpb = kv->k_pos_bytes;
        float                    *out = c->att + ((size_t)t * H + h0) * hv;
        for (uint32_t h = 0; h < nh; h++) {
            const float *qv = c->q + ((size_t)t * H + h0 + h) * hk;
            if (f16) {
                uint16_t *q16 = (uint16_t *)(void *)(qb + h * qst);
                for (uint32_t i = 0; i < hk; i++)
                    q16[i] = executor_fp32_to_fp16(qv[i]);
            } else {
                executor_quantize_act(COMMON_GGML_TYPE_Q8_0, qv, qb + h * qst, hk);
            }
        }
        executor_matmul(kt, hk, kbase, kpb, 0, len_a, qb, qst, nh, scores, sst);
        if (len_b) /* a ring never wraps here (no sliding window), but stay exact if it did */
            executor_matmul(kt, hk, kbase, kpb, 0, len_b, qb, qst, nh, scores + len_a, sst);
        for (uint32_t h = 0; h < nh; h++) {
            float *s = scores + h * sst;
            for (uint32_t i = 0; i < n_kv; i++)
                s[i] *= j->scale;
            fwd_softmax(s, n_kv);
            for (uint32_t i = 0; f16 && i < n_kv; i++)
                s[i] = executor_fp16_to_fp32(executor_fp32_to_fp16(s[i]));
        }
        memset(out, 0, (size_t)nh * hv * sizeof(*out));
        if (f16) {
            const uint16_t *rows = (const uint16_t *)(const void *)kbase;
            executor_wsum_f16(hv, len_a, rows, kpb, scores, sst, nh, out, hv);
            if (len_b)
                executor_wsum_f16(hv, len_b, rows, kpb, scores + len_a, sst, nh, out, hv);
            continue;
        }
        for (uint32_t pos = 0; pos < n_kv; pos++) {
            executor_dequantize_row(COMMON_GGML_TYPE_Q8_0, kbase + (size_t)(pos % cap) * kpb, vrow,
                                    hv);
            for (uint32_t h = 0; h < nh; h++)
                for (uint32_t d = 0; d < hv; d++)
                    out[(size_t)h * hv + d] += scores[h * sst + pos] * vrow[d];
        }
    }
}

/* Runs the attention of layer il over the cache for the n queries in c->q into c->att. */
static void fwd_attend(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    const struct common_hparams *hp = &c->m->desc->hp;
    struct fwd_att_job           aj = {.c = c, .il = il, .scale = fwd_attn_scale(hp)};
    if (c->rows[0].kv->v_in_k && c->att_heads > 1) {
        /* Groups of heads: as many as fit the scratch, fewer when a few tokens must still
         * give every thread a share (a decode step's one token). */
        const uint32_t nth = c->pool ? executor_threadpool_n_threads(c->pool) : 1;
        const uint64_t want = (uint64_t)hp->n_head * n / (4u * nth);
        aj.group = want < 1 ? 1 : want > c->att_heads ? c->att_heads : (uint32_t)want;
        const uint32_t n_grp = (hp->n_head + aj.group - 1) / aj.group;
        executor_threadpool_for(c->pool, (int64_t)n * n_grp, 0, fwd_att_mla_piece, &aj);
        return;
    }
    executor_threadpool_for(c->pool, (int64_t)n * hp->n_head, 0, fwd_att_piece, &aj);
}

/* The output projection of c->att-like rows `in` (n rows of `width`), plus its bias when the
 * layer has one (gpt-oss), added to c->x. */
static void fwd_attn_out(struct executor_ctx *c, const struct executor_mat *wo, const float *bo,
                         const float *in, uint32_t width, uint32_t n)
{
    const uint32_t    ne = c->m->desc->hp.n_embd;
    size_t            as = executor_fwd_quantize(c, 0, wo->type, in, width, n, width);
    struct fwd_mm_job oj = {.n = 1};
    oj.t[0] = fwd_mm_of(wo, c->act[0], as, n, c->tmp, ne);
    executor_fwd_mm_run(c, &oj);
    for (uint32_t t = 0; bo && t < n; t++)
        for (uint32_t d = 0; d < ne; d++)
            c->tmp[(size_t)t * ne + d] = c->tmp[(size_t)t * ne + d] + bo[d];
    for (size_t i = 0; i < (size_t)n * ne; i++)
        c->x[i] = c->tmp[i] + c->x[i];
}

/* One product W . x for the n rows of x (stride x_stride floats) into y (stride y_stride), with
 * x converted to W's activation type in act slot `slot`. */
static void fwd_mm1(struct executor_ctx *c, int slot, const struct executor_mat *w, const float *x,
                    size_t x_stride, uint32_t n, float *y, size_t y_stride)
{
    size_t            st = executor_fwd_quantize(c, slot, w->type, x, x_stride, n, w->cols);
    struct fwd_mm_job j = {.n = 1};
    j.t[0] = fwd_mm_of(w, c->act[slot], st, n, y, y_stride);
    executor_fwd_mm_run(c, &j);
}

/* Rows [h * rows, (h + 1) * rows) of a matrix of n_head stacked blocks: head h's matrix. */
static struct executor_mat fwd_head_block(const struct executor_mat *w, uint32_t h, uint32_t n_head)
{
    struct executor_mat b = *w;
    b.rows = w->rows / n_head;
    b.data = (const uint8_t *)w->data + (size_t)h * (size_t)b.rows * w->row_bytes;
    return b;
}

/* Multi-head latent attention of layer il (deepseek2, llama.cpp's absorbed form): the cache holds
 * per position the normalised latent (kv_lora_rank) and the rotated shared key (n_rot); each
 * head's query is its non-rotary part absorbed into the latent by attn_k_b, followed by its
 * rotated part; the attention output over the latent is expanded per head by attn_v_b. */
static void fwd_attention_mla(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    const struct executor_model   *m = c->m;
    const struct common_hparams   *hp = &m->desc->hp;
    const struct executor_layer_w *lw = &m->layers[il];
    const uint32_t                 ne = hp->n_embd, H = hp->n_head, rot = hp->n_rot;
    const uint32_t                 kvr = hp->n_lora_kv, kq = hp->head_dim_k_mla;
    const uint32_t                 nope = kq - rot, hk = hp->head_dim_k, vm = hp->head_dim_v_mla;
    for (uint32_t t = 0; t < n; t++)
        fwd_rmsnorm(c->xn + (size_t)t * ne, c->x + (size_t)t * ne, lw->attn_norm, ne, hp->rms_eps);
    if (lw->wq_a.data) {
        fwd_mm1(c, 0, &lw->wq_a, c->xn, ne, n, c->mla_qa, hp->n_lora_q);
        for (uint32_t t = 0; t < n; t++)
            fwd_rmsnorm(c->mla_qa + (size_t)t * hp->n_lora_q, c->mla_qa + (size_t)t * hp->n_lora_q,
                        lw->q_a_norm, hp->n_lora_q, hp->rms_eps);
        fwd_mm1(c, 1, &lw->wq_b, c->mla_qa, hp->n_lora_q, n, c->mla_q, (size_t)H * kq);
    } else {
        fwd_mm1(c, 0, &lw->wq, c->xn, ne, n, c->mla_q, (size_t)H * kq);
    }
    fwd_mm1(c, 2, &lw->wkv_a, c->xn, ne, n, c->mla_kv, (size_t)kvr + rot);
    for (uint32_t t = 0; t < n; t++) {
        const float *cs = c->rope + (size_t)t * rot;
        float       *kv = c->mla_kv + (size_t)t * (kvr + rot);
        float       *q = c->mla_q + (size_t)t * H * kq;
        float       *k = c->k + (size_t)t * hk;
        /* K = [norm(latent), rope(k_pe)], V = norm(latent); q_pe of every head rotated. */
        fwd_rope_apply(kv + kvr, 1, rot, rot, cs, hp->rope_neox != 0);
        fwd_rmsnorm(k, kv, lw->kv_a_norm, kvr, hp->rms_eps);
        memcpy(k + kvr, kv + kvr, rot * sizeof(float));
        memcpy(c->v + (size_t)t * kvr, k, kvr * sizeof(float));
        for (uint32_t h = 0; h < H; h++)
            fwd_rope_apply(q + (size_t)h * kq + nope, 1, rot, rot, cs, hp->rope_neox != 0);
        executor_kv_store(c->rows[t].kv, il, c->rows[t].pos, k, c->v + (size_t)t * kvr);
    }
    /* Absorb: head h's query over the latent is attn_k_b[h] . q_nope[h], then its q_pe. */
    for (uint32_t h = 0; h < H; h++) {
        const struct executor_mat kb = fwd_head_block(&lw->wk_b, h, H);
        fwd_mm1(c, 0, &kb, c->mla_q + (size_t)h * kq, (size_t)H * kq, n, c->q + (size_t)h * hk,
                (size_t)H * hk);
    }
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < H; h++)
            memcpy(c->q + ((size_t)t * H + h) * hk + kvr,
                   c->mla_q + ((size_t)t * H + h) * kq + nope, rot * sizeof(float));
    fwd_attend(c, il, n);
    /* Expand: head h's value is attn_v_b[h] . its output over the latent. */
    for (uint32_t h = 0; h < H; h++) {
        const struct executor_mat vb = fwd_head_block(&lw->wv_b, h, H);
        fwd_mm1(c, 0, &vb, c->att + (size_t)h * kvr, (size_t)H * kvr, n, c->mla_o + (size_t)h * vm,
                (size_t)H * vm);
    }
    fwd_attn_out(c, &lw->wo, NULL, c->mla_o, H * vm, n);
}

/* Self-attention block of layer il for the n rows of the batch (each in the cache and at the
 * position c->rows gives): adds its output to c->x. */
static void fwd_attention(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    if (c->m->desc->hp.n_lora_kv) {
        fwd_attention_mla(c, il, n);
        return;
    }
    const struct executor_model   *m = c->m;
    const struct common_hparams   *hp = &m->desc->hp;
    const struct executor_layer_w *lw = &m->layers[il];
    const uint32_t                 ne = hp->n_embd;
    const uint32_t qd = hp->n_head * hp->head_dim_k, kd = hp->n_head_kv * hp->head_dim_k;
    const uint32_t vd = hp->n_head_kv * hp->head_dim_v, ad = hp->n_head * hp->head_dim_v;

    for (uint32_t t = 0; t < n; t++)
        fwd_rmsnorm(c->xn + (size_t)t * ne, c->x + (size_t)t * ne, lw->attn_norm, ne, hp->rms_eps);

    /* q, k, v in one parallel loop; weights sharing an activation type share its buffer. */
    const struct executor_mat *ws[3] = {&lw->wq, &lw->wk, &lw->wv};
    float                     *ys[3] = {c->q, c->k, c->v};
    const size_t               yd[3] = {qd, kd, vd};
    struct fwd_mm_job          job = {.n = 3};
    uint32_t                   vdt[3];
    size_t                     strides[3];
    int                        slot_of[3];
    for (int i = 0; i < 3; i++) {
        vdt[i] = executor_vec_dot_type(ws[i]->type);
        slot_of[i] = i;
        for (int k = 0; k < i; k++)
            if (vdt[k] == vdt[i] && slot_of[k] == k) {
                slot_of[i] = k;
                break;
            }
        if (slot_of[i] == i)
            strides[i] = executor_fwd_quantize(c, i, ws[i]->type, c->xn, ne, n, ne);
        else
            strides[i] = strides[slot_of[i]];
        job.t[i] = fwd_mm_of(ws[i], c->act[slot_of[i]], strides[i], n, ys[i], yd[i]);
    }
    executor_fwd_mm_run(c, &job);

    for (uint32_t t = 0; t < n; t++) {
        float *q = c->q + (size_t)t * qd, *k = c->k + (size_t)t * kd, *v = c->v + (size_t)t * vd;
        if (lw->bq)
            for (uint32_t i = 0; i < qd; i++)
                q[i] += lw->bq[i];
        if (lw->bk)
            for (uint32_t i = 0; i < kd; i++)
                k[i] += lw->bk[i];
        if (lw->bv)
            for (uint32_t i = 0; i < vd; i++)
                v[i] += lw->bv[i];
        /* Per head (weights of one head's width) or over the whole projection (olmoe). */
        if (lw->q_norm)
            for (uint32_t i = 0; i < qd; i += lw->q_norm_n)
                fwd_rmsnorm(q + i, q + i, lw->q_norm, lw->q_norm_n, hp->rms_eps);
        if (lw->k_norm)
            for (uint32_t i = 0; i < kd; i += lw->k_norm_n)
                fwd_rmsnorm(k + i, k + i, lw->k_norm, lw->k_norm_n, hp->rms_eps);
        const float *cs = c->rope + (size_t)t * hp->n_rot;
        fwd_rope_apply(q, hp->n_head, hp->head_dim_k, hp->n_rot, cs, hp->rope_neox != 0);
        fwd_rope_apply(k, hp->n_head_kv, hp->head_dim_k, hp->n_rot, cs, hp->rope_neox != 0);
        executor_kv_store(c->rows[t].kv, il, c->rows[t].pos, k, v);
    }

    fwd_attend(c, il, n);
    for (uint32_t t = 0; lw->attn_sub_norm && t < n; t++)
        fwd_rmsnorm(c->att + (size_t)t * ad, c->att + (size_t)t * ad, lw->attn_sub_norm, ad,
                    hp->rms_eps);
    fwd_attn_out(c, &lw->wo, lw->bo, c->att, ad, n);
}

/* ------------------------------------------------------------------------------------------ */
/* Feed-forward: dense SwiGLU (the MoE layer is moe.c)                                            */
/* ------------------------------------------------------------------------------------------ */

/* gate/up products of rows `xin` (n rows of n_embd) into c->ga / c->up, then ga = silu(ga) * up.
 */
/* The gate and up products of rows `xin` (n rows of n_embd) into c->ga / c->up, the two weights
 * sharing one activation buffer when their activation types agree. */
static void fwd_gate_up_products(struct executor_ctx *c, const float *xin, uint32_t n,
                                 const struct executor_mat *gate, const struct executor_mat *up)
{
    const uint32_t    ne = c->m->desc->hp.n_embd;
    const int64_t     nf = gate->rows;
    struct fwd_mm_job job = {.n = 2};
    size_t            gs = executor_fwd_quantize(c, 0, gate->type, xin, ne, n, ne);
    int               us = 0;
    size_t            ust = gs;
    if (executor_vec_dot_type(up->type) != executor_vec_dot_type(gate->type)) {
        us = 1;
        ust = executor_fwd_quantize(c, 1, up->type, xin, ne, n, ne);
    }
    job.t[0] = fwd_mm_of(gate, c->act[0], gs, n, c->ga, (size_t)nf);
    job.t[1] = fwd_mm_of(up, c->act[us], ust, n, c->up, (size_t)nf);
    executor_fwd_mm_run(c, &job);
}

void executor_fwd_swiglu_gate_up(struct executor_ctx *c, const float *xin, uint32_t n,
                                 const struct executor_mat *gate, const struct executor_mat *up)
{
    const int64_t nf = gate->rows;
    fwd_gate_up_products(c, xin, n, gate, up);
    for (size_t i = 0; i < (size_t)n * (size_t)nf; i++)
        c->ga[i] = fwd_silu(c->ga[i]) * c->up[i];
}

/* gpt-oss's expert gate/up: the products of rows `xin` plus the expert's biases gb and ub, then
 * ga = min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1) (ggml's swiglu_oai). */
void executor_fwd_oai_gate_up(struct executor_ctx *c, const float *xin, uint32_t n,
                              const struct executor_mat *gate, const struct executor_mat *up,
                              const float *gb, const float *ub)
{
    const int64_t nf = gate->rows;
    fwd_gate_up_products(c, xin, n, gate, up);
    const float alpha = 1.702f, limit = 7.0f;
    for (uint32_t t = 0; t < n; t++)
        for (int64_t i = 0; i < nf; i++) {
            const size_t k = (size_t)t * (size_t)nf + (size_t)i;
            const float  g = c->ga[k] + gb[i], u = c->up[k] + ub[i];
            const float  x = g < limit ? g : limit;
            const float  y = u < -limit ? -limit : u > limit ? limit : u;
            c->ga[k] = x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
        }
}

/* The down product of c->ga (n rows of down->cols) into c->tmp. */
void executor_fwd_swiglu_down(struct executor_ctx *c, uint32_t n, const struct executor_mat *down)
{
    const uint32_t    ne = c->m->desc->hp.n_embd;
    const int64_t     nf = down->cols;
    size_t            ds = executor_fwd_quantize(c, 2, down->type, c->ga, (size_t)nf, n, nf);
    struct fwd_mm_job dj = {.n = 1};
    dj.t[0] = fwd_mm_of(down, c->act[2], ds, n, c->tmp, ne);
    executor_fwd_mm_run(c, &dj);
}

static void fwd_swiglu(struct executor_ctx *c, const float *xin, uint32_t n,
                       const struct executor_mat *gate, const struct executor_mat *up,
                       const struct executor_mat *down)
{
    executor_fwd_swiglu_gate_up(c, xin, n, gate, up);
    executor_fwd_swiglu_down(c, n, down);
}

/* A dense FFN's gate and up products of rows `xin` into c->ga: silu(g) * u, or relu(g)^2 * u
 * (bitnet-b1.58), then bitnet's ffn_sub_norm over each row when `sub_norm` is given (llama.cpp's
 * build_ffn and sub-norm). Without either it is executor_fwd_swiglu_gate_up. */
void executor_fwd_dense_gate_up(struct executor_ctx *c, const float *xin, uint32_t n,
                                const struct executor_mat *gate, const struct executor_mat *up,
                                const float *sub_norm)
{
    const struct common_hparams *hp = &c->m->desc->hp;
    const int64_t                nf = gate->rows;
    fwd_gate_up_products(c, xin, n, gate, up);
    for (size_t i = 0; i < (size_t)n * (size_t)nf; i++) {
        if (hp->ffn_relu2) {
            const float r = c->ga[i] > 0.0f ? c->ga[i] : 0.0f;
            const float r2 = r * r;
            c->ga[i] = r2 * c->up[i];
        } else {
            c->ga[i] = fwd_silu(c->ga[i]) * c->up[i];
        }
    }
    for (uint32_t t = 0; sub_norm && t < n; t++)
        fwd_rmsnorm(c->ga + (size_t)t * (size_t)nf, c->ga + (size_t)t * (size_t)nf, sub_norm,
                    (uint32_t)nf, hp->rms_eps);
}

static int fwd_ffn(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    const struct common_hparams   *hp = &c->m->desc->hp;
    const struct executor_layer_w *lw = &c->m->layers[il];
    const uint32_t                 ne = hp->n_embd;
    for (uint32_t t = 0; t < n; t++)
        fwd_rmsnorm(c->xn + (size_t)t * ne, c->x + (size_t)t * ne, lw->ffn_norm, ne, hp->rms_eps);
    if (lw->gate_inp.data)
        return executor_fwd_moe(c, il, n);
    if (lw->ffn_streamed)
        return executor_fwd_ffn_streamed(c, il, n);
    if (lw->ffn_sub_norm || c->m->desc->hp.ffn_relu2) {
        executor_fwd_dense_gate_up(c, c->xn, n, &lw->gate, &lw->up, lw->ffn_sub_norm);
        executor_fwd_swiglu_down(c, n, &lw->down);
    } else {
        fwd_swiglu(c, c->xn, n, &lw->gate, &lw->up, &lw->down);
    }
    for (size_t i = 0; i < (size_t)n * ne; i++)
        c->x[i] = c->tmp[i] + c->x[i];
    return 0;
}

int executor_fwd_cpu_ffn(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    return fwd_ffn(c, il, n);
}

/* ------------------------------------------------------------------------------------------ */
/* One batch                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* The embeddings of tokens[0..n) (n <= n_batch), their RoPE tables at the positions c->rows
 * gives, then every CPU layer over them. */
static int fwd_cpu_layers(struct executor_ctx *c, const int32_t *tokens, uint32_t n)
{
    const struct executor_model *m = c->m;
    const struct common_hparams *hp = &m->desc->hp;
    const uint32_t               ne = hp->n_embd;
    if (m->w->ops->token_begin)
        m->w->ops->token_begin(m->w->impl);
    for (uint32_t t = 0; t < n; t++) {
        const uint8_t *row =
            (const uint8_t *)m->tok_embd.data + (size_t)tokens[t] * m->tok_embd.row_bytes;
        executor_dequantize_row(m->tok_embd.type, row, c->x + (size_t)t * ne, ne);
        for (uint32_t i = 0; m->tok_embd.out_scale != 0.0f && i < ne; i++)
            c->x[(size_t)t * ne + i] *= m->tok_embd.out_scale;
        fwd_rope_table(c->rope + (size_t)t * hp->n_rot, c->rows[t].pos, hp, m->rope_freqs);
    }
    const uint32_t n_cpu = c->gpu ? executor_gpu_first_layer(c->gpu) : hp->n_layer;
    for (uint32_t il = 0; il < n_cpu; il++) {
        fwd_attention(c, il, n);
        int rc = fwd_ffn(c, il, n);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The output norm and head of the n_out rows of c->x listed in `rows` (ascending) into `out`
 * (n_out rows of n_vocab). */
static void fwd_head(struct executor_ctx *c, const uint32_t *rows, uint32_t n_out, float *out)
{
    const struct executor_model *m = c->m;
    const struct common_hparams *hp = &m->desc->hp;
    const uint32_t               ne = hp->n_embd;
    for (uint32_t i = 0; i < n_out; i++)
        fwd_rmsnorm(c->xn + (size_t)i * ne, c->x + (size_t)rows[i] * ne, m->output_norm, ne,
                    hp->rms_eps);
    size_t            os = executor_fwd_quantize(c, 0, m->output.type, c->xn, ne, n_out, ne);
    struct fwd_mm_job oj = {.n = 1};
    oj.t[0] = fwd_mm_of(&m->output, c->act[0], os, n_out, out, hp->n_vocab);
    executor_fwd_mm_run(c, &oj);
}

/* Runs n tokens (n <= n_batch) at positions n_past..; writes logits of every token to `logits`
 * (n * n_vocab) when all, else of the last token when logits is not NULL. */
static int fwd_batch(struct executor_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
                     bool all, struct common_errmsg *e)
{
    const uint32_t p0 = c->n_past;
    for (uint32_t t = 0; t < n; t++)
        c->rows[t] = (struct fwd_row){.kv = &c->kv, .pos = p0 + t};
    c->err.text[0] = '\0';
    const uint64_t prof = c->gpu ? gpu_prof_begin() : 0;
    int rc = gpu_prof_end(prof, "(host: embeddings, cpu layers)", fwd_cpu_layers(c, tokens, n));
    if (rc < 0)
        return c->err.text[0] ? common_errmsg_set(e, rc, "%s", c->err.text) : rc;
    if (c->gpu) {
        /* The device's layers, then its head (done) or the CPU's. */
        rc = executor_gpu_forward(c->gpu, c, n, p0, logits, all, e);
        if (rc < 0)
            return rc;
        c->n_past += n;
        if (rc == 1)
            return 0;
    } else {
        c->n_past += n;
    }
    if (!logits)
        return 0;
    const uint32_t t0 = all ? 0 : n - 1, n_out = n - t0;
    for (uint32_t i = 0; i < n_out; i++)
        c->head_rows[i] = t0 + i;
    fwd_head(c, c->head_rows, n_out, logits);
    return 0;
}

/* Checks tokens[0..n) for context c: ids in the vocabulary, room in the cache. */
static int fwd_check_tokens(const struct executor_ctx *c, const int32_t *tokens, uint32_t n,
                            struct common_errmsg *e)
{
    const struct common_hparams *hp = &c->m->desc->hp;
    if (n == 0 || !tokens)
        return common_errmsg_set(e, COMMON_EINVAL, "nothing to decode");
    if (n > c->n_ctx - c->n_past)
        return common_errmsg_set(e, COMMON_ERANGE,
                                 "%u tokens at position %u do not fit the context of %u tokens "
                                 "(%u needed)",
                                 n, c->n_past, c->n_ctx, c->n_past + n);
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->n_vocab)
            return common_errmsg_set(e, COMMON_EINVAL, "token id %d is not in 0..%u", tokens[i],
                                     hp->n_vocab - 1);
    return 0;
}

/* Checked tokens of one sequence in batches of n_batch; logits as executor_ctx_decode (NULL:
 * none). */
static int fwd_decode_seq(struct executor_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
                          bool all, struct common_errmsg *e)
{
    const uint32_t n_vocab = c->m->desc->hp.n_vocab;
    for (uint32_t off = 0; off < n; off += c->n_batch) {
        const uint32_t nb = n - off < c->n_batch ? n - off : c->n_batch;
        const bool     last = off + nb == n;
        float *out = !logits ? NULL : all ? logits + (size_t)off * n_vocab : (last ? logits : NULL);
        struct common_errmsg ge = {{0}};
        int                  rc = fwd_batch(c, tokens + off, nb, out, all, &ge);
        if (rc < 0)
            return common_errmsg_set(e, rc, "forward pass failed at position %u: %s", c->n_past,
                                     ge.text[0] ? ge.text : common_strerror(rc));
    }
    return 0;
}

int executor_ctx_decode(struct executor_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
                        const struct executor_decode_opts *o, struct common_errmsg *e)
{
    if (!logits)
        return common_errmsg_set(e, COMMON_EINVAL, "nothing to decode");
    int rc = fwd_check_tokens(c, tokens, n, e);
    return rc < 0 ? rc : fwd_decode_seq(c, tokens, n, logits, o && o->all_logits, e);
}

/* ------------------------------------------------------------------------------------------ */
/* Several sequences in one batch (continuous batching)                                        */
/* ------------------------------------------------------------------------------------------ */

/* A sequence's share of one batch: rows [row, row + n) of it. */
struct fwd_member {
    uint32_t seq, row, n;
    bool     ends; /* its last token is in this batch */
};

/* Fails the members of a batch that failed: their caches may be half-written. */
static void fwd_batch_failed(struct executor_batch_seq *seqs, const struct fwd_member *mb,
                             uint32_t n_mb, int rc)
{
    for (uint32_t i = 0; i < n_mb; i++) {
        seqs[mb[i].seq].status = rc;
        executor_ctx_reset(seqs[mb[i].seq].ctx);
    }
}

/* Runs the rows lead->btok[0..nb) of members mb[0..n_mb) and hands out their logits. With
 * layers on a device (lead->gpu: then n_mb <= EXECUTOR_GPU_ROW_EXACT, every member whole), the
 * device's layers follow the CPU's, each member attending over its own device cache. Returns 0
 * or a negative common_err, its text in e or lead->err. */
static int fwd_run_members(struct executor_ctx *lead, struct executor_batch_seq *seqs,
                           const struct fwd_member *mb, uint32_t n_mb, uint32_t nb,
                           struct common_errmsg *e)
{
    const uint32_t n_vocab = lead->m->desc->hp.n_vocab;
    lead->err.text[0] = '\0';
    int rc = fwd_cpu_layers(lead, lead->btok, nb);
    if (rc < 0)
        return rc;
    uint32_t n_out = 0;
    for (uint32_t i = 0; i < n_mb; i++)
        if (mb[i].ends && seqs[mb[i].seq].logits)
            lead->head_rows[n_out++] = mb[i].row + mb[i].n - 1;
    const size_t want = (size_t)n_out * n_vocab;
    if (want > lead->head_cap) {
        float *p = realloc(lead->head_out, want * sizeof(*p));
        if (!p)
            return COMMON_ENOMEM;
        lead->head_out = p;
        lead->head_cap = want;
    }
    int on_device = 0;
    if (lead->gpu) {
        struct executor_gpu_member gm[EXECUTOR_GPU_ROW_EXACT];
        if (n_mb > EXECUTOR_GPU_ROW_EXACT)
            return common_errmsg_set(e, COMMON_EINVAL, "%u sequences in one device batch", n_mb);
        for (uint32_t i = 0; i < n_mb; i++) {
            const struct executor_ctx *c = seqs[mb[i].seq].ctx;
            gm[i] = (struct executor_gpu_member){
                .g = c->gpu, .row = mb[i].row, .n = mb[i].n, .p0 = c->n_past};
        }
        on_device = executor_gpu_forward_members(lead->gpu, gm, n_mb, lead, nb, lead->head_rows,
                                                 n_out, lead->head_out, e);
        if (on_device < 0)
            return on_device;
    }
    for (uint32_t i = 0; i < n_mb; i++)
        seqs[mb[i].seq].ctx->n_past += mb[i].n;
    if (!n_out)
        return 0;
    if (!on_device)
        fwd_head(lead, lead->head_rows, n_out, lead->head_out);
    for (uint32_t i = 0, o = 0; i < n_mb; i++)
        if (mb[i].ends && seqs[mb[i].seq].logits)
            memcpy(seqs[mb[i].seq].logits, lead->head_out + (size_t)o++ * n_vocab,
                   n_vocab * sizeof(float));
    return 0;
}

/* Checks sequence i of a batch against the lead context and the sequences before it. */
static int fwd_check_seq(const struct executor_ctx *lead, const struct executor_batch_seq *seqs,
                         uint32_t i, struct common_errmsg *e)
{
    const struct executor_ctx *c = seqs[i].ctx;
    if (!c)
        return common_errmsg_set(e, COMMON_EINVAL, "no context");
    if (c->m != lead->m || c->kv.type != lead->kv.type || c->n_ctx > lead->n_ctx)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "its context differs from the batch's (model, cache type, or a "
                                 "longer context)");
    for (uint32_t k = 0; k < i; k++)
        if (seqs[k].ctx == c)
            return common_errmsg_set(e, COMMON_EINVAL, "its context is also sequence %u's", k);
    return fwd_check_tokens(c, seqs[i].tokens, seqs[i].n, e);
}

/* Rows of a shared device step: at most EXECUTOR_GPU_ROW_EXACT, and what lead's batch holds. */
static uint32_t fwd_device_rows(const struct executor_ctx *lead)
{
    return lead->n_batch < EXECUTOR_GPU_ROW_EXACT ? lead->n_batch : EXECUTOR_GPU_ROW_EXACT;
}

/* Whether sequence context c may share the device steps of lead: both have layers on the device
 * over the same weights, and c's tokens alone leave each device kernel computing rows apart. */
static bool fwd_device_batchable(const struct executor_ctx *lead, const struct executor_ctx *c,
                                 uint32_t n)
{
    return lead->gpu && c->gpu && executor_gpu_same_weights(lead->gpu, c->gpu) &&
           n <= fwd_device_rows(lead);
}

/* The device branch of executor_ctx_decode_batch (first: the first failure so far). Sequences
 * share a step while it has at most EXECUTOR_GPU_ROW_EXACT rows: below GPU_GEMM_MIN_N every
 * device kernel computes a row independently of the others, so each sequence gets what it gets
 * alone (the f16 matmul of longer batches rounds otherwise). Longer ones run by themselves. A
 * device failure fails every sequence not yet run. */
static int fwd_decode_device(struct executor_ctx *lead, struct executor_batch_seq *seqs,
                             uint32_t n_seqs, int first, struct common_errmsg *e)
{
    struct fwd_member mb[EXECUTOR_GPU_ROW_EXACT];
    uint32_t          i = 0;
    bool              dead = false;
    while (i < n_seqs && !dead) {
        struct common_errmsg se = {{0}};
        uint32_t             n_mb = 0, nb = 0, k = i;
        for (; k < n_seqs; k++) {
            const struct executor_batch_seq *q = &seqs[k];
            if (q->status < 0)
                continue;
            if (!fwd_device_batchable(lead, q->ctx, q->n) || nb + q->n > fwd_device_rows(lead))
                break;
            for (uint32_t t = 0; t < q->n; t++) {
                lead->btok[nb + t] = q->tokens[t];
                lead->rows[nb + t] = (struct fwd_row){.kv = &q->ctx->kv, .pos = q->ctx->n_past + t};
            }
            mb[n_mb++] = (struct fwd_member){.seq = k, .row = nb, .n = q->n, .ends = true};
            nb += q->n;
        }
        int rc = 0;
        if (n_mb == 0 && k == n_seqs)
            break;  /* only failed sequences were left */
        if (n_mb) { /* sequences i..k-1 (the valid ones) share this step */
            rc = fwd_run_members(lead, seqs, mb, n_mb, nb, &se);
            if (rc < 0) {
                fwd_batch_failed(seqs, mb, n_mb, rc);
                const char *why = se.text[0]          ? se.text
                                  : lead->err.text[0] ? lead->err.text
                                                      : common_strerror(rc);
                /* the CPU device's alone (one pass): as the CPU's own pass says it */
                const bool cpu = executor_gpu_layers(lead->gpu, NULL, 0) == 0;
                if ((first == 0 || rc == COMMON_EDEVICE) && cpu && n_mb == 1)
                    first = common_errmsg_set(e, rc, "%s", why);
                else if (first == 0 || rc == COMMON_EDEVICE)
                    first = common_errmsg_set(e, rc, "a %sbatch of %u sequences failed: %s",
                                              cpu ? "" : "device ", n_mb, why);
            }
            i = k;
        } else { /* sequence k alone: more rows than a shared step takes, or no device */
            struct executor_batch_seq *q = &seqs[k];
            rc = q->status = fwd_decode_seq(q->ctx, q->tokens, q->n, q->logits, false, &se);
            if (rc < 0) {
                executor_ctx_reset(q->ctx);
                if (first == 0 || rc == COMMON_EDEVICE)
                    first = common_errmsg_set(e, rc, "sequence %u: %s", k, se.text);
            }
            i = k + 1;
        }
        dead = rc == COMMON_EDEVICE;
    }
    for (; dead && i < n_seqs; i++) /* the rest would fail the same way */
        if (seqs[i].status == 0)
            seqs[i].status = COMMON_EDEVICE;
    return first;
}

int executor_ctx_decode_batch(struct executor_ctx *lead, struct executor_batch_seq *seqs,
                              uint32_t n_seqs, struct common_errmsg *e)
{
    if (!lead || (n_seqs && !seqs))
        return common_errmsg_set(e, COMMON_EINVAL, "nothing to decode");
    int  first = 0;
    bool device = lead->gpu != NULL;
    for (uint32_t i = 0; i < n_seqs; i++) {
        struct common_errmsg se = {{0}};
        seqs[i].status = fwd_check_seq(lead, seqs, i, &se);
        if (seqs[i].status < 0 && first == 0)
            first = common_errmsg_set(e, seqs[i].status, "sequence %u: %s", i, se.text);
        if (seqs[i].status == 0 && seqs[i].ctx->gpu)
            device = true;
    }
    if (device)
        return fwd_decode_device(lead, seqs, n_seqs, first, e);
    struct fwd_member *mb = malloc((n_seqs ? n_seqs : 1) * sizeof(*mb));
    if (!mb)
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    uint32_t si = 0, off = 0;
    while (si < n_seqs) {
        uint32_t nb = 0, n_mb = 0;
        while (si < n_seqs && nb < lead->n_batch) {
            struct executor_batch_seq *q = &seqs[si];
            if (q->status < 0) {
                si++;
                continue;
            }
            const uint32_t k = q->n - off < lead->n_batch - nb ? q->n - off : lead->n_batch - nb;
            for (uint32_t i = 0; i < k; i++) {
                lead->btok[nb + i] = q->tokens[off + i];
                lead->rows[nb + i] = (struct fwd_row){.kv = &q->ctx->kv, .pos = q->ctx->n_past + i};
            }
            mb[n_mb++] = (struct fwd_member){.seq = si, .row = nb, .n = k, .ends = off + k == q->n};
            nb += k;
            off += k;
            if (off == q->n) {
                si++;
                off = 0;
            }
        }
        if (nb == 0)
            break;
        struct common_errmsg be = {{0}};
        int                  rc = fwd_run_members(lead, seqs, mb, n_mb, nb, &be);
        if (rc < 0) {
            fwd_batch_failed(seqs, mb, n_mb, rc);
            const char *why = lead->err.text[0] ? lead->err.text : common_strerror(rc);
            if (first == 0 && n_mb > 1)
                first = common_errmsg_set(e, rc, "a batch of %u sequences failed: %s", n_mb, why);
            else if (first == 0)
                first = common_errmsg_set(e, rc, "%s", why);
            if (off) { /* the sequence split here failed with the batch */
                si++;
                off = 0;
            }
        }
    }
    free(mb);
    return first;
}

/* ------------------------------------------------------------------------------------------ */
/* Creation                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static void *fwd_alloc(size_t bytes, bool *ok)
{
    size_t sz = (bytes + FWD_ALIGN - 1) / FWD_ALIGN * FWD_ALIGN;
    void  *p = aligned_alloc(FWD_ALIGN, sz ? sz : FWD_ALIGN);
    if (!p)
        *ok = false;
    else
        memset(p, 0, sz ? sz : FWD_ALIGN);
    return p;
}

int executor_ctx_create(const struct executor_model *m, const struct executor_ctx_opts *o,
                        struct executor_ctx **out, struct common_errmsg *e)
{
    struct executor_ctx_opts     def = {0};
    const struct common_hparams *hp = &m->desc->hp;
    if (!o)
        o = &def;
    /* Every size comes from the layout table the memory plan uses too. */
    struct common_ctx_layout      lay;
    struct common_ctx_layout_opts lo = {.n_ctx = o->n_ctx,
                                        .n_batch = o->n_batch,
                                        .n_threads = executor_threadpool_n_threads(o->pool),
                                        .cache_type = o->cache_type};
    int                           rc = common_ctx_layout_compute(hp, &lo, &lay, e);
    if (rc < 0)
        return rc;
    struct executor_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return COMMON_ENOMEM;
    c->m = m;
    c->pool = o->pool;
    c->nth = lay.n_threads;
    c->n_ctx = lay.n_ctx;
    c->n_batch = lay.n_batch;
    bool ok = true;
    /* Allocates buffer b of the layout (the MoE ones only for a model with experts). */
#define FWD_BUF(b) fwd_alloc((size_t)lay.buf[b], &ok)
    c->x = FWD_BUF(COMMON_CTX_X);
    c->xn = FWD_BUF(COMMON_CTX_XN);
    c->q = FWD_BUF(COMMON_CTX_Q);
    c->k = FWD_BUF(COMMON_CTX_K);
    c->v = FWD_BUF(COMMON_CTX_V);
    c->att = FWD_BUF(COMMON_CTX_ATT);
    c->tmp = FWD_BUF(COMMON_CTX_TMP);
    c->ga = FWD_BUF(COMMON_CTX_GATE);
    c->up = FWD_BUF(COMMON_CTX_UP);
    c->act_cap = lay.buf[COMMON_CTX_ACT0];
    c->act[0] = FWD_BUF(COMMON_CTX_ACT0);
    c->act[1] = FWD_BUF(COMMON_CTX_ACT1);
    c->act[2] = FWD_BUF(COMMON_CTX_ACT2);
    c->rope = FWD_BUF(COMMON_CTX_ROPE);
    c->rows = fwd_alloc((size_t)lay.n_batch * sizeof(*c->rows), &ok);
    c->head_rows = fwd_alloc((size_t)lay.n_batch * sizeof(*c->head_rows), &ok);
    c->btok = fwd_alloc((size_t)lay.n_batch * sizeof(*c->btok), &ok);
    c->th_scores = FWD_BUF(COMMON_CTX_TH_SCORES);
    c->th_p16 = FWD_BUF(COMMON_CTX_TH_P16);
    c->th_q_bytes = lay.th_q_bytes;
    c->att_heads = lay.att_heads;
    c->th_q = FWD_BUF(COMMON_CTX_TH_Q);
    c->th_v = FWD_BUF(COMMON_CTX_TH_V);
    c->mla_qa = FWD_BUF(COMMON_CTX_MLA_QA);
    c->mla_q = FWD_BUF(COMMON_CTX_MLA_Q);
    c->mla_kv = FWD_BUF(COMMON_CTX_MLA_KV);
    c->mla_o = FWD_BUF(COMMON_CTX_MLA_O);
    if (hp->n_expert) {
        c->router = FWD_BUF(COMMON_CTX_ROUTER);
        c->sel = FWD_BUF(COMMON_CTX_SEL);
        c->sel_w = FWD_BUF(COMMON_CTX_SEL_W);
        c->ex_count = FWD_BUF(COMMON_CTX_EX_COUNT);
        c->ex_start = FWD_BUF(COMMON_CTX_EX_START);
        c->ex_items = FWD_BUF(COMMON_CTX_EX_ITEMS);
        c->gx = FWD_BUF(COMMON_CTX_GX);
        c->moe_out = FWD_BUF(COMMON_CTX_MOE_OUT);
        c->sh_out = FWD_BUF(COMMON_CTX_SH_OUT);
        c->ex_order = FWD_BUF(COMMON_CTX_EX_ORDER);
        c->pred_logits = FWD_BUF(COMMON_CTX_PRED_LOGITS);
        c->pred_gate = FWD_BUF(COMMON_CTX_PRED_GATE);
        c->prev_sel = FWD_BUF(COMMON_CTX_PREV_SEL);
        c->have_prev = FWD_BUF(COMMON_CTX_HAVE_PREV);
        c->hint_mark = FWD_BUF(COMMON_CTX_HINT_MARK);
    }
#undef FWD_BUF
    c->hints = hp->n_expert && m->w->ops->expert_request;
    c->no_postfetch = o->no_postfetch;
    c->no_prefetch = o->no_prefetch;
    c->history = o->prefetch_history;
    c->pf_top = o->prefetch_top;
    c->window = o->fetch_window;
    c->pred_gate_layer = -1;
    if (!ok) {
        executor_ctx_destroy(c);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory for a context of %u tokens",
                                 lay.n_ctx);
    }
    /* One pass: gpu.c's, its CPU layers on the CPU device, where the model allows (else the
     * CPU's own pass below, as without it). */
    const bool one_pass = o->one_pass || executor_gpu_one_pass();
    const bool one = o->n_gpu_layers <= 0 && !o->gpu_weights && one_pass;
    if ((o->n_gpu_layers > 0 || o->gpu_weights || one) &&
        (rc = executor_gpu_create(m, o->gpu_weights,
                                  &(struct executor_gpu_place){.n_gpu_layers = o->n_gpu_layers,
                                                               .n_cpu_moe = o->n_cpu_moe,
                                                               .devices = o->devices,
                                                               .vram_budget = o->vram_budget,
                                                               .expert_miss = o->expert_miss,
                                                               .pool_policy = o->pool_policy,
                                                               .cache_type = o->cache_type,
                                                               .one_pass = one_pass},
                                  c->n_ctx, c->n_batch, &c->gpu, e)) < 0 &&
        !(one && rc == COMMON_ENOTSUP)) {
        executor_ctx_destroy(c);
        return rc;
    }
    /* The KV of the layers on the device is there (the same table, without them). */
    lo.n_device_layers = c->gpu ? hp->n_layer - executor_gpu_first_layer(c->gpu) : 0;
    if (c->gpu && (rc = common_ctx_layout_compute(hp, &lo, &lay, e)) < 0) {
        executor_ctx_destroy(c);
        return rc;
    }
    if ((rc = executor_kv_init(&c->kv, &lay, hp)) < 0) {
        executor_ctx_destroy(c);
        return common_errmsg_set(e, rc, "out of memory for a KV cache of %u tokens", lay.n_ctx);
    }
    *out = c;
    return 0;
}

void executor_ctx_destroy(struct executor_ctx *c)
{
    if (!c)
        return;
    executor_kv_fini(&c->kv);
    executor_gpu_destroy(c->gpu);
    void *bufs[] = {c->x,         c->xn,          c->q,         c->k,         c->v,
                    c->att,       c->tmp,         c->ga,        c->up,        c->act[0],
                    c->act[1],    c->act[2],      c->rope,      c->th_scores, c->th_p16,
                    c->th_q,      c->th_v,        c->router,    c->sel,       c->sel_w,
                    c->ex_count,  c->ex_start,    c->ex_items,  c->gx,        c->moe_out,
                    c->ex_order,  c->pred_logits, c->pred_gate, c->prev_sel,  c->have_prev,
                    c->hint_mark, c->mla_qa,      c->mla_q,     c->mla_kv,    c->mla_o,
                    c->sh_out,    c->rows,        c->head_rows, c->head_out,  c->btok};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    free(c);
}

int32_t executor_ctx_gpu_layers(const struct executor_ctx *c, char *name, size_t len)
{
    return c->gpu ? executor_gpu_layers(c->gpu, name, len) : 0;
}

uint32_t executor_ctx_gpu_kv_layers(const struct executor_ctx *c)
{
    if (!c->gpu)
        return 0;
    return executor_gpu_device_layers(c->gpu);
}

bool executor_ctx_gpu_pass(const struct executor_ctx *c)
{
    return c->gpu != NULL;
}

uint64_t executor_ctx_gpu_kv_bytes(const struct executor_ctx *c)
{
    return c->gpu ? executor_gpu_kv_bytes(c->gpu) : 0;
}

uint64_t executor_ctx_gpu_graph_steps(const struct executor_ctx *c)
{
    return c->gpu ? executor_gpu_graph_steps(c->gpu) : 0;
}

double executor_ctx_gpu_membw(const struct executor_ctx *c, size_t bytes)
{
    return c->gpu ? executor_gpu_membw(c->gpu, bytes) : 0.0;
}

bool executor_ctx_gpu_pool_stats(const struct executor_ctx *c, struct executor_gpu_pool_stats *out)
{
    *out = (struct executor_gpu_pool_stats){0};
    if (!c->gpu)
        return false;
    executor_gpu_pool_stats(c->gpu, out);
    return true;
}

bool executor_ctx_gpu_describe(const struct executor_ctx *c, char *buf, size_t len)
{
    if (!c->gpu || executor_gpu_layers(c->gpu, NULL, 0) == 0) /* none, or the CPU device's only */
        return false;
    executor_gpu_describe(c->gpu, buf, len);
    return true;
}

uint32_t executor_ctx_n_ctx(const struct executor_ctx *c)
{
    return c->n_ctx;
}

uint32_t executor_ctx_n_vocab(const struct executor_ctx *c)
{
    return c->m->desc->hp.n_vocab;
}

uint32_t executor_ctx_n_past(const struct executor_ctx *c)
{
    return c->n_past;
}

void executor_ctx_reset(struct executor_ctx *c)
{
    c->n_past = 0;
    if (c->have_prev)
        memset(c->have_prev, 0, c->m->desc->hp.n_layer);
    c->pred_gate_layer = -1;
}
