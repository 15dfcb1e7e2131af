/* cli/cmd_inspect.c - `sluice inspect MODEL [--json]`: what a GGUF holds and what it costs.
 */
#include "cli.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define INSPECT_PROG "sluice inspect"

/* What the command line asked for. */
struct inspect_args {
    const char             *path;     /* MODEL or -m: borrowed from argv */
    bool                    json;     /* --json */
    bool                    metadata; /* --metadata */
    struct common_gguf_opts gguf;     /* --no-splits */
};

/* Parses the options; returns 0, or the result to pass to common_opts_exit_status(). */
static int inspect_parse(int argc, char **argv, struct inspect_args *a)
{
    const char             *words_v[1];
    struct common_opt_strs  words = {.v = words_v, .cap = 1};
    const struct common_opt rows[] = {
        {.name = "model",
         .short_name = "m",
         .type = COMMON_OPT_STR,
         .target = &a->path,
         .metavar = "PATH",
         .help = "the model (same as the positional MODEL.gguf)"},
        {.name = "json",
         .type = COMMON_OPT_SWITCH,
         .target = &a->json,
         .help = "machine-readable output (schema: docs/inspect.md)"},
        {.name = "metadata",
         .type = COMMON_OPT_SWITCH,
         .target = &a->metadata,
         .help = "also list every metadata key (arrays are summarised)"},
        {.name = "no-splits",
         .type = COMMON_OPT_SWITCH,
         .target = &a->gguf.no_splits,
         .help = "open only the named file of a split model"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = INSPECT_PROG,
        .usage = INSPECT_PROG " MODEL.gguf [--json] [--metadata] [--no-splits]",
        .description =
            "Prints the architecture, hyper-parameters, tokenizer, a tensor table (name, type, "
            "shape, bytes, offset) and totals: resident bytes, expert bytes, the per-expert bundle "
            "(gate+up+down of one expert) and the bytes a token touches.",
        .opts = rows,
        .positional = &words,
    };
    int rc = common_opts_parse(&spec, argc, argv);
    if (rc != 0)
        return rc;
    if (words.n && a->path)
        return common_opts_error(&spec, "give the model once: MODEL.gguf or -m MODEL.gguf");
    if (words.n)
        a->path = words_v[0];
    if (!a->path)
        return common_opts_error(&spec, "no model (MODEL.gguf)");
    return 0;
}

/* Prints a scalar or summarised array value, human form. */
static void inspect_value_text(const struct common_gguf_value *v)
{
    switch (v->type) {
    case COMMON_GGUF_STRING: {
        uint64_t n = v->v.str.len > 80 ? 80 : v->v.str.len;
        printf("\"");
        for (uint64_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)v->v.str.ptr[i];
            if (c == '\n')
                printf("\\n");
            else if (c < 0x20)
                printf("\\x%02x", c);
            else
                putchar(c);
        }
        printf("\"%s", v->v.str.len > 80 ? "..." : "");
        break;
    }
    case COMMON_GGUF_ARRAY:
        printf("[%s x %" PRIu64 "]", common_gguf_vtype_name(v->v.arr.type), v->v.arr.n);
        break;
    case COMMON_GGUF_FLOAT32:
    case COMMON_GGUF_FLOAT64:
        printf("%g", v->v.f64);
        break;
    case COMMON_GGUF_BOOL:
        printf("%s", v->v.u64 ? "true" : "false");
        break;
    case COMMON_GGUF_INT8:
    case COMMON_GGUF_INT16:
    case COMMON_GGUF_INT32:
    case COMMON_GGUF_INT64:
        printf("%" PRId64, v->v.i64);
        break;
    default:
        printf("%" PRIu64, v->v.u64);
        break;
    }
}

static json_t *inspect_value_json(const struct common_gguf_value *v)
{
    switch (v->type) {
    case COMMON_GGUF_STRING:
        return cli_json_str(v->v.str.ptr, (size_t)v->v.str.len);
    case COMMON_GGUF_ARRAY:
        return json_pack("{s:s,s:I}", "array", common_gguf_vtype_name(v->v.arr.type), "count",
                         (json_int_t)v->v.arr.n);
    case COMMON_GGUF_FLOAT32:
    case COMMON_GGUF_FLOAT64:
        return isfinite(v->v.f64) ? json_real(v->v.f64) : json_null();
    case COMMON_GGUF_BOOL:
        return json_boolean(v->v.u64 != 0);
    case COMMON_GGUF_INT8:
    case COMMON_GGUF_INT16:
    case COMMON_GGUF_INT32:
    case COMMON_GGUF_INT64:
        return json_integer((json_int_t)v->v.i64);
    default: /* unsigned: past INT64_MAX as a real (JSON numbers have no size) */
        return v->v.u64 > (uint64_t)INT64_MAX ? json_real((double)v->v.u64)
                                              : json_integer((json_int_t)v->v.u64);
    }
}

static void inspect_shape(const struct common_gguf_tensor *t, char *buf, size_t len)
{
    size_t used = 0;
    used += (size_t)snprintf(buf + used, len - used, "[");
    for (uint32_t d = 0; d < t->n_dims && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
}

/* Reads tokenizer model and vocabulary size. */
static void inspect_tokenizer(const struct common_gguf *g, struct common_gguf_str *model,
                              uint64_t *n_vocab)
{
    const struct common_gguf_value *tokens;
    model->ptr = "none";
    model->len = 4;
    common_gguf_get_str(g, "tokenizer.ggml.model", model);
    *n_vocab = 0;
    if (common_gguf_get_arr(g, "tokenizer.ggml.tokens", COMMON_GGUF_STRING, &tokens) == COMMON_OK)
        *n_vocab = tokens->v.arr.n;
}

static void inspect_text(const char *path, const struct common_gguf *g,
                         const struct common_model *m, bool model_ok, bool metadata)
{
    char     b1[32], b2[32], b3[32], b4[32];
    uint64_t file_bytes = 0;
    for (uint32_t s = 0; s < common_gguf_n_splits(g); s++)
        file_bytes += common_gguf_split_size(g, s);
    printf("file:           %s\n", path);
    if (common_gguf_is_qsf(g))
        printf("format:         QSF v%u (streaming container: metadata as GGUF v%u, one bundle per "
               "expert, checksums), %s, alignment %" PRIu64 "\n",
               COMMON_QSF_VERSION, common_gguf_version(g),
               common_format_size(file_bytes, b1, sizeof(b1)), common_gguf_alignment(g));
    else
        printf("format:         GGUF v%u, %u file(s), %s, alignment %" PRIu64 "\n",
               common_gguf_version(g), common_gguf_n_splits(g),
               common_format_size(file_bytes, b1, sizeof(b1)), common_gguf_alignment(g));
    struct common_gguf_str s;
    if (common_gguf_get_str(g, "general.name", &s) == COMMON_OK)
        printf("name:           %.*s\n", (int)(s.len > 200 ? 200 : s.len), s.ptr);
    if (common_gguf_get_str(g, "general.architecture", &s) == COMMON_OK)
        printf("architecture:   %.*s\n", (int)(s.len > 64 ? 64 : s.len), s.ptr);
    if (model_ok) {
        const struct common_hparams *hp = &m->hp;
        if (hp->n_expert && hp->n_ff_shexp)
            printf("kind:           MoE, %u experts of width %u, %u used per token, a shared "
                   "expert of width %u%s\n",
                   hp->n_expert, hp->n_ff_exp, hp->n_expert_used, hp->n_ff_shexp,
                   m->layers[0].tensor[COMMON_ROLE_FFN_GATE_INP_SHEXP] >= 0 ? " (gated)" : "");
        else if (hp->n_expert)
            printf("kind:           MoE, %u experts of width %u, %u used per token%s\n",
                   hp->n_expert, hp->n_ff_exp, hp->n_expert_used,
                   hp->norm_topk_prob ? " (weights renormalised)" : "");
        else
            printf("kind:           dense\n");
        printf("hyper-parameters:\n");
        printf("  n_vocab %u  n_ctx_train %u  n_embd %u  n_layer %u\n", hp->n_vocab,
               hp->n_ctx_train, hp->n_embd, hp->n_layer);
        printf("  n_head %u  n_head_kv %u  head_dim %u/%u  n_rot %u  rope %s  freq_base %g\n",
               hp->n_head, hp->n_head_kv, hp->head_dim_k, hp->head_dim_v, hp->n_rot,
               hp->rope_neox ? "neox" : "normal", (double)hp->rope_freq_base);
        printf("  n_ff %u  n_ff_exp %u  n_ff_shexp %u  rms_eps %g  output %s\n", hp->n_ff,
               hp->n_ff_exp, hp->n_ff_shexp, (double)hp->rms_eps,
               m->global[COMMON_GROLE_OUTPUT] >= 0 ? "separate" : "tied to token_embd");
        if (hp->n_lora_kv)
            printf("  latent attention: q_lora_rank %u  kv_lora_rank %u  head_dim_mla %u/%u  "
                   "(the cache holds %u values per position and layer)\n",
                   hp->n_lora_q, hp->n_lora_kv, hp->head_dim_k_mla, hp->head_dim_v_mla,
                   hp->head_dim_k);
        if (hp->n_layer_dense_lead || hp->expert_gating != COMMON_GATING_SOFTMAX ||
            hp->n_expert_groups > 1 || hp->expert_weights_scale != 0.0f)
            printf("  routing: %s  groups %u (keep %u)  scale %g  leading dense layers %u\n",
                   hp->expert_gating == COMMON_GATING_SIGMOID ? "sigmoid"
                   : hp->expert_gating == COMMON_GATING_SOFTMAX_WEIGHT
                       ? "softmax of the top-k logits"
                       : "softmax",
                   hp->n_expert_groups, hp->n_group_used, (double)hp->expert_weights_scale,
                   hp->n_layer_dense_lead);
        if (hp->n_swa)
            printf("  sliding window: %u positions on layers il %% %u < %u; attention sinks; "
                   "experts with biases and the clamped SwiGLU\n",
                   hp->n_swa, hp->swa_period, hp->swa_period ? hp->swa_period - 1 : 0);
        if (hp->yarn_ext_factor != 0.0f)
            printf("  rope scaling: yarn x%g over %u tokens\n",
                   (double)(1.0f / hp->rope_freq_scale), hp->n_ctx_orig_yarn);
    }
    uint64_t n_vocab;
    inspect_tokenizer(g, &s, &n_vocab);
    printf("tokenizer:      %.*s, %" PRIu64 " tokens\n", (int)(s.len > 64 ? 64 : s.len), s.ptr,
           n_vocab);
    printf("metadata:       %" PRIu64 " keys\n", common_gguf_n_kv(g));
    if (metadata) {
        for (uint64_t i = 0; i < common_gguf_n_kv(g); i++) {
            const struct common_gguf_kv *kv = common_gguf_kv_at(g, i);
            printf("  %-48s ", kv->key);
            inspect_value_text(&kv->value);
            printf("\n");
        }
    }
    printf("tensors:        %" PRIu64 "\n", common_gguf_n_tensors(g));
    if (common_gguf_n_tensors(g))
        printf("  %-36s %-7s %-24s %12s %14s\n", "name", "type", "shape", "bytes", "offset");
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        char                             shape[96];
        inspect_shape(t, shape, sizeof(shape));
        printf("  %-36s %-7s %-24s %12" PRIu64 " %14" PRIu64 "%s\n", t->name,
               common_ggml_type_get(t->type)->name, shape, t->size, t->offset,
               common_gguf_n_splits(g) > 1 ? (t->split ? " (split)" : "") : "");
    }
    if (model_ok) {
        printf("totals:\n");
        printf("  tensor data      %14" PRIu64 "  %s\n", m->bytes_total,
               common_format_size(m->bytes_total, b1, sizeof(b1)));
        printf("  resident         %14" PRIu64 "  %s\n", m->bytes_resident,
               common_format_size(m->bytes_resident, b2, sizeof(b2)));
        printf("  experts          %14" PRIu64 "  %s\n", m->bytes_experts,
               common_format_size(m->bytes_experts, b3, sizeof(b3)));
        printf("  expert bundle    %14" PRIu64 "  %s (gate+up+down of one expert)\n",
               m->bytes_expert_bundle, common_format_size(m->bytes_expert_bundle, b4, sizeof(b4)));
        if (m->bytes_unused)
            printf("  not run          %14" PRIu64 "  %s (prediction layers after the last)\n",
                   m->bytes_unused, common_format_size(m->bytes_unused, b1, sizeof(b1)));
        printf("  active per token %14" PRIu64 "  %s\n", m->bytes_active,
               common_format_size(m->bytes_active, b1, sizeof(b1)));
    }
}

static void inspect_json(const char *path, const struct common_gguf *g,
                         const struct common_model *m, bool model_ok, const char *model_error)
{
    uint64_t file_bytes = 0;
    for (uint32_t s = 0; s < common_gguf_n_splits(g); s++)
        file_bytes += common_gguf_split_size(g, s);
    json_t *o = json_object();
    json_object_set_new(o, "file", cli_json_str(path, strlen(path)));
    json_object_set_new(o, "container", json_string(common_gguf_is_qsf(g) ? "qsf" : "gguf"));
    json_object_set_new(o, "gguf_version", json_integer(common_gguf_version(g)));
    json_object_set_new(o, "alignment", json_integer((json_int_t)common_gguf_alignment(g)));
    json_object_set_new(o, "splits", json_integer(common_gguf_n_splits(g)));
    json_object_set_new(o, "file_bytes", json_integer((json_int_t)file_bytes));
    struct common_gguf_str s;
    json_object_set_new(o, "architecture",
                        common_gguf_get_str(g, "general.architecture", &s) == COMMON_OK
                            ? cli_json_str(s.ptr, (size_t)s.len)
                            : json_null());
    uint64_t n_vocab;
    inspect_tokenizer(g, &s, &n_vocab);
    json_object_set_new(o, "tokenizer",
                        json_pack("{s:o,s:I}", "model", cli_json_str(s.ptr, (size_t)s.len),
                                  "vocab_size", (json_int_t)n_vocab));
    if (model_ok) {
        const struct common_hparams *hp = &m->hp;
        json_t                      *mo = json_pack(
                                 "{s:b,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:s,s:f,s:f,s:I,s:I,s:I,s:I,s:I,s:b}", "moe",
                                 hp->n_expert != 0, "n_vocab", (json_int_t)hp->n_vocab, "n_ctx_train",
                                 (json_int_t)hp->n_ctx_train, "n_embd", (json_int_t)hp->n_embd, "n_layer",
                                 (json_int_t)hp->n_layer, "n_head", (json_int_t)hp->n_head, "n_head_kv",
                                 (json_int_t)hp->n_head_kv, "head_dim_k", (json_int_t)hp->head_dim_k, "head_dim_v",
                                 (json_int_t)hp->head_dim_v, "n_rot", (json_int_t)hp->n_rot, "rope",
            hp->rope_neox ? "neox" : "normal", "rope_freq_base", (double)hp->rope_freq_base,
                                 "rms_eps", (double)hp->rms_eps, "n_ff", (json_int_t)hp->n_ff, "n_expert",
                                 (json_int_t)hp->n_expert, "n_expert_used", (json_int_t)hp->n_expert_used, "n_ff_exp",
                                 (json_int_t)hp->n_ff_exp, "n_ff_shexp", (json_int_t)hp->n_ff_shexp, "output_tied",
                                 m->global[COMMON_GROLE_OUTPUT] < 0);
        /* what the architecture table adds: latent attention, routing, window, rope scaling */
        const bool yarn = hp->yarn_ext_factor != 0.0f;
        json_t    *mo2 = json_pack(
               "{s:I,s:I,s:I,s:I,s:s,s:I,s:I,s:f,s:I,s:I,s:I,s:s,s:f,s:I}", "q_lora_rank",
               (json_int_t)hp->n_lora_q, "kv_lora_rank", (json_int_t)hp->n_lora_kv, "head_dim_k_mla",
               (json_int_t)(hp->n_lora_kv ? hp->head_dim_k_mla : 0), "head_dim_v_mla",
               (json_int_t)(hp->n_lora_kv ? hp->head_dim_v_mla : 0), "gating",
            hp->expert_gating == COMMON_GATING_SIGMOID          ? "sigmoid"
               : hp->expert_gating == COMMON_GATING_SOFTMAX_WEIGHT ? "softmax_weight"
                                                                   : "softmax",
               "expert_groups", (json_int_t)hp->n_expert_groups, "expert_groups_used",
               (json_int_t)hp->n_group_used, "expert_weights_scale", (double)hp->expert_weights_scale,
               "n_layer_dense_lead", (json_int_t)hp->n_layer_dense_lead, "n_swa",
               (json_int_t)hp->n_swa, "swa_period", (json_int_t)hp->swa_period, "rope_scaling",
            yarn ? "yarn" : "none", "rope_scaling_factor",
            yarn ? (double)(1.0f / hp->rope_freq_scale) : 1.0, "n_ctx_orig_yarn",
               (json_int_t)(yarn ? hp->n_ctx_orig_yarn : 0));
        json_object_update(mo, mo2);
        json_decref(mo2);
        json_object_set_new(o, "model", mo);
        json_object_set_new(
            o, "totals",
            json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "tensor_bytes", (json_int_t)m->bytes_total,
                      "resident_bytes", (json_int_t)m->bytes_resident, "expert_bytes",
                      (json_int_t)m->bytes_experts, "expert_bundle_bytes",
                      (json_int_t)m->bytes_expert_bundle, "active_bytes_per_token",
                      (json_int_t)m->bytes_active, "unused_bytes", (json_int_t)m->bytes_unused));
    } else {
        json_object_set_new(o, "model", json_null());
        json_object_set_new(o, "model_error", cli_json_str(model_error, strlen(model_error)));
    }
    json_t *meta = json_object();
    for (uint64_t i = 0; i < common_gguf_n_kv(g); i++) {
        const struct common_gguf_kv *kv = common_gguf_kv_at(g, i);
        char                        *key = common_utf8_repair(kv->key, strlen(kv->key), NULL);
        if (key)
            json_object_set_new(meta, key, inspect_value_json(&kv->value));
        free(key);
    }
    json_object_set_new(o, "metadata", meta);
    json_t *tensors = json_array();
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        json_t                          *shape = json_array();
        for (uint32_t d = 0; d < t->n_dims; d++)
            json_array_append_new(shape, json_integer((json_int_t)t->ne[d]));
        json_array_append_new(tensors,
                              json_pack("{s:o,s:s,s:o,s:I,s:I,s:I}", "name",
                                        cli_json_str(t->name, strlen(t->name)), "type",
                                        common_ggml_type_get(t->type)->name, "shape", shape,
                                        "bytes", (json_int_t)t->size, "offset",
                                        (json_int_t)t->offset, "split", (json_int_t)t->split));
    }
    json_object_set_new(o, "tensors", tensors);
    if (json_dumpf(o, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) == 0)
        putchar('\n');
    json_decref(o);
}

int cli_cmd_inspect(int argc, char **argv)
{
    struct inspect_args a = {0};
    int                 rc = inspect_parse(argc, argv, &a);
    if (rc != 0)
        return common_opts_exit_status(rc);
    struct common_errmsg e = {{0}};
    struct common_gguf  *g = NULL;
    if ((rc = common_gguf_open(a.path, &a.gguf, &g, &e)) != COMMON_OK) {
        cli_error_path(INSPECT_PROG, a.path, rc, &e);
        return 1;
    }
    struct common_model  m;
    struct common_errmsg me = {{0}};
    bool                 vocab_only = common_gguf_n_tensors(g) == 0;
    int                  mrc = vocab_only ? COMMON_ENOENT : common_model_init(&m, g, &me);
    if (vocab_only)
        snprintf(me.text, sizeof(me.text), "no tensors (vocabulary-only file)");
    if (a.json)
        inspect_json(a.path, g, &m, mrc == COMMON_OK, me.text);
    else
        inspect_text(a.path, g, &m, mrc == COMMON_OK, a.metadata);
    int status = 0;
    if (mrc == COMMON_OK) {
        common_model_fini(&m);
    } else if (!vocab_only) {
        cli_error_path(INSPECT_PROG, a.path, mrc, &me);
        status = 1;
    } else if (!a.json) {
        printf("note:           %s\n", me.text);
    }
    common_gguf_close(g);
    return status;
}
