/* router/cli/cmd_run.c - `sluice run`: generate a continuation of a prompt in one process. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "executor.h"
#include "router.h"

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: sluice run -m MODEL.gguf (-p PROMPT | --prompt-ids 1,2,3) [options]\n\n"
            "Generates a continuation of the prompt on the CPU and prints it as it is made.\n\n"
            "  -m, --model PATH     GGUF model (first split of a split model)\n"
            "  -p, --prompt TEXT    prompt text (tokenized with the model's tokenizer, BOS added)\n"
            "  --prompt-ids LIST    prompt as comma-separated token ids (no tokenizer needed)\n"
            "  -n, --n-predict N    tokens to generate                       [128]\n"
            "  -t, --threads N      threads                                  [physical cores]\n"
            "  -c, --ctx-size N     context (KV cache) size; 0 = model's, at most 4096 [0]\n"
            "  -b, --batch-size N   prompt tokens per forward batch          [512]\n"
            "  --cache-type T       KV cache type: f16 or q8_0               [f16]\n"
            "  --temp X             temperature; 0 = greedy (argmax)         [0.8]\n"
            "  --top-k K            keep the K most likely tokens; 0 = off   [40]\n"
            "  --top-p P            nucleus sampling; 1 = off                [0.95]\n"
            "  --min-p P            drop tokens below P * max prob; 0 = off  [0.05]\n"
            "  --seed S             sampling seed; 0 = from the clock        [0]\n"
            "  --ignore-eos         keep generating after an end-of-sequence token\n"
            "  --ids                print token ids instead of text (format below)\n\n"
            "Without --ids, stdout gets the text of the generated tokens only (not the prompt),\n"
            "flushed after each token, then a newline. With --ids, stdout has one line\n"
            "'prompt_ids: ID ID ...', then one line 'gen: ID' per generated token, printed as\n"
            "soon as it is chosen. Timings go to stderr. Generation stops after -n tokens, at an\n"
            "end-of-generation token (unless --ignore-eos) or when the context is full. A prompt\n"
            "longer than the context is refused, never truncated.\n");
}

/* Parses "1,2,3" into a malloc'd array. */
static int32_t *run_parse_ids(const char *s, uint32_t *n)
{
    size_t   cap = 16, len = 0;
    int32_t *ids = malloc(cap * sizeof(*ids));
    while (ids && *s) {
        char *end = NULL;
        long  v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            free(ids);
            return NULL;
        }
        if (len == cap) {
            int32_t *p = realloc(ids, (cap *= 2) * sizeof(*ids));
            if (!p) {
                free(ids);
                return NULL;
            }
            ids = p;
        }
        ids[len++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    if (ids && len == 0) {
        free(ids);
        return NULL;
    }
    *n = (uint32_t)len;
    return ids;
}

static int32_t run_argmax(const float *logits, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = (int32_t)i;
    return best;
}

int cli_cmd_run(int argc, char **argv)
{
    const char              *model = NULL, *prompt = NULL, *prompt_ids = NULL;
    uint32_t                 n_predict = 128, n_threads = 0, n_ctx = 0, n_batch = 0;
    float                    temp = 0.8f, top_p = 0.95f, min_p = 0.05f;
    uint32_t                 top_k = 40;
    uint64_t                 seed = 0;
    bool                     ids = false, ignore_eos = false;
    enum executor_cache_type cache = EXECUTOR_CACHE_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            run_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--ids") == 0) {
            ids = true;
            continue;
        }
        if (strcmp(a, "--ignore-eos") == 0) {
            ignore_eos = true;
            continue;
        }
        if (a[0] != '-') {
            fprintf(stderr, "error: unexpected argument '%s'\n", a);
            return 2;
        }
        if (!(v = cli_next_arg(argc, argv, &i)))
            return 2;
        bool ok = true;
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0)
            model = v;
        else if (strcmp(a, "-p") == 0 || strcmp(a, "--prompt") == 0)
            prompt = v;
        else if (strcmp(a, "--prompt-ids") == 0)
            prompt_ids = v;
        else if (strcmp(a, "-n") == 0 || strcmp(a, "--n-predict") == 0)
            ok = cli_parse_u32(a, v, 0, 1u << 24, &n_predict);
        else if (strcmp(a, "-t") == 0 || strcmp(a, "--threads") == 0)
            ok = cli_parse_u32(a, v, 1, 256, &n_threads);
        else if (strcmp(a, "-c") == 0 || strcmp(a, "--ctx-size") == 0)
            ok = cli_parse_u32(a, v, 0, 1u << 24, &n_ctx);
        else if (strcmp(a, "-b") == 0 || strcmp(a, "--batch-size") == 0)
            ok = cli_parse_u32(a, v, 1, 1u << 16, &n_batch);
        else if (strcmp(a, "--cache-type") == 0 || strcmp(a, "-ctk") == 0) {
            ok = executor_cache_type_parse(v, &cache) == 0;
            if (!ok)
                fprintf(stderr, "error: --cache-type expects f16 or q8_0, got '%s'\n", v);
        } else if (strcmp(a, "--temp") == 0)
            ok = cli_parse_f32(a, v, &temp);
        else if (strcmp(a, "--top-k") == 0)
            ok = cli_parse_u32(a, v, 0, 1u << 24, &top_k);
        else if (strcmp(a, "--top-p") == 0)
            ok = cli_parse_f32(a, v, &top_p);
        else if (strcmp(a, "--min-p") == 0)
            ok = cli_parse_f32(a, v, &min_p);
        else if (strcmp(a, "--seed") == 0 || strcmp(a, "-s") == 0)
            ok = cli_parse_u64(a, v, &seed);
        else {
            fprintf(stderr, "error: unknown option '%s'\n", a);
            run_usage(stderr);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (!model) {
        fprintf(stderr, "error: no model given (-m MODEL.gguf); see sluice run --help\n");
        return 2;
    }
    if (!prompt && !prompt_ids) {
        fprintf(stderr, "error: no prompt (-p TEXT or --prompt-ids 1,2,3)\n");
        return 2;
    }
    if (prompt && prompt_ids) {
        fprintf(stderr, "error: give either -p or --prompt-ids, not both\n");
        return 2;
    }
    if (!(temp >= 0.0f) || !(top_p >= 0.0f) || !(min_p >= 0.0f && min_p <= 1.0f)) {
        fprintf(stderr, "error: --temp and --top-p must be >= 0, --min-p in 0..1\n");
        return 2;
    }
    uint32_t n_prompt = 0;
    int32_t *tokens = NULL;
    if (prompt_ids && !(tokens = run_parse_ids(prompt_ids, &n_prompt))) {
        fprintf(stderr, "error: --prompt-ids expects comma-separated token ids, got '%s'\n",
                prompt_ids);
        return 2;
    }

    int                    status = 1;
    struct common_errmsg   e = {{0}};
    struct executor_pool  *pool = NULL;
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct router_vocab   *vocab = NULL;
    struct router_sampler  smp = {0};
    struct router_text     piece = {0};
    float                 *logits = NULL;
    int                    rc;
    executor_kernels_init();
    if ((rc = executor_model_open(model, NULL, &m, &e)) < 0) {
        fprintf(stderr, "error: %s: %s\n", model, e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    if ((rc = router_vocab_load(executor_model_desc(m)->gguf, &vocab, &e)) < 0) {
        if (prompt) {
            fprintf(stderr, "error: %s: no usable tokenizer: %s\n", model,
                    e.text[0] ? e.text : common_strerror(rc));
            goto out;
        }
        vocab = NULL; /* --prompt-ids works without a tokenizer; ids are printed as [id] */
    }
    if (prompt) {
        struct router_tokens toks = {0};
        rc = router_tokenize(vocab, prompt, strlen(prompt),
                             &(struct router_tokenize_opts){.add_special = true}, &toks);
        if (rc < 0 || toks.n == 0 || toks.n > UINT32_MAX) {
            fprintf(stderr, "error: tokenizing the prompt failed\n");
            router_tokens_fini(&toks);
            goto out;
        }
        tokens = toks.ids; /* taken over */
        n_prompt = (uint32_t)toks.n;
    }
    if ((rc = executor_pool_create(n_threads, &pool)) < 0) {
        fprintf(stderr, "error: thread pool: %s\n", common_strerror(rc));
        goto out;
    }
    struct executor_ctx_opts co = {
        .n_ctx = n_ctx, .n_batch = n_batch, .cache_type = cache, .pool = pool};
    if ((rc = executor_ctx_create(m, &co, &c, &e)) < 0) {
        fprintf(stderr, "error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    const uint32_t n_vocab = executor_ctx_n_vocab(c);
    if (n_prompt > executor_ctx_n_ctx(c)) {
        fprintf(stderr, "error: the prompt has %u tokens but the context holds %u (use -c)\n",
                n_prompt, executor_ctx_n_ctx(c));
        goto out;
    }
    struct router_sampler_opts so = {
        .temperature = temp, .top_k = (int32_t)top_k, .top_p = top_p, .min_p = min_p, .seed = seed};
    if ((rc = router_sampler_init(&smp, &so, n_vocab)) < 0) {
        fprintf(stderr, "error: sampler options rejected: %s\n", common_strerror(rc));
        goto out;
    }
    for (uint32_t i = 0; i < n_prompt; i++)
        router_sampler_accept(&smp, tokens[i]);
    struct router_detok_stream ds;
    if (vocab)
        router_detok_stream_init(&ds, vocab,
                                 &(struct router_detok_opts){.keep_leading_space = true});
    logits = malloc((size_t)n_vocab * sizeof(*logits));
    if (!logits)
        goto out;
    if (ids) {
        printf("prompt_ids:");
        for (uint32_t i = 0; i < n_prompt; i++)
            printf(" %d", tokens[i]);
        printf("\n");
        fflush(stdout);
    }
    uint64_t t0 = common_now_ns();
    if ((rc = executor_ctx_decode(c, tokens, n_prompt, logits, NULL, &e)) < 0) {
        fprintf(stderr, "error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    uint64_t t1 = common_now_ns(), t_gen = 0;
    uint32_t n_gen = 0;
    for (; n_gen < n_predict; n_gen++) {
        int32_t id = 0;
        if (temp <= 0.0f)
            id = run_argmax(logits, n_vocab);
        else if ((rc = router_sampler_pick(&smp, logits, &id)) < 0) {
            fprintf(stderr, "error: sampling failed: %s\n", common_strerror(rc));
            goto out;
        }
        router_sampler_accept(&smp, id);
        if (ids) {
            printf("gen: %d\n", id);
        } else if (vocab) {
            router_text_clear(&piece);
            if (router_detok_stream_push(&ds, id, &piece) > 0)
                fwrite(piece.ptr, 1, piece.len, stdout);
        } else {
            printf("[%d]", id);
        }
        fflush(stdout);
        if (!ignore_eos && vocab && router_vocab_is_eog(vocab, id)) {
            n_gen++;
            break;
        }
        if (n_gen + 1 == n_predict)
            break;
        if (executor_ctx_n_past(c) >= executor_ctx_n_ctx(c)) {
            fprintf(stderr, "\nwarning: context full after %u tokens\n", executor_ctx_n_past(c));
            n_gen++;
            break;
        }
        uint64_t ts = common_now_ns();
        if ((rc = executor_ctx_decode(c, &id, 1, logits, NULL, &e)) < 0) {
            fprintf(stderr, "error: %s\n", e.text[0] ? e.text : common_strerror(rc));
            goto out;
        }
        t_gen += common_now_ns() - ts;
    }
    if (!ids) {
        router_text_clear(&piece);
        if (vocab && router_detok_stream_flush(&ds, &piece) > 0)
            fwrite(piece.ptr, 1, piece.len, stdout);
        printf("\n");
    }
    fprintf(stderr,
            "run: prompt %u tokens in %.1f ms (%.2f tok/s); generated %u tokens, decode %.2f "
            "tok/s; %u threads, isa %s\n",
            n_prompt, (double)(t1 - t0) / 1e6, (double)n_prompt / ((double)(t1 - t0) / 1e9), n_gen,
            n_gen > 1 ? (double)(n_gen - 1) / ((double)t_gen / 1e9) : 0.0,
            executor_pool_n_threads(pool), executor_isa_name(executor_kernels_active()));
    status = 0;
out:
    free(logits);
    router_text_fini(&piece);
    router_sampler_fini(&smp);
    router_vocab_destroy(vocab);
    executor_ctx_destroy(c);
    executor_model_destroy(m);
    executor_pool_destroy(pool);
    free(tokens);
    return status;
}
