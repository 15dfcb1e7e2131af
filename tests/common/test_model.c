/* tests/common/test_model.c - model description for each architecture, on files built here. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fixture.h"

/* Geometry of a tiny test model; all tensors F32, data zero. */
struct arch_spec {
    const char *arch;
    uint32_t    n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_expert, n_used, n_ff_exp;
    uint32_t    n_ff_shexp;
    bool        qk_norm, qkv_bias, tied;
    bool        qk_norm_full; /* q/k norms over the whole projection (olmoe), not per head */
    bool        key_length;   /* write attention.key_length/value_length */
    const char *skip_tensor;  /* leave this tensor out (NULL = none) */
};

static void add(struct common_gguf_writer *w, const char *name, uint32_t nd, uint64_t a, uint64_t b,
                uint64_t c)
{
    if (!name)
        return;
    uint64_t ne[3] = {a, b, c};
    cr_assert_eq(common_gguf_writer_add_tensor(w, name, COMMON_GGML_TYPE_F32, nd, ne), COMMON_OK,
                 "%s", name);
}

/* Writes the model and returns its path (malloc'd) in a fresh temp dir (*dir). */
static char *write_model(const struct arch_spec *s, char **dir)
{
    *dir = fixture_tmpdir();
    char *path = malloc(512);
    snprintf(path, 512, "%s/m.gguf", *dir);
    struct common_gguf_writer *w = NULL;
    cr_assert_eq(common_gguf_writer_create(&w, 32), COMMON_OK);
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof(key), "%s.%s", s->arch, suffix), key)
    common_gguf_writer_set_str(w, "general.architecture", s->arch);
    common_gguf_writer_set_u32(w, KEY("embedding_length"), s->n_embd);
    common_gguf_writer_set_u32(w, KEY("block_count"), s->n_layer);
    common_gguf_writer_set_u32(w, KEY("attention.head_count"), s->n_head);
    common_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), s->n_head_kv);
    common_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    common_gguf_writer_set_f32(w, KEY("rope.freq_base"), 1000000.0f);
    common_gguf_writer_set_u32(w, KEY("context_length"), 512);
    if (s->key_length) {
        common_gguf_writer_set_u32(w, KEY("attention.key_length"), s->head_dim);
        common_gguf_writer_set_u32(w, KEY("attention.value_length"), s->head_dim);
    }
    if (s->n_ff)
        common_gguf_writer_set_u32(w, KEY("feed_forward_length"), s->n_ff);
    if (s->n_expert) {
        common_gguf_writer_set_u32(w, KEY("expert_count"), s->n_expert);
        common_gguf_writer_set_u32(w, KEY("expert_used_count"), s->n_used);
        common_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), s->n_ff_exp);
    }
    if (s->n_ff_shexp)
        common_gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"), s->n_ff_shexp);
#undef KEY
    const uint64_t E = s->n_embd, V = 64, hd = s->head_dim;
    const uint64_t q = s->n_head * hd, kv = s->n_head_kv * hd;
    add(w, "token_embd.weight", 2, E, V, 1);
    add(w, "output_norm.weight", 1, E, 1, 1);
    if (!s->tied)
        add(w, "output.weight", 2, E, V, 1);
    for (uint32_t l = 0; l < s->n_layer; l++) {
        char n[64];
#define T(suffix)                                                                                  \
    (snprintf(n, sizeof(n), "blk.%u.%s", l, suffix),                                               \
     s->skip_tensor && strcmp(n, s->skip_tensor) == 0 ? NULL : n)
        add(w, T("attn_norm.weight"), 1, E, 1, 1);
        add(w, T("attn_q.weight"), 2, E, q, 1);
        add(w, T("attn_k.weight"), 2, E, kv, 1);
        add(w, T("attn_v.weight"), 2, E, kv, 1);
        add(w, T("attn_output.weight"), 2, q, E, 1);
        if (s->qkv_bias) {
            add(w, T("attn_q.bias"), 1, q, 1, 1);
            add(w, T("attn_k.bias"), 1, kv, 1, 1);
            add(w, T("attn_v.bias"), 1, kv, 1, 1);
        }
        if (s->qk_norm) {
            add(w, T("attn_q_norm.weight"), 1, s->qk_norm_full ? q : hd, 1, 1);
            add(w, T("attn_k_norm.weight"), 1, s->qk_norm_full ? kv : hd, 1, 1);
        }
        add(w, T("ffn_norm.weight"), 1, E, 1, 1);
        if (s->n_expert == 0) {
            add(w, T("ffn_gate.weight"), 2, E, s->n_ff, 1);
            add(w, T("ffn_up.weight"), 2, E, s->n_ff, 1);
            add(w, T("ffn_down.weight"), 2, s->n_ff, E, 1);
        } else {
            add(w, T("ffn_gate_inp.weight"), 2, E, s->n_expert, 1);
            add(w, T("ffn_gate_exps.weight"), 3, E, s->n_ff_exp, s->n_expert);
            add(w, T("ffn_up_exps.weight"), 3, E, s->n_ff_exp, s->n_expert);
            add(w, T("ffn_down_exps.weight"), 3, s->n_ff_exp, E, s->n_expert);
        }
        if (s->n_ff_shexp) {
            add(w, T("ffn_gate_inp_shexp.weight"), 1, E, 1, 1);
            add(w, T("ffn_gate_shexp.weight"), 2, E, s->n_ff_shexp, 1);
            add(w, T("ffn_up_shexp.weight"), 2, E, s->n_ff_shexp, 1);
            add(w, T("ffn_down_shexp.weight"), 2, s->n_ff_shexp, E, 1);
        }
#undef T
    }
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_writer_begin(w, path, &e), COMMON_OK, "%s", e.text);
    /* Data is all zeros: stream zeros until the writer has every tensor's bytes. */
    static const uint8_t zero[1 << 16];
    for (;;) {
        int rc = common_gguf_writer_write_data(w, zero, sizeof(zero), &e);
        if (rc != COMMON_OK)
            break; /* "more data than tensors": every tensor is complete */
    }
    cr_assert_eq(common_gguf_writer_finish(w, &e), COMMON_OK, "%s", e.text);
    common_gguf_writer_destroy(w);
    return path;
}

/* Opens and describes; returns the rc of common_model_init with *m filled on success. */
static int describe(const struct arch_spec *s, struct common_model *m, struct common_gguf **g,
                    struct common_errmsg *e)
{
    char *dir = NULL;
    char *path = write_model(s, &dir);
    cr_assert_eq(common_gguf_open(path, NULL, g, e), COMMON_OK, "%s", e->text);
    int rc = common_model_init(m, *g, e);
    fixture_rmtree(dir);
    free(dir);
    free(path);
    return rc;
}

Test(common_model, qwen2moe_shared_expert_and_bias)
{
    struct arch_spec     s = {.arch = "qwen2moe",
                              .n_embd = 64,
                              .n_layer = 2,
                              .n_head = 4,
                              .n_head_kv = 2,
                              .head_dim = 16,
                              .n_expert = 6,
                              .n_used = 2,
                              .n_ff_exp = 32,
                              .n_ff_shexp = 96,
                              .qkv_bias = true};
    struct common_model  m;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(m.arch, COMMON_ARCH_QWEN2MOE);
    cr_assert_eq(m.hp.rope_neox, 1, "qwen2moe uses NeoX rope");
    cr_assert_eq(m.hp.norm_topk_prob, 0, "qwen2moe does not renormalise top-k");
    cr_assert_eq(m.hp.n_ff_exp, 32);
    cr_assert_eq(m.hp.n_ff_shexp, 96);
    cr_assert_float_eq(m.hp.rope_freq_base, 1e6f, 1.0f);
    cr_assert_geq(m.layers[1].tensor[COMMON_ROLE_ATTN_K_BIAS], 0);
    cr_assert_geq(m.layers[1].tensor[COMMON_ROLE_FFN_DOWN_SHEXP], 0);
    /* Shared experts are resident: experts are only the routed ones. */
    uint64_t routed = 2ull * 3 * 6 * 64 * 32 * 4;
    cr_assert_eq(m.bytes_experts, routed);
    cr_assert_eq(m.bytes_expert_bundle, 3ull * 64 * 32 * 4);
    common_model_fini(&m);
    common_gguf_close(g);
}

Test(common_model, qwen3_key_length_and_qk_norm)
{
    /* head_dim 32 while n_embd / n_head = 16: key_length decides. */
    struct arch_spec     s = {.arch = "qwen3",
                              .n_embd = 64,
                              .n_layer = 1,
                              .n_head = 4,
                              .n_head_kv = 1,
                              .head_dim = 32,
                              .n_ff = 128,
                              .qk_norm = true,
                              .key_length = true,
                              .tied = true};
    struct common_model  m;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(m.hp.head_dim_k, 32);
    cr_assert_eq(m.hp.n_rot, 32);
    cr_assert_eq(m.hp.n_ff, 128);
    cr_assert_not(common_model_is_moe(&m));
    cr_assert_lt(m.global[COMMON_GROLE_OUTPUT], 0, "tied output head");
    cr_assert_geq(m.layers[0].tensor[COMMON_ROLE_ATTN_Q_NORM], 0);
    /* A tied head reads the whole embedding for the logits. */
    cr_assert_eq(m.bytes_active, m.bytes_resident);
    struct common_span sp;
    cr_assert_eq(common_model_expert_span(&m, 0, 0, COMMON_EXPERT_GATE, &sp), COMMON_EINVAL);
    common_model_fini(&m);
    common_gguf_close(g);
}

Test(common_model, qwen3moe_and_olmoe)
{
    struct arch_spec     s = {.arch = "qwen3moe",
                              .n_embd = 64,
                              .n_layer = 1,
                              .n_head = 4,
                              .n_head_kv = 4,
                              .head_dim = 16,
                              .n_expert = 4,
                              .n_used = 2,
                              .n_ff_exp = 32,
                              .qk_norm = true};
    struct common_model  m;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(m.hp.norm_topk_prob, 1);
    cr_assert_eq(m.hp.rope_neox, 1);
    common_model_fini(&m);
    common_gguf_close(g);

    /* olmoe normalises the whole q and k projections: per-head norms are a bad shape there. */
    s.arch = "olmoe";
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_ECORRUPT);
    cr_assert_not_null(strstr(e.text, "attn_q_norm.weight"), "%s", e.text);
    common_gguf_close(g);
    s.qk_norm_full = true;
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(m.arch, COMMON_ARCH_OLMOE);
    cr_assert_eq(m.hp.norm_topk_prob, 0);
    cr_assert_eq(m.hp.n_expert, 4);
    common_model_fini(&m);
    common_gguf_close(g);

    /* Norms an architecture does not have are refused, not ignored. */
    s.arch = "qwen2moe";
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_ENOTSUP);
    cr_assert_not_null(strstr(e.text, "no attn_q_norm"), "%s", e.text);
    common_gguf_close(g);
}

Test(common_model, qwen2moe_shared_expert_needs_its_gate)
{
    struct arch_spec     s = {.arch = "qwen2moe",
                              .n_embd = 64,
                              .n_layer = 1,
                              .n_head = 4,
                              .n_head_kv = 2,
                              .head_dim = 16,
                              .n_expert = 4,
                              .n_used = 2,
                              .n_ff_exp = 32,
                              .n_ff_shexp = 64,
                              .skip_tensor = "blk.0.ffn_gate_inp_shexp.weight"};
    struct common_model  m;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_ECORRUPT);
    cr_assert_not_null(strstr(e.text, "blk.0.ffn_gate_inp_shexp.weight"), "%s", e.text);
    common_gguf_close(g);
}

Test(common_model, unknown_architecture_is_named)
{
    struct arch_spec     s = {.arch = "mamba",
                              .n_embd = 64,
                              .n_layer = 1,
                              .n_head = 4,
                              .n_head_kv = 4,
                              .head_dim = 16,
                              .n_ff = 64};
    struct common_model  m;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_ENOTSUP);
    cr_assert_not_null(strstr(e.text, "'mamba'"), "%s", e.text);
    common_gguf_close(g);
}

Test(common_model, missing_tensor_is_named)
{
    struct arch_spec     s = {.arch = "llama",
                              .n_embd = 64,
                              .n_layer = 3,
                              .n_head = 4,
                              .n_head_kv = 4,
                              .head_dim = 16,
                              .n_ff = 64,
                              .skip_tensor = "blk.2.attn_v.weight"};
    struct common_model  m;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_ECORRUPT);
    cr_assert_not_null(strstr(e.text, "blk.2.attn_v.weight"), "%s", e.text);
    common_gguf_close(g);
}

Test(common_model, inconsistent_shape_is_named)
{
    /* head_count_kv 3 does not divide head_count 4. */
    struct arch_spec     s = {.arch = "llama",
                              .n_embd = 64,
                              .n_layer = 1,
                              .n_head = 4,
                              .n_head_kv = 3,
                              .head_dim = 16,
                              .n_ff = 64};
    struct common_model  m;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_ECORRUPT);
    cr_assert_not_null(strstr(e.text, "head_count_kv"), "%s", e.text);
    common_gguf_close(g);
}

/* A MoE file's feed_forward_length backs no tensor: a huge one must not size any buffer (it is
 * cleared), and the widths left are those of the tensors. */
Test(common_model, moe_feed_forward_length_without_a_dense_layer_is_dropped)
{
    struct arch_spec     s = {.arch = "qwen3moe",
                              .n_embd = 64,
                              .n_layer = 1,
                              .n_head = 4,
                              .n_head_kv = 4,
                              .head_dim = 16,
                              .n_ff = 1u << 24,
                              .n_expert = 4,
                              .n_used = 2,
                              .n_ff_exp = 32,
                              .qk_norm = true};
    struct common_model  m;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(describe(&s, &m, &g, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(m.hp.n_ff, 0, "no dense FFN tensor backs feed_forward_length");
    cr_assert_eq(m.hp.n_ff_exp, 32);
    struct common_ctx_layout lay;
    cr_assert_eq(common_ctx_layout_compute(&m.hp, NULL, &lay, NULL), COMMON_OK);
    cr_assert_lt(lay.buf[COMMON_CTX_GATE], 1u << 20, "FFN scratch sized by the experts' width");
    common_model_fini(&m);
    common_gguf_close(g);
}
