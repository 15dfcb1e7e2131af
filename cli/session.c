/* cli/session.c - a model loaded for generation in one process: the part `sluice run`
 * and `sluice chat` share (options, model, context, tokenizer, sampler, token picking). */
#include "cli.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ---- stream options -------------------------------------------------------------------------- */

/* --io: uring, pread or mmap (either case, "io_uring" too); sets io_set. */
static int stream_parse_io(void *arg, const char *v, struct common_errmsg *e)
{
    struct cli_stream_opts *o = arg;
    enum fetcher_io_mode    io;
    if (fetcher_io_mode_parse(v, &io) != COMMON_OK || io == FETCHER_IO_AUTO)
        return common_errmsg_set(e, COMMON_EINVAL, "expects uring, pread or mmap, got '%s'", v);
    o->io = io;
    o->io_set = true;
    return COMMON_OK;
}

/* --policy: lru or lfu (either case). */
static int stream_parse_policy(void *arg, const char *v, struct common_errmsg *e)
{
    if (fetcher_policy_parse(v, arg) != COMMON_OK)
        return common_errmsg_set(e, COMMON_EINVAL, "expects lru or lfu, got '%s'", v);
    return COMMON_OK;
}

/* --prefetch: gate, all or none; the last of --prefetch and --no-prefetch wins. */
static int stream_parse_prefetch(void *arg, const char *v, struct common_errmsg *e)
{
    struct cli_stream_opts *o = arg;
    if (strcmp(v, "gate") != 0 && strcmp(v, "all") != 0 && strcmp(v, "none") != 0)
        return common_errmsg_set(e, COMMON_EINVAL, "expects gate, all or none, got '%s'", v);
    o->no_prefetch = strcmp(v, "none") == 0;
    o->prefetch_all = strcmp(v, "all") == 0;
    return COMMON_OK;
}

void cli_stream_table_init(struct cli_stream_table *t, struct cli_stream_opts *o)
{
    const struct common_opt rows[] = {
        {.name = "ram-budget",
         .type = COMMON_OPT_SIZE,
         .target = &o->ram_budget,
         .min = 1,
         .help = "bound everything resident (weights, expert pool, KV, scratch, i/o) to SIZE "
                 "(e.g. 1.5G); prints the plan, refuses below the minimum"},
        {.name = "io",
         .type = COMMON_OPT_CALLBACK,
         .target = o,
         .parse = stream_parse_io,
         .metavar = "uring|pread|mmap",
         .help = "expert reads: uring (O_DIRECT), pread, or mmap (the page cache decides, as "
                 "llama.cpp)",
         .def = "uring when a budget"},
        {.name = "mmap-advise",
         .type = COMMON_OPT_SWITCH,
         .target = &o->mmap_advise,
         .help = "with --io mmap: madvise(WILLNEED) each expert the router picks or the "
                 "predictor guesses (llama.cpp only faults pages in at use)"},
        {.name = "policy",
         .type = COMMON_OPT_CALLBACK,
         .target = &o->policy,
         .parse = stream_parse_policy,
         .metavar = "lru|lfu",
         .help = "expert pool eviction",
         .def = "lru"},
        {.name = "io-depth",
         .type = COMMON_OPT_U32,
         .target = &o->queue_depth,
         .min = 1,
         .max = 4096,
         .help = "reads in flight",
         .def = "32"},
        {.name = "trace-out",
         .type = COMMON_OPT_STR,
         .target = &o->trace_out,
         .metavar = "FILE",
         .help = "write the expert trace as JSON (docs/fetcher.md) on exit"},
        {.name = "trace-names",
         .type = COMMON_OPT_SWITCH,
         .target = &o->trace_names,
         .help = "log each expert tensor as used (stderr)"},
        {.name = "prefetch",
         .type = COMMON_OPT_CALLBACK,
         .target = o,
         .parse = stream_parse_prefetch,
         .metavar = "gate|all|none",
         .help = "gate: hint the next layer's experts from its router on the current state; all: "
                 "also the previous token's choices and the next token's first layers",
         .def = "gate"},
        {.name = "prefetch-top",
         .type = COMMON_OPT_U32,
         .target = &o->prefetch_top,
         .max = 1024,
         .help = "hint the gate predictor's best N guesses per token; 0 = the best, and each next "
                 "rank while 85% of its guesses are right",
         .def = "0"},
        {.name = "no-prefetch",
         .type = COMMON_OPT_SWITCH,
         .target = &o->no_prefetch,
         .help = "same as --prefetch none"},
        {.name = "no-postfetch",
         .type = COMMON_OPT_SWITCH,
         .target = &o->no_postfetch,
         .help = "do not request a layer's experts before computing them"},
        {.name = "report-rss",
         .type = COMMON_OPT_SWITCH,
         .target = &o->report_rss,
         .help = "print the peak resident set (VmHWM) on exit"},
        {.name = "n-gpu-layers",
         .short_name = "ngl",
         .type = COMMON_OPT_I32,
         .target = &o->n_gpu_layers,
         .max = 1u << 20,
         .metavar = "N",
         .help = "put the last N layers on the CUDA devices (--device), and the output head when N "
                 "exceeds "
                 "the layers (999 = all); without a usable device the CPU runs them",
         .def = "0"},
        EXECUTOR_DEVICE_OPTS(&o->devices, &o->n_cpu_moe, &o->vram_budget),
        EXECUTOR_EXPERT_MISS_OPT(&o->expert_miss),
        FETCHER_VRAM_FILL_OPT(&o->vram_fill,
                              "with --vram-budget and --ram-budget, where the device pool's "
                              "misses come from: ram (read into the RAM pool, copied from there), "
                              "storage (those not in the RAM pool read into pinned staging and "
                              "copied from there, the RAM pool left to what it holds), auto "
                              "(storage when the RAM pool is no bigger than the device pools)"),
        {0},
    };
    static_assert(sizeof(rows) == sizeof(t->rows), "CLI_STREAM_N_ROWS is the number of rows");
    memcpy(t->rows, rows, sizeof(rows));
}

bool cli_stream_is_on(const struct cli_stream_opts *o)
{
    return o->ram_budget != 0 || o->io_set || o->mmap_advise; /* the last one refused later */
}

/* ---- engine: the fetcher plugged into the executor as its expert source ---------------------- */

static int engine_acquire(void *arg, uint32_t layer, uint32_t expert, enum common_expert_part part,
                          const void **data, uint32_t *loan)
{
    return fetcher_acquire(arg, layer, expert, part, data, loan);
}

static void engine_error(void *arg, uint32_t layer, uint32_t expert, struct common_errmsg *out)
{
    fetcher_expert_error(arg, layer, expert, out);
}

/* The fetcher's pool segment (mapped read-write here, fixed for its life): a device pool's
 * copies read it as pinned memory once registered. It is never remapped, so remove is never
 * called: the device unregisters it itself, before the source goes. */
static void engine_regions(void *arg, const struct executor_region_hooks *h)
{
    const void    *b = fetcher_get_pool_base(arg);
    const uint64_t n = fetcher_get_pool_bytes(arg);
    if (h && b && n > 0)
        (void)h->add(h->arg, b, (size_t)n, false);
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

/* The device pools (--vram-fill storage): this process's fetcher makes each device's and fills
 * it as a fetcher daemon fills an executor's, its misses read from storage through its staging
 * (struct executor_dev_ops over fetcher_devpool_local_*; the argument is the fetcher). */
static int engine_dev_open(void *arg, int dev, uint32_t first_layer, uint32_t n_layers,
                           size_t bytes, uint32_t n_events, struct executor_dev_pool *out,
                           void **pool, struct common_errmsg *e)
{
    (void)first_layer;
    (void)n_layers;
    struct fetcher_devpool_local l;
    struct fetcher_devpool      *d = NULL;
    if (n_events > EXECUTOR_DEV_MAX_EVENTS)
        return common_errmsg_set(e, COMMON_EINVAL, "a bad request for a device pool");
    /* (gpu.c sizes the pool within --vram-budget) */
    int rc = fetcher_devpool_local_open(arg, true, dev, bytes, bytes, n_events, &l, &d, e);
    if (rc != COMMON_OK)
        return rc;
    *out = (struct executor_dev_pool){.base = l.base,
                                      .bytes = l.bytes,
                                      .gran = l.gran,
                                      .kev = l.kev,
                                      .n_fetchers = 1,
                                      .stages = l.stages,
                                      .local = true};
    snprintf(out->backend, sizeof(out->backend), "%s", l.backend);
    *pool = d;
    return COMMON_OK;
}

static int engine_dev_back(void *arg, uint32_t piece, struct common_errmsg *e)
{
    return fetcher_devpool_local_piece(arg, piece, e);
}

static int engine_dev_copy(void *arg, size_t dst, const void *src, size_t bytes)
{
    return fetcher_devpool_local_copy(arg, dst, src, bytes);
}

static int engine_dev_read(void *arg, uint32_t layer, uint32_t expert, enum common_expert_part part,
                           size_t dst, size_t bytes)
{
    return fetcher_devpool_local_read(arg, layer, expert, part, dst, bytes);
}

static int engine_dev_mark(void *arg, uint32_t k)
{
    return fetcher_devpool_local_mark(arg, k);
}

static int engine_dev_ready(void *arg, uint32_t k, struct common_devmem_event **evs, uint32_t *n)
{
    const int rc = fetcher_devpool_local_ready(arg, k, &evs[0]);
    *n = evs[0] ? 1 : 0;
    return rc;
}

static int engine_dev_after(void *arg)
{
    return fetcher_devpool_local_after(arg);
}

static void engine_dev_copy_time(void *arg, uint64_t *ns)
{
    *ns = fetcher_devpool_local_copy_ns(arg);
}

static void engine_dev_close(void *arg)
{
    fetcher_devpool_stop(arg);
}

/* (never lost: no retake) */
static const struct executor_dev_ops engine_dev_ops = {.open = engine_dev_open,
                                                       .back = engine_dev_back,
                                                       .copy = engine_dev_copy,
                                                       .read = engine_dev_read,
                                                       .mark = engine_dev_mark,
                                                       .ready = engine_dev_ready,
                                                       .after = engine_dev_after,
                                                       .copy_time = engine_dev_copy_time,
                                                       .close = engine_dev_close};

/* Whether the device pools of n_dev device layers read their misses from storage (--vram-fill;
 * auto: when the RAM pool, planned without staging, is no bigger than the device pools, an
 * inclusive RAM tier that small only duplicating them), and the staging bytes of every pool. */
static bool engine_stages(const struct cli_engine *en, const struct fetcher_opts *fo,
                          uint32_t n_dev, uint64_t *staging)
{
    const struct cli_stream_opts *so = &en->so;
    *staging = 0;
    const bool io_pool = !(so->io_set && so->io == FETCHER_IO_MMAP);
    if (!n_dev || !so->vram_budget || !so->ram_budget || !io_pool || en->desc->ffn_streamed ||
        so->vram_fill == FETCHER_VRAM_FILL_RAM)
        return false;
    int32_t   ids[EXECUTOR_MAX_DEVICES];
    const int n_ids = so->devices.single ? 1 : executor_devices_resolve(&so->devices, ids, NULL, 0);
    const uint64_t n_pools = n_ids > 0 ? (uint64_t)n_ids : 1;
    const uint64_t staging_bytes = n_pools * fetcher_devpool_staging_bytes(en->desc);
    if (so->vram_fill == FETCHER_VRAM_FILL_AUTO) { /* and only where the staging fits too */
        struct fetcher_plan      plan = {0};
        struct fetcher_plan_opts po = {.ram_budget = fo->ram_budget,
                                       .kv_bytes = fo->kv_bytes,
                                       .act_bytes = fo->act_bytes,
                                       .queue_depth = fo->queue_depth};
        if (fetcher_plan_compute(en->desc, &po, &plan, NULL) != COMMON_OK ||
            (uint64_t)plan.n_slots * plan.slot_bytes > n_pools * so->vram_budget)
            return false;
        po.staging_bytes = staging_bytes;
        if (fetcher_plan_compute(en->desc, &po, &plan, NULL) != COMMON_OK)
            return false;
    }
    *staging = staging_bytes;
    return true;
}

/* Opens the streamed model: plan, fetcher, resident weights, model. The plan leaves out the KV
 * of the last `n_dev` layers (a device holds it). */
static int engine_open_stream(struct cli_engine *en, const char *path,
                              const struct cli_engine_opts *o, uint32_t n_dev,
                              struct common_errmsg *e)
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
    /* A dense model streams its FFNs, one "expert" per layer (attention stays resident). */
    if (!common_model_is_moe(en->desc))
        (void)common_model_stream_dense(en->desc);
    struct common_ctx_layout lay;
    if ((rc = common_ctx_layout_compute(
             &en->desc->hp,
             &(struct common_ctx_layout_opts){.n_ctx = o->ctx.n_ctx,
                                              .n_batch = o->ctx.n_batch,
                                              .n_threads = executor_threadpool_n_threads(en->pool),
                                              .cache_type = o->ctx.cache_type,
                                              .n_device_layers = n_dev},
             &lay, e)) < 0)
        return rc;
    enum fetcher_io_mode io = so->io_set ? so->io : FETCHER_IO_AUTO;
    if (so->mmap_advise && io != FETCHER_IO_MMAP)
        return common_errmsg_set(e, COMMON_EINVAL, "--mmap-advise applies to --io mmap only");
    const uint64_t n_seqs = o->n_seqs ? o->n_seqs : 1;
    /* The CPU backend's device scratch is RAM too (its KV is in the plan: n_dev is 0 then), and
     * so is the CPU device's in one pass when it has layers (their KV is in the plan too). */
    const bool     ngl = en->so.n_gpu_layers > 0 && !en->so.devices.none;
    const uint64_t dev_ram =
        (ngl && executor_gpu_in_ram()) || (executor_gpu_one_pass() && n_dev < en->desc->hp.n_layer)
            ? executor_gpu_scratch_bytes(&en->desc->hp, lay.n_ctx, lay.n_batch) * n_seqs
            : 0;
    struct fetcher_opts fo = {.ram_budget = so->ram_budget,
                              .kv_bytes = lay.kv_bytes * n_seqs,
                              .act_bytes = lay.scratch_bytes * n_seqs + o->extra_bytes + dev_ram +
                                           (uint64_t)o->logit_rows * lay.logits_bytes,
                              .policy = so->policy,
                              .io = io,
                              .queue_depth = so->queue_depth,
                              .mmap_advise = so->mmap_advise};
    en->stages = engine_stages(en, &fo, n_dev, &fo.staging_bytes);
    if ((rc = fetcher_create(en->gguf, en->desc, &fo, &en->fetcher, e)) < 0)
        return rc;
    enum fetcher_io_mode          mode = fetcher_get_io_mode(en->fetcher);
    struct executor_expert_source src = {.acquire = engine_acquire,
                                         .release = engine_release,
                                         .request = engine_request,
                                         .is_ready = engine_is_ready,
                                         .token_begin = engine_token_begin,
                                         .error = engine_error,
                                         .regions = engine_regions,
                                         .dev = en->stages ? &engine_dev_ops : NULL,
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

/* Prints the streamed model's plan (under a budget) and how its experts are read. */
static void engine_print_stream(const struct cli_engine *en)
{
    const struct cli_stream_opts *so = &en->so;
    const struct fetcher_plan    *plan = fetcher_get_plan(en->fetcher);
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
    if (en->stages)
        fprintf(stderr,
                "device pool: its misses not in the RAM pool read from storage through %u pinned "
                "staging slots per device (--vram-fill %s)\n",
                FETCHER_DEVPOOL_STAGE_SLOTS, fetcher_vram_fill_names[so->vram_fill]);
}

/* Frees what engine_open_stream made (the model borrows desc and its weights: in order). */
static void engine_close_stream(struct cli_engine *en)
{
    struct executor_weights *w = en->model ? executor_model_weights(en->model) : NULL;
    executor_model_destroy(en->model);
    executor_weights_destroy(w);
    fetcher_destroy(en->fetcher);
    if (en->desc)
        common_model_fini(en->desc);
    free(en->desc);
    common_gguf_close(en->gguf);
    en->model = NULL;
    en->fetcher = NULL;
    en->desc = NULL;
    en->gguf = NULL;
}

int cli_engine_open(struct cli_engine *en, const char *path, const struct cli_stream_opts *so,
                    const struct cli_engine_opts *o)
{
    struct common_errmsg e = {{0}};
    int                  rc;
    memset(en, 0, sizeof(*en));
    en->prog = o->prog ? o->prog : "sluice";
    if (so)
        en->so = *so;
    if ((rc = executor_threadpool_create(o->n_threads, &en->pool)) < 0) {
        cli_error(en->prog, "thread pool: %s", common_strerror(rc));
        goto out_close;
    }
    const bool stream = cli_stream_is_on(&en->so);
    const bool want_gpu = en->so.n_gpu_layers > 0 && !en->so.devices.none;
    /* The plan leaves out the KV of the layers on a device (not the CPU backend's, which is RAM).
     * Whether the device takes this model is known once it is open (its architecture and
     * types): if not, it opens again with all the KV in the plan (nothing was read yet). */
    uint32_t n_dev = stream && want_gpu && !executor_gpu_in_ram() &&
                             executor_gpu_usable(NULL, &en->so.devices, 0, NULL, 0)
                         ? (uint32_t)en->so.n_gpu_layers
                         : 0;
    if (stream)
        rc = engine_open_stream(en, path, o, n_dev, &e);
    else
        rc = executor_model_open(path, &(struct executor_model_opts){.populate = o->populate},
                                 &en->model, &e);
    char why[256] = "";
    bool gpu_ok =
        rc >= 0 && want_gpu &&
        executor_gpu_usable(en->model, &en->so.devices, en->so.n_cpu_moe, why, sizeof(why));
    if (rc >= 0 && n_dev && !gpu_ok) {
        engine_close_stream(en);
        rc = engine_open_stream(en, path, o, 0, &e);
    }
    if (rc < 0) {
        cli_error_path(en->prog, path, rc, &e);
        goto out_close;
    }
    if (stream)
        engine_print_stream(en);
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
    if (en->so.vram_budget && en->so.n_gpu_layers <= 0)
        fprintf(stderr, "%s: warning: --vram-budget ignored: no layer is on a device (-ngl)\n",
                en->prog);
    if (en->so.expert_miss != EXECUTOR_MISS_COPY && !en->so.vram_budget)
        fprintf(stderr, "%s: warning: --expert-miss %s ignored: it needs --vram-budget\n", en->prog,
                executor_expert_miss_name(en->so.expert_miss));
    if (want_gpu) {
        /* As llama.cpp: without a usable device the layers stay on the CPU, with a warning. */
        if (gpu_ok) {
            co.n_gpu_layers = en->so.n_gpu_layers;
            co.devices = en->so.devices;
            co.n_cpu_moe = en->so.n_cpu_moe;
            co.vram_budget = en->so.vram_budget;
            co.expert_miss = en->so.expert_miss;
            co.pool_policy =
                en->so.policy == FETCHER_POLICY_LFU ? EXECUTOR_POOL_LFU : EXECUTOR_POOL_LRU;
        } else {
            fprintf(stderr, "%s: warning: -ngl %d ignored, running on the CPU: %s\n", en->prog,
                    en->so.n_gpu_layers, why);
        }
    }
    if (o->n_seqs > 1 && co.n_gpu_layers > 0) {
        /* Several sequences share one copy of the device weights (and device steps). */
        const struct common_hparams    *hp = executor_model_hparams(en->model);
        const uint32_t                  n_ctx = co.n_ctx                 ? co.n_ctx
                                                : hp->n_ctx_train < 4096 ? hp->n_ctx_train
                                                                         : 4096;
        const struct executor_gpu_place pl = {.n_gpu_layers = co.n_gpu_layers,
                                              .n_cpu_moe = co.n_cpu_moe,
                                              .devices = co.devices,
                                              .vram_budget = co.vram_budget,
                                              .expert_miss = co.expert_miss,
                                              .pool_policy = co.pool_policy,
                                              .cache_type = co.cache_type};
        if ((rc = executor_gpu_weights_create(en->model, &pl, n_ctx, co.n_batch ? co.n_batch : 512,
                                              o->n_seqs, &en->gpu_w, &e)) < 0) {
            cli_error(en->prog, "%s", e.text[0] ? e.text : common_strerror(rc));
            goto out_close;
        }
        co.gpu_weights = en->gpu_w;
    }
    if ((rc = executor_ctx_create(en->model, &co, &en->ctx, &e)) < 0) {
        cli_error(en->prog, "%s", e.text[0] ? e.text : common_strerror(rc));
        goto out_close;
    }
    if (o->n_seqs > 1) {
        if (!(en->seqs = calloc(o->n_seqs, sizeof(*en->seqs)))) {
            cli_error(en->prog, "out of memory");
            rc = COMMON_ENOMEM;
            goto out_close;
        }
        en->seqs[0] = en->ctx;
        en->n_seqs = o->n_seqs;
        for (uint32_t i = 1; i < o->n_seqs; i++)
            if ((rc = executor_ctx_create(en->model, &co, &en->seqs[i], &e)) < 0) {
                cli_error(en->prog, "context %u: %s", i, e.text[0] ? e.text : common_strerror(rc));
                goto out_close;
            }
    }
    char gd[4096];
    if (executor_ctx_gpu_describe(en->ctx, gd, sizeof(gd)))
        fprintf(stderr, "%s\n", gd);
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
                cli_error(en->prog, "cannot write the trace to '%s'", en->so.trace_out);
                rc = COMMON_EIO;
            }
            if (f && fclose(f) != 0 && rc == COMMON_OK) {
                cli_error(en->prog, "cannot write the trace to '%s'", en->so.trace_out);
                rc = COMMON_EIO;
            }
        }
    }
    struct executor_gpu_pool_stats gs;
    if (en->ctx && executor_ctx_gpu_pool_stats(en->ctx, &gs) && gs.n_slots) {
        char           cb[32];
        const uint64_t picks = gs.hits + gs.misses + gs.cpu_misses;
        char           st[96] = "";
        if (gs.staged || en->stages)
            snprintf(st, sizeof(st), ", %llu parts read from storage through staging",
                     (unsigned long long)gs.staged);
        fprintf(stderr,
                "gpu expert pool: %u slots; %llu picks, %llu found (%.1f%%), %llu copied in "
                "(%s to the device%s), %llu computed on the CPU",
                gs.n_slots, (unsigned long long)picks, (unsigned long long)gs.hits,
                picks ? 100.0 * (double)gs.hits / (double)picks : 0.0,
                (unsigned long long)gs.misses, common_format_size(gs.copied_bytes, cb, sizeof(cb)),
                st, (unsigned long long)gs.cpu_misses);
        if (gs.copy_gbps > 0)
            fprintf(stderr, " (copies at %.2f GB/s", gs.copy_gbps);
        if (gs.copy_gbps > 0 && gs.cpu_gbps > 0)
            fprintf(stderr, ", the CPU at %.2f GB/s of expert bytes", gs.cpu_gbps);
        if (gs.copy_gbps > 0)
            fputc(')', stderr);
        if (gs.copy_timed && gs.copy_busy_ns)
            fprintf(stderr,
                    "; copying took %.1f ms, the kernels waited %.1f ms for copies (%.0f%% of the "
                    "copy time hidden behind compute)",
                    (double)gs.copy_busy_ns / 1e6, (double)gs.copy_stall_ns / 1e6,
                    gs.copy_stall_ns >= gs.copy_busy_ns
                        ? 0.0
                        : 100.0 * (double)(gs.copy_busy_ns - gs.copy_stall_ns) /
                              (double)gs.copy_busy_ns);
        if (gs.on_demand)
            fprintf(stderr, "; %s of device memory mapped behind its slots as they filled",
                    common_format_size(gs.mapped_bytes, cb, sizeof(cb)));
        fputc('\n', stderr);
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

int cli_engine_close(struct cli_engine *en)
{
    int rc = en->ctx ? cli_engine_report(en) : COMMON_OK;
    for (uint32_t i = 1; i < en->n_seqs; i++)
        executor_ctx_destroy(en->seqs[i]);
    free(en->seqs);
    en->seqs = NULL;
    en->n_seqs = 0;
    executor_ctx_destroy(en->ctx);
    en->ctx = NULL;
    executor_gpu_weights_destroy(en->gpu_w);
    if (en->desc)
        engine_close_stream(en);
    else
        executor_model_destroy(en->model);
    common_gguf_close(en->gguf);
    executor_threadpool_destroy(en->pool);
    memset(en, 0, sizeof(*en));
    return rc;
}

/* ---- session --------------------------------------------------------------------------------- */

void cli_session_opts_default(struct cli_session_opts *o, const char *prog)
{
    memset(o, 0, sizeof(*o));
    o->prog = prog;
    o->n_predict = 128;
    o->repeat_last_n = 64;
    o->sampler = (struct router_sampler_opts){
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f};
}

/* The model and context rows of the session table. */
static void session_model_rows(struct common_opt *rows, size_t cap, struct cli_session_opts *o)
{
    const struct common_opt r[] = {
        {.name = "model",
         .short_name = "m",
         .type = COMMON_OPT_STR,
         .target = &o->model,
         .metavar = "PATH",
         .help = "GGUF model (the first split of a split model)",
         .required = true},
        {.name = "n-predict",
         .short_name = "n",
         .type = COMMON_OPT_U32,
         .target = &o->n_predict,
         .max = 1u << 24,
         .help = "tokens to generate (chat: most tokens per reply)",
         .def = "128"},
        {.name = "threads",
         .short_name = "t",
         .type = COMMON_OPT_U32,
         .target = &o->n_threads,
         .min = 1,
         .max = 256,
         .help = "threads",
         .def = "physical cores"},
        {.name = "ctx-size",
         .short_name = "c",
         .type = COMMON_OPT_U32,
         .target = &o->n_ctx,
         .max = 1u << 24,
         .help = "context (KV cache) size, for the whole conversation in chat; 0 = the model's, "
                 "at most 4096",
         .def = "0"},
        {.name = "batch-size",
         .short_name = "b",
         .type = COMMON_OPT_U32,
         .target = &o->n_batch,
         .min = 1,
         .max = 1u << 16,
         .help = "prompt tokens per forward batch",
         .def = "512"},
        {.name = "cache-type",
         .short_name = "ctk",
         .type = COMMON_OPT_CALLBACK,
         .target = &o->cache,
         .parse = common_cache_type_opt,
         .metavar = "f16|q8_0",
         .help = "KV cache type",
         .def = "f16"},
        {0},
    };
    assert(sizeof(r) <= cap * sizeof(*rows));
    (void)cap;
    memcpy(rows, r, sizeof(r));
}

/* The sampler rows of the session table, llama.cpp's names and meanings. */
static void session_sampling_rows(struct common_opt *rows, size_t cap, struct cli_session_opts *o)
{
    struct router_sampler_opts *so = &o->sampler;
    const struct common_opt     r[] = {
            {.name = "temp",
             .type = COMMON_OPT_F32,
             .target = &so->temperature,
             .help = "temperature; 0 = greedy (argmax)",
             .def = "0.8"},
            {.name = "top-k",
             .type = COMMON_OPT_I32,
             .target = &so->top_k,
             .max = 1u << 24,
             .metavar = "K",
             .help = "keep the K most likely tokens; 0 = off",
             .def = "40"},
            {.name = "top-p",
             .type = COMMON_OPT_F32,
             .target = &so->top_p,
             .metavar = "P",
             .help = "nucleus sampling; 1 = off",
             .def = "0.95"},
            {.name = "min-p",
             .type = COMMON_OPT_F32,
             .target = &so->min_p,
             .max = 1,
             .metavar = "P",
             .help = "drop tokens below P * max prob; 0 = off",
             .def = "0.05"},
            {.name = "seed",
             .short_name = "s",
             .type = COMMON_OPT_U64,
             .target = &so->seed,
             .help = "sampling seed; 0 = from the clock",
             .def = "0"},
            {.name = "repeat-penalty",
             .type = COMMON_OPT_F32,
             .target = &so->repeat_penalty,
             .max = 100,
             .help = "penalise the tokens of the last --repeat-last-n: positive logits divided "
                         "by X, negative ones multiplied; 1 = off",
             .def = "1"},
            {.name = "repeat-last-n",
             .type = COMMON_OPT_U32,
             .target = &o->repeat_last_n,
             .max = 1u << 24,
             .help = "tokens the penalties look back at; 0 = no penalties (at most 4096 are kept)",
             .def = "64"},
            {.name = "presence-penalty",
             .type = COMMON_OPT_F32,
             .target = &so->presence_penalty,
             .min = -100,
             .max = 100,
             .help = "subtract X from the logit of each token present in that window; 0 = off",
             .def = "0"},
            {.name = "frequency-penalty",
             .type = COMMON_OPT_F32,
             .target = &so->frequency_penalty,
             .min = -100,
             .max = 100,
             .help = "subtract X times its count from the logit of each token in that window; "
                         "0 = off",
             .def = "0"},
            {0},
    };
    assert(sizeof(r) <= cap * sizeof(*rows));
    (void)cap;
    memcpy(rows, r, sizeof(r));
}

void cli_session_table_init(struct cli_session_table *t, struct cli_session_opts *o)
{
    session_model_rows(t->model, sizeof(t->model) / sizeof(t->model[0]), o);
    session_sampling_rows(t->sampling, sizeof(t->sampling) / sizeof(t->sampling[0]), o);
    cli_stream_table_init(&t->stream, &o->stream);
    t->groups[0] = (struct common_opt_group){.title = "Model options", .opts = t->model};
    t->groups[1] = (struct common_opt_group){.title = "Sampling options", .opts = t->sampling};
    t->groups[2] = (struct common_opt_group){.title = CLI_STREAM_TITLE, .opts = t->stream.rows};
    t->groups[3] = (struct common_opt_group){0};
}

/* True when the penalties change the logits (llama.cpp: --repeat-last-n 0 turns them off). */
static bool session_has_penalties(const struct cli_session_opts *o)
{
    const struct router_sampler_opts *so = &o->sampler;
    return o->repeat_last_n > 0 && ((so->repeat_penalty != 0.0f && so->repeat_penalty != 1.0f) ||
                                    so->presence_penalty != 0.0f || so->frequency_penalty != 0.0f);
}

int cli_session_open(struct cli_session *s, const struct cli_session_opts *o, bool need_vocab)
{
    struct common_errmsg e = {{0}};
    int                  rc;
    memset(s, 0, sizeof(*s));
    executor_kernels_init();
    struct cli_engine_opts eo = {
        .prog = o->prog,
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
            cli_error(s->engine.prog, "%s: no usable tokenizer: %s", o->model,
                      e.text[0] ? e.text : common_strerror(rc));
            goto out_close;
        }
    }
    s->n_vocab = executor_ctx_n_vocab(s->ctx);
    struct router_sampler_opts so = o->sampler;
    so.penalty_last_n = (int32_t)o->repeat_last_n;
    if (!session_has_penalties(o)) {
        so.repeat_penalty = 1.0f;
        so.presence_penalty = so.frequency_penalty = 0.0f;
        so.penalty_last_n = 0;
    }
    if ((rc = router_sampler_init(&s->sampler, &so, s->n_vocab)) < 0) {
        cli_error(s->engine.prog, "sampler options rejected: %s", common_strerror(rc));
        goto out_close;
    }
    s->logits = malloc((size_t)s->n_vocab * sizeof(*s->logits));
    if (!s->logits) {
        rc = COMMON_ENOMEM;
        cli_error(s->engine.prog, "out of memory");
        goto out_close;
    }
    return COMMON_OK;

out_close:
    cli_session_close(s);
    return rc < 0 ? rc : COMMON_EINVAL;
}

int cli_session_close(struct cli_session *s)
{
    free(s->logits);
    router_sampler_fini(&s->sampler);
    router_vocab_destroy(s->vocab);
    int rc = cli_engine_close(&s->engine);
    memset(s, 0, sizeof(*s));
    return rc;
}

int cli_session_feed(struct cli_session *s, const int32_t *tokens, uint32_t n)
{
    struct common_errmsg e = {{0}};
    if (executor_ctx_n_past(s->ctx) + (uint64_t)n > executor_ctx_n_ctx(s->ctx)) {
        cli_error(s->engine.prog,
                  "%u more tokens do not fit: %u of the %u context positions are used (use -c)", n,
                  executor_ctx_n_past(s->ctx), executor_ctx_n_ctx(s->ctx));
        return COMMON_ERANGE;
    }
    for (uint32_t i = 0; i < n; i++)
        router_sampler_accept(&s->sampler, tokens[i]);
    int rc = executor_ctx_decode(s->ctx, tokens, n, s->logits, NULL, &e);
    if (rc < 0)
        cli_error(s->engine.prog, "%s", e.text[0] ? e.text : common_strerror(rc));
    return rc;
}

int cli_session_pick(struct cli_session *s, int32_t *id)
{
    /* Greedy (--temp 0) is the sampler's own case: argmax, after the penalties if any. */
    int rc = router_sampler_pick(&s->sampler, s->logits, id);
    if (rc < 0)
        cli_error(s->engine.prog, "sampling failed: %s", common_strerror(rc));
    return rc;
}

bool cli_session_is_full(const struct cli_session *s)
{
    return executor_ctx_n_past(s->ctx) >= executor_ctx_n_ctx(s->ctx);
}
