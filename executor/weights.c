/* executor/weights.c - weight sources: mmap of the model files, or pread into owned buffers. */
#include "executor.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ------------------------------------------------------------------------------------------ */
/* mmap source                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* A QSF bundle's state in the mmap source: checked (and, for LZ4, decoded) on first use. */
enum weights_bundle_state { WEIGHTS_B_NEW = 0, WEIGHTS_B_OK, WEIGHTS_B_BAD };

struct weights_mmap {
    const struct common_model *model;    /* borrowed */
    uint32_t                   n_splits; /* mappings */
    uint8_t                  **base;     /* mapped: one read-only mapping per split, munmap'd in
                                            weights_mmap_destroy */
    size_t *len;                         /* owned: bytes of each mapping */
    /* QSF only (NULL otherwise), one entry per bundle (layer * n_expert + expert): */
    void            *bstate_mem; /* owned: the memory of bstate */
    _Atomic uint8_t *bstate;     /* enum weights_bundle_state */
    uint8_t        **decoded;    /* owned: an LZ4 bundle decoded (aligned_alloc), else NULL */
    pthread_mutex_t  bmu;        /* serializes first uses */
};

/* QSF: checks bundle (layer, expert) against its checksum on its first use, decoding an LZ4 one
 * into memory of its own; *raw is then where its decoded bytes start. COMMON_ECORRUPT (logged,
 * naming the bundle) when it fails, on this and every later use. */
static int weights_mmap_bundle(struct weights_mmap *w, uint32_t layer, uint32_t expert,
                               const struct common_qsf_bundle *b, const uint8_t **raw)
{
    const struct common_gguf *g = w->model->gguf;
    uint64_t                  k = (uint64_t)layer * w->model->hp.n_expert + expert;
    uint8_t                   st = atomic_load_explicit(&w->bstate[k], memory_order_acquire);
    if (st == WEIGHTS_B_NEW) {
        pthread_mutex_lock(&w->bmu);
        st = atomic_load_explicit(&w->bstate[k], memory_order_relaxed);
        if (st == WEIGHTS_B_NEW) {
            struct common_errmsg e = {{0}};
            int                  rc = COMMON_ECORRUPT;
            const uint8_t *src = b->file < w->n_splits && b->offset + b->stored <= w->len[b->file]
                                     ? w->base[b->file] + b->offset
                                     : NULL;
            uint8_t       *buf = NULL;
            if (src && b->codec == COMMON_QSF_RAW) { /* checked where it is mapped */
                rc = common_qsf_hash(src, (size_t)b->stored) == b->hash
                         ? COMMON_OK
                         : common_errmsg_set(&e, COMMON_ECORRUPT, "checksum mismatch");
            } else if (src && (buf = aligned_alloc(COMMON_QSF_ALIGN, (size_t)b->buf_bytes))) {
                memcpy(buf + b->read_off, src, (size_t)b->stored);
                rc = common_qsf_bundle_finish(b, buf, &e);
            }
            if (rc == COMMON_OK && b->codec == COMMON_QSF_LZ4) {
                w->decoded[k] = buf;
                buf = NULL;
            }
            free(buf);
            if (rc != COMMON_OK)
                COMMON_LOG_ERR("executor", "%s: layer %u expert %u: %s",
                               common_gguf_split_path(g, b->file), layer, expert,
                               e.text[0] ? e.text : common_strerror(rc));
            st = rc == COMMON_OK ? WEIGHTS_B_OK : WEIGHTS_B_BAD;
            atomic_store_explicit(&w->bstate[k], st, memory_order_release);
        }
        pthread_mutex_unlock(&w->bmu);
    }
    if (st != WEIGHTS_B_OK)
        return COMMON_ECORRUPT;
    *raw = b->codec == COMMON_QSF_LZ4 ? w->decoded[k] : w->base[b->file] + b->offset;
    return COMMON_OK;
}

static int weights_mmap_tensor(void *impl, uint64_t index, const void **data)
{
    struct weights_mmap      *w = impl;
    const struct common_gguf *g = w->model->gguf;
    if (index >= common_gguf_n_tensors(g))
        return COMMON_EINVAL;
    const struct common_gguf_tensor *t = common_gguf_tensor_at(g, index);
    if (t->split >= w->n_splits || t->offset > w->len[t->split] ||
        t->size > w->len[t->split] - t->offset)
        return COMMON_EINVAL;
    *data = w->base[t->split] + t->offset;
    return 0;
}

static int weights_mmap_acquire(void *impl, uint32_t layer, uint32_t expert,
                                enum common_expert_part part, const void **data, uint32_t *slot)
{
    struct weights_mmap     *w = impl;
    struct common_span       s;
    struct common_qsf_bundle b;
    int                      rc = common_model_expert_span(w->model, layer, expert, part, &s);
    if (rc < 0)
        return rc;
    if (w->bstate && !w->model->ffn_streamed &&
        common_gguf_bundle(w->model->gguf, layer, expert, &b) == COMMON_OK) {
        const uint8_t *raw = NULL;
        if ((rc = weights_mmap_bundle(w, layer, expert, &b, &raw)) != COMMON_OK)
            return rc;
        *data = raw + b.part_off[part];
        *slot = 0;
        return 0;
    }
    if (s.split >= w->n_splits || s.offset > w->len[s.split] || s.size > w->len[s.split] - s.offset)
        return COMMON_EINVAL;
    *data = w->base[s.split] + s.offset;
    *slot = 0;
    return 0;
}

static void weights_mmap_expert_error(void *impl, uint32_t layer, uint32_t expert,
                                      struct common_errmsg *out)
{
    struct weights_mmap     *w = impl;
    struct common_qsf_bundle b;
    out->text[0] = '\0';
    if (!w->bstate || layer >= w->model->hp.n_layer || expert >= w->model->hp.n_expert ||
        common_gguf_bundle(w->model->gguf, layer, expert, &b) != COMMON_OK)
        return;
    uint64_t k = (uint64_t)layer * w->model->hp.n_expert + expert;
    if (atomic_load_explicit(&w->bstate[k], memory_order_acquire) == WEIGHTS_B_BAD)
        common_errmsg_set(out, COMMON_ECORRUPT,
                          "%s: layer %u expert %u: the bundle at offset %llu fails its checksum "
                          "or does not decode (sluice verify names every bad one)",
                          common_gguf_split_path(w->model->gguf, b.file), layer, expert,
                          (unsigned long long)b.offset);
}

static int weights_mmap_release(void *impl, uint32_t slot)
{
    (void)impl;
    (void)slot;
    return COMMON_OK;
}

static void weights_mmap_destroy(void *impl)
{
    struct weights_mmap *w = impl;
    if (!w)
        return;
    for (uint32_t i = 0; i < w->n_splits && w->base; i++)
        if (w->base[i])
            munmap(w->base[i], w->len[i]);
    free(w->base);
    free(w->len);
    if (w->bstate) {
        uint64_t n = (uint64_t)w->model->hp.n_layer * w->model->hp.n_expert;
        for (uint64_t k = 0; k < n && w->decoded; k++)
            free(w->decoded[k]);
        pthread_mutex_destroy(&w->bmu);
    }
    free(w->bstate_mem);
    free(w->decoded);
    free(w);
}

static const struct executor_weight_ops weights_mmap_ops = {
    .tensor = weights_mmap_tensor,
    .expert_acquire = weights_mmap_acquire,
    .expert_release = weights_mmap_release,
    .destroy = weights_mmap_destroy,
    .expert_error = weights_mmap_expert_error,
};

int executor_weights_mmap_create(const struct common_model          *m,
                                 const struct executor_weights_opts *o,
                                 struct executor_weights **out, struct common_errmsg *e)
{
    const struct common_gguf *g = m->gguf;
    struct weights_mmap      *w = calloc(1, sizeof(*w));
    struct executor_weights  *ws = calloc(1, sizeof(*ws));
    if (!w || !ws) {
        free(w);
        free(ws);
        return COMMON_ENOMEM;
    }
    w->model = m;
    w->n_splits = common_gguf_n_splits(g);
    w->base = calloc(w->n_splits, sizeof(*w->base));
    w->len = calloc(w->n_splits, sizeof(*w->len));
    if (!w->base || !w->len) {
        weights_mmap_destroy(w);
        free(ws);
        return COMMON_ENOMEM;
    }
    for (uint32_t i = 0; i < w->n_splits; i++) {
        int fd = common_gguf_split_fd(g, i);
        if (fd < 0) {
            weights_mmap_destroy(w);
            free(ws);
            return common_errmsg_set(e, COMMON_EINVAL, "model has no file to map (split %u)", i);
        }
        size_t len = (size_t)common_gguf_split_size(g, i);
        if (len == 0)
            continue;
        int   flags = MAP_SHARED | (o && o->populate ? MAP_POPULATE : 0);
        void *p = mmap(NULL, len, PROT_READ, flags, fd, 0);
        if (p == MAP_FAILED) {
            weights_mmap_destroy(w);
            free(ws);
            return common_errmsg_set(e, COMMON_EIO, "mmap of '%s' (%zu bytes) failed",
                                     common_gguf_split_path(g, i), len);
        }
        w->base[i] = p;
        w->len[i] = len;
    }
    if (common_gguf_is_qsf(g) && common_model_is_moe(m)) {
        uint64_t n = (uint64_t)m->hp.n_layer * m->hp.n_expert;
        pthread_mutex_init(&w->bmu, NULL);
        w->bstate = w->bstate_mem = calloc(n ? n : 1, sizeof(*w->bstate));
        w->decoded = calloc(n ? n : 1, sizeof(*w->decoded));
        if (!w->bstate || !w->decoded) {
            if (!w->bstate) /* destroy tears the mutex down with the table only */
                pthread_mutex_destroy(&w->bmu);
            weights_mmap_destroy(w);
            free(ws);
            return COMMON_ENOMEM;
        }
    }
    /* QSF: every resident tensor is checked once against its checksum before it is used. */
    for (uint64_t i = 0; common_gguf_is_qsf(g) && i < common_gguf_n_tensors(g); i++) {
        const void *data;
        int         rc;
        if (common_gguf_tensor_bundled(g, i) || weights_mmap_tensor(w, i, &data) != COMMON_OK)
            continue;
        if ((rc = common_gguf_check_tensor(g, i, data, e)) != COMMON_OK) {
            weights_mmap_destroy(w);
            free(ws);
            return rc;
        }
    }
    ws->ops = &weights_mmap_ops;
    ws->impl = w;
    ws->model = m;
    *out = ws;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* pread source                                                                                */
/* ------------------------------------------------------------------------------------------ */

#define WEIGHTS_ALIGN        64
#define WEIGHTS_PROGRESS_MIN (256ull << 20) /* resident bytes above which progress is shown */

struct weights_slot {
    uint32_t layer, expert, part; /* key of the bytes held */
    bool     valid;               /* the bytes of the key are loaded */
    uint32_t pins;                /* loans not yet released */
    uint64_t last_use;            /* clock of the last acquire (LRU) */
};

struct weights_pread {
    const struct common_model *model;     /* borrowed */
    executor_read_span_fn      read_span; /* how bytes are read */
    uint8_t                  **tensors;   /* owned: per tensor index, NULL for expert tensors */
    uint32_t                   n_slots;
    size_t                     slot_bytes; /* largest expert part */
    uint8_t                   *slot_mem;   /* owned: n_slots * slot_bytes */
    struct weights_slot       *slots;      /* owned: n_slots */
    uint64_t                   clock;      /* under mu */
    pthread_mutex_t            mu;         /* guards slots and clock; reads happen under it */
};

static int weights_pread_tensor(void *impl, uint64_t index, const void **data)
{
    struct weights_pread *w = impl;
    if (index >= common_gguf_n_tensors(w->model->gguf) || !w->tensors[index])
        return COMMON_EINVAL;
    *data = w->tensors[index];
    return 0;
}

static int weights_pread_acquire(void *impl, uint32_t layer, uint32_t expert,
                                 enum common_expert_part part, const void **data, uint32_t *slot)
{
    struct weights_pread *w = impl;
    struct common_span    s;
    int                   rc = common_model_expert_span(w->model, layer, expert, part, &s);
    if (rc < 0)
        return rc;
    if (s.size > w->slot_bytes || w->n_slots == 0)
        return COMMON_EINVAL;
    pthread_mutex_lock(&w->mu);
    uint32_t hit = UINT32_MAX, victim = UINT32_MAX;
    for (uint32_t i = 0; i < w->n_slots; i++) {
        struct weights_slot *sl = &w->slots[i];
        if (sl->valid && sl->layer == layer && sl->expert == expert && sl->part == (uint32_t)part)
            hit = i;
        if (sl->pins == 0 && (victim == UINT32_MAX || !sl->valid ||
                              (w->slots[victim].valid && sl->last_use < w->slots[victim].last_use)))
            victim = i;
    }
    if (hit == UINT32_MAX) {
        if (victim == UINT32_MAX) {
            pthread_mutex_unlock(&w->mu);
            return COMMON_EAGAIN;
        }
        struct weights_slot *sl = &w->slots[victim];
        uint8_t             *dst = w->slot_mem + (size_t)victim * w->slot_bytes;
        sl->valid = false;
        rc = w->read_span(w->model->gguf, &s, dst, NULL);
        if (rc < 0) {
            pthread_mutex_unlock(&w->mu);
            return rc;
        }
        sl->layer = layer;
        sl->expert = expert;
        sl->part = (uint32_t)part;
        sl->valid = true;
        hit = victim;
    }
    w->slots[hit].pins++;
    w->slots[hit].last_use = ++w->clock;
    pthread_mutex_unlock(&w->mu);
    *data = w->slot_mem + (size_t)hit * w->slot_bytes;
    *slot = hit;
    return 0;
}

static int weights_pread_release(void *impl, uint32_t slot)
{
    struct weights_pread *w = impl;
    pthread_mutex_lock(&w->mu);
    if (slot < w->n_slots && w->slots[slot].pins > 0)
        w->slots[slot].pins--;
    pthread_mutex_unlock(&w->mu);
    return COMMON_OK;
}

static void weights_pread_destroy(void *impl)
{
    struct weights_pread *w = impl;
    if (!w)
        return;
    if (w->tensors)
        for (uint64_t i = 0; i < common_gguf_n_tensors(w->model->gguf); i++)
            free(w->tensors[i]);
    free(w->tensors);
    free(w->slot_mem);
    free(w->slots);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static const struct executor_weight_ops weights_pread_ops = {
    .tensor = weights_pread_tensor,
    .expert_acquire = weights_pread_acquire,
    .expert_release = weights_pread_release,
    .destroy = weights_pread_destroy,
};

static bool weights_is_expert_tensor(const struct common_model *m, uint64_t index)
{
    for (uint32_t il = 0; il < m->hp.n_layer && m->hp.n_expert; il++)
        for (int r = COMMON_ROLE_FFN_GATE_EXPS; r <= COMMON_ROLE_FFN_DOWN_EXPS; r++)
            if (m->layers[il].tensor[r] == (int64_t)index)
                return true;
    return false;
}

int executor_weights_pread_create(const struct common_model          *m,
                                  const struct executor_weights_opts *o,
                                  struct executor_weights **out, struct common_errmsg *e)
{
    if (!o || !o->read_span)
        return common_errmsg_set(e, COMMON_EINVAL, "pread weights need a read_span function");
    if (common_gguf_is_qsf(m->gguf) && common_model_is_moe(m) && !o->no_expert_slots)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "pread weights do not read QSF bundles: stream them (the "
                                 "fetcher) or map the file");
    const struct common_gguf *g = m->gguf;
    uint64_t                  nt = common_gguf_n_tensors(g);
    struct weights_pread     *w = calloc(1, sizeof(*w));
    struct executor_weights  *ws = calloc(1, sizeof(*ws));
    if (!w || !ws) {
        free(w);
        free(ws);
        return COMMON_ENOMEM;
    }
    pthread_mutex_init(&w->mu, NULL);
    w->model = m;
    w->read_span = o->read_span;
    w->tensors = calloc(nt ? nt : 1, sizeof(*w->tensors));
    int rc = COMMON_ENOMEM;
    if (!w->tensors)
        goto out_destroy;
    uint64_t done = 0, last_mib = 0;
    for (uint64_t i = 0; i < nt; i++) {
        if (weights_is_expert_tensor(m, i) || common_model_tensor_is_unused(m, i))
            continue;
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        size_t sz = ((size_t)t->size + WEIGHTS_ALIGN - 1) / WEIGHTS_ALIGN * WEIGHTS_ALIGN;
        w->tensors[i] = aligned_alloc(WEIGHTS_ALIGN, sz ? sz : WEIGHTS_ALIGN);
        if (!w->tensors[i]) {
            rc = COMMON_ENOMEM;
            goto out_destroy;
        }
        struct common_span span = {.split = t->split,
                                   .type = t->type,
                                   .offset = t->offset,
                                   .size = t->size,
                                   .rows = t->ne[1],
                                   .cols = t->ne[0]};
        if ((rc = w->read_span(g, &span, w->tensors[i], e)) < 0 ||
            (rc = common_gguf_check_tensor(g, i, w->tensors[i], e)) < 0)
            goto out_destroy;
        done += t->size;
        if (o->progress && m->bytes_resident > WEIGHTS_PROGRESS_MIN &&
            (done >> 20) >= last_mib + 64) {
            last_mib = done >> 20;
            fprintf(o->progress, "\rreading resident weights: %llu / %llu MiB",
                    (unsigned long long)last_mib, (unsigned long long)(m->bytes_resident >> 20));
            fflush(o->progress);
        }
    }
    if (o->progress && m->bytes_resident > WEIGHTS_PROGRESS_MIN)
        fprintf(o->progress, "\rreading resident weights: %llu MiB done\n",
                (unsigned long long)(done >> 20));
    if (m->hp.n_expert && !o->no_expert_slots) {
        for (uint32_t il = 0; il < m->hp.n_layer; il++)
            for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
                struct common_span s;
                if (common_model_expert_span(m, il, 0, (enum common_expert_part)p, &s) == 0 &&
                    s.size > w->slot_bytes)
                    w->slot_bytes = (size_t)s.size;
            }
        w->slot_bytes = (w->slot_bytes + WEIGHTS_ALIGN - 1) / WEIGHTS_ALIGN * WEIGHTS_ALIGN;
        w->n_slots = o->n_expert_slots ? o->n_expert_slots : 6 * m->hp.n_expert_used;
        w->slots = calloc(w->n_slots, sizeof(*w->slots));
        w->slot_mem = aligned_alloc(WEIGHTS_ALIGN, w->slot_bytes * w->n_slots);
        if (!w->slots || !w->slot_mem) {
            rc = COMMON_ENOMEM;
            goto out_destroy;
        }
    }
    ws->ops = &weights_pread_ops;
    ws->impl = w;
    ws->model = m;
    *out = ws;
    return 0;

out_destroy:
    weights_pread_destroy(w);
    free(ws);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* stream source: resident tensors from a base source, experts from an expert source           */
/* ------------------------------------------------------------------------------------------ */

static const char *const g_part_names[COMMON_EXPERT_PART_COUNT] = {"gate", "up", "down"};

struct weights_stream {
    const struct common_model    *model; /* borrowed */
    struct executor_weights      *base;  /* owned: pread (tensors only) or mmap source */
    struct executor_expert_source src;   /* copied; src.arg borrowed */
    FILE                         *names; /* borrowed: --trace-names sink, or NULL */
};

static int weights_stream_tensor(void *impl, uint64_t index, const void **data)
{
    struct weights_stream *w = impl;
    return w->base->ops->tensor(w->base->impl, index, data);
}

static int weights_stream_acquire(void *impl, uint32_t layer, uint32_t expert,
                                  enum common_expert_part part, const void **data, uint32_t *slot)
{
    struct weights_stream *w = impl;
    if (layer >= w->model->hp.n_layer || expert >= w->model->hp.n_expert ||
        (unsigned)part >= COMMON_EXPERT_PART_COUNT)
        return COMMON_EINVAL;
    int rc = w->src.acquire(w->src.arg, layer, expert, part, data, slot);
    if (rc == 0 && w->names)
        fprintf(w->names, "blk.%u.ffn_%s_exps.weight expert %u\n", layer, g_part_names[part],
                expert);
    return rc;
}

static int weights_stream_release(void *impl, uint32_t slot)
{
    struct weights_stream *w = impl;
    return w->src.release(w->src.arg, slot);
}

static int weights_stream_request(void *impl, uint32_t layer, uint32_t expert,
                                  enum executor_expert_hint hint)
{
    struct weights_stream *w = impl;
    return w->src.request ? w->src.request(w->src.arg, layer, expert, hint) : 0;
}

static bool weights_stream_is_ready(void *impl, uint32_t layer, uint32_t expert)
{
    struct weights_stream *w = impl;
    return w->src.is_ready ? w->src.is_ready(w->src.arg, layer, expert) : true;
}

static void weights_stream_token_begin(void *impl)
{
    struct weights_stream *w = impl;
    if (w->src.token_begin)
        w->src.token_begin(w->src.arg);
}

static void weights_stream_destroy(void *impl)
{
    struct weights_stream *w = impl;
    if (!w)
        return;
    executor_weights_destroy(w->base);
    free(w);
}

static void weights_stream_expert_error(void *impl, uint32_t layer, uint32_t expert,
                                        struct common_errmsg *out)
{
    struct weights_stream *w = impl;
    if (w->src.error)
        w->src.error(w->src.arg, layer, expert, out);
}

static const struct executor_dev_ops *weights_stream_expert_device(void *impl, void **arg)
{
    struct weights_stream *w = impl;
    *arg = w->src.arg;
    return w->src.dev;
}

static void weights_stream_expert_regions(void *impl, const struct executor_region_hooks *h)
{
    struct weights_stream *w = impl;
    if (w->src.regions)
        w->src.regions(w->src.arg, h);
}

static const struct executor_weight_ops weights_stream_ops = {
    .tensor = weights_stream_tensor,
    .expert_acquire = weights_stream_acquire,
    .expert_release = weights_stream_release,
    .destroy = weights_stream_destroy,
    .expert_request = weights_stream_request,
    .expert_is_ready = weights_stream_is_ready,
    .token_begin = weights_stream_token_begin,
    .expert_error = weights_stream_expert_error,
    .expert_regions = weights_stream_expert_regions,
    .expert_device = weights_stream_expert_device,
};

int executor_weights_stream_create(const struct common_model           *m,
                                   const struct executor_weights_opts  *o,
                                   const struct executor_expert_source *src,
                                   struct executor_weights **out, struct common_errmsg *e)
{
    struct executor_weights_opts def = {0};
    if (!o)
        o = &def;
    if (!common_model_is_moe(m))
        return common_errmsg_set(e, COMMON_EINVAL, "a streaming source needs routed experts");
    if (!src || !src->acquire || !src->release)
        return common_errmsg_set(e, COMMON_EINVAL, "expert source without acquire/release");
    struct weights_stream   *w = calloc(1, sizeof(*w));
    struct executor_weights *ws = calloc(1, sizeof(*ws));
    if (!w || !ws) {
        free(w);
        free(ws);
        return COMMON_ENOMEM;
    }
    w->model = m;
    w->src = *src;
    w->names = o->trace_names;
    struct executor_weights_opts bo = *o;
    bo.no_expert_slots = true;
    int rc = o->read_span ? executor_weights_pread_create(m, &bo, &w->base, e)
                          : executor_weights_mmap_create(m, &bo, &w->base, e);
    if (rc < 0) {
        free(w);
        free(ws);
        return rc;
    }
    ws->ops = &weights_stream_ops;
    ws->impl = w;
    ws->model = m;
    *out = ws;
    return 0;
}

void executor_weights_destroy(struct executor_weights *w)
{
    if (!w)
        return;
    if (w->ops && w->ops->destroy)
        w->ops->destroy(w->impl);
    free(w);
}
