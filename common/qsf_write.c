/* common/qsf_write.c - QSF writer: a GGUF model rewritten as resident tensors plus one bundle per
 * routed expert, with checksums and optional LZ4, in bounded memory. The reader is qsf.c. */
#include "common.h"
#include "qsf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QSF_COPY_CHUNK (UINT64_C(8) << 20)

/* One output file: the main file (0) or a bundle file (1..n_shards). */
struct qsf_out {
    char *path;  /* owned: final path */
    char *tmp;   /* owned: path + ".tmp", written then renamed */
    char *entry; /* owned: bundle files: its path as the metadata records it */
    int   fd;
};

struct qsf_wr {
    const struct common_gguf             *in;
    const struct common_qsf_convert_opts *o;
    struct common_errmsg                 *e;
    uint32_t                              n_out; /* 1 + bundle files */
    struct qsf_out                        out[1 + QSF_MAX_FILES];
    uint64_t                              done, total; /* progress */
};

static void le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes n bytes at `off` of output file f. */
static int wr_put(struct qsf_wr *w, uint32_t f, const void *p, uint64_t n, uint64_t off)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t r = pwrite(w->out[f].fd, b, n > (UINT64_C(1) << 30) ? (size_t)1 << 30 : (size_t)n,
                           (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return common_errmsg_set(w->e, COMMON_EIO, "%s: write at offset %llu failed: %s",
                                     w->out[f].tmp, (unsigned long long)off,
                                     r < 0 ? strerror(errno) : "no progress");
        b += r;
        off += (uint64_t)r;
        n -= (uint64_t)r;
    }
    return COMMON_OK;
}

static int wr_get(struct qsf_wr *w, uint32_t split, void *dst, uint64_t n, uint64_t off)
{
    struct common_span s = {.split = split, .offset = off, .size = n};
    return common_gguf_read_span(w->in, &s, dst, w->e);
}

static void wr_progress(struct qsf_wr *w, uint64_t n)
{
    w->done += n;
    if (w->o->progress)
        w->o->progress(w->o->progress_arg, w->done, w->total);
}

/* Copies resident tensor `t` to `off`, returning its checksum in *hash. */
static int wr_copy_tensor(struct qsf_wr *w, const struct common_gguf_tensor *t, uint64_t off,
                          uint8_t *buf, uint64_t *hash)
{
    struct qsf_hasher *st = qsf_hash_begin();
    if (!st)
        return COMMON_ENOMEM;
    int rc = COMMON_OK;
    for (uint64_t at = 0; at < t->size && rc == COMMON_OK;) {
        uint64_t n = t->size - at < QSF_COPY_CHUNK ? t->size - at : QSF_COPY_CHUNK;
        if ((rc = wr_get(w, t->split, buf, n, t->offset + at)) == COMMON_OK &&
            (rc = wr_put(w, 0, buf, n, off + at)) == COMMON_OK) {
            qsf_hash_update(st, buf, (size_t)n);
            wr_progress(w, n);
        }
        at += n;
    }
    *hash = qsf_hash_end(st);
    return rc;
}

/* The layers' bundled tensors: idx[l][p] = tensor index in `in`, -1 when absent. */
static int wr_bundled(const struct common_model *m, int64_t (*idx)[COMMON_EXPERT_PART_COUNT],
                      uint64_t (*psize)[COMMON_EXPERT_PART_COUNT], struct common_errmsg *e)
{
    for (uint32_t l = 0; l < m->hp.n_layer; l++)
        for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
            idx[l][p] = -1;
            psize[l][p] = 0;
            if (!common_model_layer_is_moe(m, l))
                continue;
            int64_t i = m->layers[l].tensor[COMMON_ROLE_FFN_GATE_EXPS + p];
            if (i < 0)
                continue;
            const struct common_gguf_tensor *t = common_gguf_tensor_at(m->gguf, (uint64_t)i);
            if (t->n_dims != 3 || t->ne[2] != m->hp.n_expert || t->size % m->hp.n_expert != 0)
                return common_errmsg_set(e, COMMON_EINVAL,
                                         "tensor '%s' is not %u experts of equal size", t->name,
                                         m->hp.n_expert);
            idx[l][p] = i;
            psize[l][p] = t->size / m->hp.n_expert;
        }
    return COMMON_OK;
}

/* Declares the metadata (split keys left out) and the tensors, resident ones first; order[k] is
 * the input index of output tensor k. */
static int wr_declare(const struct qsf_wr *w, struct common_gguf_writer *gw, const bool *bundled,
                      uint64_t *order, uint64_t *n_resident)
{
    const struct common_gguf *in = w->in;
    int                       rc = COMMON_OK;
    uint64_t                  n = common_gguf_n_tensors(in), k = 0;
    for (uint64_t i = 0; i < common_gguf_n_kv(in) && rc == COMMON_OK; i++) {
        const struct common_gguf_kv *kv = common_gguf_kv_at(in, i);
        if (strncmp(kv->key, "split.", 6) != 0 && strncmp(kv->key, "qsf.", 4) != 0)
            rc = common_gguf_writer_copy_kv(gw, kv);
    }
    if (w->n_out > 1 && rc == COMMON_OK) {
        struct common_gguf_str names[QSF_MAX_FILES];
        for (uint32_t f = 1; f < w->n_out; f++)
            names[f - 1] = (struct common_gguf_str){w->out[f].entry, strlen(w->out[f].entry)};
        rc = common_gguf_writer_set_arr(gw, QSF_KEY_FILES, COMMON_GGUF_STRING, names, w->n_out - 1);
    }
    for (int pass = 0; pass < 2 && rc == COMMON_OK; pass++) {
        for (uint64_t i = 0; i < n && rc == COMMON_OK; i++) {
            if (bundled[i] != (pass == 1))
                continue;
            const struct common_gguf_tensor *t = common_gguf_tensor_at(in, i);
            rc =
                common_gguf_writer_add_tensor_sized(gw, t->name, t->type, t->n_dims, t->ne,
                                                    t->type == COMMON_GGML_TYPE_I2_S ? t->size : 0);
            order[k++] = i;
        }
        if (pass == 0)
            *n_resident = k;
    }
    return rc;
}

/* Writes the bundles of every MoE layer from `off` on; fills the bundle records (rec) and *end. */
/* The file holding expert x's bundles: 0 without bundle files, else the k whose range
 * [(k-1)*E/N, k*E/N) holds x (fetcher daemon k-1 of N serves those experts). */
static uint32_t wr_file_of(const struct qsf_wr *w, uint32_t x, uint32_t n_expert)
{
    uint32_t n = w->n_out - 1;
    for (uint32_t k = 1; k <= n; k++)
        if (x < (uint32_t)((uint64_t)k * n_expert / n))
            return k;
    return 0;
}

static int wr_bundles(struct qsf_wr *w, const struct common_model *m,
                      int64_t (*idx)[COMMON_EXPERT_PART_COUNT],
                      uint64_t (*psize)[COMMON_EXPERT_PART_COUNT], uint8_t *rec, uint64_t *end,
                      struct common_qsf_stats *st)
{
    uint64_t raw_max = 0;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        uint64_t po[COMMON_EXPERT_PART_COUNT], raw;
        qsf_part_layout(psize[l], po, &raw);
        raw_max = raw > raw_max ? raw : raw_max;
    }
    uint64_t cap = raw_max <= LZ4_MAX_INPUT_SIZE ? (uint64_t)LZ4_compressBound((int)raw_max) : 0;
    uint8_t *raw_buf = malloc(raw_max ? (size_t)raw_max : 1);
    uint8_t *lz_buf = malloc(cap ? (size_t)cap : 1);
    int      rc = raw_buf && lz_buf ? COMMON_OK : COMMON_ENOMEM;
    for (uint32_t l = 0; l < m->hp.n_layer && rc == COMMON_OK; l++) {
        if (idx[l][0] < 0 && idx[l][1] < 0 && idx[l][2] < 0)
            continue;
        uint64_t po[COMMON_EXPERT_PART_COUNT], raw;
        qsf_part_layout(psize[l], po, &raw);
        for (uint32_t x = 0; x < m->hp.n_expert && rc == COMMON_OK; x++) {
            memset(raw_buf, 0, (size_t)raw);
            for (int p = 0; p < COMMON_EXPERT_PART_COUNT && rc == COMMON_OK; p++) {
                if (idx[l][p] < 0)
                    continue;
                const struct common_gguf_tensor *t =
                    common_gguf_tensor_at(w->in, (uint64_t)idx[l][p]);
                rc = wr_get(w, t->split, raw_buf + po[p], psize[l][p], t->offset + psize[l][p] * x);
            }
            if (rc != COMMON_OK)
                break;
            const uint8_t *data = raw_buf;
            uint64_t       stored = raw;
            uint32_t       codec = COMMON_QSF_RAW;
            if (w->o->lz4 != COMMON_QSF_LZ4_NEVER && cap && raw > 0) {
                int c =
                    LZ4_compress_default((const char *)raw_buf, (char *)lz_buf, (int)raw, (int)cap);
                bool keep =
                    c > 0 && (w->o->lz4 == COMMON_QSF_LZ4_ALWAYS ? (uint64_t)c < raw
                                                                 : (uint64_t)c * 10 <= raw * 9);
                if (keep) {
                    data = lz_buf;
                    stored = (uint64_t)c;
                    codec = COMMON_QSF_LZ4;
                }
            }
            uint32_t f = wr_file_of(w, x, m->hp.n_expert);
            if ((rc = wr_put(w, f, data, stored, end[f])) != COMMON_OK)
                break;
            uint8_t *r = rec + ((uint64_t)l * m->hp.n_expert + x) * QSF_BREC_BYTES;
            le64(r, end[f]);
            le64(r + 8, stored);
            le64(r + 16, raw);
            le64(r + 24, common_qsf_hash(data, (size_t)stored));
            le32(r + 32, codec);
            le32(r + 36, f);
            end[f] = qsf_align_up(end[f] + stored, COMMON_QSF_ALIGN);
            st->n_bundles++;
            st->n_lz4 += codec == COMMON_QSF_LZ4;
            st->raw_bytes += raw;
            st->stored_bytes += stored;
            wr_progress(w, raw);
        }
    }
    free(raw_buf);
    free(lz_buf);
    return rc;
}

/* Header fields into their bytes, with the header checksum. */
static void wr_header(const struct qsf_header *h, uint8_t *p)
{
    memset(p, 0, QSF_HEADER_BYTES);
    le32(p + 0, h->magic);
    le32(p + 4, h->version);
    le32(p + 8, h->hash_kind);
    le32(p + 12, h->flags);
    le64(p + 16, h->meta_off);
    le64(p + 24, h->meta_len);
    le64(p + 32, h->meta_virt);
    le64(p + 40, h->index_off);
    le64(p + 48, h->index_len);
    le64(p + 56, h->data_off);
    le64(p + 64, h->data_len);
    le64(p + 72, h->bundles_off);
    le64(p + 80, h->bundles_len);
    le32(p + 88, h->n_layer);
    le32(p + 92, h->n_expert);
    le64(p + 96, h->meta_hash);
    le64(p + 104, h->index_hash);
    le64(p + 120, common_qsf_hash(p, QSF_HEADER_HASHED));
}

/* Everything but the rename: the layout, the regions in order, the index, then the header. */
static int wr_file(struct qsf_wr *w, const struct common_model *m, struct common_qsf_stats *st)
{
    const struct common_gguf  *in = w->in;
    uint64_t                   n = common_gguf_n_tensors(in), n_res = 0;
    uint32_t                   nl = m->hp.n_layer, ne = m->hp.n_expert;
    struct common_gguf_writer *gw = NULL;
    uint8_t                   *image = NULL, *ix = NULL, *copy = malloc((size_t)QSF_COPY_CHUNK);
    size_t                     image_len = 0;
    bool                      *bundled = calloc(n ? n : 1, sizeof(*bundled));
    uint64_t                  *order = calloc(n ? n : 1, sizeof(*order));
    int64_t(*idx)[COMMON_EXPERT_PART_COUNT] = calloc(nl ? nl : 1, sizeof(*idx));
    uint64_t(*psize)[COMMON_EXPERT_PART_COUNT] = calloc(nl ? nl : 1, sizeof(*psize));
    uint64_t n_bundles = common_model_is_moe(m) ? (uint64_t)nl * ne : 0;
    uint64_t index_len = QSF_INDEX_HEAD + n * QSF_TREC_BYTES + n_bundles * QSF_BREC_BYTES;
    int      rc = COMMON_ENOMEM;
    if (!copy || !bundled || !order || !idx || !psize || !(ix = calloc(1, (size_t)index_len)))
        goto out;
    if ((rc = wr_bundled(m, idx, psize, w->e)) != COMMON_OK)
        goto out;
    for (uint32_t l = 0; l < nl && n_bundles; l++)
        for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
            if (idx[l][p] >= 0)
                bundled[idx[l][p]] = true;
    if ((rc = common_gguf_writer_create(&gw, (uint32_t)common_gguf_alignment(in))) != COMMON_OK ||
        (rc = wr_declare(w, gw, bundled, order, &n_res)) != COMMON_OK ||
        (rc = common_gguf_writer_image(gw, &image, &image_len)) != COMMON_OK) {
        common_errmsg_set(w->e, rc, "metadata: %s", common_strerror(rc));
        goto out;
    }
    struct qsf_header h = {.magic = COMMON_QSF_MAGIC,
                           .version = COMMON_QSF_VERSION,
                           .hash_kind = QSF_HASH_XXH3,
                           .meta_off = COMMON_QSF_ALIGN,
                           .meta_len = image_len,
                           .meta_virt = common_gguf_writer_data_size(gw),
                           .n_layer = n_bundles ? nl : 0,
                           .n_expert = n_bundles ? ne : 0,
                           .meta_hash = common_qsf_hash(image, image_len)};
    uint64_t          last_off = 0, last_size = 0;
    if (n_res)
        common_gguf_writer_tensor_place(gw, n_res - 1, &last_off, &last_size);
    h.data_off = qsf_align_up(h.meta_off + h.meta_len, COMMON_QSF_ALIGN);
    h.data_len = n_res ? last_off + last_size : 0;
    h.bundles_off = qsf_align_up(h.data_off + h.data_len, COMMON_QSF_ALIGN);
    for (uint64_t k = 0; k < n; k++)
        w->total += common_gguf_tensor_at(in, order[k])->size;
    if ((rc = wr_put(w, 0, image, image_len, h.meta_off)) != COMMON_OK)
        goto out;
    le64(ix, n);
    le64(ix + 8, n_bundles);
    for (uint64_t k = 0; k < n; k++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(in, order[k]);
        uint8_t                         *r = ix + QSF_INDEX_HEAD + k * QSF_TREC_BYTES;
        if (bundled[order[k]]) {
            for (uint32_t l = 0; l < nl; l++)
                for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
                    if (idx[l][p] == (int64_t)order[k]) {
                        le32(r, QSF_TENSOR_BUNDLED);
                        le32(r + 4, l);
                        le32(r + 8, p);
                    }
            continue;
        }
        uint64_t off = 0, size = 0, hash = 0;
        common_gguf_writer_tensor_place(gw, k, &off, &size);
        if ((rc = wr_copy_tensor(w, t, h.data_off + off, copy, &hash)) != COMMON_OK)
            goto out;
        le32(r, QSF_TENSOR_RESIDENT);
        le64(r + 16, hash);
        st->n_tensors++;
        st->resident_bytes += t->size;
    }
    uint64_t end[1 + QSF_MAX_FILES];
    end[0] = h.bundles_off;
    for (uint32_t f = 1; f < w->n_out; f++)
        end[f] = COMMON_QSF_ALIGN;
    if (n_bundles && (rc = wr_bundles(w, m, idx, psize, ix + QSF_INDEX_HEAD + n * QSF_TREC_BYTES,
                                      end, st)) != COMMON_OK)
        goto out;
    h.bundles_len = end[0] - h.bundles_off;
    h.index_off = end[0];
    h.index_len = index_len;
    h.index_hash = common_qsf_hash(ix, (size_t)index_len);
    uint8_t hb[QSF_HEADER_BYTES];
    wr_header(&h, hb);
    st->file_bytes = h.index_off + h.index_len;
    if ((rc = wr_put(w, 0, ix, index_len, h.index_off)) != COMMON_OK ||
        (rc = wr_put(w, 0, hb, sizeof(hb), 0)) != COMMON_OK)
        goto out;
    for (uint32_t f = 1; f < w->n_out && rc == COMMON_OK; f++) {
        /* A bundle file: its header binds it to this main file (the index checksum) and names
         * its size, padded to the last bundle's aligned end (O_DIRECT reads whole pages). */
        memset(hb, 0, sizeof(hb));
        le32(hb, QSF_BFILE_MAGIC);
        le32(hb + 4, COMMON_QSF_VERSION);
        le32(hb + 8, f);
        le32(hb + 12, w->n_out - 1);
        le64(hb + 16, h.index_hash);
        le64(hb + 24, end[f]);
        le64(hb + 120, common_qsf_hash(hb, QSF_HEADER_HASHED));
        st->file_bytes += end[f];
        if ((rc = wr_put(w, f, hb, sizeof(hb), 0)) == COMMON_OK &&
            ftruncate(w->out[f].fd, (off_t)end[f]) != 0)
            rc = common_errmsg_set(w->e, COMMON_EIO, "%s: truncate failed: %s", w->out[f].tmp,
                                   strerror(errno));
    }
    for (uint32_t f = 0; f < w->n_out && rc == COMMON_OK; f++)
        if (fsync(w->out[f].fd) != 0)
            rc = common_errmsg_set(w->e, COMMON_EIO, "%s: fsync failed: %s", w->out[f].tmp,
                                   strerror(errno));
out:
    common_gguf_writer_destroy(gw);
    free(image);
    free(ix);
    free(copy);
    free(bundled);
    free(order);
    free(idx);
    free(psize);
    return rc;
}

/* Names the output files: OUT, and for N shards OUT's stem + "-experts-0000k-of-0000N.qsf" in
 * shard_dirs[k-1] (recorded there by absolute path) or beside OUT (recorded by name). */
static int wr_name_files(struct qsf_wr *w, const char *path)
{
    const struct common_qsf_convert_opts *o = w->o;
    w->n_out = o->n_shards >= 2 ? 1 + o->n_shards : 1;
    if (!(w->out[0].path = strdup(path)))
        return COMMON_ENOMEM;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t      stem = strlen(base);
    if (stem > 4 && strcmp(base + stem - 4, ".qsf") == 0)
        stem -= 4;
    for (uint32_t f = 1; f < w->n_out; f++) {
        char name[512];
        snprintf(name, sizeof(name), "%.*s-experts-%05u-of-%05u.qsf",
                 (int)(stem > 400 ? 400 : stem), base, f, w->n_out - 1);
        const char *dir = o->shard_dirs ? o->shard_dirs[f - 1] : NULL;
        char       *abs = dir ? realpath(dir, NULL) : NULL;
        if (dir && !abs)
            return common_errmsg_set(w->e, common_err_from_errno(errno), "%s: %s", dir,
                                     strerror(errno));
        size_t len = strlen(path) + strlen(name) + (abs ? strlen(abs) : 0) + 2;
        char  *full = malloc(len);
        if (!full) {
            free(abs);
            return COMMON_ENOMEM;
        }
        if (abs)
            snprintf(full, len, "%s/%s", abs, name);
        else
            snprintf(full, len, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path, name);
        free(abs);
        w->out[f].path = full;
        if (!(w->out[f].entry = strdup(dir ? full : name)))
            return COMMON_ENOMEM;
    }
    return COMMON_OK;
}

int common_qsf_convert(const struct common_gguf *in, const struct common_model *m, const char *path,
                       const struct common_qsf_convert_opts *o, struct common_qsf_stats *st,
                       struct common_errmsg *e)
{
    static const struct common_qsf_convert_opts none = {0};
    if (!in || !m || !path || !st || m->gguf != in)
        return common_errmsg_set(e, COMMON_EINVAL, "convert: bad arguments");
    if (common_gguf_is_qsf(in))
        return common_errmsg_set(e, COMMON_EINVAL, "the input is already a QSF file");
    if (o && o->n_shards > QSF_MAX_FILES)
        return common_errmsg_set(e, COMMON_EINVAL, "at most %u bundle files", QSF_MAX_FILES);
    if (o && o->n_shards >= 2 && o->n_shards > m->hp.n_expert)
        return common_errmsg_set(e, COMMON_EINVAL, "%u bundle files for %u experts", o->n_shards,
                                 m->hp.n_expert);
    memset(st, 0, sizeof(*st));
    struct qsf_wr *w = calloc(1, sizeof(*w));
    if (!w)
        return COMMON_ENOMEM;
    *w = (struct qsf_wr){.in = in, .o = o ? o : &none, .e = e};
    for (uint32_t f = 0; f <= QSF_MAX_FILES; f++)
        w->out[f].fd = -1;
    int rc = wr_name_files(w, path);
    for (uint32_t f = 0; f < w->n_out && rc == COMMON_OK; f++) {
        size_t n = strlen(w->out[f].path) + 5;
        if (!(w->out[f].tmp = malloc(n))) {
            rc = COMMON_ENOMEM;
            break;
        }
        snprintf(w->out[f].tmp, n, "%s.tmp", w->out[f].path);
        w->out[f].fd = open(w->out[f].tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (w->out[f].fd < 0)
            rc = common_errmsg_set(e, common_err_from_errno(errno), "%s: cannot create: %s",
                                   w->out[f].tmp, strerror(errno));
    }
    if (rc == COMMON_OK)
        rc = wr_file(w, m, st);
    for (uint32_t f = 0; f < w->n_out; f++)
        if (w->out[f].fd >= 0 && close(w->out[f].fd) != 0 && rc == COMMON_OK)
            rc = common_errmsg_set(e, COMMON_EIO, "%s: close failed: %s", w->out[f].tmp,
                                   strerror(errno));
    /* Bundle files first: the main file appears last, complete. */
    for (uint32_t f = w->n_out; f-- > 0 && rc == COMMON_OK;)
        if (rename(w->out[f].tmp, w->out[f].path) != 0)
            rc = common_errmsg_set(e, COMMON_EIO, "cannot rename %s to %s: %s", w->out[f].tmp,
                                   w->out[f].path, strerror(errno));
    for (uint32_t f = 0; f < w->n_out; f++) {
        if (rc != COMMON_OK && w->out[f].tmp)
            unlink(w->out[f].tmp);
        free(w->out[f].path);
        free(w->out[f].tmp);
        free(w->out[f].entry);
    }
    free(w);
    return rc;
}
