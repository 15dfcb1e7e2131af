/* cli/session.c - a model loaded for generation in one process: the part `sluice run`
 * and `sluice chat` share (options, model, context, tokenizer, sampler, token picking). */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ---- stream options ----------------------------------------------------------------------- */

int cli_stream_parse_flag(struct cli_stream_opts *o, const char *a, const char *v)
{
    if (strcmp(a, "--ram-budget") == 0) {
        if (common_parse_size(v, &o->ram_budget) != 0 || o->ram_budget == 0) {
            fprintf(stderr, "error: --ram-budget expects a size like 1.5G, got '%s'\n", v);
            return -1;
        }
    } else if (strcmp(a, "--io") == 0) {
        if (fetcher_io_mode_parse(v, &o->io) != 0 || o->io == FETCHER_IO_AUTO) {
            fprintf(stderr, "error: --io expects uring, pread or mmap, got '%s'\n", v);
            return -1;
        }
        o->io_set = true;
    } else if (strcmp(a, "--policy") == 0) {
        if (fetcher_policy_parse(v, &o->policy) != 0) {
            fprintf(stderr, "error: --policy expects lru or lfu, got '%s'\n", v);
            return -1;
        }
    } else if (strcmp(a, "--io-depth") == 0) {
        if (!cli_parse_u32(a, v, 1, 4096, &o->queue_depth))
            return -1;
    } else if (strcmp(a, "--prefetch") == 0) {
        if (strcmp(v, "gate") != 0 && strcmp(v, "all") != 0 && strcmp(v, "none") != 0) {
            fprintf(stderr, "error: --prefetch expects gate, all or none, got '%s'\n", v);
            return -1;
        }
        o->no_prefetch = strcmp(v, "none") == 0;
        o->prefetch_all = strcmp(v, "all") == 0;
    } else if (strcmp(a, "--prefetch-top") == 0) {
        if (!cli_parse_u32(a, v, 1, 1024, &o->prefetch_top))
            return -1;
    } else if (strcmp(a, "--trace-out") == 0) {
        o->trace_out = v;
    } else {
        return 0;
    }
    return 1;
}

int cli_stream_parse_switch(struct cli_stream_opts *o, const char *a)
{
    if (strcmp(a, "--trace-names") == 0)
        o->trace_names = true;
    else if (strcmp(a, "--report-rss") == 0)
        o->report_rss = true;
    else if (strcmp(a, "--no-prefetch") == 0)
        o->no_prefetch = true;
    else if (strcmp(a, "--no-postfetch") == 0)
        o->no_postfetch = true;
    else if (strcmp(a, "--mmap-advise") == 0)
        o->mmap_advise = true;
    else
        return 0;
    return 1;
}

bool cli_stream_is_on(const struct cli_stream_opts *o)
{
    return o->ram_budget != 0 || o->io_set || o->mmap_advise; /* the last one refused later */
}

/* ---- engine: the fetcher plugged into the executor as its expert source ------------------- */

static int engine_acquire(void *arg, uint32_t layer, uint32_t expert, enum common_expert_part part,
                          const void **data, uint32_t *loan)
{
    return fetcher_acquire(arg, layer, expert, part, data, loan);
}

static int engine_release(void *arg, uint32_t loan)
{
    fetcher_release(arg, loan);
    return COMMON_OK;
}

static int engine_request(void *arg, uint32_t layer, uint32_t expert,
                          enum executor_expert_hint hint)
{
    return fetcher_request(arg, layer, expert,
                           hint == EXECUTOR_HINT_PREFETCH ? FETCHER_PRIO_PREFETCH
                                                          : FETCHER_PRIO_POSTFETCH);
}

static bool engine_is_ready(void *arg, uint32_t layer, uint32_t expert)
{
    return fetcher_is_ready(arg, layer, expert);
}

static void engine_token_begin(void *arg)
{
    fetcher_token_begin(arg);
}

/* Opens the streamed model: plan, fetcher, resident weights, model. */
static int engine_open_stream(struct cli_engine *en, const char *path,
                              const struct cli_engine_opts *o, struct common_errmsg *e)
{
    const struct cli_stream_opts *so = &en->so;
    int                           rc;
    if ((rc = common_gguf_open(path, NULL, &en->gguf, e)) < 0)
        return rc;
    if (!(en->desc = calloc(1, sizeof(*en->desc))))
        return COMMON_ENOMEM;
    if ((rc = common_model_init(en->desc, en->gguf, e)) < 0) {
        free(en->desc);
        en->desc = NULL;
        return rc;
    }
    if (!common_model_is_moe(en->desc))
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "--ram-budget and --io stream routed experts; this model is "
                                 "dense (run it without them)");
    struct common_ctx_layout lay;
    if ((rc = common_ctx_layout_compute(
             &en->desc->hp,
             &(struct common_ctx_layout_opts){.n_ctx = o->ctx.n_ctx,
                                              .n_batch = o->ctx.n_batch,
                                              .n_threads = executor_threadpool_n_threads(en->pool),
                                              .cache_type = o->ctx.cache_type},
             &lay, e)) < 0)
        return rc;
    enum fetcher_io_mode io = so->io_set ? so->io : FETCHER_IO_AUTO;
    if (so->mmap_advise && io != FETCHER_IO_MMAP)
        return common_errmsg_set(e, COMMON_EINVAL, "--mmap-advise applies to --io mmap only");
    struct fetcher_opts fo = {.ram_budget = so->ram_budget,
                              .kv_bytes = lay.kv_bytes,
                              .act_bytes = lay.scratch_bytes + o->extra_bytes +
                                           (uint64_t)o->logit_rows * lay.logits_bytes,
                              .policy = so->policy,
                              .io = io,
                              .queue_depth = so->queue_depth,
                              .mmap_advise = so->mmap_advise};
    if ((rc = fetcher_create(en->gguf, en->desc, &fo, &en->fetcher, e)) < 0)
        return rc;
    const struct fetcher_plan *plan = fetcher_get_plan(en->fetcher);
    if (so->ram_budget) {
        char buf[2048];
        fetcher_plan_format(plan, buf, sizeof(buf));
        fputs(buf, stderr);
    }
    enum fetcher_io_mode mode = fetcher_get_io_mode(en->fetcher);
    char                 sz[32];
    if (mode == FETCHER_IO_MMAP)
        fprintf(stderr,
                "experts: io mmap%s (the page cache decides what stays; the budget is not "
                "enforced in-process: run under a memory cgroup)\n",
                so->mmap_advise ? ", madvise(WILLNEED) on requested experts" : "");
    else
        fprintf(stderr, "experts: io %s%s, policy %s, pool %u slots of %s, queue depth %u\n",
                fetcher_io_mode_name(mode), fetcher_is_direct(en->fetcher) ? " (O_DIRECT)" : "",
                fetcher_policy_name(so->policy), plan->n_slots,
                common_format_size(plan->slot_bytes, sz, sizeof(sz)),
                so->queue_depth ? so->queue_depth : 32);
    struct executor_expert_source src = {.acquire = engine_acquire,
                                         .release = engine_release,
                                         .request = engine_request,
                                         .is_ready = engine_is_ready,
                                         .token_begin = engine_token_begin,
                                         .arg = en->fetcher};
    struct executor_weights_opts  wo = {.read_span =
                                           mode == FETCHER_IO_MMAP ? NULL : common_gguf_read_span,
                                        .progress = stderr,
                                        .trace_names = so->trace_names ? stderr : NULL};
    struct executor_weights      *w = NULL;
    if ((rc = executor_weights_stream_create(en->desc, &wo, &src, &w, e)) < 0)
        return rc;
    if ((rc = executor_model_create(en->desc, w, &en->model, e)) < 0) {
        executor_weights_destroy(w);
        return rc;
    }
    return 0;
}

int cli_engine_open(struct cli_engine *en, const char *path, const struct cli_stream_opts *so,
                    const struct cli_engine_opts *o)
{
    struct common_errmsg e = {{0}};
    int                  rc;
    memset(en, 0, sizeof(*en));
    if (so)
        en->so = *so;
    if ((rc = executor_threadpool_create(o->n_threads, &en->pool)) < 0) {
        fprintf(stderr, "error: thread pool: %s\n", common_strerror(rc));
        goto out_close;
    }
    if (cli_stream_is_on(&en->so))
        rc = engine_open_stream(en, path, o, &e);
    else
        rc = executor_model_open(path, &(struct executor_model_opts){.populate = o->populate},
                                 &en->model, &e);
    if (rc < 0) {
        fprintf(stderr, "error: %s: %s\n", path, e.text[0] ? e.text : common_strerror(rc));
        goto out_close;
    }
    struct executor_ctx_opts co = o->ctx;
    co.pool = en->pool;
    co.no_prefetch = co.no_prefetch || en->so.no_prefetch;
    co.no_postfetch = co.no_postfetch || en->so.no_postfetch;
    co.prefetch_history = co.prefetch_history || en->so.prefetch_all;
    if (!co.prefetch_top)
        co.prefetch_top = en->so.prefetch_top;
    if (en->fetcher && !co.fetch_window) {
        /* A pool that cannot hold two layers' worth of experts: ask for half of it at a time,
         * so requests made ahead do not evict each other before use. */
        uint32_t n_slots = fetcher_get_plan(en->fetcher)->n_slots;
        if (n_slots < 2 * en->desc->hp.n_expert)
            co.fetch_window = n_slots / 2 ? n_slots / 2 : 1;
    }
    if ((rc = executor_ctx_create(en->model, &co, &en->ctx, &e)) < 0) {
        fprintf(stderr, "error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        goto out_close;
    }
    return COMMON_OK;

out_close:
    en->reported = true; /* nothing ran: no summary */
    cli_engine_close(en);
    return rc < 0 ? rc : COMMON_EINVAL;
}

/* Peak resident set of this process in kB (VmHWM), 0 when unknown. */
static uint64_t engine_vmhwm_kb(void)
{
    FILE              *f = fopen("/proc/self/status", "r");
    char               line[256];
    unsigned long long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

int cli_engine_report(struct cli_engine *en)
{
    int rc = COMMON_OK;
    if (en->reported)
        return rc;
    en->reported = true;
    if (en->fetcher) {
        struct fetcher_trace           *t = fetcher_get_trace(en->fetcher);
        struct executor_predictor_stats ps[EXECUTOR_PRED_COUNT];
        executor_ctx_predictor_stats(en->ctx, ps);
        for (int i = 0; i < EXECUTOR_PRED_COUNT; i++)
            if (!en->so.no_prefetch && ps[i].actual > 0)
                (void)fetcher_trace_predictor(t,
                                              executor_predictor_name((enum executor_predictor)i),
                                              ps[i].predicted, ps[i].correct, ps[i].actual);
        fetcher_trace_write_summary(t, stderr);
        if (en->so.trace_out) {
            FILE *f = fopen(en->so.trace_out, "w");
            if (!f || fetcher_trace_write_json(t, f) < 0) {
                fprintf(stderr, "error: cannot write the trace to '%s'\n", en->so.trace_out);
                rc = COMMON_EIO;
            }
            if (f && fclose(f) != 0 && rc == COMMON_OK) {
                fprintf(stderr, "error: cannot write the trace to '%s'\n", en->so.trace_out);
                rc = COMMON_EIO;
            }
        }
    }
    if (en->so.report_rss) {
        uint64_t kb = engine_vmhwm_kb();
        fprintf(stderr, "peak rss: %llu kB", (unsigned long long)kb);
        if (en->so.ram_budget)
            fprintf(stderr, " (ram budget %llu kB, %.1f%%)",
                    (unsigned long long)(en->so.ram_budget >> 10),
                    100.0 * (double)kb * 1024.0 / (double)en->so.ram_budget);
        fputc('\n', stderr);
    }
    return rc;
}

void cli_engine_close(struct cli_engine *en)
{
    if (en->ctx)
        (void)cli_engine_report(en);
    executor_ctx_destroy(en->ctx);
    if (en->desc) {
        /* Streaming: the model borrows desc and its weights; free them in order. */
        struct executor_weights *w = en->model ? executor_model_weights(en->model) : NULL;
        executor_model_destroy(en->model);
        executor_weights_destroy(w);
        fetcher_destroy(en->fetcher);
        common_model_fini(en->desc);
        free(en->desc);
    } else {
        executor_model_destroy(en->model);
    }
    common_gguf_close(en->gguf);
    executor_threadpool_destroy(en->pool);
    memset(en, 0, sizeof(*en));
}

/* ---- session -------------------------------------------------------------------------------- */

void cli_session_opts_default(struct cli_session_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->n_predict = 128;
    o->sampler = (struct router_sampler_opts){
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f};
}

int cli_take_option(int argc, char **argv, int *i, struct cli_stream_opts *so, const char **value)
{
    const char *a = argv[*i];
    if (cli_stream_parse_switch(so, a))
        return 1;
    if (a[0] != '-') {
        fprintf(stderr, "error: unexpected argument '%s'\n", a);
        return -1;
    }
    if (!(*value = cli_next_arg(argc, argv, i)))
        return -1;
    return cli_stream_parse_flag(so, a, *value);
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
        ok = common_cache_type_parse(v, &o->cache) == 0;
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
        return cli_stream_parse_flag(&o->stream, a, v);
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
    struct cli_engine_opts eo = {
        .n_threads = o->n_threads,
        .ctx = {.n_ctx = o->n_ctx, .n_batch = o->n_batch, .cache_type = o->cache},
        .logit_rows = 4}; /* logits and the sampler's candidates */
    if ((rc = cli_engine_open(&s->engine, o->model, &o->stream, &eo)) < 0)
        goto out_close;
    s->pool = s->engine.pool;
    s->model = s->engine.model;
    s->ctx = s->engine.ctx;
    if ((rc = router_vocab_load(executor_model_desc(s->model)->gguf, &s->vocab, &e)) < 0) {
        s->vocab = NULL;
        if (need_vocab) {
            fprintf(stderr, "error: %s: no usable tokenizer: %s\n", o->model,
                    e.text[0] ? e.text : common_strerror(rc));
            goto out_close;
        }
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
    cli_engine_close(&s->engine);
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
