/* executor/moe.c - the MoE layer: routing, post-fetch, prefetch predictors, experts in waves. */
#include "forward_impl.h"

#include <string.h>

/* Picks the top k of p[0..n) (ties: lower index first). */
static void fwd_topk(const float *p, uint32_t n, uint32_t k, int32_t *out)
{
    for (uint32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < n; e++) {
            bool taken = false;
            for (uint32_t i = 0; i < j && !taken; i++)
                taken = out[i] == (int32_t)e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = (int32_t)e;
        }
        out[j] = best;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* MoE: post-fetch, prefetch (two predictors), expert compute in waves                         */
/* ------------------------------------------------------------------------------------------ */

static const char *const g_pred_names[EXECUTOR_PRED_COUNT] = {"gate", "prev_token", "next_token"};

const char *executor_predictor_name(enum executor_predictor p)
{
    return (unsigned)p < EXECUTOR_PRED_COUNT ? g_pred_names[p] : "?";
}

const char *const executor_expert_miss_names[] = {"copy", "cpu", "auto", NULL};

const char *executor_expert_miss_name(enum executor_expert_miss m)
{
    return (unsigned)m <= EXECUTOR_MISS_AUTO ? executor_expert_miss_names[m] : "?";
}

void executor_ctx_predictor_stats(const struct executor_ctx      *c,
                                  struct executor_predictor_stats out[EXECUTOR_PRED_COUNT])
{
    memcpy(out, c->pred_stats, sizeof(c->pred_stats));
}

/* Counts how well `pred` (k ids, -1 = none) matched `actual` (k ids) into predictor p. */
static void fwd_pred_count(struct executor_ctx *c, enum executor_predictor p, const int32_t *pred,
                           const int32_t *actual, uint32_t k)
{
    struct executor_predictor_stats *st = &c->pred_stats[p];
    for (uint32_t i = 0; i < k; i++) {
        if (pred[i] < 0)
            continue;
        st->predicted++;
        for (uint32_t j = 0; j < k; j++)
            if (actual[j] == pred[i]) {
                st->correct++;
                break;
            }
    }
    st->actual += k;
}

/* Asks the source for expert e of layer il once per (layer, batch, hint) as marked in `mark`. */
static void fwd_hint(struct executor_ctx *c, uint32_t il, int32_t e, enum executor_expert_hint h)
{
    struct executor_weights *w = c->m->w;
    if (e < 0 || c->hint_mark[e] == c->hint_stamp)
        return;
    c->hint_mark[e] = c->hint_stamp;
    (void)w->ops->expert_request(w->impl, il, (uint32_t)e, h);
}

/* Turns row p of layer lw's router logits into the probabilities its weights are taken from:
 * the router bias added, then sigmoid or softmax per the model's gating (gpt-oss's softmax over
 * the k chosen comes after selection). */
static void moe_probs(const struct common_hparams *hp, const struct executor_layer_w *lw, float *p)
{
    const uint32_t E = hp->n_expert;
    for (uint32_t e = 0; lw->gate_inp_b && e < E; e++)
        p[e] = p[e] + lw->gate_inp_b[e];
    if (hp->expert_gating == COMMON_GATING_SIGMOID)
        for (uint32_t e = 0; e < E; e++)
            p[e] = 1.0f / (1.0f + expf(-p[e]));
    else if (hp->expert_gating == COMMON_GATING_SOFTMAX)
        fwd_softmax(p, E);
}

/* The scores experts are selected by for token t, from its probabilities p: p itself, or (DeepSeek
 * V3) p plus the layer's selection bias, with every group outside the n_group_used best masked
 * to -inf, a group scoring the sum of its two best (llama.cpp's build_moe_ffn). The weights are
 * taken from p either way. Uses the token's row of c->pred_logits as scratch (routing and the
 * gate predictor consume the result before the next call). */
static const float *moe_selection(struct executor_ctx *c, const struct executor_layer_w *lw,
                                  const float *p, uint32_t t)
{
    const struct common_hparams *hp = &c->m->desc->hp;
    const uint32_t               E = hp->n_expert, G = hp->n_expert_groups;
    if (!lw->exp_probs_b && G <= 1)
        return p;
    float *s = c->pred_logits + (size_t)t * E;
    for (uint32_t e = 0; e < E; e++)
        s[e] = lw->exp_probs_b ? p[e] + lw->exp_probs_b[e] : p[e];
    if (G <= 1)
        return s;
    const uint32_t per = E / G;
    float          gs[COMMON_MAX_EXPERT_GROUPS];
    int32_t        keep[COMMON_MAX_EXPERT_GROUPS];
    for (uint32_t g = 0; g < G; g++) {
        int32_t top2[2] = {-1, -1};
        fwd_topk(s + (size_t)g * per, per, per < 2 ? per : 2, top2);
        gs[g] = s[(size_t)g * per + (uint32_t)top2[0]];
        if (per >= 2)
            gs[g] = gs[g] + s[(size_t)g * per + (uint32_t)top2[1]];
    }
    fwd_topk(gs, G, hp->n_group_used, keep);
    for (uint32_t g = 0; g < G; g++) {
        bool kept = false;
        for (uint32_t i = 0; i < hp->n_group_used; i++)
            kept = kept || keep[i] == (int32_t)g;
        for (uint32_t e = 0; !kept && e < per; e++)
            s[(size_t)g * per + e] = -INFINITY;
    }
    return s;
}

/* Whether the gate predictor's guesses of rank j (0 = best) are worth a read: at least 85% of
 * them were picked so far (an unscored rank is tried). A wrong guess is a read on the path that
 * bounds a streamed decode, and may evict a bundle still in use; a right one overlaps a read the
 * layer would otherwise wait for (docs/fetcher.md has the measurements). */
static bool fwd_rank_pays(const struct executor_ctx *c, uint32_t j)
{
    const uint32_t r = j < FWD_PF_RANKS ? j : FWD_PF_RANKS - 1;
    return 20u * (uint64_t)c->pf_rank_hit[r] >= 17u * (uint64_t)c->pf_rank_pred[r];
}

/* Scores the gate predictor's guesses for one token by rank (pred and actual: k ids each). */
static void fwd_rank_score(struct executor_ctx *c, const int32_t *pred, const int32_t *actual,
                           uint32_t k)
{
    for (uint32_t j = 0; j < k; j++) {
        const uint32_t r = j < FWD_PF_RANKS ? j : FWD_PF_RANKS - 1;
        bool           hit = false;
        for (uint32_t i = 0; i < k && !hit; i++)
            hit = actual[i] == pred[j];
        c->pf_rank_pred[r]++;
        c->pf_rank_hit[r] += hit;
        if (c->pf_rank_pred[r] >= 256u) { /* forget slowly: the run's recent tokens count most */
            c->pf_rank_pred[r] /= 2u;
            c->pf_rank_hit[r] /= 2u;
        }
    }
}

/* Prefetch hints for layer il + 1 (or the next token's first layers after the last layer):
 * layer il+1's router applied to the hidden state now (h, normalised with il+1's ffn_norm), and
 * the previous token's choices at il+1. Predictions are kept to score them at il+1. */
static void fwd_prefetch(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    const struct executor_model *m = c->m;
    const struct common_hparams *hp = &m->desc->hp;
    const uint32_t               ne = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used;
    uint32_t                     budget = c->window ? c->window : UINT32_MAX, sent = 0;
    c->hint_stamp++;
    if (il + 1 < hp->n_layer && !m->layers[il + 1].gate_inp.data)
        return; /* a dense layer next (deepseek2's leading ones) */
    if (il + 1 < hp->n_layer) {
        const struct executor_layer_w *nl = &m->layers[il + 1];
        for (uint32_t t = 0; t < n; t++)
            fwd_rmsnorm(c->tmp + (size_t)t * ne, c->x + (size_t)t * ne, nl->ffn_norm, ne,
                        hp->rms_eps);
        size_t            rs = executor_fwd_quantize(c, 0, nl->gate_inp.type, c->tmp, ne, n, ne);
        struct fwd_mm_job rj = {.n = 1};
        rj.t[0] = fwd_mm_of(&nl->gate_inp, c->act[0], rs, n, c->router, E);
        executor_fwd_mm_run(c, &rj);
        /* The router's rows are spent (this layer's weights are in c->sel_w); the guesses
         * follow layer il+1's own rule: its bias, gating, selection bias and expert groups. */
        for (uint32_t t = 0; t < n; t++) {
            float *p = c->router + (size_t)t * E;
            moe_probs(hp, nl, p);
            fwd_topk(moe_selection(c, nl, p, t), E, K, c->pred_gate + (size_t)t * K);
        }
        c->pred_gate_layer = (int32_t)(il + 1);
        /* Hints in rank order (every token's best guess first), then the previous token's. */
        uint32_t top = c->pf_top < K ? c->pf_top : K;
        while (c->pf_top == 0 && top < K && fwd_rank_pays(c, top))
            top++;
        top = top ? top : 1;
        for (uint32_t j = 0; j < top; j++)
            for (uint32_t t = 0; t < n && sent < budget; t++, sent++)
                fwd_hint(c, il + 1, c->pred_gate[(size_t)t * K + j], EXECUTOR_HINT_PREFETCH);
        if (c->history && c->have_prev[il + 1])
            for (uint32_t j = 0; j < K && sent < budget; j++, sent++)
                fwd_hint(c, il + 1, c->prev_sel[(size_t)(il + 1) * K + j], EXECUTOR_HINT_PREFETCH);
        return;
    }
    /* Last layer: the next token starts at layer 0; guess it repeats this token's choices. */
    for (uint32_t l = 0; c->history && l < FWD_NEXT_TOKEN_LAYERS && l < hp->n_layer; l++) {
        c->hint_stamp++;
        for (uint32_t j = 0; j < K && sent < budget && c->have_prev[l]; j++, sent++)
            fwd_hint(c, l, c->prev_sel[(size_t)l * K + j], EXECUTOR_HINT_PREFETCH);
    }
}

/* Scores the predictions made for layer il against the router's choices (decode steps only:
 * a prefill wave reads what it routes anyway), then remembers the last token's choices. */
static void fwd_predict_score(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    const uint32_t K = c->m->desc->hp.n_expert_used;
    const int32_t *sel_last = c->sel + (size_t)(n - 1) * K;
    if (n == 1 && c->hints) {
        if (il == 0 && c->have_prev[0])
            fwd_pred_count(c, EXECUTOR_PRED_NEXT_TOKEN, c->prev_sel, c->sel, K);
        if (il > 0 && c->have_prev[il])
            fwd_pred_count(c, EXECUTOR_PRED_PREV_TOKEN, c->prev_sel + (size_t)il * K, c->sel, K);
        if (il > 0 && c->pred_gate_layer == (int32_t)il)
            fwd_pred_count(c, EXECUTOR_PRED_GATE, c->pred_gate, c->sel, K);
    }
    /* Every row the predictor guessed for scores its ranks (a batch of sequences' decode steps
     * hints by them too). */
    if (c->hints && il > 0 && c->pred_gate_layer == (int32_t)il)
        for (uint32_t t = 0; t < n; t++)
            fwd_rank_score(c, c->pred_gate + (size_t)t * K, c->sel + (size_t)t * K, K);
    if (c->pred_gate_layer == (int32_t)il)
        c->pred_gate_layer = -1; /* spent: another batch's layer il did not guess */
    memcpy(c->prev_sel + (size_t)il * K, sel_last, K * sizeof(*sel_last));
    c->have_prev[il] = 1;
}

/* Router of layer il: softmax (or sigmoid) over all experts, top-k by the selection scores,
 * optional renormalisation and scaling of the k weights; then the (token, slot) items grouped by
 * expert (ex_start, ex_items, ex_count). */
static void moe_route(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    const struct common_hparams   *hp = &c->m->desc->hp;
    const struct executor_layer_w *lw = &c->m->layers[il];
    const uint32_t                 ne = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used;
    size_t            rs = executor_fwd_quantize(c, 0, lw->gate_inp.type, c->xn, ne, n, ne);
    struct fwd_mm_job rj = {.n = 1};
    rj.t[0] = fwd_mm_of(&lw->gate_inp, c->act[0], rs, n, c->router, E);
    executor_fwd_mm_run(c, &rj);
    memset(c->ex_count, 0, E * sizeof(*c->ex_count));
    const float scale = hp->expert_weights_scale;
    for (uint32_t t = 0; t < n; t++) {
        float   *p = c->router + (size_t)t * E;
        int32_t *sel = c->sel + (size_t)t * K;
        float   *sw = c->sel_w + (size_t)t * K;
        moe_probs(hp, lw, p);
        fwd_topk(moe_selection(c, lw, p, t), E, K, sel);
        double sum = 0.0;
        for (uint32_t j = 0; j < K; j++) {
            sw[j] = p[sel[j]];
            sum += (double)sw[j];
            c->ex_count[sel[j]]++;
        }
        /* gpt-oss: the weights are the softmax of the k chosen logits. */
        if (hp->expert_gating == COMMON_GATING_SOFTMAX_WEIGHT) {
            fwd_softmax(sw, K);
            sum = 0.0;
            for (uint32_t j = 0; j < K; j++)
                sum += (double)sw[j];
        }
        /* llama.cpp clamps the sum to the smallest f16 normal before dividing. */
        const float fsum = (float)sum > 6.103515625e-5f ? (float)sum : 6.103515625e-5f;
        if (hp->norm_topk_prob)
            for (uint32_t j = 0; j < K; j++)
                sw[j] = sw[j] / fsum;
        if (scale != 0.0f && scale != 1.0f)
            for (uint32_t j = 0; j < K; j++)
                sw[j] = sw[j] * scale;
    }
    c->ex_start[0] = 0;
    for (uint32_t e = 0; e < E; e++)
        c->ex_start[e + 1] = c->ex_start[e] + c->ex_count[e];
    memset(c->ex_count, 0, E * sizeof(*c->ex_count));
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t j = 0; j < K; j++) {
            int32_t e = c->sel[(size_t)t * K + j];
            c->ex_items[c->ex_start[e] + c->ex_count[e]++] = (int32_t)(t * K + j);
        }
}

/* The order experts are computed in (c->ex_order; returns how many): those already in memory
 * first, then the others in expert order (the order their post-fetches are queued). Results do
 * not depend on it: each (token, slot) output has its own row and the sum runs in slot order. A
 * load may complete while we look, so each expert's readiness is read once: ready ones from the
 * front, the others from the back (then put back in expert order). */
static uint32_t moe_order(struct executor_ctx *c, uint32_t il)
{
    struct executor_weights *w = c->m->w;
    const uint32_t           E = c->m->desc->hp.n_expert;
    uint32_t                 n_ord = 0, n_used = 0;
    for (uint32_t e = 0; e < E; e++)
        n_used += c->ex_count[e] != 0;
    uint32_t back = n_used;
    for (uint32_t e = 0; e < E; e++) {
        if (c->ex_count[e] == 0)
            continue;
        bool ready = !w->ops->expert_is_ready || w->ops->expert_is_ready(w->impl, il, e);
        c->ex_order[ready ? n_ord++ : --back] = (int32_t)e;
    }
    for (uint32_t i = n_ord, j = n_used; i + 1 < j; i++, j--) {
        int32_t tmp = c->ex_order[i];
        c->ex_order[i] = c->ex_order[j - 1];
        c->ex_order[j - 1] = tmp;
    }
    return n_used;
}

int executor_moe_acquire_failed(struct executor_ctx *c, uint32_t il, uint32_t e, int part, int rc)
{
    static const char *const       parts[COMMON_EXPERT_PART_COUNT] = {"gate", "up", "down"};
    const struct executor_weights *w = c->m->w;
    struct common_errmsg           why = {{0}};
    if ((rc == COMMON_EIO || rc == COMMON_ECORRUPT) && w->ops->expert_error)
        w->ops->expert_error(w->impl, il, e, &why);
    if (why.text[0]) /* it names the file, the layer and the expert */
        common_errmsg_set(&c->err, rc, "%s", why.text);
    else
        common_errmsg_set(&c->err, rc, "layer %u expert %u (%s): %s", il, e, parts[part],
                          common_strerror(rc));
    return rc;
}

/* One pass over expert e of layer il for its `cnt` rows gathered in c->gx: pin gate and up,
 * compute them while down may still be in flight, then pin down, compute, release (DESIGN 2).
 * Returns 0, 1 when a part lent without a pin changed during the pass (the result is wrong),
 * or an error of the weight source. */
static int moe_expert_pass(struct executor_ctx *c, uint32_t il, uint32_t e, int32_t cnt)
{
    const struct executor_layer_w *lw = &c->m->layers[il];
    struct executor_weights       *w = c->m->w;
    const void                    *data[COMMON_EXPERT_PART_COUNT];
    uint32_t                       slot[COMMON_EXPERT_PART_COUNT];
    struct executor_mat            mats[COMMON_EXPERT_PART_COUNT];
    int                            got = 0, rc = 0;
    bool                           torn = false;
    for (; got < COMMON_EXPERT_PART_COUNT; got++) {
        if (got == COMMON_EXPERT_DOWN && lw->gate_exps_b) {
            const size_t ff = (size_t)lw->exp[COMMON_EXPERT_GATE].rows;
            executor_fwd_oai_gate_up(c, c->gx, (uint32_t)cnt, &mats[COMMON_EXPERT_GATE],
                                     &mats[COMMON_EXPERT_UP], lw->gate_exps_b + (size_t)e * ff,
                                     lw->up_exps_b + (size_t)e * ff);
        } else if (got == COMMON_EXPERT_DOWN) {
            executor_fwd_swiglu_gate_up(c, c->gx, (uint32_t)cnt, &mats[COMMON_EXPERT_GATE],
                                        &mats[COMMON_EXPERT_UP]);
        }
        rc = w->ops->expert_acquire(w->impl, il, e, (enum common_expert_part)got, &data[got],
                                    &slot[got]);
        if (rc < 0) {
            executor_moe_acquire_failed(c, il, e, got, rc);
            break;
        }
        mats[got] = (struct executor_mat){.data = data[got],
                                          .type = lw->exp[got].type,
                                          .rows = lw->exp[got].rows,
                                          .cols = lw->exp[got].cols,
                                          .row_bytes = lw->exp[got].row_bytes};
    }
    if (rc == 0)
        executor_fwd_swiglu_down(c, (uint32_t)cnt, &mats[COMMON_EXPERT_DOWN]);
    for (int p = 0; p < got; p++)
        if (w->ops->expert_release(w->impl, slot[p]) == COMMON_EAGAIN)
            torn = true;
    return rc < 0 ? rc : torn ? 1 : 0;
}

int executor_moe_expert_rows(struct executor_ctx *c, uint32_t il, uint32_t e, int32_t cnt)
{
    const uint32_t ne = c->m->desc->hp.n_embd;
    int            rc;
    for (uint32_t attempt = 0; (rc = moe_expert_pass(c, il, e, cnt)) == 1; attempt++)
        if (attempt + 1 >= FWD_TORN_RETRIES)
            return COMMON_EIO; /* a source that keeps lending changing bytes */
    if (rc < 0)
        return rc;
    const float *db = c->m->layers[il].down_exps_b;
    for (int32_t i = 0; db && i < cnt; i++)
        for (uint32_t d = 0; d < ne; d++)
            c->tmp[(size_t)i * ne + d] = c->tmp[(size_t)i * ne + d] + db[(size_t)e * ne + d];
    return 0;
}

/* Expert e of layer il over the batch's rows routed to it (one wave: its parts are read once
 * for all of them); the weighted outputs go to their (token, slot) rows of c->moe_out. A part
 * lent without a pin whose bytes were reused meanwhile gave a wrong result: the expert is
 * computed again (the source pins parts then). */
static int moe_expert(struct executor_ctx *c, uint32_t il, uint32_t e)
{
    const uint32_t ne = c->m->desc->hp.n_embd, K = c->m->desc->hp.n_expert_used;
    const int32_t  cnt = c->ex_count[e];
    const int32_t *items = c->ex_items + c->ex_start[e];
    for (int32_t i = 0; i < cnt; i++)
        memcpy(c->gx + (size_t)i * ne, c->xn + (size_t)(items[i] / (int32_t)K) * ne,
               ne * sizeof(float));
    const int rc = executor_moe_expert_rows(c, il, e, cnt);
    if (rc < 0)
        return rc;
    for (int32_t i = 0; i < cnt; i++) {
        const float  wt = c->sel_w[items[i]];
        const float *src = c->tmp + (size_t)i * ne;
        float       *dst = c->moe_out + (size_t)items[i] * ne;
        for (uint32_t d = 0; d < ne; d++)
            dst[d] = src[d] * wt;
    }
    return 0;
}

/* The shared expert of layer il (resident, beside the routed ones) over the n rows of c->xn:
 * its output in c->sh_out, scaled by sigmoid(gate . x) where the layer has that gate (qwen2moe).
 * Returns false for a layer without one. */
static bool moe_shared(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    const struct executor_layer_w *lw = &c->m->layers[il];
    const uint32_t                 ne = c->m->desc->hp.n_embd;
    if (!lw->sh_up.data)
        return false;
    executor_fwd_swiglu_gate_up(c, c->xn, n, &lw->sh_gate, &lw->sh_up);
    executor_fwd_swiglu_down(c, n, &lw->sh_down);
    memcpy(c->sh_out, c->tmp, (size_t)n * ne * sizeof(float));
    if (!lw->sh_gate_inp.data)
        return true;
    /* The router's logits are spent: one gate logit per row goes there. */
    size_t            gs = executor_fwd_quantize(c, 0, lw->sh_gate_inp.type, c->xn, ne, n, ne);
    struct fwd_mm_job gj = {.n = 1};
    gj.t[0] = fwd_mm_of(&lw->sh_gate_inp, c->act[0], gs, n, c->router, 1);
    executor_fwd_mm_run(c, &gj);
    for (uint32_t t = 0; t < n; t++) {
        /* llama.cpp computes the sigmoid as silu(g) / g. */
        const float g = c->router[t];
        const float s = g != 0.0f ? fwd_silu(g) / g : 0.5f;
        float      *y = c->sh_out + (size_t)t * ne;
        for (uint32_t d = 0; d < ne; d++)
            y[d] = y[d] * s;
    }
    return true;
}

int executor_fwd_moe(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    struct executor_weights *w = c->m->w;
    const uint32_t           ne = c->m->desc->hp.n_embd, K = c->m->desc->hp.n_expert_used;
    moe_route(c, il, n);
    const uint32_t n_ord = moe_order(c, il);

    /* Post-fetch: every routed expert of this batch is asked for now, gate/up parts first and
     * down last (the fetcher's order), at most `window` ahead of the one being computed. */
    const bool     post = c->hints && !c->no_postfetch;
    const uint32_t win = c->window ? c->window : n_ord;
    uint32_t       asked = 0;
    if (post)
        for (; asked < n_ord && asked < win; asked++)
            (void)w->ops->expert_request(w->impl, il, (uint32_t)c->ex_order[asked],
                                         EXECUTOR_HINT_POSTFETCH);
    fwd_predict_score(c, il, n);
    /* A prefill wave in a pool too small for two layers would evict its own experts. */
    if (c->hints && !c->no_prefetch && (n == 1 || c->window == 0))
        fwd_prefetch(c, il, n);

    /* The shared expert is resident: computed while the routed ones are still being read. */
    const bool shared = moe_shared(c, il, n);
    for (uint32_t oi = 0; oi < n_ord; oi++) {
        if (post && asked < n_ord)
            (void)w->ops->expert_request(w->impl, il, (uint32_t)c->ex_order[asked++],
                                         EXECUTOR_HINT_POSTFETCH);
        int rc = moe_expert(c, il, (uint32_t)c->ex_order[oi]);
        if (rc < 0)
            return rc;
    }
    /* Sum the k weighted outputs in slot order, add the shared expert's output, then the
     * residual (the order of llama.cpp's graph). */
    for (uint32_t t = 0; t < n; t++) {
        const float *mo = c->moe_out + (size_t)t * K * ne;
        const float *sh = c->sh_out + (size_t)t * ne;
        float       *x = c->x + (size_t)t * ne;
        for (uint32_t d = 0; d < ne; d++) {
            float acc = mo[d];
            for (uint32_t j = 1; j < K; j++)
                acc += mo[(size_t)j * ne + d];
            if (shared)
                acc = acc + sh[d];
            x[d] = acc + x[d];
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* A dense FFN streamed as one expert per layer                                                */
/* ------------------------------------------------------------------------------------------ */

/* Layers asked for ahead of the one computed: the next ones are certain (every token runs every
 * layer), so the storage reads overlap this layer's compute. */
#define FWD_STREAM_AHEAD 2u

/* One pass over layer il's FFN for the n rows of c->xn into c->tmp: gate and up pinned and
 * computed while down may still be in flight, then down (moe_expert_pass's shape). Returns 0,
 * 1 when a part lent without a pin changed during the pass, or an error of the weight source. */
static int ffn_streamed_pass(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    const struct executor_layer_w *lw = &c->m->layers[il];
    struct executor_weights       *w = c->m->w;
    const void                    *data[COMMON_EXPERT_PART_COUNT];
    uint32_t                       slot[COMMON_EXPERT_PART_COUNT];
    struct executor_mat            mats[COMMON_EXPERT_PART_COUNT];
    int                            got = 0, rc = 0;
    bool                           torn = false;
    for (; got < COMMON_EXPERT_PART_COUNT; got++) {
        if (got == COMMON_EXPERT_DOWN)
            executor_fwd_dense_gate_up(c, c->xn, n, &mats[COMMON_EXPERT_GATE],
                                       &mats[COMMON_EXPERT_UP], lw->ffn_sub_norm);
        rc = w->ops->expert_acquire(w->impl, il, 0, (enum common_expert_part)got, &data[got],
                                    &slot[got]);
        if (rc < 0) {
            executor_moe_acquire_failed(c, il, 0, got, rc);
            break;
        }
        float scale = lw->exp_scale[got];
        if (lw->exp_tail[got]) { /* Microsoft's I2_S: the tensor scale after the codes */
            float tail;
            memcpy(&tail, (const uint8_t *)data[got] + lw->exp_tail[got], sizeof(tail));
            scale = scale != 0.0f ? tail * scale : tail;
        }
        mats[got] = (struct executor_mat){.data = data[got],
                                          .type = lw->exp[got].type,
                                          .rows = lw->exp[got].rows,
                                          .cols = lw->exp[got].cols,
                                          .row_bytes = lw->exp[got].row_bytes,
                                          .out_scale = scale};
    }
    if (rc == 0)
        executor_fwd_swiglu_down(c, n, &mats[COMMON_EXPERT_DOWN]);
    for (int p = 0; p < got; p++)
        if (w->ops->expert_release(w->impl, slot[p]) == COMMON_EAGAIN)
            torn = true;
    return rc < 0 ? rc : torn ? 1 : 0;
}

int executor_fwd_ffn_streamed(struct executor_ctx *c, uint32_t il, uint32_t n)
{
    struct executor_weights *w = c->m->w;
    const uint32_t           ne = c->m->desc->hp.n_embd, nl = c->m->desc->hp.n_layer;
    if (c->hints && !c->no_postfetch)
        (void)w->ops->expert_request(w->impl, il, 0, EXECUTOR_HINT_POSTFETCH);
    for (uint32_t k = 1; c->hints && !c->no_prefetch && k <= FWD_STREAM_AHEAD; k++)
        (void)w->ops->expert_request(w->impl, (il + k) % nl, 0, EXECUTOR_HINT_PREFETCH);
    int rc;
    for (uint32_t attempt = 0; (rc = ffn_streamed_pass(c, il, n)) == 1; attempt++)
        if (attempt + 1 >= FWD_TORN_RETRIES)
            return COMMON_EIO; /* a source that keeps lending changing bytes */
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < (size_t)n * ne; i++)
        c->x[i] = c->tmp[i] + c->x[i];
    return 0;
}
