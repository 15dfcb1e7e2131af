/* common/gguf.c - GGUF v2/v3 reader: header, metadata, tensor infos, split files; untrusted input.
 * The accessors are in gguf_get.c. */
#include "common.h"
#include "gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAX_HEADER_DEFAULT (1ull << 30)
#define GGUF_FIRST_READ         (1u << 20)
#define GGUF_MAX_NAME           1024u /* longest tensor name accepted */
#define GGUF_MAX_SPLITS         9999u
/* Internal (positive) code: the buffer ended before the file did; read more and retry. */
#define GGUF_NEED_MORE 1

/* ---- small arena for NUL-terminated names ------------------------------------------------ */

/* Returns `size` bytes aligned to 8 from the arena, or NULL. */
static void *gguf_arena_alloc(struct gguf_arena_chunk **head, size_t size)
{
    struct gguf_arena_chunk *c = *head;
    size = (size + 7u) & ~(size_t)7u;
    if (!c || c->cap - c->used < size) {
        size_t cap = size > 65536 ? size : 65536;
        c = malloc(sizeof(*c) + cap);
        if (!c)
            return NULL;
        c->next = *head;
        c->used = 0;
        c->cap = cap;
        *head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    return p;
}

static char *gguf_arena_strdup(struct gguf_arena_chunk **head, const char *s, size_t len)
{
    char *p = gguf_arena_alloc(head, len + 1);
    if (!p)
        return NULL;
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

static void gguf_arena_free(struct gguf_arena_chunk *c)
{
    while (c) {
        struct gguf_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
}

/* ---- cursor over untrusted bytes ----------------------------------------------------------- */

#define GGUF_MAX_COUNT (1u << 20) /* metadata entries, and tensors, of one file at most */

struct gguf_cursor {
    const uint8_t        *buf;       /* borrowed: header bytes read so far */
    uint64_t              len;       /* bytes in buf */
    uint64_t              max_len;   /* the most bytes buf may grow to (the header's limit) */
    uint64_t              file_size; /* bytes in the whole file */
    uint64_t              pos;
    struct common_errmsg *e;
    const char           *what; /* what is being read, for messages */
};

/* Checks that n more bytes exist. */
static int gguf_need(struct gguf_cursor *c, uint64_t n)
{
    uint64_t end;
    if (!common_add_u64(c->pos, n, &end) || end > c->file_size)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "truncated: %s needs %llu bytes at offset %llu, file has %llu",
                                 c->what, (unsigned long long)n, (unsigned long long)c->pos,
                                 (unsigned long long)c->file_size);
    if (end > c->len)
        return GGUF_NEED_MORE;
    return COMMON_OK;
}

static int gguf_read(struct gguf_cursor *c, void *dst, uint64_t n)
{
    int rc = gguf_need(c, n);
    if (rc != COMMON_OK)
        return rc;
    memcpy(dst, c->buf + c->pos, n);
    c->pos += n;
    return COMMON_OK;
}

static int gguf_read_u32(struct gguf_cursor *c, uint32_t *v)
{
    return gguf_read(c, v, sizeof(*v));
}

static int gguf_read_u64(struct gguf_cursor *c, uint64_t *v)
{
    return gguf_read(c, v, sizeof(*v));
}

/* Reads a GGUF string (u64 length + bytes) without copying. */
static int gguf_read_str(struct gguf_cursor *c, struct common_gguf_str *s)
{
    uint64_t len;
    uint64_t at = c->pos;
    int      rc = gguf_read_u64(c, &len);
    if (rc != COMMON_OK)
        return rc;
    if (len > c->file_size - c->pos)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "%s: string length %llu at offset %llu exceeds the file", c->what,
                                 (unsigned long long)len, (unsigned long long)at);
    rc = gguf_need(c, len);
    if (rc != COMMON_OK)
        return rc;
    s->ptr = (const char *)(c->buf + c->pos);
    s->len = len;
    c->pos += len;
    return COMMON_OK;
}

uint64_t common_gguf_vtype_size(uint32_t t)
{
    switch (t) {
    case COMMON_GGUF_UINT8:
    case COMMON_GGUF_INT8:
    case COMMON_GGUF_BOOL:
        return 1;
    case COMMON_GGUF_UINT16:
    case COMMON_GGUF_INT16:
        return 2;
    case COMMON_GGUF_UINT32:
    case COMMON_GGUF_INT32:
    case COMMON_GGUF_FLOAT32:
        return 4;
    case COMMON_GGUF_UINT64:
    case COMMON_GGUF_INT64:
    case COMMON_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

const char *common_gguf_vtype_name(uint32_t type)
{
    static const char *names[COMMON_GGUF_VTYPE_COUNT] = {
        "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
        "bool",  "string", "array",  "uint64", "int64",  "float64",
    };
    return type < COMMON_GGUF_VTYPE_COUNT ? names[type] : "unknown";
}

/* Decodes one little-endian scalar of type t at p into the value union. */
void common_gguf_decode_scalar(uint32_t t, const uint8_t *p, struct common_gguf_value *v)
{
    v->type = t;
    switch (t) {
    case COMMON_GGUF_UINT8:
        v->v.u64 = p[0];
        break;
    case COMMON_GGUF_BOOL:
        v->v.u64 = p[0] != 0;
        break;
    case COMMON_GGUF_INT8:
        v->v.i64 = (int8_t)p[0];
        break;
    case COMMON_GGUF_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        v->v.u64 = x;
        break;
    }
    case COMMON_GGUF_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        v->v.i64 = x;
        break;
    }
    case COMMON_GGUF_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        v->v.u64 = x;
        break;
    }
    case COMMON_GGUF_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        v->v.i64 = x;
        break;
    }
    case COMMON_GGUF_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        v->v.f64 = (double)x;
        break;
    }
    case COMMON_GGUF_UINT64:
        memcpy(&v->v.u64, p, 8);
        break;
    case COMMON_GGUF_INT64:
        memcpy(&v->v.i64, p, 8);
        break;
    case COMMON_GGUF_FLOAT64:
        memcpy(&v->v.f64, p, 8);
        break;
    default:
        break;
    }
}

/* Reads one value of type t (after the type tag). Arrays of arrays are rejected. */
static int gguf_read_value(struct gguf_cursor *c, struct common_gguf *g, uint32_t t,
                           const char *key, struct common_gguf_value *v)
{
    int      rc;
    uint64_t at = c->pos;
    if (t == COMMON_GGUF_STRING) {
        v->type = t;
        return gguf_read_str(c, &v->v.str);
    }
    if (t == COMMON_GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        if ((rc = gguf_read_u32(c, &et)) != COMMON_OK || (rc = gguf_read_u64(c, &n)) != COMMON_OK)
            return rc;
        v->type = t;
        v->v.arr.type = et;
        v->v.arr.n = n;
        v->v.arr.data = NULL;
        v->v.arr.strs = NULL;
        if (et == COMMON_GGUF_ARRAY)
            return common_errmsg_set(c->e, COMMON_ENOTSUP,
                                     "key '%s': arrays of arrays are not supported (offset %llu)",
                                     key, (unsigned long long)at);
        if (et == COMMON_GGUF_STRING) {
            /* Each string takes at least its 8-byte length, and every one lies in the header:
             * n is bounded by the bytes read so far before its table is allocated (more are
             * read first, up to the header's limit). */
            const uint64_t room = (c->max_len < c->file_size ? c->max_len : c->file_size);
            if (n > (room > c->pos ? room - c->pos : 0) / 8)
                return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                         "key '%s': array of %llu strings at offset %llu "
                                         "exceeds the %s",
                                         key, (unsigned long long)n, (unsigned long long)at,
                                         room < c->file_size ? "header's limit" : "file");
            if (n > (c->len - c->pos) / 8)
                return GGUF_NEED_MORE;
            /* The table lives in the arena; a restarted parse builds a new one. */
            struct common_gguf_str *strs =
                n ? gguf_arena_alloc(&g->arena, n * sizeof(struct common_gguf_str)) : NULL;
            if (n && !strs)
                return COMMON_ENOMEM;
            for (uint64_t i = 0; i < n; i++) {
                c->what = key;
                if ((rc = gguf_read_str(c, &strs[i])) != COMMON_OK)
                    return rc;
            }
            v->v.arr.strs = strs;
            return COMMON_OK;
        }
        uint64_t es = common_gguf_vtype_size(et);
        if (es == 0)
            return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                     "key '%s': unknown array element type %u at offset %llu", key,
                                     et, (unsigned long long)at);
        if (n > (c->file_size - c->pos) / es)
            return common_errmsg_set(
                c->e, COMMON_ECORRUPT, "key '%s': array of %llu %s at offset %llu exceeds the file",
                key, (unsigned long long)n, common_gguf_vtype_name(et), (unsigned long long)at);
        if ((rc = gguf_need(c, n * es)) != COMMON_OK)
            return rc;
        v->v.arr.data = c->buf + c->pos;
        c->pos += n * es;
        return COMMON_OK;
    }
    uint64_t es = common_gguf_vtype_size(t);
    if (es == 0)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "key '%s': unknown value type %u at offset %llu", key, t,
                                 (unsigned long long)at);
    if ((rc = gguf_need(c, es)) != COMMON_OK)
        return rc;
    common_gguf_decode_scalar(t, c->buf + c->pos, v);
    c->pos += es;
    return COMMON_OK;
}

/* Result of parsing one file's header. */
struct gguf_header {
    uint32_t                   version;
    uint64_t                   alignment;
    struct common_gguf_kv     *kvs; /* owned until moved into the model */
    uint64_t                   n_kv;
    struct common_gguf_tensor *tensors; /* owned until moved into the model */
    uint64_t                   n_tensors;
    uint64_t                   data_offset;
};

static void gguf_header_free(struct gguf_header *h)
{
    free(h->kvs);
    free(h->tensors);
    memset(h, 0, sizeof(*h));
}

/* The fixed start of a header: magic, version, tensor and metadata counts (checked against
 * what the file can hold). Returns 0, GGUF_NEED_MORE, or a negative error with a message. */
static int gguf_parse_prelude(struct gguf_cursor *c, struct gguf_header *h)
{
    int      rc;
    uint32_t magic;
    c->what = "magic";
    if ((rc = gguf_read_u32(c, &magic)) != COMMON_OK)
        return rc;
    if (magic != COMMON_GGUF_MAGIC)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "not a GGUF file: magic 0x%08x at offset 0 (want \"GGUF\")",
                                 magic);
    c->what = "version";
    if ((rc = gguf_read_u32(c, &h->version)) != COMMON_OK)
        return rc;
    if (h->version == 1)
        return common_errmsg_set(c->e, COMMON_ENOTSUP,
                                 "GGUF version 1 is not supported (re-convert the model to v3)");
    if ((h->version & 0xFFFFu) == 0 && h->version != 0)
        return common_errmsg_set(c->e, COMMON_ENOTSUP,
                                 "big-endian GGUF (version field 0x%08x) is not supported",
                                 h->version);
    if (h->version < 2 || h->version > 3)
        return common_errmsg_set(c->e, COMMON_ENOTSUP, "GGUF version %u is not supported (2 or 3)",
                                 h->version);
    c->what = "tensor count";
    if ((rc = gguf_read_u64(c, &h->n_tensors)) != COMMON_OK)
        return rc;
    c->what = "metadata count";
    if ((rc = gguf_read_u64(c, &h->n_kv)) != COMMON_OK)
        return rc;
    /* A kv takes at least 8 (key len) + 4 (type) + 1 bytes; a tensor info at least 8+4+8+4+8. */
    if (h->n_kv > (c->file_size - c->pos) / 13)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "metadata count %llu at offset 16 cannot fit in the file",
                                 (unsigned long long)h->n_kv);
    if (h->n_tensors > (c->file_size - c->pos) / 32)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "tensor count %llu at offset 8 cannot fit in the file",
                                 (unsigned long long)h->n_tensors);
    /* The size bounds above trust file_size, which a QSF metadata image states itself (its
     * tensor data lies elsewhere): cap the counts at what no real file comes near. */
    if (h->n_kv > GGUF_MAX_COUNT || h->n_tensors > GGUF_MAX_COUNT)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "%llu metadata entries and %llu tensors: more than the %u a file "
                                 "may hold",
                                 (unsigned long long)h->n_kv, (unsigned long long)h->n_tensors,
                                 GGUF_MAX_COUNT);

    return COMMON_OK;
}

/* The metadata of a header: keys unique and NUL-free (into g's arena), values decoded,
 * general.alignment checked. Returns 0, GGUF_NEED_MORE, or a negative error with a message. */
static int gguf_parse_kvs(struct gguf_cursor *c, struct common_gguf *g, struct gguf_header *h)
{
    int               rc;
    struct gguf_index kix = {0};
    if ((rc = gguf_index_init(&kix, h->n_kv)) != COMMON_OK)
        return rc;
    h->alignment = COMMON_GGUF_DEFAULT_ALIGN;
    for (uint64_t i = 0; i < h->n_kv; i++) {
        struct common_gguf_kv *kv = &h->kvs[i];
        struct common_gguf_str key;
        uint32_t               t;
        kv->file_offset = c->pos;
        c->what = "metadata key";
        if ((rc = gguf_read_str(c, &key)) != COMMON_OK)
            goto out_kix;
        if (key.len == 0 || memchr(key.ptr, '\0', key.len)) {
            rc = common_errmsg_set(c->e, COMMON_ECORRUPT,
                                   "metadata key %llu at offset %llu is empty or contains NUL",
                                   (unsigned long long)i, (unsigned long long)kv->file_offset);
            goto out_kix;
        }
        kv->key = gguf_arena_strdup(&g->arena, key.ptr, key.len);
        if (!kv->key) {
            rc = COMMON_ENOMEM;
            goto out_kix;
        }
        if (!gguf_index_insert(&kix, kv->key, gguf_kv_name, h->kvs, i)) {
            rc = common_errmsg_set(c->e, COMMON_ECORRUPT,
                                   "duplicate metadata key '%s' at offset %llu", kv->key,
                                   (unsigned long long)kv->file_offset);
            goto out_kix;
        }
        c->what = kv->key;
        if ((rc = gguf_read_u32(c, &t)) != COMMON_OK)
            goto out_kix;
        if ((rc = gguf_read_value(c, g, t, kv->key, &kv->value)) != COMMON_OK)
            goto out_kix;
        if (strcmp(kv->key, "general.alignment") == 0) {
            uint64_t a = kv->value.v.u64;
            if (t != COMMON_GGUF_UINT32 || a == 0 || (a & (a - 1)) != 0) {
                rc = common_errmsg_set(
                    c->e, COMMON_ECORRUPT,
                    "general.alignment must be a power-of-two uint32 (offset %llu)",
                    (unsigned long long)kv->file_offset);
                goto out_kix;
            }
            h->alignment = a;
        }
    }
    free(kix.slots);
    return COMMON_OK;

out_kix:
    free(kix.slots);
    return rc;
}

/* Tensor info `i`: name, dimensions, type and data offset, its size computed and checked; the
 * offset stays relative to the data section. Returns 0, GGUF_NEED_MORE, or a negative error. */
static int gguf_parse_tensor_info(struct gguf_cursor *c, struct common_gguf *g, uint32_t split,
                                  const struct gguf_header *h, uint64_t i,
                                  struct common_gguf_tensor *ti)
{
    int                    rc;
    struct common_gguf_str name;
    uint64_t               at = c->pos;
    c->what = "tensor name";
    if ((rc = gguf_read_str(c, &name)) != COMMON_OK)
        return rc;
    if (name.len == 0 || name.len > GGUF_MAX_NAME || memchr(name.ptr, '\0', name.len))
        return common_errmsg_set(
            c->e, COMMON_ECORRUPT, "tensor %llu at offset %llu: bad name (length %llu)",
            (unsigned long long)i, (unsigned long long)at, (unsigned long long)name.len);
    ti->name = gguf_arena_strdup(&g->arena, name.ptr, name.len);
    if (!ti->name)
        return COMMON_ENOMEM;
    c->what = ti->name;
    if ((rc = gguf_read_u32(c, &ti->n_dims)) != COMMON_OK)
        return rc;
    if (ti->n_dims == 0 || ti->n_dims > COMMON_GGUF_MAX_DIMS)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "tensor '%s' at offset %llu: %u dimensions (1..4 allowed)",
                                 ti->name, (unsigned long long)at, ti->n_dims);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < COMMON_GGUF_MAX_DIMS; d++) {
        ti->ne[d] = 1;
        if (d < ti->n_dims && (rc = gguf_read_u64(c, &ti->ne[d])) != COMMON_OK)
            return rc;
        if (ti->ne[d] > (uint64_t)INT64_MAX || !common_mul_u64(nel, ti->ne[d], &nel) ||
            nel > (uint64_t)INT64_MAX)
            return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                     "tensor '%s' at offset %llu: element count overflows",
                                     ti->name, (unsigned long long)at);
    }
    uint64_t rel;
    if ((rc = gguf_read_u32(c, &ti->type)) != COMMON_OK ||
        (rc = gguf_read_u64(c, &rel)) != COMMON_OK)
        return rc;
    const struct common_ggml_type_info *tt =
        ti->type < COMMON_GGML_TYPE_FILE_COUNT ? common_ggml_type_get(ti->type) : NULL;
    if (!tt)
        return common_errmsg_set(c->e, COMMON_ENOTSUP,
                                 "tensor '%s': unknown ggml type id %u (offset %llu)", ti->name,
                                 ti->type, (unsigned long long)at);
    if (ti->ne[0] % tt->blck != 0)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "tensor '%s': row of %llu elements is not a multiple of the "
                                 "%s block size %u",
                                 ti->name, (unsigned long long)ti->ne[0], tt->name, tt->blck);
    uint64_t size = 0;
    if (nel > 0 && (!common_mul_u64(nel / tt->blck, tt->type_size, &size)))
        return common_errmsg_set(c->e, COMMON_ECORRUPT, "tensor '%s': size overflows", ti->name);
    if (rel % h->alignment != 0)
        return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                 "tensor '%s': data offset %llu is not a multiple of the "
                                 "alignment %llu",
                                 ti->name, (unsigned long long)rel,
                                 (unsigned long long)h->alignment);
    ti->size = size;
    ti->offset = rel; /* made absolute below, once the data section start is known */
    ti->split = split;
    return COMMON_OK;
}

/* Places the data section after the infos (padded to the alignment) and makes every tensor's
 * offset absolute after checking that its data lies inside the file. */
static int gguf_place_tensors(struct gguf_cursor *c, struct gguf_header *h)
{
    /* The data section starts after the infos, padded to the alignment. */
    uint64_t pad = (h->alignment - c->pos % h->alignment) % h->alignment;
    h->data_offset = c->pos + pad;
    uint64_t data_bytes = h->data_offset <= c->file_size ? c->file_size - h->data_offset : 0;
    if (h->n_tensors > 0 && h->data_offset > c->file_size)
        return common_errmsg_set(
            c->e, COMMON_ECORRUPT, "truncated: data section starts at %llu, file has %llu bytes",
            (unsigned long long)h->data_offset, (unsigned long long)c->file_size);
    /* Each tensor's data starts where the previous one's ends, padded to the alignment, as
     * llama.cpp requires: overlapping, out-of-order or gapped data is refused, so no tensor's
     * bytes can be another's (or a type id changed in place be computed on garbage). */
    uint64_t expect = 0;
    for (uint64_t i = 0; i < h->n_tensors; i++) {
        struct common_gguf_tensor *ti = &h->tensors[i];
        uint64_t                   end;
        /* I2_S has three layouts of different sizes (executor/model.c tells them apart): its
         * bytes are all up to the next tensor's data (or the end of the file), at least the
         * 2-bit codes counted in ti->size. */
        if (ti->type == COMMON_GGML_TYPE_I2_S) {
            const uint64_t next = i + 1 < h->n_tensors ? h->tensors[i + 1].offset : data_bytes;
            if (next < ti->offset || next - ti->offset < ti->size)
                return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                         "tensor '%s': %s data [%llu, %llu) holds fewer than the "
                                         "%llu bytes of its codes",
                                         ti->name, "i2_s", (unsigned long long)ti->offset,
                                         (unsigned long long)next, (unsigned long long)ti->size);
            ti->size = next - ti->offset;
        }
        if (!common_add_u64(ti->offset, ti->size, &end) || end > data_bytes)
            return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                     "tensor '%s': data [%llu, +%llu) lies beyond the end of the "
                                     "file (data section %llu bytes at offset %llu)",
                                     ti->name, (unsigned long long)ti->offset,
                                     (unsigned long long)ti->size, (unsigned long long)data_bytes,
                                     (unsigned long long)h->data_offset);
        if (ti->offset != expect)
            return common_errmsg_set(c->e, COMMON_ECORRUPT,
                                     "tensor '%s': data offset %llu, expected %llu (tensor data "
                                     "must follow the infos' order without overlap or gap)",
                                     ti->name, (unsigned long long)ti->offset,
                                     (unsigned long long)expect);
        /* end <= data_bytes: neither the padding nor the sum can overflow. */
        expect = (end + h->alignment - 1) / h->alignment * h->alignment;
        ti->offset += h->data_offset;
    }
    return COMMON_OK;
}

/* Parses a header from c; names go into g's arena; tensor offsets become absolute. Returns 0,
 * GGUF_NEED_MORE, or a negative error with a message. */
static int gguf_parse_header(struct gguf_cursor *c, struct common_gguf *g, uint32_t split,
                             struct gguf_header *h)
{
    int rc;
    memset(h, 0, sizeof(*h));
    if ((rc = gguf_parse_prelude(c, h)) != COMMON_OK)
        return rc;
    h->kvs = calloc(h->n_kv ? h->n_kv : 1, sizeof(*h->kvs));
    h->tensors = calloc(h->n_tensors ? h->n_tensors : 1, sizeof(*h->tensors));
    if (!h->kvs || !h->tensors)
        return COMMON_ENOMEM;
    if ((rc = gguf_parse_kvs(c, g, h)) != COMMON_OK)
        return rc;
    for (uint64_t i = 0; i < h->n_tensors; i++)
        if ((rc = gguf_parse_tensor_info(c, g, split, h, i, &h->tensors[i])) != COMMON_OK)
            return rc;
    return gguf_place_tensors(c, h);
}

/* ---- building the model object --------------------------------------------------------------- */

static void gguf_free_splits(struct common_gguf *g)
{
    for (uint32_t i = 0; i < g->n_splits; i++) {
        free(g->splits[i].path);
        free(g->splits[i].hdr);
        if (g->splits[i].fd >= 0)
            close(g->splits[i].fd);
    }
    free(g->splits);
    g->splits = NULL;
    g->n_splits = 0;
}

void common_gguf_close(struct common_gguf *g)
{
    if (!g)
        return;
    gguf_free_splits(g);
    free(g->kvs);
    free(g->tensors);
    free(g->kv_index.slots);
    free(g->t_index.slots);
    qsf_info_free(g->qsf);
    gguf_arena_free(g->arena);
    free(g);
}

/* Adds split `h` (parsed from g->splits[split]) to g: kvs of split 0, tensors of every split. */
static int gguf_adopt(struct common_gguf *g, struct gguf_header *h, uint32_t split)
{
    g->splits[split].data_offset = h->data_offset;
    if (split == 0) {
        g->version = h->version;
        g->alignment = h->alignment;
        g->kvs = h->kvs;
        g->n_kv = h->n_kv;
        h->kvs = NULL;
    }
    if (h->n_tensors) {
        uint64_t                   n = g->n_tensors + h->n_tensors;
        struct common_gguf_tensor *t = realloc(g->tensors, n * sizeof(*t));
        if (!t)
            return COMMON_ENOMEM;
        memcpy(t + g->n_tensors, h->tensors, h->n_tensors * sizeof(*t));
        g->tensors = t;
        g->n_tensors = n;
    }
    gguf_header_free(h);
    return COMMON_OK;
}

/* Builds the name indexes and rejects duplicate tensor names (across splits too). */
static int gguf_build_indexes(struct common_gguf *g, struct common_errmsg *e)
{
    int rc;
    if ((rc = gguf_index_init(&g->kv_index, g->n_kv)) != COMMON_OK ||
        (rc = gguf_index_init(&g->t_index, g->n_tensors)) != COMMON_OK)
        return rc;
    for (uint64_t i = 0; i < g->n_kv; i++)
        gguf_index_insert(&g->kv_index, g->kvs[i].key, gguf_kv_name, g->kvs, i);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (!gguf_index_insert(&g->t_index, g->tensors[i].name, gguf_tensor_name, g->tensors, i))
            return common_errmsg_set(e, COMMON_ECORRUPT, "duplicate tensor name '%s'",
                                     g->tensors[i].name);
    }
    return COMMON_OK;
}

static struct common_gguf *gguf_new(uint32_t n_splits)
{
    struct common_gguf *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->splits = calloc(n_splits, sizeof(*g->splits));
    if (!g->splits) {
        free(g);
        return NULL;
    }
    for (uint32_t i = 0; i < n_splits; i++)
        g->splits[i].fd = -1;
    g->n_splits = n_splits;
    return g;
}

int common_gguf_parse(const void *buf, size_t len, uint64_t file_size, struct common_gguf **out,
                      struct common_errmsg *e)
{
    if (!buf || !out || len > file_size)
        return common_errmsg_set(e, COMMON_EINVAL, "gguf: bad arguments");
    struct common_gguf *g = gguf_new(1);
    if (!g)
        return COMMON_ENOMEM;
    int rc = COMMON_ENOMEM;
    g->splits[0].hdr = malloc(len ? len : 1);
    if (!g->splits[0].hdr)
        goto out_free;
    memcpy(g->splits[0].hdr, buf, len);
    g->splits[0].size = file_size;

    struct gguf_cursor c = {
        .buf = g->splits[0].hdr, .len = len, .max_len = len, .file_size = file_size, .e = e};
    struct gguf_header h;
    rc = gguf_parse_header(&c, g, 0, &h);
    if (rc == GGUF_NEED_MORE)
        rc = common_errmsg_set(e, COMMON_ECORRUPT,
                               "truncated header: more than the %zu bytes given are needed", len);
    if (rc == COMMON_OK)
        rc = gguf_adopt(g, &h, 0);
    gguf_header_free(&h);
    if (rc == COMMON_OK)
        rc = gguf_build_indexes(g, e);
    if (rc != COMMON_OK)
        goto out_free;
    *out = g;
    return COMMON_OK;

out_free:
    common_gguf_close(g);
    return rc;
}

/* pread until n bytes or EOF. */
static int gguf_pread_full(int fd, void *dst, uint64_t n, uint64_t off)
{
    uint8_t *p = dst;
    while (n > 0) {
        size_t  chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return common_err_from_errno(errno);
        }
        if (r == 0)
            return COMMON_EIO;
        p += r;
        off += (uint64_t)r;
        n -= (uint64_t)r;
    }
    return COMMON_OK;
}

/* Opens one file into g->splits[split] and parses its header, reading more as needed. */
static int gguf_load_file(struct common_gguf *g, uint32_t split, const char *path, uint64_t max_hdr,
                          struct gguf_header *h, struct common_errmsg *e)
{
    struct gguf_split *s = &g->splits[split];
    s->path = strdup(path);
    if (!s->path)
        return COMMON_ENOMEM;
    /* O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; anything but a
     * regular file is refused below, before a byte is read. */
    s->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (s->fd < 0)
        return common_errmsg_set(e, common_err_from_errno(errno), "cannot open: %s",
                                 strerror(errno));
    struct stat st;
    if (fstat(s->fd, &st) != 0)
        return common_errmsg_set(e, COMMON_EIO, "cannot stat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return common_errmsg_set(e, COMMON_EINVAL, "not a regular file (%s)",
                                 S_ISFIFO(st.st_mode)  ? "a FIFO"
                                 : S_ISDIR(st.st_mode) ? "a directory"
                                                       : "a device or socket");
    int fl = fcntl(s->fd, F_GETFL);
    if (fl < 0 || fcntl(s->fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        return common_errmsg_set(e, COMMON_EIO, "cannot set blocking reads: %s", strerror(errno));
    s->size = (uint64_t)st.st_size;

    uint64_t want = s->size < GGUF_FIRST_READ ? s->size : GGUF_FIRST_READ;
    for (;;) {
        uint8_t *nb = realloc(s->hdr, want ? want : 1);
        if (!nb)
            return COMMON_ENOMEM;
        s->hdr = nb;
        int rc = gguf_pread_full(s->fd, s->hdr, want, 0);
        if (rc != COMMON_OK)
            return common_errmsg_set(e, rc, "read failed at offset 0 (%llu bytes): %s",
                                     (unsigned long long)want, common_strerror(rc));
        struct gguf_cursor c = {
            .buf = s->hdr, .len = want, .max_len = max_hdr, .file_size = s->size, .e = e};
        /* Restarting drops the arena strings of the failed attempt only at close; bounded by
         * the doubling, so at most twice the header. */
        rc = gguf_parse_header(&c, g, split, h);
        if (rc != GGUF_NEED_MORE)
            return rc;
        gguf_header_free(h);
        if (want >= s->size || want >= max_hdr)
            return common_errmsg_set(e, COMMON_ECORRUPT, "header larger than the %llu-byte limit",
                                     (unsigned long long)max_hdr);
        want = want * 2 > s->size ? s->size : want * 2;
        if (want > max_hdr)
            want = max_hdr;
    }
}

/* Finds "-NNNNN-of-MMMMM.gguf" at the end of path; returns the prefix length or 0. */
static size_t gguf_split_prefix(const char *path, uint32_t *no, uint32_t *count)
{
    size_t            n = strlen(path);
    static const char tail[] = "-00000-of-00000.gguf";
    size_t            tl = sizeof(tail) - 1;
    if (n <= tl)
        return 0;
    const char *s = path + n - tl;
    unsigned    a = 0, b = 0;
    for (size_t i = 0; i < tl; i++) {
        char want = tail[i];
        if (want == '0') {
            if (s[i] < '0' || s[i] > '9')
                return 0;
            if (i < 6)
                a = a * 10 + (unsigned)(s[i] - '0');
            else
                b = b * 10 + (unsigned)(s[i] - '0');
        } else if (s[i] != want) {
            return 0;
        }
    }
    *no = a;
    *count = b;
    return n - tl;
}

int common_gguf_open(const char *path, const struct common_gguf_opts *opts,
                     struct common_gguf **out, struct common_errmsg *e)
{
    struct common_gguf_opts o = opts ? *opts : (struct common_gguf_opts){0};
    uint64_t max_hdr = o.max_header_bytes ? o.max_header_bytes : GGUF_MAX_HEADER_DEFAULT;
    struct common_errmsg inner = {{0}};
    struct gguf_header   h;
    memset(&h, 0, sizeof(h));
    if (!path || !out)
        return common_errmsg_set(e, COMMON_EINVAL, "gguf: bad arguments");
    if (common_qsf_file_is(path))
        return qsf_open(path, max_hdr, out, e);

    struct common_gguf *g = gguf_new(1);
    if (!g)
        return COMMON_ENOMEM;
    int rc = gguf_load_file(g, 0, path, max_hdr, &h, &inner);
    if (rc == COMMON_OK)
        rc = gguf_adopt(g, &h, 0);
    if (rc != COMMON_OK) {
        common_errmsg_set(e, rc, "%s: %s", path, inner.text[0] ? inner.text : common_strerror(rc));
        goto out_free;
    }

    uint32_t count = 1, no = 0;
    if (!o.no_splits && common_gguf_get_u32(g, "split.count", &count) == COMMON_OK && count > 1) {
        uint32_t fno = 0, fcount = 0;
        size_t   plen = gguf_split_prefix(path, &fno, &fcount);
        if (common_gguf_get_u32(g, "split.no", &no) != COMMON_OK)
            no = 0;
        if (plen == 0 || fcount != count || count > GGUF_MAX_SPLITS) {
            rc = common_errmsg_set(
                e, COMMON_EINVAL,
                "%s: split.count is %u but the name is not NAME-%05u-of-%05u.gguf", path, count,
                no + 1, count);
            goto out_free;
        }
        /* Reopen as a split set starting from file 1, whichever file was named. */
        common_gguf_close(g);
        g = gguf_new(count);
        if (!g)
            return COMMON_ENOMEM;
        size_t n = plen + 32;
        char  *sp = malloc(n);
        if (!sp) {
            rc = COMMON_ENOMEM;
            goto out_free;
        }
        for (uint32_t i = 0; i < count; i++) {
            snprintf(sp, n, "%.*s-%05u-of-%05u.gguf", (int)plen, path, i + 1, count);
            inner.text[0] = '\0';
            rc = gguf_load_file(g, i, sp, max_hdr, &h, &inner);
            uint32_t sno = UINT32_MAX, scount = 0;
            if (rc == COMMON_OK) {
                /* Each split names its own index and the count. */
                for (uint64_t k = 0; k < h.n_kv; k++) {
                    if (strcmp(h.kvs[k].key, "split.no") == 0)
                        sno = (uint32_t)h.kvs[k].value.v.u64;
                    if (strcmp(h.kvs[k].key, "split.count") == 0)
                        scount = (uint32_t)h.kvs[k].value.v.u64;
                }
                if (sno != i || scount != count)
                    rc = common_errmsg_set(&inner, COMMON_ECORRUPT,
                                           "split.no/split.count are %u/%u, expected %u/%u", sno,
                                           scount, i, count);
            }
            if (rc == COMMON_OK)
                rc = gguf_adopt(g, &h, i);
            if (rc != COMMON_OK) {
                common_errmsg_set(e, rc, "%s: %s", sp,
                                  inner.text[0] ? inner.text : common_strerror(rc));
                free(sp);
                goto out_free;
            }
        }
        free(sp);
        uint64_t want_tensors;
        if (common_gguf_get_u64(g, "split.tensors.count", &want_tensors) == COMMON_OK &&
            want_tensors != g->n_tensors) {
            rc = common_errmsg_set(
                e, COMMON_ECORRUPT, "%s: split.tensors.count is %llu but the splits hold %llu",
                path, (unsigned long long)want_tensors, (unsigned long long)g->n_tensors);
            goto out_free;
        }
    }
    rc = gguf_build_indexes(g, &inner);
    if (rc != COMMON_OK) {
        common_errmsg_set(e, rc, "%s: %s", path, inner.text[0] ? inner.text : common_strerror(rc));
        goto out_free;
    }
    *out = g;
    return COMMON_OK;

out_free:
    gguf_header_free(&h);
    common_gguf_close(g);
    return rc;
}
