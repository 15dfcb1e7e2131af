/* cli/cmd_mkmodel.c - `sluice mkmodel`: write a GGUF model with random weights. */
#include "cli.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "executor.h"

#define MKMODEL_PROG "sluice mkmodel"

/* Applies a named geometry (--preset) to the synth options at `arg`; options given later
 * override it. */
static int mkmodel_parse_preset(void *arg, const char *name, struct common_errmsg *e)
{
    struct executor_synth_opts *o = arg;
    if (strcmp(name, "tiny") == 0) {
        o->n_embd = 256;
        o->n_layer = 2;
        o->n_head = 8;
        o->n_ff = 512;
    } else if (strcmp(name, "demo") == 0) {
        o->n_embd = 256;
        o->n_layer = 4;
        o->n_head = 8;
        o->n_head_kv = 2;
        o->n_ff = 256;
        o->n_expert = 8;
        o->n_expert_used = 2;
        o->n_vocab = 2048;
        o->type = COMMON_GGML_TYPE_Q8_0;
    } else if (strcmp(name, "moe-large") == 0) {
        o->n_embd = 2048;
        o->n_head = 16;
        o->n_head_kv = 4;
        o->n_ff = 1024;
        o->n_expert = 32;
        o->n_expert_used = 4;
        o->n_ctx = 4096;
        o->type = COMMON_GGML_TYPE_Q4_0;
        o->target_bytes = 7ull << 30;
    } else {
        return common_errmsg_set(e, COMMON_EINVAL, "expects tiny, demo or moe-large, got '%s'",
                                 name);
    }
    return COMMON_OK;
}

/* --i2s-layout: one of seed 003's three I2_S layouts. */
static int mkmodel_parse_i2s(void *arg, const char *name, struct common_errmsg *e)
{
    enum executor_synth_i2s *l = arg;
    if (strcmp(name, "qk256") == 0)
        *l = EXECUTOR_SYNTH_I2S_QK256;
    else if (strcmp(name, "bitnet32") == 0)
        *l = EXECUTOR_SYNTH_I2S_BITNET32;
    else if (strcmp(name, "split32") == 0)
        *l = EXECUTOR_SYNTH_I2S_SPLIT32;
    else
        return common_errmsg_set(e, COMMON_EINVAL, "expects qk256, bitnet32 or split32, got '%s'",
                                 name);
    return COMMON_OK;
}

/* --routing: natural or balanced. */
static int mkmodel_parse_routing(void *arg, const char *name, struct common_errmsg *e)
{
    enum executor_synth_routing *r = arg;
    if (strcmp(name, "natural") == 0)
        *r = EXECUTOR_SYNTH_ROUTING_NATURAL;
    else if (strcmp(name, "balanced") == 0)
        *r = EXECUTOR_SYNTH_ROUTING_BALANCED;
    else
        return common_errmsg_set(e, COMMON_EINVAL, "expects natural or balanced, got '%s'", name);
    return COMMON_OK;
}

static int mkmodel_parse_arch(void *arg, const char *name, struct common_errmsg *e)
{
    char list[256];
    if (!common_arch_from_name(name, strlen(name), arg))
        return common_errmsg_set(e, COMMON_EINVAL, "expects one of %s, got '%s'",
                                 common_arch_list(list, sizeof(list)), name);
    return COMMON_OK;
}

/* --type: a ggml type name (either case) into the uint32_t at `arg`. */
static int mkmodel_parse_type(void *arg, const char *name, struct common_errmsg *e)
{
    if (common_ggml_type_from_name(name, arg) != COMMON_OK)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "expects f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, "
                                 "q5_K, q6_K, mxfp4, tq1_0, tq2_0 or i2_s, got '%s'",
                                 name);
    return COMMON_OK;
}

/* The geometry rows: sizes of the model. */
static void mkmodel_geometry_rows(struct common_opt *rows, size_t cap,
                                  struct executor_synth_opts *o)
{
    const struct common_opt r[] = {
        {.name = "n-embd",
         .type = COMMON_OPT_U32,
         .target = &o->n_embd,
         .min = 2,
         .max = 1u << 16,
         .help = "model width",
         .def = "256"},
        {.name = "n-layer",
         .type = COMMON_OPT_U32,
         .target = &o->n_layer,
         .min = 1,
         .max = 4096,
         .help = "blocks",
         .def = "2"},
        {.name = "n-head",
         .type = COMMON_OPT_U32,
         .target = &o->n_head,
         .min = 1,
         .max = 1024,
         .help = "query heads",
         .def = "8"},
        {.name = "n-head-kv",
         .type = COMMON_OPT_U32,
         .target = &o->n_head_kv,
         .min = 1,
         .max = 1024,
         .help = "key/value heads",
         .def = "n-head"},
        {.name = "n-ff",
         .type = COMMON_OPT_U32,
         .target = &o->n_ff,
         .min = 1,
         .max = 1u << 20,
         .help = "FFN width (per expert for MoE)",
         .def = "4*n-embd"},
        {.name = "n-expert",
         .type = COMMON_OPT_U32,
         .target = &o->n_expert,
         .max = 1024,
         .help = "routed experts per layer; 0 = dense",
         .def = "0, 8 for MoE architectures"},
        {.name = "n-expert-used",
         .type = COMMON_OPT_U32,
         .target = &o->n_expert_used,
         .min = 1,
         .max = 1024,
         .help = "experts per token",
         .def = "2"},
        {.name = "n-ff-shexp",
         .type = COMMON_OPT_U32,
         .target = &o->n_ff_shexp,
         .min = 1,
         .max = 1u << 20,
         .help = "shared expert width (qwen2moe)",
         .def = "2*n-ff"},
        {.name = "n-vocab",
         .type = COMMON_OPT_U32,
         .target = &o->n_vocab,
         .min = 1,
         .max = 1u << 22,
         .help = "vocabulary: 259 byte tokens, then syllable pieces",
         .def = "259"},
        {.name = "n-ctx",
         .type = COMMON_OPT_U32,
         .target = &o->n_ctx,
         .min = 1,
         .max = 1u << 24,
         .help = "context length",
         .def = "2048"},
        {.name = "size",
         .type = COMMON_OPT_SIZE,
         .target = &o->target_bytes,
         .min = 1,
         .help = "pick the layer count to reach SIZE (e.g. 1.5G)"},
        {0},
    };
    assert(sizeof(r) <= cap * sizeof(*rows));
    (void)cap;
    memcpy(rows, r, sizeof(r));
}

int cli_cmd_mkmodel(int argc, char **argv)
{
    struct executor_synth_opts o = {.progress = true};
    struct common_opt          geometry[12];
    const struct common_opt    rows[] = {
           {.name = "output",
            .short_name = "o",
            .type = COMMON_OPT_STR,
            .target = &o.path,
            .metavar = "PATH",
            .help = "file to write",
            .required = true},
           {.name = "arch",
            .type = COMMON_OPT_CALLBACK,
            .target = &o.arch,
            .parse = mkmodel_parse_arch,
            .metavar = "NAME",
            .help = "architecture: llama, qwen2, qwen3, qwen2moe, qwen3moe, olmoe, deepseek2, "
                       "glm4moe, gpt-oss, bitnet or bitnet-b1.58; "
                       "tensor names, shapes and keys as llama.cpp's converter writes them "
                       "(bitnet-b1.58: as Microsoft's BitNet fork does)",
            .def = "llama"},
           {.name = "lite",
            .type = COMMON_OPT_SWITCH,
            .target = &o.lite,
            .help = "deepseek2: the V2-Lite shape (one q projection, softmax routing without "
                       "groups or bias) instead of V3's (q LoRA, sigmoid routing with a selection "
                       "bias and expert groups)"},
           {.name = "routing",
            .type = COMMON_OPT_CALLBACK,
            .target = &o.routing,
            .parse = mkmodel_parse_routing,
            .metavar = "MODE",
            .help = "MoE routing: natural (the random network's own, skewed: a few experts take "
                       "most tokens) or balanced (token embeddings dominate the residual stream, "
                       "so each layer routes by the current token: near uniform, little reuse, "
                       "like a trained MoE; for streaming benchmarks)",
            .def = "natural"},
           {.name = "routing-skew",
            .type = COMMON_OPT_F32,
            .target = &o.routing_skew,
            .max = 1000,
            .metavar = "X",
            .help = "with --routing balanced: a component common to all token embeddings gives "
                       "each expert a fixed offset, X times the token-dependent part of its "
                       "gate logit: 0 = uniform, 1 = a skewed load, 4 = a few experts take most "
                       "tokens (the trace summary's load entropy says how much)",
            .def = "0"},
           {.name = "routing-reuse",
            .type = COMMON_OPT_F32,
            .target = &o.routing_reuse,
            .max = 1000,
            .metavar = "X",
            .help = "with --routing balanced and --arch qwen2moe or gpt-oss: every head attends "
                       "to the last few tokens and carries them into the routing, X times as "
                       "strongly as the embeddings, so experts repeat over neighbouring tokens "
                       "(temporal reuse) while the load stays spread: 0 = memoryless (the trace "
                       "summary's reuse histogram says how much)",
            .def = "0"},
           {.name = "preset",
            .type = COMMON_OPT_CALLBACK,
            .target = &o,
            .parse = mkmodel_parse_preset,
            .metavar = "NAME",
            .help = "tiny (dense, 2 layers), demo (MoE 8x top-2, 4 layers, 2048 tokens), "
                       "moe-large (Mixtral-like: 32 experts top-4, Q4_0, ~7 GiB); options given "
                       "after it override it"},
           {.name = "type",
            .type = COMMON_OPT_CALLBACK,
            .target = &o.type,
            .parse = mkmodel_parse_type,
            .metavar = "TYPE",
            .help = "weight type: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K q4_K q5_K "
                       "q6_K mxfp4 tq1_0 tq2_0 i2_s (norms and router stay f32; with i2_s the "
                       "embedding is f16 and the weights random ternary values times a power of "
                       "two)",
            .def = "f32"},
           {.name = "i2s-layout",
            .type = COMMON_OPT_CALLBACK,
            .target = &o.i2s_layout,
            .parse = mkmodel_parse_i2s,
            .metavar = "LAYOUT",
            .help = "i2_s: qk256 (Microsoft's: 2-bit codes in groups of 128, one f32 scale after "
                       "them), bitnet32 (blocks of 32 codes with an inline f16 scale) or split32 "
                       "(blocks of 32 codes, the scales in a '<name>.scales' tensor)",
            .def = "qk256"},
           {.name = "quick-quant",
            .type = COMMON_OPT_SWITCH,
            .target = &o.quick_quant,
            .help = "q4_K, q5_K: each 32's scale and min from its minimum and maximum, without "
                       "the error search (about 10x faster; for large benchmark models)"},
           {.name = "vocab-from",
            .type = COMMON_OPT_STR,
            .target = &o.vocab_from,
            .metavar = "GGUF",
            .help = "copy the tokenizer of another GGUF"},
           {.name = "threads",
            .short_name = "t",
            .type = COMMON_OPT_U32,
            .target = &o.n_threads,
            .min = 1,
            .max = 256,
            .help = "threads generating and quantizing the weights; the file does not depend "
                       "on it",
            .def = "physical cores"},
           {.name = "seed",
            .type = COMMON_OPT_U64,
            .target = &o.seed,
            .help = "weight seed",
            .def = "1"},
           {.name = "name",
            .type = COMMON_OPT_STR,
            .target = &o.name,
            .metavar = "NAME",
            .help = "general.name",
            .def = "sluice-synth"},
           {.name = "quiet",
            .short_name = "q",
            .type = COMMON_OPT_SWITCH_OFF,
            .target = &o.progress,
            .help = "no progress output"},
           {0},
    };
    mkmodel_geometry_rows(geometry, sizeof(geometry) / sizeof(geometry[0]), &o);
    const struct common_opt_group groups[] = {{.title = "Geometry", .opts = geometry}, {0}};
    const struct common_opts_spec spec = {
        .prog = MKMODEL_PROG,
        .usage = MKMODEL_PROG " -o OUT.gguf [--preset NAME] [options]",
        .description =
            "Writes a GGUF of any supported architecture (llama: dense, or MoE in the Mixtral "
            "layout) with random weights, streaming with bounded memory whatever the size. Output "
            "is gibberish by design: the file exists to exercise loading, kernels and expert "
            "streaming, and to compare with llama.cpp.",
        .opts = rows,
        .groups = groups,
    };
    int rc = common_opts_parse(&spec, argc, argv);
    if (rc != 0)
        return common_opts_exit_status(rc);
    struct common_errmsg e = {{0}};
    if ((rc = executor_synth_write(&o, &e)) != 0) {
        cli_error(MKMODEL_PROG, "%s", e.text[0] ? e.text : common_strerror(rc));
        return 1;
    }
    if (o.progress)
        fprintf(stderr, "mkmodel: wrote %s\n", o.path);
    return 0;
}
