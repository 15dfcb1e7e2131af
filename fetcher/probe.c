/* fetcher/probe.c - the storage limit: random expert-part reads through the fetcher's own engine.
 */
#include "fetcher.h"

#include <stdlib.h>
#include <string.h>

#include "io.h"

/* One expert part to read: file, offset, length. */
struct probe_part {
    uint32_t file;
    uint64_t offset, size;
};

static uint64_t probe_rand(uint64_t *s)
{
    /* xorshift64*: deterministic order for a given seed. */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * UINT64_C(2685821657736338717);
}

/* The buffers and the engine of one probe. */
struct probe_run {
    struct probe_part     *parts;     /* owned: n parts in read order */
    uint64_t               n;         /* parts */
    uint64_t               region;    /* bytes of one buffer: the largest aligned part */
    uint32_t               qd;        /* reads in flight at most */
    uint8_t               *mem;       /* owned: qd buffers of `region` bytes */
    struct fetcher_io_req *reqs;      /* owned: qd, one submit batch */
    struct fetcher_io_cqe *cqes;      /* owned: qd, completions */
    uint32_t              *free_bufs; /* owned: qd, indices of idle buffers */
    struct fetcher_io     *io;        /* owned */
};

/* Lists the parts to read (every part of n_keys experts: the replay's keys in order, else every
 * expert of the model in a random order) and the buffer size they need. */
static int probe_parts(const struct common_model *m, const struct fetcher_probe_opts *o,
                       uint64_t n_keys, struct probe_run *r)
{
    const bool replay = o->keys != NULL;
    /* A QSF bundle is one read of its stored bytes, as the fetcher reads it. */
    const bool qsf = common_gguf_is_qsf(m->gguf) && !m->ffn_streamed;
    int        rc;
    r->n = n_keys * (qsf ? 1 : COMMON_EXPERT_PART_COUNT);
    if (!(r->parts = calloc(r->n, sizeof(*r->parts))))
        return COMMON_ENOMEM;
    for (uint64_t k = 0, i = 0; k < n_keys; k++) {
        uint32_t l =
            replay ? o->keys[k].layer : m->hp.n_layer_dense_lead + (uint32_t)(k / m->hp.n_expert);
        uint32_t x = replay ? o->keys[k].expert : (uint32_t)(k % m->hp.n_expert);
        if (qsf) {
            struct common_qsf_bundle b;
            if ((rc = common_gguf_bundle(m->gguf, l, x, &b)) < 0)
                return rc;
            r->parts[i++] = (struct probe_part){b.file, b.offset, b.stored};
            uint64_t len = (b.stored + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN;
            r->region = len > r->region ? len : r->region;
            continue;
        }
        for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++, i++) {
            struct common_span s;
            if ((rc = common_model_expert_span(m, l, x, (enum common_expert_part)p, &s)) < 0)
                return rc;
            r->parts[i] = (struct probe_part){s.split, s.offset, s.size};
            uint64_t len = (s.offset + s.size + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN -
                           s.offset / FETCHER_ALIGN * FETCHER_ALIGN;
            r->region = len > r->region ? len : r->region;
        }
    }
    /* Random order, each part at most once: no read finds its bytes cached by an earlier one.
     * A replay keeps the run's order. */
    uint64_t seed = o->seed ? o->seed : 1;
    for (uint64_t i = r->n - 1; !replay && i > 0; i--) {
        uint64_t          j = probe_rand(&seed) % (i + 1);
        struct probe_part t = r->parts[i];
        r->parts[i] = r->parts[j];
        r->parts[j] = t;
    }
    return COMMON_OK;
}

/* Reads the parts in order with qd reads in flight until all are read or max_bytes is reached;
 * fills *out. */
static int probe_loop(struct probe_run *r, uint64_t max_bytes, struct fetcher_probe_result *out,
                      struct common_errmsg *e)
{
    for (uint32_t i = 0; i < r->qd; i++)
        r->free_bufs[i] = i;
    uint32_t n_free = r->qd, in_flight = 0;
    uint64_t next = 0, bytes = 0, wanted = 0, reads = 0;
    uint64_t t0 = common_now_ns();
    int      rc;
    while ((next < r->n && bytes + wanted < max_bytes) || in_flight > 0) {
        uint32_t k = 0;
        while (n_free > 0 && next < r->n && bytes + wanted < max_bytes) {
            const struct probe_part *pp = &r->parts[next];
            uint32_t                 b = r->free_bufs[--n_free];
            r->reqs[k++] = (struct fetcher_io_req){.file = pp->file,
                                                   .offset = pp->offset,
                                                   .len = pp->size,
                                                   .buf = r->mem + (uint64_t)b * r->region +
                                                          pp->offset % FETCHER_ALIGN,
                                                   .user = ((uint64_t)next << 32) | b};
            wanted += pp->size;
            next++;
        }
        if (k > 0) {
            if ((rc = fetcher_io_submit(r->io, r->reqs, k)) < 0)
                return common_errmsg_set(e, rc, "probe: submit failed");
            in_flight += k;
        }
        uint32_t nc = fetcher_io_reap(r->io, r->cqes, r->qd, true);
        for (uint32_t i = 0; i < nc; i++) {
            if (r->cqes[i].err)
                return fetcher_io_describe_error(r->io, &r->cqes[i], e);
            bytes += r->cqes[i].bytes;
            wanted -= r->cqes[i].len;
            reads++;
            r->free_bufs[n_free++] = (uint32_t)(r->cqes[i].user & 0xffffffffu);
            in_flight--;
        }
    }
    double secs = (double)(common_now_ns() - t0) / 1e9;
    *out = (struct fetcher_probe_result){.bytes = bytes,
                                         .reads = reads,
                                         .seconds = secs,
                                         .bytes_per_s = secs > 0 ? (double)bytes / secs : 0.0,
                                         .read_bytes = reads ? bytes / reads : 0,
                                         .queue_depth = r->qd,
                                         .mode = fetcher_io_get_mode(r->io),
                                         .direct = fetcher_io_is_direct(r->io, 0)};
    return COMMON_OK;
}

int fetcher_probe_read(const struct common_gguf *g, const struct common_model *m,
                       const struct fetcher_probe_opts *o, struct fetcher_probe_result *out,
                       struct common_errmsg *e)
{
    struct fetcher_probe_opts def = {0};
    if (!o)
        o = &def;
    if (!g || !m || !common_model_is_moe(m) || o->io == FETCHER_IO_MMAP)
        return common_errmsg_set(e, COMMON_EINVAL, "probe: needs an MoE model and an I/O engine");
    const bool     replay = o->keys != NULL;
    const uint64_t max_bytes = replay         ? UINT64_MAX
                               : o->max_bytes ? o->max_bytes
                                              : UINT64_C(1) << 30;
    const uint64_t n_keys =
        replay ? o->n_keys : (uint64_t)(m->hp.n_layer - m->hp.n_layer_dense_lead) * m->hp.n_expert;
    if (replay && (n_keys == 0 || n_keys > UINT64_MAX / (2 * COMMON_EXPERT_PART_COUNT)))
        return common_errmsg_set(e, COMMON_EINVAL, "probe: nothing to replay");
    for (uint64_t i = 0; replay && i < n_keys; i++)
        if (o->keys[i].layer >= m->hp.n_layer || o->keys[i].expert >= m->hp.n_expert)
            return common_errmsg_set(e, COMMON_EINVAL, "probe: replay key %llu out of range",
                                     (unsigned long long)i);
    struct probe_run        r = {.qd = o->queue_depth ? o->queue_depth : 32};
    const uint32_t          n_files = common_gguf_n_splits(g);
    struct fetcher_io_file *files = calloc(n_files, sizeof(*files));
    int                     rc = COMMON_ENOMEM;
    r.reqs = calloc(r.qd, sizeof(*r.reqs));
    r.cqes = calloc(r.qd, sizeof(*r.cqes));
    r.free_bufs = calloc(r.qd, sizeof(*r.free_bufs));
    if (!files || !r.reqs || !r.cqes || !r.free_bufs)
        goto out_free;
    if ((rc = probe_parts(m, o, n_keys, &r)) < 0)
        goto out_free;
    rc = COMMON_ENOMEM;
    if (!(r.mem = aligned_alloc(FETCHER_ALIGN, (size_t)(r.region * r.qd))))
        goto out_free;
    memset(r.mem, 0, (size_t)(r.region * r.qd));
    for (uint32_t i = 0; i < n_files; i++)
        files[i] = (struct fetcher_io_file){.fd = common_gguf_split_fd(g, i),
                                            .path = common_gguf_split_path(g, i)};
    /* The buffers are registered with io_uring as the fetcher registers its pool. */
    struct fetcher_io_opts io_o = {.mode = o->io,
                                   .direct = o->direct,
                                   .queue_depth = r.qd,
                                   .reg_base = r.mem,
                                   .reg_bytes = r.region * r.qd};
    if ((rc = fetcher_io_create(&io_o, files, n_files, &r.io, e)) < 0)
        goto out_free;
    rc = probe_loop(&r, max_bytes, out, e);

out_free:
    fetcher_io_destroy(r.io);
    free(r.mem);
    free(r.parts);
    free(files);
    free(r.reqs);
    free(r.cqes);
    free(r.free_bufs);
    return rc;
}
