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

int fetcher_probe_read(const struct common_gguf *g, const struct common_model *m,
                       const struct fetcher_probe_opts *o, struct fetcher_probe_result *out,
                       struct common_errmsg *e)
{
    struct fetcher_probe_opts def = {0};
    if (!o)
        o = &def;
    if (!g || !m || !common_model_is_moe(m) || o->io == FETCHER_IO_MMAP)
        return common_errmsg_set(e, COMMON_EINVAL, "probe: needs an MoE model and an I/O engine");
    const uint32_t qd = o->queue_depth ? o->queue_depth : 32;
    const bool     replay = o->keys != NULL;
    const uint64_t max_bytes = replay         ? UINT64_MAX
                               : o->max_bytes ? o->max_bytes
                                              : UINT64_C(1) << 30;
    const uint64_t n_keys = replay ? o->n_keys : (uint64_t)m->hp.n_layer * m->hp.n_expert;
    if (replay && (n_keys == 0 || n_keys > UINT64_MAX / (2 * COMMON_EXPERT_PART_COUNT)))
        return common_errmsg_set(e, COMMON_EINVAL, "probe: nothing to replay");
    for (uint64_t i = 0; replay && i < n_keys; i++)
        if (o->keys[i].layer >= m->hp.n_layer || o->keys[i].expert >= m->hp.n_expert)
            return common_errmsg_set(e, COMMON_EINVAL, "probe: replay key %llu out of range",
                                     (unsigned long long)i);
    const uint64_t          n = n_keys * COMMON_EXPERT_PART_COUNT;
    const uint32_t          n_files = common_gguf_n_splits(g);
    struct probe_part      *parts = calloc(n, sizeof(*parts));
    struct fetcher_io_file *files = calloc(n_files, sizeof(*files));
    struct fetcher_io_req  *reqs = calloc(qd, sizeof(*reqs));
    struct fetcher_io_cqe  *cqes = calloc(qd, sizeof(*cqes));
    uint32_t               *free_bufs = calloc(qd, sizeof(*free_bufs));
    uint8_t                *mem = NULL;
    struct fetcher_io      *io = NULL;
    int                     rc = COMMON_ENOMEM;
    if (!parts || !files || !reqs || !cqes || !free_bufs)
        goto out_free;
    uint64_t region = 0;
    for (uint64_t k = 0, i = 0; k < n_keys; k++) {
        uint32_t l = replay ? o->keys[k].layer : (uint32_t)(k / m->hp.n_expert);
        uint32_t x = replay ? o->keys[k].expert : (uint32_t)(k % m->hp.n_expert);
        for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++, i++) {
            struct common_span s;
            if ((rc = common_model_expert_span(m, l, x, (enum common_expert_part)p, &s)) < 0)
                goto out_free;
            parts[i] = (struct probe_part){s.split, s.offset, s.size};
            uint64_t r = (s.offset + s.size + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN -
                         s.offset / FETCHER_ALIGN * FETCHER_ALIGN;
            region = r > region ? r : region;
        }
    }
    /* Random order, each part at most once: no read finds its bytes cached by an earlier one.
     * A replay keeps the run's order. */
    uint64_t seed = o->seed ? o->seed : 1;
    for (uint64_t i = n - 1; !replay && i > 0; i--) {
        uint64_t          j = probe_rand(&seed) % (i + 1);
        struct probe_part t = parts[i];
        parts[i] = parts[j];
        parts[j] = t;
    }
    mem = aligned_alloc(FETCHER_ALIGN, (size_t)(region * qd));
    if (!mem)
        goto out_free;
    memset(mem, 0, (size_t)(region * qd));
    for (uint32_t i = 0; i < n_files; i++)
        files[i] = (struct fetcher_io_file){.fd = common_gguf_split_fd(g, i),
                                            .path = common_gguf_split_path(g, i)};
    /* The buffers are registered with io_uring as the fetcher registers its pool. */
    struct fetcher_io_opts io_o = {.mode = o->io,
                                   .direct = o->direct,
                                   .queue_depth = qd,
                                   .reg_base = mem,
                                   .reg_bytes = region * qd};
    if ((rc = fetcher_io_create(&io_o, files, n_files, &io, e)) < 0)
        goto out_free;
    for (uint32_t i = 0; i < qd; i++)
        free_bufs[i] = i;
    uint32_t n_free = qd, in_flight = 0;
    uint64_t next = 0, bytes = 0, wanted = 0, reads = 0;
    uint64_t t0 = common_now_ns();
    while ((next < n && bytes + wanted < max_bytes) || in_flight > 0) {
        uint32_t k = 0;
        while (n_free > 0 && next < n && bytes + wanted < max_bytes) {
            const struct probe_part *pp = &parts[next];
            uint32_t                 b = free_bufs[--n_free];
            reqs[k++] = (struct fetcher_io_req){.file = pp->file,
                                                .offset = pp->offset,
                                                .len = pp->size,
                                                .buf = mem + (uint64_t)b * region +
                                                       pp->offset % FETCHER_ALIGN,
                                                .user = ((uint64_t)next << 32) | b};
            wanted += pp->size;
            next++;
        }
        if (k > 0) {
            if ((rc = fetcher_io_submit(io, reqs, k)) < 0) {
                common_errmsg_set(e, rc, "probe: submit failed");
                goto out_free;
            }
            in_flight += k;
        }
        uint32_t nc = fetcher_io_reap(io, cqes, qd, true);
        for (uint32_t i = 0; i < nc; i++) {
            if (cqes[i].err) {
                rc = fetcher_io_describe_error(io, &cqes[i], e);
                goto out_free;
            }
            bytes += cqes[i].bytes;
            wanted -= cqes[i].len;
            reads++;
            free_bufs[n_free++] = (uint32_t)(cqes[i].user & 0xffffffffu);
            in_flight--;
        }
    }
    double secs = (double)(common_now_ns() - t0) / 1e9;
    *out = (struct fetcher_probe_result){.bytes = bytes,
                                         .reads = reads,
                                         .seconds = secs,
                                         .bytes_per_s = secs > 0 ? (double)bytes / secs : 0.0,
                                         .read_bytes = reads ? bytes / reads : 0,
                                         .queue_depth = qd,
                                         .mode = fetcher_io_get_mode(io),
                                         .direct = fetcher_io_is_direct(io, 0)};
    rc = COMMON_OK;

out_free:
    fetcher_io_destroy(io);
    free(mem);
    free(parts);
    free(files);
    free(reqs);
    free(cqes);
    free(free_bufs);
    return rc;
}
