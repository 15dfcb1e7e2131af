/* cli/cmd_mkmodel.c - `sluice mkmodel`: write a GGUF model with random weights. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#include "common.h"
#include "executor.h"

static void mkmodel_usage(FILE *f)
{
    fprintf(f,
            "usage: sluice mkmodel -o OUT.gguf [--preset NAME] [options]\n\n"
            "Writes a llama-architecture GGUF (dense, or MoE in the Mixtral layout) with random\n"
            "weights, streaming with bounded memory whatever the size. Output is gibberish by\n"
            "design: the file exists to exercise loading, kernels and expert streaming.\n\n"
            "  -o, --output PATH    file to write (required)\n"
            "  --preset NAME        tiny (dense, 2 layers), demo (MoE 8x top-2, 4 layers,\n"
            "                       2048 tokens),\n"
            "                       moe-large (Mixtral-like: 32 experts top-4, Q4_0, ~7 GiB)\n"
            "  --type TYPE          weight type: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K\n"
            "                       q5_K q6_K (norms and router stay f32)   [f32]\n"
            "  --n-embd N           model width                               [256]\n"
            "  --n-layer N          blocks                                    [2]\n"
            "  --n-head N           query heads                               [8]\n"
            "  --n-head-kv N        key/value heads                           [n-head]\n"
            "  --n-ff N             FFN width (per expert for MoE)            [4*n-embd]\n"
            "  --n-expert N         routed experts per layer (0 = dense)      [0]\n"
            "  --n-expert-used N    experts per token                         [2]\n"
            "  --n-vocab N          vocabulary: 259 byte tokens, then syllable pieces [259]\n"
            "  --n-ctx N            context length                            [2048]\n"
            "  --size SIZE          pick the layer count to reach SIZE (e.g. 1.5G)\n"
            "  --vocab-from GGUF    copy the tokenizer of another GGUF\n"
            "  --seed N             weight seed                               [1]\n"
            "  --name NAME          general.name                              [sluice-synth]\n"
            "  -q, --quiet          no progress output\n");
}

/* Applies a named geometry; explicit options given later override it. */
static bool mkmodel_preset(const char *name, struct executor_synth_opts *o)
{
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
        fprintf(stderr, "error: unknown preset '%s' (tiny, demo, moe-large)\n", name);
        return false;
    }
    return true;
}

int cli_cmd_mkmodel(int argc, char **argv)
{
    struct executor_synth_opts o = {.progress = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            mkmodel_usage(stdout);
            return 0;
        }
        if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
            o.progress = false;
            continue;
        }
        if (a[0] != '-') {
            fprintf(stderr, "error: unexpected argument '%s'\n", a);
            return 2;
        }
        if (!(v = cli_next_arg(argc, argv, &i)))
            return 2;
        bool ok = true;
        if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0)
            o.path = v;
        else if (strcmp(a, "--preset") == 0)
            ok = mkmodel_preset(v, &o);
        else if (strcmp(a, "--type") == 0) {
            ok = common_ggml_type_from_name(v, &o.type) == COMMON_OK;
            if (!ok)
                fprintf(stderr, "error: unknown type '%s'\n", v);
        } else if (strcmp(a, "--n-embd") == 0)
            ok = cli_parse_u32(a, v, 2, 1u << 16, &o.n_embd);
        else if (strcmp(a, "--n-layer") == 0)
            ok = cli_parse_u32(a, v, 1, 4096, &o.n_layer);
        else if (strcmp(a, "--n-head") == 0)
            ok = cli_parse_u32(a, v, 1, 1024, &o.n_head);
        else if (strcmp(a, "--n-head-kv") == 0)
            ok = cli_parse_u32(a, v, 1, 1024, &o.n_head_kv);
        else if (strcmp(a, "--n-ff") == 0)
            ok = cli_parse_u32(a, v, 1, 1u << 20, &o.n_ff);
        else if (strcmp(a, "--n-expert") == 0)
            ok = cli_parse_u32(a, v, 0, 1024, &o.n_expert);
        else if (strcmp(a, "--n-expert-used") == 0)
            ok = cli_parse_u32(a, v, 1, 1024, &o.n_expert_used);
        else if (strcmp(a, "--n-vocab") == 0)
            ok = cli_parse_u32(a, v, 1, 1u << 22, &o.n_vocab);
        else if (strcmp(a, "--n-ctx") == 0)
            ok = cli_parse_u32(a, v, 1, 1u << 24, &o.n_ctx);
        else if (strcmp(a, "--size") == 0) {
            ok = common_parse_size(v, &o.target_bytes) == COMMON_OK && o.target_bytes > 0;
            if (!ok)
                fprintf(stderr, "error: --size expects a size like 1.5G, got '%s'\n", v);
        } else if (strcmp(a, "--vocab-from") == 0)
            o.vocab_from = v;
        else if (strcmp(a, "--seed") == 0)
            ok = cli_parse_u64(a, v, &o.seed);
        else if (strcmp(a, "--name") == 0)
            o.name = v;
        else {
            fprintf(stderr, "error: unknown option '%s'\n", a);
            mkmodel_usage(stderr);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (!o.path) {
        fprintf(stderr, "error: no output file (-o OUT.gguf)\n");
        mkmodel_usage(stderr);
        return 2;
    }
    struct common_errmsg e = {{0}};
    int                  rc = executor_synth_write(&o, &e);
    if (rc) {
        fprintf(stderr, "error: mkmodel: %s\n", e.text[0] ? e.text : common_strerror(rc));
        return 1;
    }
    if (o.progress)
        fprintf(stderr, "mkmodel: wrote %s\n", o.path);
    return 0;
}
