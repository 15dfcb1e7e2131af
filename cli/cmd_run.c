/* cli/cmd_run.c - `sluice run`: generate a continuation of a prompt in one process. */
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
            "  --ids                print token ids instead of text (format below)\n");
    fputs(CLI_STREAM_USAGE "\n", f);
    fprintf(f,
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

int cli_cmd_run(int argc, char **argv)
{
    struct cli_session_opts so;
    const char             *prompt = NULL, *prompt_ids = NULL;
    bool                    ids = false, ignore_eos = false;
    cli_session_opts_default(&so);
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
        int taken = cli_take_option(argc, argv, &i, &so.stream, &v);
        if (taken == 0)
            taken = cli_session_parse_flag(&so, a, v);
        if (taken < 0)
            return 2;
        if (taken > 0)
            continue;
        if (strcmp(a, "-p") == 0 || strcmp(a, "--prompt") == 0)
            prompt = v;
        else if (strcmp(a, "--prompt-ids") == 0)
            prompt_ids = v;
        else {
            fprintf(stderr, "error: unknown option '%s'\n", a);
            run_usage(stderr);
            return 2;
        }
    }
    if (!so.model) {
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
    uint32_t n_prompt = 0;
    int32_t *tokens = NULL;
    if (prompt_ids && !(tokens = run_parse_ids(prompt_ids, &n_prompt))) {
        fprintf(stderr, "error: --prompt-ids expects comma-separated token ids, got '%s'\n",
                prompt_ids);
        return 2;
    }

    int                status = 1;
    struct cli_session s;
    struct router_text piece = {0};
    int                rc;
    if (cli_session_open(&s, &so, prompt != NULL) < 0)
        goto out;
    if (prompt) {
        struct router_tokens toks = {0};
        rc = router_tokenize(s.vocab, prompt, strlen(prompt),
                             &(struct router_tokenize_opts){.add_special = true}, &toks);
        if (rc < 0 || toks.n == 0 || toks.n > UINT32_MAX) {
            fprintf(stderr, "error: tokenizing the prompt failed\n");
            router_tokens_fini(&toks);
            goto out;
        }
        tokens = toks.ids; /* taken over */
        n_prompt = (uint32_t)toks.n;
    }
    if (n_prompt > executor_ctx_n_ctx(s.ctx)) {
        fprintf(stderr, "error: the prompt has %u tokens but the context holds %u (use -c)\n",
                n_prompt, executor_ctx_n_ctx(s.ctx));
        goto out;
    }
    struct router_detok_stream ds;
    if (s.vocab)
        router_detok_stream_init(&ds, s.vocab,
                                 &(struct router_detok_opts){.keep_leading_space = true});
    if (ids) {
        printf("prompt_ids:");
        for (uint32_t i = 0; i < n_prompt; i++)
            printf(" %d", tokens[i]);
        printf("\n");
        fflush(stdout);
    }
    uint64_t t0 = common_now_ns();
    if (cli_session_feed(&s, tokens, n_prompt) < 0)
        goto out;
    uint64_t t1 = common_now_ns(), t_gen = 0;
    uint32_t n_gen = 0;
    for (; n_gen < so.n_predict; n_gen++) {
        int32_t id = 0;
        if (cli_session_pick(&s, &id) < 0)
            goto out;
        if (ids) {
            printf("gen: %d\n", id);
        } else if (s.vocab) {
            router_text_clear(&piece);
            if (router_detok_stream_push(&ds, id, &piece) > 0)
                fwrite(piece.ptr, 1, piece.len, stdout);
        } else {
            printf("[%d]", id);
        }
        fflush(stdout);
        if (!ignore_eos && s.vocab && router_vocab_is_eog(s.vocab, id)) {
            n_gen++;
            break;
        }
        if (n_gen + 1 == so.n_predict) {
            n_gen++;
            break;
        }
        if (cli_session_is_full(&s)) {
            fprintf(stderr, "\nwarning: context full after %u tokens\n",
                    executor_ctx_n_past(s.ctx));
            n_gen++;
            break;
        }
        uint64_t ts = common_now_ns();
        if (cli_session_feed(&s, &id, 1) < 0)
            goto out;
        t_gen += common_now_ns() - ts;
    }
    if (!ids) {
        router_text_clear(&piece);
        if (s.vocab && router_detok_stream_flush(&ds, &piece) > 0)
            fwrite(piece.ptr, 1, piece.len, stdout);
        printf("\n");
    }
    fflush(stdout); /* the text ends before the timing line on a shared terminal */
    fprintf(stderr,
            "run: prompt %u tokens in %.1f ms (%.2f tok/s); generated %u tokens, decode %.2f "
            "tok/s; %u threads, isa %s\n",
            n_prompt, (double)(t1 - t0) / 1e6, (double)n_prompt / ((double)(t1 - t0) / 1e9), n_gen,
            n_gen > 1 ? (double)(n_gen - 1) / ((double)t_gen / 1e9) : 0.0,
            executor_threadpool_n_threads(s.pool), executor_isa_name(executor_kernels_active()));
    status = 0;
out:
    router_text_fini(&piece);
    cli_session_close(&s);
    free(tokens);
    return status;
}
