/* common/qsf.c - QSF reader: header, embedded metadata, index and bundles of an untrusted file;
 * checks of bundles and tensors; whole-file verification. The writer is qsf_write.c. */
#include "common.h"
#include "gguf_impl.h"
#include "qsf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxh_x86dispatch.h>

#define QSF_MAX_INDEX (UINT64_C(1) << 30)

struct qsf_info {
    uint32_t                  n_layer, n_expert;
    uint64_t                  data_off, data_len, bundles_off, bundles_len;
    struct qsf_trec          *trec;    /* owned: one per tensor */
    struct common_qsf_bundle *bundles; /* owned: n_layer * n_expert */
    bool                     *has_moe; /* owned: per layer, whether it has bundles */
    uint64_t                  buf_max;
};

void qsf_info_free(struct qsf_info *q)
{
    if (!q)
        return;
    free(q->trec);
    free(q->bundles);
    free(q->has_moe);
    free(q);
}

uint64_t common_qsf_hash(const void *data, size_t len)
{
    return (uint64_t)XXH3_64bits_dispatch(data, len);
}

struct qsf_hasher *qsf_hash_begin(void)
{
    XXH3_state_t *st = XXH3_createState();
    if (st)
        XXH3_64bits_reset(st);
    return (struct qsf_hasher *)st;
}

void qsf_hash_update(struct qsf_hasher *h, const void *p, size_t n)
{
    XXH3_64bits_update_dispatch((XXH3_state_t *)h, p, n);
}

uint64_t qsf_hash_end(struct qsf_hasher *h)
{
    uint64_t v = (uint64_t)XXH3_64bits_digest((XXH3_state_t *)h);
    XXH3_freeState((XXH3_state_t *)h);
    return v;
}

uint64_t qsf_align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

void qsf_bundle_layout(struct common_qsf_bundle *b)
{
    if (b->codec == COMMON_QSF_LZ4) {
        uint64_t margin = (b->raw >> 8) + 32; /* LZ4_DECOMPRESS_INPLACE_MARGIN, on the raw size */
        b->read_off = qsf_align_up(b->raw + margin - b->stored, COMMON_QSF_ALIGN);
    } else {
        b->read_off = 0;
    }
    b->buf_bytes = b->read_off + qsf_align_up(b->stored, COMMON_QSF_ALIGN);
}

void qsf_part_layout(const uint64_t size[COMMON_EXPERT_PART_COUNT],
                     uint64_t off[COMMON_EXPERT_PART_COUNT], uint64_t *raw)
{
    uint64_t at = 0;
    for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        off[p] = at;
        at = qsf_align_up(at + size[p], COMMON_QSF_PART_ALIGN);
    }
    /* The last part ends the bundle: no padding after it. */
    *raw = off[COMMON_EXPERT_PART_COUNT - 1] + size[COMMON_EXPERT_PART_COUNT - 1];
}

/* ---- little-endian fields ------------------------------------------------------------------- */

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

int qsf_header_decode(const uint8_t *p, struct qsf_header *h, struct common_errmsg *e)
{
    h->magic = rd32(p + 0);
    h->version = rd32(p + 4);
    h->hash_kind = rd32(p + 8);
    h->flags = rd32(p + 12);
    h->meta_off = rd64(p + 16);
    h->meta_len = rd64(p + 24);
    h->meta_virt = rd64(p + 32);
    h->index_off = rd64(p + 40);
    h->index_len = rd64(p + 48);
    h->data_off = rd64(p + 56);
    h->data_len = rd64(p + 64);
    h->bundles_off = rd64(p + 72);
    h->bundles_len = rd64(p + 80);
    h->n_layer = rd32(p + 88);
    h->n_expert = rd32(p + 92);
    h->meta_hash = rd64(p + 96);
    h->index_hash = rd64(p + 104);
    h->header_hash = rd64(p + 120);
    if (h->magic != COMMON_QSF_MAGIC)
        return common_errmsg_set(e, COMMON_ECORRUPT, "not a QSF file: magic 0x%08x", h->magic);
    if (h->version != COMMON_QSF_VERSION)
        return common_errmsg_set(e, COMMON_ENOTSUP, "QSF version %u is not supported (%u)",
                                 h->version, COMMON_QSF_VERSION);
    uint64_t got = common_qsf_hash(p, QSF_HEADER_HASHED);
    if (got != h->header_hash)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "header checksum mismatch (xxh3 %016llx, header says %016llx)",
                                 (unsigned long long)got, (unsigned long long)h->header_hash);
    if (h->hash_kind != QSF_HASH_XXH3)
        return common_errmsg_set(e, COMMON_ENOTSUP, "checksum kind %u is not supported",
                                 h->hash_kind);
    return COMMON_OK;
}

/* ---- reading: a file or an image in memory ------------------------------------------------- */

struct qsf_src {
    int            fd;   /* -1 for an image */
    const uint8_t *mem;  /* the image, or NULL */
    uint64_t       size; /* bytes of the file */
    const char    *path; /* the file's path; NULL for an image */
};

static int qsf_src_read(const struct qsf_src *s, void *dst, uint64_t n, uint64_t off,
                        struct common_errmsg *e)
{
    uint64_t end;
    if (!common_add_u64(off, n, &end) || end > s->size)
        return common_errmsg_set(
            e, COMMON_ECORRUPT, "truncated: %llu bytes at offset %llu, file has %llu",
            (unsigned long long)n, (unsigned long long)off, (unsigned long long)s->size);
    if (s->mem) {
        memcpy(dst, s->mem + off, (size_t)n);
        return COMMON_OK;
    }
    uint8_t *p = dst;
    while (n > 0) {
        size_t  chunk = n > (UINT64_C(1) << 30) ? (size_t)1 << 30 : (size_t)n;
        ssize_t r = pread(s->fd, p, chunk, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return common_errmsg_set(e, COMMON_EIO, "read of %llu bytes at offset %llu failed: %s",
                                     (unsigned long long)n, (unsigned long long)off,
                                     r < 0 ? strerror(errno) : "end of file");
        p += r;
        off += (uint64_t)r;
        n -= (uint64_t)r;
    }
    return COMMON_OK;
}

/* Checks that region [off, off + len) lies in the file, aligned. */
static int qsf_region(const char *what, uint64_t off, uint64_t len, uint64_t size,
                      struct common_errmsg *e)
{
    uint64_t end;
    if (off % COMMON_QSF_ALIGN != 0 || !common_add_u64(off, len, &end) || end > size ||
        off < COMMON_QSF_ALIGN)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "%s region [%llu, +%llu) is not an aligned part of the %llu-byte "
                                 "file",
                                 what, (unsigned long long)off, (unsigned long long)len,
                                 (unsigned long long)size);
    return COMMON_OK;
}

/* Reads region [off, off + len) and checks its checksum; *out is malloc'd. */
static int qsf_read_checked(const struct qsf_src *s, const char *what, uint64_t off, uint64_t len,
                            uint64_t want, uint8_t **out, struct common_errmsg *e)
{
    uint8_t *b = malloc(len ? (size_t)len : 1);
    if (!b)
        return COMMON_ENOMEM;
    int rc = qsf_src_read(s, b, len, off, e);
    if (rc == COMMON_OK) {
        uint64_t got = common_qsf_hash(b, (size_t)len);
        if (got != want)
            rc = common_errmsg_set(e, COMMON_ECORRUPT,
                                   "%s checksum mismatch (xxh3 %016llx, header says %016llx)", what,
                                   (unsigned long long)got, (unsigned long long)want);
    }
    if (rc != COMMON_OK) {
        free(b);
        return rc;
    }
    *out = b;
    return COMMON_OK;
}

/* The tensor records: resident tensors placed in the data region, bundled ones checked against
 * the expert count; fills each layer's part sizes. */
static int qsf_tensors(struct common_gguf *g, struct qsf_info *q, const struct qsf_header *h,
                       const uint8_t        *ix, uint64_t (*psize)[COMMON_EXPERT_PART_COUNT],
                       struct common_errmsg *e)
{
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const uint8_t             *r = ix + QSF_INDEX_HEAD + i * QSF_TREC_BYTES;
        struct qsf_trec           *t = &q->trec[i];
        struct common_gguf_tensor *gt = &g->tensors[i];
        t->kind = rd32(r);
        t->layer = rd32(r + 4);
        t->part = rd32(r + 8);
        t->hash = rd64(r + 16);
        uint64_t rel = gt->offset - h->meta_len, end;
        if (t->kind == QSF_TENSOR_RESIDENT) {
            if (!common_add_u64(rel, gt->size, &end) || end > h->data_len)
                return common_errmsg_set(e, COMMON_ECORRUPT,
                                         "tensor '%s': [%llu, +%llu) lies beyond the %llu-byte "
                                         "data region",
                                         gt->name, (unsigned long long)rel,
                                         (unsigned long long)gt->size,
                                         (unsigned long long)h->data_len);
            gt->offset = h->data_off + rel;
            continue;
        }
        if (t->kind != QSF_TENSOR_BUNDLED || t->layer >= h->n_layer ||
            t->part >= COMMON_EXPERT_PART_COUNT || h->n_expert == 0 || gt->n_dims != 3 ||
            gt->ne[2] != h->n_expert || gt->size % h->n_expert != 0)
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "tensor '%s': bad index record (kind %u, layer %u, part %u, "
                                     "%u experts)",
                                     gt->name, t->kind, t->layer, t->part, h->n_expert);
        if (psize[t->layer][t->part] != 0)
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "tensor '%s': layer %u part %u is bundled twice", gt->name,
                                     t->layer, t->part);
        psize[t->layer][t->part] = gt->size / h->n_expert;
        if (psize[t->layer][t->part] == 0)
            return common_errmsg_set(e, COMMON_ECORRUPT, "tensor '%s': empty expert part",
                                     gt->name);
        gt->offset = h->bundles_off; /* not contiguous: reached through its bundles */
        q->has_moe[t->layer] = true;
    }
    return COMMON_OK;
}

/* The bundle records: each inside the bundle region, aligned, after the previous one, with the
 * size its layer's parts give. */
static int qsf_bundles(struct qsf_info *q, const struct qsf_header *h, const uint8_t *rec,
                       uint64_t (*psize)[COMMON_EXPERT_PART_COUNT], const struct common_gguf *g,
                       struct common_errmsg *e)
{
    /* Per file: where the next bundle may start and where its bundles must end. */
    uint64_t next[1 + QSF_MAX_FILES], end_region[1 + QSF_MAX_FILES];
    next[0] = h->bundles_off;
    end_region[0] = h->bundles_off + h->bundles_len;
    for (uint32_t k = 1; k < g->n_splits; k++) {
        next[k] = COMMON_QSF_ALIGN;
        end_region[k] = g->splits[k].size;
    }
    for (uint32_t l = 0; l < h->n_layer; l++) {
        uint64_t off[COMMON_EXPERT_PART_COUNT], raw;
        qsf_part_layout(psize[l], off, &raw);
        for (uint32_t x = 0; x < h->n_expert; x++) {
            const uint8_t            *r = rec + ((uint64_t)l * h->n_expert + x) * QSF_BREC_BYTES;
            struct common_qsf_bundle *b = &q->bundles[(uint64_t)l * h->n_expert + x];
            b->offset = rd64(r);
            b->stored = rd64(r + 8);
            b->raw = rd64(r + 16);
            b->hash = rd64(r + 24);
            b->codec = rd32(r + 32);
            b->file = rd32(r + 36);
            if (!q->has_moe[l]) {
                if (b->offset || b->stored || b->raw || b->codec || b->file)
                    return common_errmsg_set(e, COMMON_ECORRUPT,
                                             "layer %u has no experts but bundle %u is set", l, x);
                continue;
            }
            memcpy(b->part_off, off, sizeof(off));
            memcpy(b->part_size, psize[l], sizeof(b->part_size));
            bool codec_ok = (b->codec == COMMON_QSF_RAW && b->stored == b->raw) ||
                            (b->codec == COMMON_QSF_LZ4 && b->stored > 0 && b->stored < b->raw);
            uint64_t end;
            uint32_t f = b->file;
            if (b->raw != raw || !codec_ok || f >= g->n_splits ||
                b->offset % COMMON_QSF_ALIGN != 0 || b->offset < next[f] ||
                !common_add_u64(b->offset, qsf_align_up(b->stored, COMMON_QSF_ALIGN), &end) ||
                end > end_region[f])
                return common_errmsg_set(
                    e, COMMON_ECORRUPT,
                    "layer %u expert %u: bad bundle record (file %u, offset %llu, %llu stored, "
                    "%llu raw of %llu, codec %u)",
                    l, x, f, (unsigned long long)b->offset, (unsigned long long)b->stored,
                    (unsigned long long)b->raw, (unsigned long long)raw, b->codec);
            next[f] = end;
            qsf_bundle_layout(b);
            if (b->buf_bytes > q->buf_max)
                q->buf_max = b->buf_bytes;
        }
    }
    return COMMON_OK;
}

/* Opens the bundle files the metadata lists as splits 1..N of g, each checked against its header
 * (magic, number, checksum, the main file's index checksum, size). An image in memory cannot
 * name files: refused. */
static int qsf_open_files(const struct qsf_src *s, struct common_gguf *g,
                          const struct qsf_header *h, struct common_errmsg *e)
{
    const struct common_gguf_value *arr = NULL;
    if (common_gguf_get_arr(g, QSF_KEY_FILES, COMMON_GGUF_STRING, &arr) != COMMON_OK)
        return common_gguf_find(g, QSF_KEY_FILES)
                   ? common_errmsg_set(e, COMMON_ECORRUPT, "%s is not a string array",
                                       QSF_KEY_FILES)
                   : COMMON_OK;
    uint64_t n = arr->v.arr.n;
    if (n == 0 || n > QSF_MAX_FILES || !s->path)
        return common_errmsg_set(e, COMMON_ECORRUPT, "%llu bundle files (1..%u, on disk only)",
                                 (unsigned long long)n, QSF_MAX_FILES);
    struct gguf_split *sp = realloc(g->splits, (size_t)(n + 1) * sizeof(*sp));
    if (!sp)
        return COMMON_ENOMEM;
    g->splits = sp;
    const char *slash = strrchr(s->path, '/');
    int         dir_len = slash ? (int)(slash - s->path) : 1;
    const char *dir = slash ? s->path : ".";
    for (uint32_t k = 1; k <= n; k++) {
        struct gguf_split *f = &g->splits[k];
        memset(f, 0, sizeof(*f));
        f->fd = -1;
        g->n_splits = k + 1;
        const struct common_gguf_str *name = &arr->v.arr.strs[k - 1];
        if (name->len == 0 || name->len > 4096 || memchr(name->ptr, '\0', (size_t)name->len))
            return common_errmsg_set(e, COMMON_ECORRUPT, "bundle file %u: bad path", k);
        size_t len = (size_t)name->len + (size_t)dir_len + 2;
        if (!(f->path = malloc(len)))
            return COMMON_ENOMEM;
        if (name->ptr[0] == '/')
            snprintf(f->path, len, "%.*s", (int)name->len, name->ptr);
        else
            snprintf(f->path, len, "%.*s/%.*s", dir_len, dir, (int)name->len, name->ptr);
        struct stat st;
        /* O_NONBLOCK: a FIFO in its place must not wait for a writer; refused below. */
        if ((f->fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0)
            return common_errmsg_set(e, common_err_from_errno(errno),
                                     "bundle file %u: %s: cannot open: %s", k, f->path,
                                     strerror(errno));
        if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode))
            return common_errmsg_set(e, COMMON_EINVAL, "%s: not a regular file", f->path);
        int fl = fcntl(f->fd, F_GETFL);
        if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
            return common_errmsg_set(e, COMMON_EIO, "%s: cannot set blocking reads", f->path);
        f->size = (uint64_t)st.st_size;
        uint8_t        b[QSF_HEADER_BYTES];
        struct qsf_src fs = {.fd = f->fd, .size = f->size, .path = f->path};
        int            rc = qsf_src_read(&fs, b, sizeof(b), 0, e);
        if (rc != COMMON_OK)
            return rc;
        if (rd32(b) != QSF_BFILE_MAGIC || rd32(b + 4) != COMMON_QSF_VERSION || rd32(b + 8) != k ||
            rd32(b + 12) != n || rd64(b + 120) != common_qsf_hash(b, QSF_HEADER_HASHED))
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "%s is not bundle file %u of %llu (bad header or checksum)",
                                     f->path, k, (unsigned long long)n);
        if (rd64(b + 16) != h->index_hash || rd64(b + 24) != f->size)
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "%s belongs to another conversion or was cut short", f->path);
    }
    return COMMON_OK;
}

/* Header, metadata and index of `s`: the model object with tensors placed and the QSF index. */
static int qsf_load(const struct qsf_src *s, uint64_t max_hdr, struct common_gguf **out,
                    struct common_errmsg *e)
{
    uint8_t           hb[QSF_HEADER_BYTES];
    struct qsf_header h;
    int               rc;
    if ((rc = qsf_src_read(s, hb, sizeof(hb), 0, e)) != COMMON_OK ||
        (rc = qsf_header_decode(hb, &h, e)) != COMMON_OK)
        return rc;
    uint64_t meta_virt_end;
    if ((rc = qsf_region("metadata", h.meta_off, h.meta_len, s->size, e)) ||
        (rc = qsf_region("index", h.index_off, h.index_len, s->size, e)) ||
        (rc = qsf_region("data", h.data_off, h.data_len, s->size, e)) ||
        (rc = qsf_region("bundle", h.bundles_off, h.bundles_len, s->size, e)))
        return rc;
    if (h.meta_len > max_hdr || h.index_len > QSF_MAX_INDEX ||
        !common_add_u64(h.meta_len, h.meta_virt, &meta_virt_end))
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "metadata (%llu bytes) or index (%llu bytes) too large",
                                 (unsigned long long)h.meta_len, (unsigned long long)h.index_len);
    uint64_t n_bundles = (uint64_t)h.n_layer * h.n_expert;
    uint8_t *meta = NULL, *ix = NULL;
    if ((rc = qsf_read_checked(s, "metadata", h.meta_off, h.meta_len, h.meta_hash, &meta, e)) ||
        (rc = qsf_read_checked(s, "index", h.index_off, h.index_len, h.index_hash, &ix, e))) {
        free(meta);
        return rc;
    }
    struct common_gguf *g = NULL;
    struct qsf_info    *q = NULL;
    uint64_t(*psize)[COMMON_EXPERT_PART_COUNT] = NULL;
    rc = common_gguf_parse(meta, (size_t)h.meta_len, meta_virt_end, &g, e);
    if (rc != COMMON_OK)
        goto out;
    rc = COMMON_ECORRUPT;
    if (g->splits[0].data_offset != h.meta_len) {
        common_errmsg_set(e, rc, "metadata image ends at %llu, its data section starts at %llu",
                          (unsigned long long)h.meta_len,
                          (unsigned long long)g->splits[0].data_offset);
        goto out;
    }
    if (h.index_len < QSF_INDEX_HEAD || rd64(ix) != g->n_tensors || rd64(ix + 8) != n_bundles ||
        h.index_len !=
            QSF_INDEX_HEAD + g->n_tensors * QSF_TREC_BYTES + n_bundles * QSF_BREC_BYTES) {
        common_errmsg_set(e, rc, "index (%llu bytes) does not hold %llu tensors and %llu bundles",
                          (unsigned long long)h.index_len, (unsigned long long)g->n_tensors,
                          (unsigned long long)n_bundles);
        goto out;
    }
    rc = COMMON_ENOMEM;
    q = calloc(1, sizeof(*q));
    if (!q)
        goto out;
    q->trec = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*q->trec));
    q->bundles = calloc(n_bundles ? n_bundles : 1, sizeof(*q->bundles));
    q->has_moe = calloc(h.n_layer ? h.n_layer : 1, sizeof(*q->has_moe));
    psize = calloc(h.n_layer ? h.n_layer : 1, sizeof(*psize));
    if (!q->trec || !q->bundles || !q->has_moe || !psize)
        goto out;
    q->n_layer = h.n_layer;
    q->n_expert = h.n_expert;
    q->data_off = h.data_off;
    q->data_len = h.data_len;
    q->bundles_off = h.bundles_off;
    q->bundles_len = h.bundles_len;
    if ((rc = qsf_open_files(s, g, &h, e)) != COMMON_OK ||
        (rc = qsf_tensors(g, q, &h, ix, psize, e)) != COMMON_OK ||
        (rc = qsf_bundles(q, &h, ix + QSF_INDEX_HEAD + g->n_tensors * QSF_TREC_BYTES, psize, g,
                          e)) != COMMON_OK)
        goto out;
    g->splits[0].size = s->size;
    g->splits[0].data_offset = h.data_off;
    g->qsf = q;
    q = NULL;
    *out = g;
    g = NULL;
    rc = COMMON_OK;
out:
    free(psize);
    qsf_info_free(q);
    common_gguf_close(g);
    free(meta);
    free(ix);
    return rc;
}

bool common_qsf_file_is(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return false;
    struct stat st;
    uint8_t     m[4];
    bool        is = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
              pread(fd, m, sizeof(m), 0) == (ssize_t)sizeof(m) && rd32(m) == COMMON_QSF_MAGIC;
    close(fd);
    return is;
}

int qsf_open(const char *path, uint64_t max_hdr, struct common_gguf **out, struct common_errmsg *e)
{
    struct common_errmsg inner = {{0}};
    struct stat          st;
    int                  fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return common_errmsg_set(e, common_err_from_errno(errno), "%s: cannot open: %s", path,
                                 strerror(errno));
    if (fstat(fd, &st) != 0) {
        close(fd);
        return common_errmsg_set(e, COMMON_EIO, "%s: cannot stat: %s", path, strerror(errno));
    }
    struct qsf_src      s = {.fd = fd, .size = (uint64_t)st.st_size, .path = path};
    struct common_gguf *g = NULL;
    int                 rc = qsf_load(&s, max_hdr, &g, &inner);
    if (rc == COMMON_OK && !(g->splits[0].path = strdup(path)))
        rc = COMMON_ENOMEM;
    if (rc != COMMON_OK) {
        common_gguf_close(g);
        close(fd);
        return common_errmsg_set(e, rc, "%s: %s", path,
                                 inner.text[0] ? inner.text : common_strerror(rc));
    }
    g->splits[0].fd = fd;
    *out = g;
    return COMMON_OK;
}

int common_qsf_parse(const void *buf, size_t len, struct common_gguf **out, struct common_errmsg *e)
{
    if (!buf || !out)
        return common_errmsg_set(e, COMMON_EINVAL, "qsf: bad arguments");
    struct qsf_src s = {.fd = -1, .mem = buf, .size = len};
    return qsf_load(&s, UINT64_C(1) << 30, out, e);
}

/* ---- accessors --------------------------------------------------------------------------------
 */

bool common_gguf_is_qsf(const struct common_gguf *g)
{
    return g && g->qsf;
}

bool common_gguf_tensor_bundled(const struct common_gguf *g, uint64_t index)
{
    return g && g->qsf && index < g->n_tensors && g->qsf->trec[index].kind == QSF_TENSOR_BUNDLED;
}

int common_gguf_bundle(const struct common_gguf *g, uint32_t layer, uint32_t expert,
                       struct common_qsf_bundle *out)
{
    if (!g || !g->qsf)
        return COMMON_ENOENT;
    const struct qsf_info *q = g->qsf;
    if (layer >= q->n_layer || expert >= q->n_expert)
        return COMMON_EINVAL;
    if (!q->has_moe[layer])
        return COMMON_ENOENT;
    *out = q->bundles[(uint64_t)layer * q->n_expert + expert];
    return COMMON_OK;
}

uint64_t common_gguf_bundle_buf_max(const struct common_gguf *g)
{
    return g && g->qsf ? g->qsf->buf_max : 0;
}

int common_qsf_bundle_finish(const struct common_qsf_bundle *b, uint8_t *buf,
                             struct common_errmsg *e)
{
    uint64_t got = common_qsf_hash(buf + b->read_off, (size_t)b->stored);
    if (got != b->hash)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "checksum mismatch in the bundle at offset %llu (xxh3 %016llx, "
                                 "index says %016llx)",
                                 (unsigned long long)b->offset, (unsigned long long)got,
                                 (unsigned long long)b->hash);
    if (b->codec != COMMON_QSF_LZ4)
        return COMMON_OK;
    /* In place: the block sits at the end of the buffer, far enough ahead of the output. */
    int n = LZ4_decompress_safe((const char *)buf + b->read_off, (char *)buf, (int)b->stored,
                                (int)b->raw);
    if (n < 0 || (uint64_t)n != b->raw)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "the LZ4 bundle at offset %llu does not decode to %llu bytes",
                                 (unsigned long long)b->offset, (unsigned long long)b->raw);
    return COMMON_OK;
}

int common_gguf_check_tensor(const struct common_gguf *g, uint64_t index, const void *data,
                             struct common_errmsg *e)
{
    if (!g || !g->qsf || index >= g->n_tensors || g->qsf->trec[index].kind != QSF_TENSOR_RESIDENT)
        return COMMON_OK;
    const struct common_gguf_tensor *t = &g->tensors[index];
    uint64_t                         got = common_qsf_hash(data, (size_t)t->size);
    if (got != g->qsf->trec[index].hash)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "%s: tensor '%s' fails its checksum (xxh3 %016llx, index says "
                                 "%016llx)",
                                 g->splits[0].path ? g->splits[0].path : "qsf", t->name,
                                 (unsigned long long)got,
                                 (unsigned long long)g->qsf->trec[index].hash);
    return COMMON_OK;
}

/* ---- verification -----------------------------------------------------------------------------
 */

#define QSF_VERIFY_CHUNK (UINT64_C(8) << 20)

/* Hashes [off, off + len) of the file in chunks. */
static int qsf_hash_region(int fd, uint64_t off, uint64_t len, uint8_t *buf, uint64_t *out,
                           struct common_errmsg *e)
{
    struct qsf_hasher *st = qsf_hash_begin();
    if (!st)
        return COMMON_ENOMEM;
    struct qsf_src s = {.fd = fd, .size = UINT64_MAX};
    int            rc = COMMON_OK;
    while (len > 0 && rc == COMMON_OK) {
        uint64_t n = len < QSF_VERIFY_CHUNK ? len : QSF_VERIFY_CHUNK;
        if ((rc = qsf_src_read(&s, buf, n, off, e)) == COMMON_OK)
            qsf_hash_update(st, buf, (size_t)n);
        off += n;
        len -= n;
    }
    *out = qsf_hash_end(st);
    return rc;
}

int common_qsf_verify(const struct common_gguf *g, common_qsf_progress_fn progress, void *arg,
                      struct common_qsf_stats *st, struct common_errmsg *e)
{
    if (!g || !g->qsf || g->splits[0].fd < 0)
        return common_errmsg_set(e, COMMON_EINVAL, "verify: not an open QSF file");
    const struct qsf_info *q = g->qsf;
    int                    fd = g->splits[0].fd;
    memset(st, 0, sizeof(*st));
    for (uint32_t k = 0; k < g->n_splits; k++)
        st->file_bytes += g->splits[k].size;
    uint64_t total = 0, done = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        total += q->trec[i].kind == QSF_TENSOR_RESIDENT ? g->tensors[i].size : 0;
    for (uint64_t k = 0; k < (uint64_t)q->n_layer * q->n_expert; k++)
        total += q->bundles[k].stored;
    uint64_t cap = q->buf_max > QSF_VERIFY_CHUNK ? q->buf_max : QSF_VERIFY_CHUNK;
    uint8_t *buf = aligned_alloc(COMMON_QSF_ALIGN, (size_t)qsf_align_up(cap, COMMON_QSF_ALIGN));
    if (!buf)
        return COMMON_ENOMEM;
    int                  first = COMMON_OK;
    struct common_errmsg one = {{0}};
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (q->trec[i].kind != QSF_TENSOR_RESIDENT)
            continue;
        const struct common_gguf_tensor *t = &g->tensors[i];
        uint64_t                         h = 0;
        int rc = qsf_hash_region(fd, t->offset, t->size, buf, &h, &one);
        if (rc == COMMON_OK && h != q->trec[i].hash)
            rc = common_errmsg_set(&one, COMMON_ECORRUPT,
                                   "tensor '%s' fails its checksum (xxh3 %016llx, index says "
                                   "%016llx)",
                                   t->name, (unsigned long long)h,
                                   (unsigned long long)q->trec[i].hash);
        if (rc == COMMON_EIO || rc == COMMON_ENOMEM) {
            free(buf);
            return common_errmsg_set(e, rc, "%s", one.text);
        }
        if (rc != COMMON_OK && st->n_bad++ == 0) {
            first = rc;
            common_errmsg_set(e, rc, "%s", one.text);
        }
        st->n_tensors++;
        st->resident_bytes += t->size;
        done += t->size;
        if (progress)
            progress(arg, done, total);
    }
    for (uint32_t l = 0; l < q->n_layer; l++) {
        for (uint32_t x = 0; x < q->n_expert && q->has_moe[l]; x++) {
            const struct common_qsf_bundle *b = &q->bundles[(uint64_t)l * q->n_expert + x];
            struct qsf_src s = {.fd = g->splits[b->file].fd, .size = g->splits[b->file].size};
            int            rc = qsf_src_read(&s, buf + b->read_off, b->stored, b->offset, &one);
            if (rc == COMMON_OK)
                rc = common_qsf_bundle_finish(b, buf, &one);
            if (rc == COMMON_EIO) {
                free(buf);
                return common_errmsg_set(e, rc, "layer %u expert %u: %s", l, x, one.text);
            }
            if (rc != COMMON_OK && st->n_bad++ == 0) {
                first = rc;
                common_errmsg_set(e, rc, "layer %u expert %u: %s", l, x, one.text);
            }
            st->n_bundles++;
            st->n_lz4 += b->codec == COMMON_QSF_LZ4;
            st->raw_bytes += b->raw;
            st->stored_bytes += b->stored;
            done += b->stored;
            if (progress)
                progress(arg, done, total);
        }
    }
    free(buf);
    return first;
}
