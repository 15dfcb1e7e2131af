/* common/ctx_layout.c - one table of an inference context's buffers, for allocation and plans. */
#include <string.h>

#include "common.h"

/* Dimensions a buffer's size is a product of. */
enum layout_dim {
    DIM_ONE = 0,
    DIM_BATCH,     /* n_batch */
    DIM_CTX,       /* n_ctx */
    DIM_THREADS,   /* n_threads */
    DIM_LAYER,     /* n_layer */
    DIM_EMBD,      /* n_embd */
    DIM_QD,        /* n_head * head_dim_k */
    DIM_KD,        /* n_head_kv * head_dim_k */
    DIM_VD,        /* n_head_kv * head_dim_v */
    DIM_AD,        /* n_head * head_dim_v */
    DIM_FF,        /* max(n_ff, n_ff_exp, n_ff_shexp) */
    DIM_ACT_ROW,   /* bytes of one activation row: max(n_embd, n_ff, ad) f32 + alignment */
    DIM_ROT,       /* n_rot (at least 1) */
    DIM_TH_Q,      /* bytes of one thread's query in the cache's dot type */
    DIM_ATT_HEADS, /* heads a thread attends together (COMMON_CTX_MLA_HEADS) */
    DIM_HDV,       /* head_dim_v */
    DIM_EXPERT,    /* n_expert */
    DIM_EXPERT1,   /* n_expert + 1 */
    DIM_USED,      /* n_expert_used (at least 1) */
    DIM_MLA_QA,    /* q_lora_rank (0 without latent attention) */
    DIM_MLA_QK,    /* n_head * head_dim_k_mla */
    DIM_MLA_KV,    /* kv_lora_rank + n_rot */
    DIM_MLA_O,     /* n_head * head_dim_v_mla */
    DIM_SH_EMBD,   /* n_embd with a shared expert, else 0 */
    DIM_COUNT,
};

/* One row of the table: the buffer's element size and the three dimensions it multiplies. */
struct layout_row {
    const char *name;
    uint8_t     elem; /* bytes per element */
    uint8_t     a, b, c;
    bool        moe; /* only for models with routed experts */
};

static const struct layout_row g_rows[COMMON_CTX_BUF_COUNT] = {
    [COMMON_CTX_X] = {"x", 4, DIM_BATCH, DIM_EMBD, DIM_ONE, false},
    [COMMON_CTX_XN] = {"xn", 4, DIM_BATCH, DIM_EMBD, DIM_ONE, false},
    [COMMON_CTX_Q] = {"q", 4, DIM_BATCH, DIM_QD, DIM_ONE, false},
    [COMMON_CTX_K] = {"k", 4, DIM_BATCH, DIM_KD, DIM_ONE, false},
    [COMMON_CTX_V] = {"v", 4, DIM_BATCH, DIM_VD, DIM_ONE, false},
    [COMMON_CTX_ATT] = {"att", 4, DIM_BATCH, DIM_AD, DIM_ONE, false},
    [COMMON_CTX_TMP] = {"tmp", 4, DIM_BATCH, DIM_EMBD, DIM_ONE, false},
    [COMMON_CTX_GATE] = {"gate", 4, DIM_BATCH, DIM_FF, DIM_ONE, false},
    [COMMON_CTX_UP] = {"up", 4, DIM_BATCH, DIM_FF, DIM_ONE, false},
    [COMMON_CTX_ACT0] = {"act0", 1, DIM_BATCH, DIM_ACT_ROW, DIM_ONE, false},
    [COMMON_CTX_ACT1] = {"act1", 1, DIM_BATCH, DIM_ACT_ROW, DIM_ONE, false},
    [COMMON_CTX_ACT2] = {"act2", 1, DIM_BATCH, DIM_ACT_ROW, DIM_ONE, false},
    [COMMON_CTX_ROPE] = {"rope", 4, DIM_BATCH, DIM_ROT, DIM_ONE, false},
    [COMMON_CTX_TH_SCORES] = {"th_scores", 4, DIM_THREADS, DIM_CTX, DIM_ATT_HEADS, false},
    [COMMON_CTX_TH_P16] = {"th_p16", 2, DIM_THREADS, DIM_CTX, DIM_ONE, false},
    [COMMON_CTX_TH_Q] = {"th_q", 1, DIM_THREADS, DIM_TH_Q, DIM_ATT_HEADS, false},
    [COMMON_CTX_TH_V] = {"th_v", 4, DIM_THREADS, DIM_HDV, DIM_ONE, false},
    [COMMON_CTX_ROUTER] = {"router", 4, DIM_BATCH, DIM_EXPERT, DIM_ONE, true},
    [COMMON_CTX_SEL] = {"sel", 4, DIM_BATCH, DIM_USED, DIM_ONE, true},
    [COMMON_CTX_SEL_W] = {"sel_w", 4, DIM_BATCH, DIM_USED, DIM_ONE, true},
    [COMMON_CTX_EX_COUNT] = {"ex_count", 4, DIM_EXPERT, DIM_ONE, DIM_ONE, true},
    [COMMON_CTX_EX_START] = {"ex_start", 4, DIM_EXPERT1, DIM_ONE, DIM_ONE, true},
    [COMMON_CTX_EX_ITEMS] = {"ex_items", 4, DIM_BATCH, DIM_USED, DIM_ONE, true},
    [COMMON_CTX_GX] = {"gx", 4, DIM_BATCH, DIM_EMBD, DIM_ONE, true},
    [COMMON_CTX_MOE_OUT] = {"moe_out", 4, DIM_BATCH, DIM_USED, DIM_EMBD, true},
    [COMMON_CTX_EX_ORDER] = {"ex_order", 4, DIM_EXPERT, DIM_ONE, DIM_ONE, true},
    [COMMON_CTX_PRED_LOGITS] = {"pred_logits", 4, DIM_BATCH, DIM_EXPERT, DIM_ONE, true},
    [COMMON_CTX_PRED_GATE] = {"pred_gate", 4, DIM_BATCH, DIM_USED, DIM_ONE, true},
    [COMMON_CTX_PREV_SEL] = {"prev_sel", 4, DIM_LAYER, DIM_USED, DIM_ONE, true},
    [COMMON_CTX_HAVE_PREV] = {"have_prev", 1, DIM_LAYER, DIM_ONE, DIM_ONE, true},
    [COMMON_CTX_HINT_MARK] = {"hint_mark", 4, DIM_EXPERT, DIM_ONE, DIM_ONE, true},
    [COMMON_CTX_MLA_QA] = {"mla_qa", 4, DIM_BATCH, DIM_MLA_QA, DIM_ONE, false},
    [COMMON_CTX_MLA_Q] = {"mla_q", 4, DIM_BATCH, DIM_MLA_QK, DIM_ONE, false},
    [COMMON_CTX_MLA_KV] = {"mla_kv", 4, DIM_BATCH, DIM_MLA_KV, DIM_ONE, false},
    [COMMON_CTX_MLA_O] = {"mla_o", 4, DIM_BATCH, DIM_MLA_O, DIM_ONE, false},
    [COMMON_CTX_SH_OUT] = {"sh_out", 4, DIM_BATCH, DIM_SH_EMBD, DIM_ONE, true},
};

int common_cache_type_parse(const char *s, enum common_cache_type *out)
{
    if (strcmp(s, "f16") == 0 || strcmp(s, "F16") == 0) {
        *out = COMMON_CACHE_F16;
        return COMMON_OK;
    }
    if (strcmp(s, "q8_0") == 0 || strcmp(s, "Q8_0") == 0) {
        *out = COMMON_CACHE_Q8_0;
        return COMMON_OK;
    }
    return COMMON_EINVAL;
}

int common_cache_type_opt(void *arg, const char *v, struct common_errmsg *e)
{
    if (common_cache_type_parse(v, arg) != COMMON_OK)
        return common_errmsg_set(e, COMMON_EINVAL, "expects f16 or q8_0, got '%s'", v);
    return COMMON_OK;
}

const char *common_cache_type_name(enum common_cache_type t)
{
    return t == COMMON_CACHE_Q8_0 ? "q8_0" : "f16";
}

const char *common_ctx_buf_name(enum common_ctx_buf b)
{
    return (unsigned)b < COMMON_CTX_BUF_COUNT ? g_rows[b].name : "?";
}

static uint64_t layout_round(uint64_t bytes)
{
    return (bytes ? (bytes + COMMON_CTX_ALIGN - 1) / COMMON_CTX_ALIGN : 1) * COMMON_CTX_ALIGN;
}

static uint64_t layout_max(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* a * b * c with overflow detection (false on overflow). */
static bool layout_mul3(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t ab;
    return common_mul_u64(a, b, &ab) && common_mul_u64(ab, c, out);
}

/* The KV part of the layout; returns 0 or a negative common_err. */
static int layout_kv(const struct common_hparams *hp, struct common_ctx_layout *l,
                     struct common_errmsg *e)
{
    uint64_t k_head, v_head;
    if (l->cache_type == COMMON_CACHE_F16) {
        k_head = (uint64_t)hp->head_dim_k * 2u;
        v_head = (uint64_t)hp->head_dim_v * 2u;
    } else if (l->cache_type == COMMON_CACHE_Q8_0) {
        if (hp->head_dim_k % 32 != 0 || hp->head_dim_v % 32 != 0)
            return common_errmsg_set(e, COMMON_EINVAL,
                                     "cache type q8_0 needs head widths that are multiples of 32 "
                                     "(model: %u, %u)",
                                     hp->head_dim_k, hp->head_dim_v);
        if (common_ggml_row_size(COMMON_GGML_TYPE_Q8_0, hp->head_dim_k, &k_head) < 0 ||
            common_ggml_row_size(COMMON_GGML_TYPE_Q8_0, hp->head_dim_v, &v_head) < 0)
            return common_errmsg_set(e, COMMON_EINVAL, "cache type q8_0: bad head width");
    } else {
        return common_errmsg_set(e, COMMON_EINVAL, "unknown cache type %d", (int)l->cache_type);
    }
    /* Latent attention: V is the first head_dim_v values of K (the latent), not stored twice. */
    if (hp->n_lora_kv)
        v_head = 0;
    /* Sliding layers keep a ring of their window (common_kv_layer_positions). */
    uint64_t cells = 0;
    for (uint32_t il = 0; il < l->kv_layers; il++)
        cells += common_kv_layer_positions(hp, l->n_ctx, l->n_batch, il);
    uint64_t positions;
    if (!common_mul_u64(cells, hp->n_head_kv, &positions) ||
        !common_mul_u64(positions, k_head, &l->kv_k_bytes) ||
        !common_mul_u64(positions, v_head, &l->kv_v_bytes) ||
        !common_add_u64(l->kv_k_bytes, l->kv_v_bytes, &l->kv_bytes))
        return common_errmsg_set(e, COMMON_ERANGE, "the KV cache of %u positions overflows",
                                 l->n_ctx);
    l->kv_k_head_bytes = k_head;
    l->kv_v_head_bytes = l->cache_type == COMMON_CACHE_Q8_0 ? v_head : 0;
    return COMMON_OK;
}

int common_ctx_layout_compute(const struct common_hparams         *hp,
                              const struct common_ctx_layout_opts *o, struct common_ctx_layout *out,
                              struct common_errmsg *e)
{
    static const struct common_ctx_layout_opts def = {0};
    if (!o)
        o = &def;
    struct common_ctx_layout l = {.cache_type = o->cache_type};
    l.n_ctx = o->n_ctx;
    if (l.n_ctx == 0)
        l.n_ctx =
            hp->n_ctx_train < COMMON_CTX_DEFAULT_CTX ? hp->n_ctx_train : COMMON_CTX_DEFAULT_CTX;
    if (l.n_ctx == 0 || l.n_ctx > COMMON_CTX_MAX_CTX)
        return common_errmsg_set(e, COMMON_EINVAL, "context size %u is not in 1..%u", l.n_ctx,
                                 COMMON_CTX_MAX_CTX);
    l.n_batch = o->n_batch ? o->n_batch : 512;
    if (l.n_batch > l.n_ctx)
        l.n_batch = l.n_ctx;
    l.n_threads = o->n_threads ? o->n_threads : 1;
    l.kv_layers = o->n_device_layers < hp->n_layer ? hp->n_layer - o->n_device_layers : 0;
    int rc = layout_kv(hp, &l, e);
    if (rc < 0)
        return rc;

    const uint64_t ad = (uint64_t)hp->n_head * hp->head_dim_v;
    const uint64_t ff = layout_max(layout_max(hp->n_ff, hp->n_ff_exp), hp->n_ff_shexp);
    uint64_t       dim[DIM_COUNT] = {
              [DIM_ONE] = 1,
              [DIM_BATCH] = l.n_batch,
              [DIM_CTX] = l.n_ctx,
              [DIM_THREADS] = l.n_threads,
              [DIM_LAYER] = hp->n_layer,
              [DIM_EMBD] = hp->n_embd,
              [DIM_QD] = (uint64_t)hp->n_head * hp->head_dim_k,
              [DIM_KD] = (uint64_t)hp->n_head_kv * hp->head_dim_k,
              [DIM_VD] = (uint64_t)hp->n_head_kv * hp->head_dim_v,
              [DIM_AD] = ad,
              [DIM_FF] = ff,
              /* An activation row is at most 4 bytes per element (f32); K-quant rows a bit over 1. */
              [DIM_ACT_ROW] = layout_max(layout_max(layout_max(hp->n_embd, ff), ad),
                                         (uint64_t)hp->n_head * hp->head_dim_v_mla) *
                                  4u +
                              COMMON_CTX_ALIGN,
              [DIM_ROT] = hp->n_rot ? hp->n_rot : 1,
              /* The query in the cache's dot type, at most f32, padded to the alignment. */
              [DIM_TH_Q] = ((uint64_t)hp->head_dim_k * 4u + COMMON_CTX_ALIGN) / COMMON_CTX_ALIGN *
                           COMMON_CTX_ALIGN,
              [DIM_ATT_HEADS] =
            hp->n_lora_kv && hp->n_head > 1
                      ? (hp->n_head < COMMON_CTX_MLA_HEADS ? hp->n_head : COMMON_CTX_MLA_HEADS)
                      : 1,
              [DIM_HDV] = hp->head_dim_v,
              [DIM_EXPERT] = hp->n_expert,
              [DIM_EXPERT1] = (uint64_t)hp->n_expert + 1,
              [DIM_USED] = hp->n_expert_used ? hp->n_expert_used : 1,
              [DIM_MLA_QA] = hp->n_lora_q,
              [DIM_MLA_QK] = (uint64_t)hp->n_head * hp->head_dim_k_mla,
              [DIM_MLA_KV] = hp->n_lora_kv ? (uint64_t)hp->n_lora_kv + hp->n_rot : 0,
              [DIM_MLA_O] = (uint64_t)hp->n_head * hp->head_dim_v_mla,
              [DIM_SH_EMBD] = hp->n_ff_shexp ? hp->n_embd : 0,
    };
    l.act_row_bytes = dim[DIM_ACT_ROW];
    l.th_q_bytes = dim[DIM_TH_Q];
    l.att_heads = (uint32_t)dim[DIM_ATT_HEADS];
    for (int b = 0; b < COMMON_CTX_BUF_COUNT; b++) {
        const struct layout_row *r = &g_rows[b];
        if (r->moe && hp->n_expert == 0)
            continue;
        uint64_t n;
        if (!layout_mul3(dim[r->a], dim[r->b], dim[r->c], &n) ||
            !common_mul_u64(n, r->elem, &l.buf[b]) ||
            !common_add_u64(l.scratch_bytes, layout_round(l.buf[b]), &l.scratch_bytes))
            return common_errmsg_set(e, COMMON_ERANGE, "context buffer %s overflows", r->name);
    }
    if (!common_mul_u64(hp->n_vocab, sizeof(float), &l.logits_bytes))
        return common_errmsg_set(e, COMMON_ERANGE, "logits row overflows");
    *out = l;
    return COMMON_OK;
}
