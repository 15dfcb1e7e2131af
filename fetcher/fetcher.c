/* fetcher/fetcher.c - the fetcher front: create and destroy, requests, loans (synchronous and
 * asynchronous), the pool and trace getters. */
#include "front.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- names -------------------------------------------------------------------------------- */

static const char *const g_policy_names[] = {"lru", "lfu"};
static const char *const g_io_names[] = {"auto", "uring", "pread", "mmap"};
static const char *const g_prio_names[] = {"demand", "postfetch", "prefetch"};

const char *const fetcher_vram_fill_names[] = {"auto", "ram", "storage", NULL};

const char *fetcher_policy_name(enum fetcher_policy p)
{
    return (unsigned)p < 2 ? g_policy_names[p] : "?";
}

int fetcher_policy_parse(const char *s, enum fetcher_policy *out)
{
    for (unsigned i = 0; i < 2; i++)
        if (strcasecmp(s, g_policy_names[i]) == 0) {
            *out = (enum fetcher_policy)i;
            return COMMON_OK;
        }
    return COMMON_EINVAL;
}

const char *fetcher_io_mode_name(enum fetcher_io_mode m)
{
    return (unsigned)m < 4 ? g_io_names[m] : "?";
}

int fetcher_io_mode_parse(const char *s, enum fetcher_io_mode *out)
{
    for (unsigned i = 0; i < 4; i++)
        if (strcasecmp(s, g_io_names[i]) == 0) {
            *out = (enum fetcher_io_mode)i;
            return COMMON_OK;
        }
    if (strcasecmp(s, "io_uring") == 0) {
        *out = FETCHER_IO_URING;
        return COMMON_OK;
    }
    return COMMON_EINVAL;
}

const char *fetcher_priority_name(enum fetcher_priority p)
{
    return (unsigned)p < FETCHER_PRIO_COUNT ? g_prio_names[p] : "?";
}

/* ---- create / destroy --------------------------------------------------------------------- */

/* A QSF file: one read per bundle (part 0 reads it all, at the bundle's read offset in the
 * slot), the parts where the decoded bundle puts them. */
static int front_layout_qsf(struct fetcher *f, struct common_errmsg *e)
{
    uint64_t n = (uint64_t)f->n_layer * f->n_expert;
    if (!(f->bundles = calloc(n, sizeof(*f->bundles))))
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    for (uint32_t l = 0; l < f->n_layer; l++) {
        for (uint32_t x = 0; x < f->n_expert && common_model_layer_is_moe(f->m, l); x++) {
            struct common_qsf_bundle *b = &f->bundles[(uint64_t)l * f->n_expert + x];
            if (common_gguf_bundle(f->g, l, x, b) != COMMON_OK)
                return common_errmsg_set(e, COMMON_ECORRUPT,
                                         "fetcher: no bundle for layer %u expert %u", l, x);
            struct front_part *pp =
                &f->parts[((uint64_t)l * f->n_expert + x) * COMMON_EXPERT_PART_COUNT];
            for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
                pp[p] = (struct front_part){.file = b->file,
                                            .offset = b->offset,
                                            .size = b->part_size[p],
                                            .data_off = b->part_off[p]};
            pp[0].read_len = b->stored;
            pp[0].read_off = b->read_off;
        }
    }
    return COMMON_OK;
}

static int front_layout(struct fetcher *f, struct common_errmsg *e)
{
    uint64_t n = (uint64_t)f->n_layer * f->n_expert;
    f->parts = calloc(n * COMMON_EXPERT_PART_COUNT, sizeof(*f->parts));
    f->seen = calloc(n, sizeof(*f->seen));
    f->failed = calloc(n, sizeof(*f->failed));
    if (!f->parts || !f->seen || !f->failed)
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    /* QSF: bundles, or a dense model's FFN tensors, are checked after each read. */
    f->checked = common_gguf_is_qsf(f->g);
    if (f->checked && !f->m->ffn_streamed)
        return front_layout_qsf(f, e);
    for (uint32_t l = 0; l < f->n_layer; l++) {
        /* The leading dense layers of deepseek2 have no experts: their parts stay empty. */
        for (uint32_t x = 0; x < f->n_expert && common_model_layer_is_moe(f->m, l); x++) {
            uint64_t region = 0;
            for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
                struct common_span s;
                int rc = common_model_expert_span(f->m, l, x, (enum common_expert_part)p, &s);
                if (rc != COMMON_OK)
                    return common_errmsg_set(e, rc, "fetcher: no span for layer %u expert %u", l,
                                             x);
                struct front_part *pp =
                    &f->parts[((uint64_t)l * f->n_expert + x) * COMMON_EXPERT_PART_COUNT + p];
                uint64_t start = s.offset / FETCHER_ALIGN * FETCHER_ALIGN;
                uint64_t end =
                    (s.offset + s.size + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN;
                pp->file = s.split;
                pp->offset = s.offset;
                pp->size = s.size;
                pp->data_off = region + (s.offset - start);
                pp->read_len = s.size;
                pp->read_off = pp->data_off;
                region += end - start;
            }
        }
    }
    return COMMON_OK;
}

static int front_mmap_init(struct fetcher *f, struct common_errmsg *e)
{
    f->maps = calloc(f->n_splits, sizeof(*f->maps));
    f->map_len = calloc(f->n_splits, sizeof(*f->map_len));
    if (!f->maps || !f->map_len)
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    for (uint32_t s = 0; s < f->n_splits; s++) {
        uint64_t len = common_gguf_split_size(f->g, s);
        void *p = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, common_gguf_split_fd(f->g, s), 0);
        if (p == MAP_FAILED)
            return common_errmsg_set(e, COMMON_EIO, "%s: mmap failed: %s",
                                     common_gguf_split_path(f->g, s), strerror(errno));
        f->maps[s] = p;
        f->map_len[s] = len;
    }
    return COMMON_OK;
}

/* Pool size: explicit, else the budget plan, else one slot per bundle. */
static int front_size_pool(struct fetcher *f, struct common_errmsg *e)
{
    const struct fetcher_opts *o = &f->o;
    uint32_t                   n_bundles = f->n_layer * f->n_expert;
    f->plan.slot_bytes = fetcher_plan_slot_bytes(f->m);
    f->plan.n_bundles = n_bundles;
    if (o->n_slots) {
        f->plan.n_slots = o->n_slots;
    } else if (o->ram_budget) {
        struct fetcher_plan_opts po = {.ram_budget = o->ram_budget,
                                       .kv_bytes = o->kv_bytes,
                                       .act_bytes = o->act_bytes,
                                       .staging_bytes = o->staging_bytes,
                                       .queue_depth = o->queue_depth};
        int                      rc = fetcher_plan_compute(f->m, &po, &f->plan, e);
        if (rc != COMMON_OK)
            return rc;
    } else {
        f->plan.n_slots = n_bundles;
    }
    f->plan.pool_bytes = (uint64_t)f->plan.n_slots * f->plan.slot_bytes;
    return COMMON_OK;
}

/* The pool, the per-slot load table, the I/O engine over the model's files and the I/O thread. */
static int front_pool_and_io(struct fetcher *f, struct common_errmsg *e)
{
    struct fetcher_pool_opts pool_o = {.slot_bytes = f->plan.slot_bytes,
                                       .n_slots = f->plan.n_slots,
                                       .n_layer = f->n_layer,
                                       .n_expert = f->n_expert,
                                       .policy = f->o.policy,
                                       .lfu_halflife = f->o.lfu_halflife,
                                       .no_memfd = f->o.no_memfd};
    int                      rc = fetcher_pool_create(&pool_o, &f->pool, e);
    if (rc != COMMON_OK)
        return rc;
    f->loads = calloc(f->plan.n_slots, sizeof(*f->loads));
    f->reqs = calloc(f->qd, sizeof(*f->reqs));
    f->cqes = calloc(f->qd, sizeof(*f->cqes));
    struct fetcher_io_file *files = calloc(f->n_splits, sizeof(*files));
    if (!f->loads || !f->reqs || !f->cqes || !files) {
        free(files);
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    }
    for (uint32_t s = 0; s < f->n_splits; s++)
        files[s] = (struct fetcher_io_file){.fd = common_gguf_split_fd(f->g, s),
                                            .path = common_gguf_split_path(f->g, s)};
    struct fetcher_io_opts io_o = {.mode = f->o.io,
                                   .direct = f->o.direct,
                                   .queue_depth = f->o.queue_depth,
                                   .n_threads = f->o.io_threads,
                                   .reg_base = fetcher_pool_slot_data(f->pool, 0),
                                   .reg_bytes = f->plan.pool_bytes};
    rc = fetcher_io_create(&io_o, files, f->n_splits, &f->io, e);
    free(files);
    if (rc != COMMON_OK)
        return rc;
    f->mode = fetcher_io_get_mode(f->io);
    if (pthread_create(&f->thread, NULL, fetcher_front_thread, f) != 0)
        return common_errmsg_set(e, COMMON_EAGAIN, "fetcher: cannot start the I/O thread");
    f->thread_started = true;
    return COMMON_OK;
}

int fetcher_create(const struct common_gguf *g, const struct common_model *m,
                   const struct fetcher_opts *o, struct fetcher **out, struct common_errmsg *e)
{
    if (!g || !m || !common_model_is_moe(m))
        return common_errmsg_set(e, COMMON_EINVAL, "fetcher: model has no routed experts");
    struct fetcher_opts opts = o ? *o : (struct fetcher_opts){0};
    if (opts.queue_depth == 0)
        opts.queue_depth = 32;
    if (opts.prefetch_age == 0)
        opts.prefetch_age = 1;
    if ((unsigned)opts.io > FETCHER_IO_MMAP || (unsigned)opts.policy > FETCHER_POLICY_LFU)
        return common_errmsg_set(e, COMMON_EINVAL, "fetcher: bad io mode or policy");
    uint32_t n_splits = common_gguf_n_splits(g);
    for (uint32_t s = 0; s < n_splits; s++)
        if (common_gguf_split_fd(g, s) < 0)
            return common_errmsg_set(e, COMMON_EINVAL, "fetcher: model has no file to read");

    struct fetcher *f = calloc(1, sizeof(*f));
    if (!f)
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    f->g = g;
    f->m = m;
    f->o = opts;
    f->n_layer = m->hp.n_layer;
    f->n_expert = m->hp.n_expert;
    f->n_splits = n_splits;
    f->qd = opts.queue_depth;
    for (uint32_t p = 0; p < FETCHER_PRIO_COUNT; p++)
        f->head[p] = f->tail[p] = FRONT_NONE;
    int rc;
    if (opts.io == FETCHER_IO_MMAP && common_gguf_is_qsf(g) && !m->ffn_streamed) {
        rc = common_errmsg_set(e, COMMON_EINVAL,
                               "a QSF file's bundles are read and checked, not mapped: use --io "
                               "uring or pread (the default), or the GGUF file with --io mmap");
        goto out_destroy;
    }
    if ((rc = front_layout(f, e)) != COMMON_OK || (rc = front_size_pool(f, e)) != COMMON_OK)
        goto out_destroy;
    struct fetcher_trace_opts to = {.n_layer = f->n_layer,
                                    .n_expert = f->n_expert,
                                    .n_slots = opts.io == FETCHER_IO_MMAP ? 0 : f->plan.n_slots,
                                    .warmup_tokens = opts.warmup_tokens};
    if ((rc = fetcher_trace_create(&to, &f->trace)) != COMMON_OK) {
        common_errmsg_set(e, rc, "fetcher: trace: out of memory");
        goto out_destroy;
    }
    if (pthread_mutex_init(&f->mu, NULL) != 0 || pthread_cond_init(&f->cv, NULL) != 0) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "fetcher: mutex init failed");
        goto out_destroy;
    }
    f->sync_init = true;
    if (opts.io == FETCHER_IO_MMAP) {
        f->mode = FETCHER_IO_MMAP;
        rc = front_mmap_init(f, e);
    } else {
        rc = front_pool_and_io(f, e);
    }
    if (rc != COMMON_OK)
        goto out_destroy;
    *out = f;
    return COMMON_OK;

out_destroy:
    fetcher_destroy(f);
    return rc;
}

/* After the I/O thread has stopped: answers every waiter still registered with COMMON_ECLOSED
 * (their loads were abandoned, or no slot freed up), so the callers drop their references. */
static void front_close_waiters(struct fetcher *f)
{
    struct front_wlist all = {0};
    fetcher_front_wlist_splice(&all,
                               &f->ready); /* empty: the I/O thread runs them before it exits */
    fetcher_front_wlist_splice(&all, &f->pending);
    for (uint32_t slot = 0; f->loads && slot < f->plan.n_slots; slot++)
        fetcher_front_wlist_splice(&all, &f->loads[slot].waiters);
    atomic_store_explicit(&f->n_pending, 0, memory_order_relaxed);
    for (struct front_waiter *w = all.head; w; w = w->next)
        w->cb(w->arg, COMMON_ECLOSED, NULL, FETCHER_LOAN_NONE);
}

void fetcher_destroy(struct fetcher *f)
{
    if (!f)
        return;
    if (f->thread_started) {
        pthread_mutex_lock(&f->mu);
        f->stop = true;
        fetcher_front_kick(f);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->thread, NULL);
    }
    front_close_waiters(f);
    fetcher_io_destroy(f->io);
    fetcher_pool_destroy(f->pool);
    fetcher_trace_destroy(f->trace);
    for (uint32_t s = 0; f->maps && s < f->n_splits; s++)
        if (f->maps[s])
            munmap(f->maps[s], (size_t)f->map_len[s]);
    free(f->maps);
    free(f->map_len);
    if (f->sync_init) {
        pthread_cond_destroy(&f->cv);
        pthread_mutex_destroy(&f->mu);
    }
    while (f->chunks) {
        struct front_chunk *c = f->chunks;
        f->chunks = c->next;
        free(c);
    }
    free(f->log);
    free(f->loads);
    free(f->reqs);
    free(f->cqes);
    free(f->parts);
    free(f->bundles);
    free(f->failed);
    free(f->seen);
    free(f);
}

/* ---- requests and loans ------------------------------------------------------------------- */

static bool front_ids_ok(const struct fetcher *f, uint32_t layer, uint32_t expert)
{
    return layer < f->n_layer && expert < f->n_expert && common_model_layer_is_moe(f->m, layer);
}

int fetcher_request(struct fetcher *f, uint32_t layer, uint32_t expert, enum fetcher_priority prio)
{
    if (!front_ids_ok(f, layer, expert) || (unsigned)prio >= FETCHER_PRIO_COUNT)
        return COMMON_EINVAL;
    int rc = COMMON_OK;
    pthread_mutex_lock(&f->mu);
    if (prio != FETCHER_PRIO_PREFETCH)
        fetcher_front_note_access(f, layer, expert);
    if (f->mode == FETCHER_IO_MMAP) {
        if (f->o.mmap_advise) { /* else plain faults at use, as llama.cpp */
            const struct front_part *pp =
                &f->parts[((uint64_t)layer * f->n_expert + expert) * COMMON_EXPERT_PART_COUNT];
            long page = sysconf(_SC_PAGESIZE);
            for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
                uint64_t start = pp[p].offset / (uint64_t)page * (uint64_t)page;
                (void)madvise(f->maps[pp[p].file] + start, pp[p].offset + pp[p].size - start,
                              MADV_WILLNEED);
            }
        }
    } else {
        rc = fetcher_front_ensure(f, layer, expert, prio);
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

int fetcher_acquire(struct fetcher *f, uint32_t layer, uint32_t expert,
                    enum common_expert_part part, const void **data, uint32_t *loan)
{
    if (!front_ids_ok(f, layer, expert) || (unsigned)part >= COMMON_EXPERT_PART_COUNT)
        return COMMON_EINVAL;
    pthread_mutex_lock(&f->mu);
    fetcher_front_note_access(f, layer, expert);
    pthread_mutex_unlock(&f->mu);
    if (f->mode == FETCHER_IO_MMAP) {
        const struct front_part *pp =
            &f->parts[((uint64_t)layer * f->n_expert + expert) * COMMON_EXPERT_PART_COUNT + part];
        *data = f->maps[pp->file] + pp->offset;
        *loan = FETCHER_LOAN_NONE;
        return COMMON_OK;
    }
    struct common_pool_key  key = {layer, expert, COMMON_POOL_BUNDLE};
    struct common_pool_loan l;
    bool                    asked = false; /* this call queued a load of the bundle */
    for (;;) {
        uint64_t seq = fetcher_pool_change_seq(f->pool);
        int      rc = fetcher_pool_try_acquire(f->pool, &key, part, &l);
        if (rc == COMMON_OK)
            break;
        if (rc == COMMON_EAGAIN) {
            /* Loading: make sure it is loading as a demand, then wait for the part. */
            pthread_mutex_lock(&f->mu);
            fetcher_front_promote(f, l.slot, l.gen, FETCHER_PRIO_DEMAND);
            fetcher_front_kick(f);
            pthread_mutex_unlock(&f->mu);
            rc = fetcher_pool_wait_acquire(f->pool, l.slot, l.gen, part, &l);
            if (rc == COMMON_OK)
                break;
            if (rc == COMMON_EAGAIN)
                continue; /* evicted before we ran, or a stale prefetch dropped: ask again */
            return rc;
        }
        pthread_mutex_lock(&f->mu);
        bool failed = f->failed[(uint64_t)layer * f->n_expert + expert];
        if (asked && failed) {
            /* The load this call queued failed before the call could wait for it (a short
             * read returns at once): that is the answer, not a reason to read again. */
            pthread_mutex_unlock(&f->mu);
            return COMMON_EIO;
        }
        rc = fetcher_front_ensure(f, layer, expert, FETCHER_PRIO_DEMAND);
        asked = asked || rc == COMMON_OK;
        pthread_mutex_unlock(&f->mu);
        if (rc == COMMON_EAGAIN) {
            struct fetcher_pool_counts c;
            fetcher_pool_counts(f->pool, &c);
            if (c.n_loading == 0 && c.n_failed == 0)
                return COMMON_EAGAIN; /* every slot is pinned */
            /* This bundle's load failed and nothing is loading: the failed slot may be pinned
             * by the caller itself (an earlier part of the same load), so waiting could last
             * forever. The failure is the answer. */
            if (failed && c.n_loading == 0)
                return COMMON_EIO;
            fetcher_pool_wait_change(f->pool, seq);
        }
    }
    *data = l.data;
    *loan = l.slot;
    return COMMON_OK;
}

int fetcher_acquire_async(struct fetcher *f, uint32_t layer, uint32_t expert,
                          enum common_expert_part part, fetcher_acquire_cb cb, void *arg)
{
    if (!front_ids_ok(f, layer, expert) || (unsigned)part >= COMMON_EXPERT_PART_COUNT || !cb)
        return COMMON_EINVAL;
    if (f->mode == FETCHER_IO_MMAP) {
        const void *data = NULL;
        uint32_t    loan = FETCHER_LOAN_NONE;
        (void)fetcher_acquire(f, layer, expert, part, &data, &loan);
        cb(arg, COMMON_OK, data, loan);
        return COMMON_OK;
    }
    pthread_mutex_lock(&f->mu);
    struct front_waiter *w = fetcher_front_waiter_get(f);
    if (!w) {
        pthread_mutex_unlock(&f->mu);
        return COMMON_ENOMEM;
    }
    *w = (struct front_waiter){
        .layer = layer, .expert = expert, .part = (uint32_t)part, .cb = cb, .arg = arg};
    fetcher_front_note_access(f, layer, expert);
    uint32_t            slot = FRONT_NONE;
    enum front_wstep    st = fetcher_front_waiter_step(f, w, &slot);
    struct front_waiter done = *w;
    struct front_wlist  spent = {0};
    fetcher_front_waiter_place(f, w, st, slot, &spent);
    fetcher_front_waiters_put(f, &spent); /* answered at once: the node is free again */
    pthread_mutex_unlock(&f->mu);
    if (st == FRONT_W_DONE)
        cb(arg, done.rc, done.data, done.loan);
    return COMMON_OK;
}

int fetcher_try_acquire(struct fetcher *f, uint32_t layer, uint32_t expert,
                        enum common_expert_part part, const void **data, uint32_t *loan)
{
    if (!front_ids_ok(f, layer, expert) || (unsigned)part >= COMMON_EXPERT_PART_COUNT)
        return COMMON_EINVAL;
    if (f->mode == FETCHER_IO_MMAP)
        return fetcher_acquire(f, layer, expert, part, data, loan);
    struct common_pool_key  key = {layer, expert, COMMON_POOL_BUNDLE};
    struct common_pool_loan l;
    pthread_mutex_lock(&f->mu);
    fetcher_front_note_access(f, layer,
                              expert); /* once per token and expert: a later acquire skips it */
    pthread_mutex_unlock(&f->mu);
    if (fetcher_pool_try_acquire(f->pool, &key, part, &l) != COMMON_OK)
        return COMMON_EAGAIN;
    *data = l.data;
    *loan = l.slot;
    return COMMON_OK;
}

int fetcher_note_use(struct fetcher *f, uint32_t layer, uint32_t expert, uint32_t n_parts)
{
    if (!front_ids_ok(f, layer, expert) || n_parts == 0)
        return COMMON_EINVAL;
    pthread_mutex_lock(&f->mu);
    fetcher_front_note_access(f, layer, expert);
    pthread_mutex_unlock(&f->mu);
    if (f->mode == FETCHER_IO_MMAP)
        return COMMON_OK;
    struct common_pool_key key = {layer, expert, COMMON_POOL_BUNDLE};
    return fetcher_pool_touch(f->pool, &key, n_parts);
}

bool fetcher_is_ready(struct fetcher *f, uint32_t layer, uint32_t expert)
{
    if (!front_ids_ok(f, layer, expert))
        return false;
    if (f->mode == FETCHER_IO_MMAP)
        return true;
    struct common_pool_key   key = {layer, expert, COMMON_POOL_BUNDLE};
    struct fetcher_pool_peek pk;
    fetcher_pool_peek(f->pool, &key, &pk);
    return pk.slot != COMMON_POOL_NO_SLOT && pk.state == COMMON_POOL_SLOT_READY;
}

void fetcher_release(struct fetcher *f, uint32_t loan)
{
    if (loan == FETCHER_LOAN_NONE || !f->pool)
        return;
    fetcher_pool_release(f->pool, loan);
    /* After the unpin: an asynchronous acquire that counted itself before its last look at the
     * pool is seen here (the pool mutex orders the two; see fetcher_front_waiter_step). Only a
     * wake-up: the I/O thread retries, no callback runs here. */
    if (atomic_load_explicit(&f->n_pending, memory_order_relaxed) > 0) {
        pthread_mutex_lock(&f->mu);
        f->retry = true;
        fetcher_front_kick(f);
        pthread_mutex_unlock(&f->mu);
    }
}

/* Retires pool slots toward the wanted count, tracing the READY ones given up. Under f->mu. */
static void fetcher_retire_locked(struct fetcher *f, uint32_t want)
{
    struct fetcher_pool_victim ev[64];
    uint32_t                   n;
    do {
        n = fetcher_pool_retire(f->pool, want, ev, 64);
        for (uint32_t i = 0; i < n; i++) {
            fetcher_trace_evict(f->trace, ev[i].key.layer, ev[i].key.expert,
                                ev[i].origin == FETCHER_PRIO_PREFETCH && ev[i].n_uses == 0);
            fetcher_trace_resident(f->trace, ev[i].key.layer, -1);
        }
    } while (n == 64);
}

uint32_t fetcher_shrink_pool(struct fetcher *f, uint32_t n_keep)
{
    if (!f->pool)
        return 0;
    const uint32_t n = fetcher_pool_n_slots(f->pool);
    if (n_keep < 1)
        n_keep = 1;
    uint32_t retired = 0, want = 0;
    pthread_mutex_lock(&f->mu);
    fetcher_retire_locked(f, n_keep < n ? n - n_keep : 0);
    fetcher_pool_retired(f->pool, &retired, &want);
    pthread_mutex_unlock(&f->mu);
    return retired;
}

void fetcher_token_begin(struct fetcher *f)
{
    pthread_mutex_lock(&f->mu);
    f->explicit_tokens = true;
    fetcher_front_new_token(f);
    if (f->pool) /* slots still to give up (fetcher_shrink_pool) that were pinned before */
        fetcher_retire_locked(f, 0);
    pthread_mutex_unlock(&f->mu);
}

struct fetcher_trace *fetcher_get_trace(struct fetcher *f)
{
    return f->trace;
}

const struct fetcher_plan *fetcher_get_plan(const struct fetcher *f)
{
    return &f->plan;
}

enum fetcher_io_mode fetcher_get_io_mode(const struct fetcher *f)
{
    return f->mode;
}

bool fetcher_is_direct(const struct fetcher *f)
{
    return f->io && fetcher_io_is_direct(f->io, 0);
}

void fetcher_last_error(struct fetcher *f, struct common_errmsg *out)
{
    pthread_mutex_lock(&f->mu);
    *out = f->last_error;
    pthread_mutex_unlock(&f->mu);
}

void fetcher_expert_error(struct fetcher *f, uint32_t layer, uint32_t expert,
                          struct common_errmsg *out)
{
    out->text[0] = '\0';
    pthread_mutex_lock(&f->mu);
    const uint32_t n = f->n_recent_errors;
    for (uint32_t i = 0; i < n && i < FRONT_RECENT_ERRORS; i++) {
        const uint32_t r = (n - 1 - i) % FRONT_RECENT_ERRORS; /* the newest first */
        if (f->recent_errors[r].layer == layer && f->recent_errors[r].expert == expert) {
            *out = f->recent_errors[r].msg;
            break;
        }
    }
    pthread_mutex_unlock(&f->mu);
}

void fetcher_get_pool_counts(struct fetcher *f, struct fetcher_pool_counts *out)
{
    if (!f->pool) {
        *out = (struct fetcher_pool_counts){0};
        return;
    }
    fetcher_pool_counts(f->pool, out);
}

int fetcher_get_pool_fd(const struct fetcher *f)
{
    return f->pool ? fetcher_pool_fd(f->pool) : -1;
}

const void *fetcher_get_pool_base(const struct fetcher *f)
{
    return f->pool ? fetcher_pool_base(f->pool) : NULL;
}

uint64_t fetcher_get_pool_bytes(const struct fetcher *f)
{
    return f->pool ? fetcher_pool_segment_bytes(f->pool) : 0;
}

int fetcher_load_log_start(struct fetcher *f, uint64_t cap)
{
    if (!f || cap == 0 || cap > (UINT64_C(1) << 32))
        return COMMON_EINVAL;
    struct fetcher_probe_key *log = calloc((size_t)cap, sizeof(*log));
    if (!log)
        return COMMON_ENOMEM;
    pthread_mutex_lock(&f->mu);
    free(f->log);
    f->log = log;
    f->log_n = 0;
    f->log_cap = cap;
    pthread_mutex_unlock(&f->mu);
    return COMMON_OK;
}

void fetcher_front_log_load(struct fetcher *f, uint32_t layer, uint32_t expert)
{
    pthread_mutex_lock(&f->mu);
    front_log_load_locked(f, layer, expert);
    pthread_mutex_unlock(&f->mu);
}

uint64_t fetcher_load_log_count(struct fetcher *f)
{
    pthread_mutex_lock(&f->mu);
    uint64_t n = f->log_n;
    pthread_mutex_unlock(&f->mu);
    return n;
}

uint64_t fetcher_load_log_take(struct fetcher *f, struct fetcher_probe_key **out)
{
    pthread_mutex_lock(&f->mu);
    *out = f->log;
    uint64_t n = f->log_n;
    f->log = NULL;
    f->log_n = f->log_cap = 0;
    pthread_mutex_unlock(&f->mu);
    return n;
}
