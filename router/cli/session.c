/* router/cli/session.c - a model loaded for generation in one process: the part `sluice run`
 * and `sluice chat` share (options, model, context, tokenizer, sampler, token picking). */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

void cli_session_opts_default(struct cli_session_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->n_predict = 128;
    o->sampler = (struct router_sampler_opts){
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f};
}

int cli_session_parse_flag(struct cli_session_opts *o, const char *a, const char *v)
{
    bool     ok = true;
    uint32_t u = 0;
    if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0)
        o->model = v;
    else if (strcmp(a, "-n") == 0 || strcmp(a, "--n-predict") == 0)
        ok = cli_parse_u32(a, v, 0, 1u << 24, &o->n_predict);
    else if (strcmp(a, "-t") == 0 || strcmp(a, "--threads") == 0)
        ok = cli_parse_u32(a, v, 1, 256, &o->n_threads);
    else if (strcmp(a, "-c") == 0 || strcmp(a, "--ctx-size") == 0)
        ok = cli_parse_u32(a, v, 0, 1u << 24, &o->n_ctx);
    else if (strcmp(a, "-b") == 0 || strcmp(a, "--batch-size") == 0)
        ok = cli_parse_u32(a, v, 1, 1u << 16, &o->n_batch);
    else if (strcmp(a, "--cache-type") == 0 || strcmp(a, "-ctk") == 0) {
        ok = executor_cache_type_parse(v, &o->cache) == 0;
        if (!ok)
            fprintf(stderr, "error: --cache-type expects f16 or q8_0, got '%s'\n", v);
    } else if (strcmp(a, "--temp") == 0)
        ok = cli_parse_f32(a, v, &o->sampler.temperature);
    else if (strcmp(a, "--top-k") == 0) {
        ok = cli_parse_u32(a, v, 0, 1u << 24, &u);
        o->sampler.top_k = (int32_t)u;
    } else if (strcmp(a, "--top-p") == 0)
        ok = cli_parse_f32(a, v, &o->sampler.top_p);
    else if (strcmp(a, "--min-p") == 0)
        ok = cli_parse_f32(a, v, &o->sampler.min_p);
    else if (strcmp(a, "--seed") == 0 || strcmp(a, "-s") == 0)
        ok = cli_parse_u64(a, v, &o->sampler.seed);
    else
        return 0;
    if (ok && (!(o->sampler.temperature >= 0.0f) || !(o->sampler.top_p >= 0.0f) ||
               !(o->sampler.min_p >= 0.0f && o->sampler.min_p <= 1.0f))) {
        fprintf(stderr, "error: --temp and --top-p must be >= 0, --min-p in 0..1\n");
        ok = false;
    }
    return ok ? 1 : -1;
}

int cli_session_open(struct cli_session *s, const struct cli_session_opts *o, bool need_vocab)
{
    struct common_errmsg e = {{0}};
    int                  rc;
    memset(s, 0, sizeof(*s));
    s->greedy = o->sampler.temperature <= 0.0f;
    executor_kernels_init();
    if ((rc = executor_model_open(o->model, NULL, &s->model, &e)) < 0) {
        fprintf(stderr, "error: %s: %s\n", o->model, e.text[0] ? e.text : common_strerror(rc));
        goto out_close;
    }
    if ((rc = router_vocab_load(executor_model_desc(s->model)->gguf, &s->vocab, &e)) < 0) {
        s->vocab = NULL;
        if (need_vocab) {
            fprintf(stderr, "error: %s: no usable tokenizer: %s\n", o->model,
                    e.text[0] ? e.text : common_strerror(rc));
            goto out_close;
        }
    }
    if ((rc = executor_pool_create(o->n_threads, &s->pool)) < 0) {
        fprintf(stderr, "error: thread pool: %s\n", common_strerror(rc));
        goto out_close;
    }
    struct executor_ctx_opts co = {
        .n_ctx = o->n_ctx, .n_batch = o->n_batch, .cache_type = o->cache, .pool = s->pool};
    if ((rc = executor_ctx_create(s->model, &co, &s->ctx, &e)) < 0) {
        fprintf(stderr, "error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        goto out_close;
    }
    s->n_vocab = executor_ctx_n_vocab(s->ctx);
    if ((rc = router_sampler_init(&s->sampler, &o->sampler, s->n_vocab)) < 0) {
        fprintf(stderr, "error: sampler options rejected: %s\n", common_strerror(rc));
        goto out_close;
    }
    s->logits = malloc((size_t)s->n_vocab * sizeof(*s->logits));
    if (!s->logits) {
        rc = COMMON_ENOMEM;
        fprintf(stderr, "error: out of memory\n");
        goto out_close;
    }
    return COMMON_OK;

out_close:
    cli_session_close(s);
    return rc < 0 ? rc : COMMON_EINVAL;
}

void cli_session_close(struct cli_session *s)
{
    free(s->logits);
    router_sampler_fini(&s->sampler);
    router_vocab_destroy(s->vocab);
    executor_ctx_destroy(s->ctx);
    executor_model_destroy(s->model);
    executor_pool_destroy(s->pool);
    memset(s, 0, sizeof(*s));
}

int cli_session_feed(struct cli_session *s, const int32_t *tokens, uint32_t n)
{
    struct common_errmsg e = {{0}};
    if (executor_ctx_n_past(s->ctx) + (uint64_t)n > executor_ctx_n_ctx(s->ctx)) {
        fprintf(stderr,
                "error: %u more tokens do not fit: %u of the %u context positions are "
                "used (use -c)\n",
                n, executor_ctx_n_past(s->ctx), executor_ctx_n_ctx(s->ctx));
        return COMMON_ERANGE;
    }
    for (uint32_t i = 0; i < n; i++)
        router_sampler_accept(&s->sampler, tokens[i]);
    int rc = executor_ctx_decode(s->ctx, tokens, n, s->logits, NULL, &e);
    if (rc < 0)
        fprintf(stderr, "error: %s\n", e.text[0] ? e.text : common_strerror(rc));
    return rc;
}

int cli_session_pick(struct cli_session *s, int32_t *id)
{
    int32_t best = 0;
    if (s->greedy) {
        for (uint32_t i = 1; i < s->n_vocab; i++)
            if (s->logits[i] > s->logits[best])
                best = (int32_t)i;
    } else {
        int rc = router_sampler_pick(&s->sampler, s->logits, &best);
        if (rc < 0) {
            fprintf(stderr, "error: sampling failed: %s\n", common_strerror(rc));
            return rc;
        }
    }
    *id = best;
    return COMMON_OK;
}

bool cli_session_is_full(const struct cli_session *s)
{
    return executor_ctx_n_past(s->ctx) >= executor_ctx_n_ctx(s->ctx);
}
