/* common/gguf_write.c - GGUF v3 writer: header in memory, tensor data streamed in order. */
#include "common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A growable byte buffer holding the serialized metadata. */
struct gguf_wbuf {
    uint8_t *data; /* owned */
    size_t   len;
    size_t   cap;
};

struct gguf_wtensor {
    char    *name; /* owned */
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[COMMON_GGUF_MAX_DIMS];
    uint64_t offset; /* relative to the data section */
    uint64_t size;
};

struct common_gguf_writer {
    uint32_t             alignment;
    struct gguf_wbuf     kv; /* serialized kv pairs */
    uint64_t             n_kv;
    char               **keys;    /* owned: n_kv copies, for duplicate checks */
    struct gguf_wtensor *tensors; /* owned */
    uint64_t             n_tensors;
    uint64_t             data_size; /* bytes of the data section so far (declared) */
    FILE                *f;         /* owned while writing */
    uint64_t             cur;       /* tensor being written */
    uint64_t             cur_done;  /* bytes of it written */
    uint64_t             written;   /* data bytes written, padding included */
};

static int wbuf_put(struct gguf_wbuf *b, const void *p, size_t n)
{
    if (b->cap - b->len < n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len < n)
            cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d)
            return COMMON_ENOMEM;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return COMMON_OK;
}

static int wbuf_u32(struct gguf_wbuf *b, uint32_t v)
{
    return wbuf_put(b, &v, sizeof(v));
}

static int wbuf_u64(struct gguf_wbuf *b, uint64_t v)
{
    return wbuf_put(b, &v, sizeof(v));
}

static int wbuf_str(struct gguf_wbuf *b, const char *s, uint64_t len)
{
    int rc = wbuf_u64(b, len);
    return rc ? rc : wbuf_put(b, s, (size_t)len);
}

int common_gguf_writer_create(struct common_gguf_writer **out, uint32_t alignment)
{
    if (alignment == 0)
        alignment = COMMON_GGUF_DEFAULT_ALIGN;
    if ((alignment & (alignment - 1)) != 0)
        return COMMON_EINVAL;
    struct common_gguf_writer *w = calloc(1, sizeof(*w));
    if (!w)
        return COMMON_ENOMEM;
    w->alignment = alignment;
    *out = w;
    return COMMON_OK;
}

void common_gguf_writer_destroy(struct common_gguf_writer *w)
{
    if (!w)
        return;
    if (w->f)
        fclose(w->f);
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->tensors);
    free(w->kv.data);
    free(w);
}

/* Starts a kv: checks the key is new, records it, writes key and type. */
static int writer_kv_begin(struct common_gguf_writer *w, const char *key, uint32_t type)
{
    if (!key || !*key || w->f)
        return COMMON_EINVAL;
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return COMMON_EINVAL;
    char **keys = realloc(w->keys, (w->n_kv + 1) * sizeof(*keys));
    if (!keys)
        return COMMON_ENOMEM;
    w->keys = keys;
    if (!(w->keys[w->n_kv] = strdup(key)))
        return COMMON_ENOMEM;
    w->n_kv++;
    int rc = wbuf_str(&w->kv, key, strlen(key));
    return rc ? rc : wbuf_u32(&w->kv, type);
}

static int writer_set_scalar(struct common_gguf_writer *w, const char *key, uint32_t type,
                             const void *v, size_t n)
{
    int rc = writer_kv_begin(w, key, type);
    return rc ? rc : wbuf_put(&w->kv, v, n);
}

int common_gguf_writer_set_u32(struct common_gguf_writer *w, const char *key, uint32_t v)
{
    return writer_set_scalar(w, key, COMMON_GGUF_UINT32, &v, sizeof(v));
}

int common_gguf_writer_set_i32(struct common_gguf_writer *w, const char *key, int32_t v)
{
    return writer_set_scalar(w, key, COMMON_GGUF_INT32, &v, sizeof(v));
}

int common_gguf_writer_set_u64(struct common_gguf_writer *w, const char *key, uint64_t v)
{
    return writer_set_scalar(w, key, COMMON_GGUF_UINT64, &v, sizeof(v));
}

int common_gguf_writer_set_f32(struct common_gguf_writer *w, const char *key, float v)
{
    return writer_set_scalar(w, key, COMMON_GGUF_FLOAT32, &v, sizeof(v));
}

int common_gguf_writer_set_bool(struct common_gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return writer_set_scalar(w, key, COMMON_GGUF_BOOL, &b, 1);
}

int common_gguf_writer_set_str(struct common_gguf_writer *w, const char *key, const char *v)
{
    int rc = writer_kv_begin(w, key, COMMON_GGUF_STRING);
    return rc ? rc : wbuf_str(&w->kv, v, strlen(v));
}

int common_gguf_writer_set_arr(struct common_gguf_writer *w, const char *key, uint32_t elem_type,
                               const void *data, uint64_t n)
{
    size_t es = (size_t)common_gguf_vtype_size(elem_type);
    if (elem_type != COMMON_GGUF_STRING && es == 0)
        return COMMON_EINVAL;
    int rc = writer_kv_begin(w, key, COMMON_GGUF_ARRAY);
    if (rc || (rc = wbuf_u32(&w->kv, elem_type)) || (rc = wbuf_u64(&w->kv, n)))
        return rc;
    if (elem_type == COMMON_GGUF_STRING) {
        const struct common_gguf_str *s = data;
        for (uint64_t i = 0; i < n; i++)
            if ((rc = wbuf_str(&w->kv, s[i].ptr, s[i].len)))
                return rc;
        return COMMON_OK;
    }
    return wbuf_put(&w->kv, data, (size_t)(n * es));
}

int common_gguf_writer_copy_kv(struct common_gguf_writer *w, const struct common_gguf_kv *kv)
{
    const struct common_gguf_value *v = &kv->value;
    switch (v->type) {
    case COMMON_GGUF_STRING: {
        int rc = writer_kv_begin(w, kv->key, COMMON_GGUF_STRING);
        return rc ? rc : wbuf_str(&w->kv, v->v.str.ptr, v->v.str.len);
    }
    case COMMON_GGUF_ARRAY:
        return common_gguf_writer_set_arr(
            w, kv->key, v->v.arr.type,
            v->v.arr.type == COMMON_GGUF_STRING ? (const void *)v->v.arr.strs : v->v.arr.data,
            v->v.arr.n);
    case COMMON_GGUF_FLOAT32: {
        float f = (float)v->v.f64;
        return writer_set_scalar(w, kv->key, v->type, &f, 4);
    }
    case COMMON_GGUF_FLOAT64:
        return writer_set_scalar(w, kv->key, v->type, &v->v.f64, 8);
    default: {
        size_t es = (size_t)common_gguf_vtype_size(v->type);
        if (es == 0)
            return COMMON_EINVAL;
        /* Integers are stored in the low bytes of the (little-endian) union. */
        return writer_set_scalar(w, kv->key, v->type, &v->v.u64, es);
    }
    }
}

int common_gguf_writer_add_tensor(struct common_gguf_writer *w, const char *name, uint32_t type,
                                  uint32_t n_dims, const uint64_t *ne)
{
    return common_gguf_writer_add_tensor_sized(w, name, type, n_dims, ne, 0);
}

int common_gguf_writer_add_tensor_sized(struct common_gguf_writer *w, const char *name,
                                        uint32_t type, uint32_t n_dims, const uint64_t *ne,
                                        uint64_t bytes)
{
    if (w->f || !name || !*name || n_dims == 0 || n_dims > COMMON_GGUF_MAX_DIMS)
        return COMMON_EINVAL;
    const struct common_ggml_type_info *ti =
        type < COMMON_GGML_TYPE_FILE_COUNT ? common_ggml_type_get(type) : NULL;
    if (!ti)
        return COMMON_EINVAL;
    uint64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (!common_mul_u64(nel, ne[d], &nel))
            return COMMON_ERANGE;
    uint64_t row;
    int      rc = common_ggml_row_size(type, ne[0], &row);
    if (rc)
        return rc;
    uint64_t size;
    if (!common_mul_u64(row, ne[0] ? nel / ne[0] : 0, &size))
        return COMMON_ERANGE;
    if (bytes) {
        if (type != COMMON_GGML_TYPE_I2_S || bytes < size)
            return COMMON_EINVAL;
        size = bytes;
    }
    struct gguf_wtensor *t = realloc(w->tensors, (w->n_tensors + 1) * sizeof(*t));
    if (!t)
        return COMMON_ENOMEM;
    w->tensors = t;
    struct gguf_wtensor *x = &w->tensors[w->n_tensors];
    memset(x, 0, sizeof(*x));
    if (!(x->name = strdup(name)))
        return COMMON_ENOMEM;
    x->type = type;
    x->n_dims = n_dims;
    for (uint32_t d = 0; d < COMMON_GGUF_MAX_DIMS; d++)
        x->ne[d] = d < n_dims ? ne[d] : 1;
    x->offset = w->data_size;
    x->size = size;
    uint64_t padded = (size + w->alignment - 1) / w->alignment * w->alignment;
    w->data_size += padded;
    w->n_tensors++;
    return COMMON_OK;
}

static int writer_io(struct common_gguf_writer *w, const void *p, size_t n, struct common_errmsg *e)
{
    if (n && fwrite(p, 1, n, w->f) != n)
        return common_errmsg_set(e, COMMON_EIO, "write failed: %s", strerror(errno));
    return COMMON_OK;
}

static int writer_pad(struct common_gguf_writer *w, uint64_t pos, struct common_errmsg *e)
{
    static const uint8_t zeros[64];
    uint64_t             pad = (w->alignment - pos % w->alignment) % w->alignment;
    while (pad) {
        size_t n = pad > sizeof(zeros) ? sizeof(zeros) : (size_t)pad;
        int    rc = writer_io(w, zeros, n, e);
        if (rc)
            return rc;
        pad -= n;
    }
    return COMMON_OK;
}

/* Serializes magic, counts, metadata and tensor infos into *hdr. */
static int writer_serialize(const struct common_gguf_writer *w, struct gguf_wbuf *hdr)
{
    int rc;
    if ((rc = wbuf_u32(hdr, COMMON_GGUF_MAGIC)) || (rc = wbuf_u32(hdr, 3)) ||
        (rc = wbuf_u64(hdr, w->n_tensors)) || (rc = wbuf_u64(hdr, w->n_kv)) ||
        (rc = wbuf_put(hdr, w->kv.data, w->kv.len)))
        return rc;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const struct gguf_wtensor *t = &w->tensors[i];
        if ((rc = wbuf_str(hdr, t->name, strlen(t->name))) || (rc = wbuf_u32(hdr, t->n_dims)))
            return rc;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((rc = wbuf_u64(hdr, t->ne[d])))
                return rc;
        if ((rc = wbuf_u32(hdr, t->type)) || (rc = wbuf_u64(hdr, t->offset)))
            return rc;
    }
    return COMMON_OK;
}

int common_gguf_writer_image(const struct common_gguf_writer *w, uint8_t **out, size_t *len)
{
    struct gguf_wbuf hdr = {0};
    int              rc = writer_serialize(w, &hdr);
    size_t           pad = (w->alignment - hdr.len % w->alignment) % w->alignment;
    uint8_t          zeros[64] = {0};
    while (rc == COMMON_OK && pad) {
        size_t n = pad > sizeof(zeros) ? sizeof(zeros) : pad;
        rc = wbuf_put(&hdr, zeros, n);
        pad -= n;
    }
    if (rc != COMMON_OK) {
        free(hdr.data);
        return rc;
    }
    *out = hdr.data;
    *len = hdr.len;
    return COMMON_OK;
}

int common_gguf_writer_tensor_place(const struct common_gguf_writer *w, uint64_t i,
                                    uint64_t *offset, uint64_t *size)
{
    if (i >= w->n_tensors)
        return COMMON_EINVAL;
    *offset = w->tensors[i].offset;
    *size = w->tensors[i].size;
    return COMMON_OK;
}

uint64_t common_gguf_writer_data_size(const struct common_gguf_writer *w)
{
    return w->data_size;
}

int common_gguf_writer_begin(struct common_gguf_writer *w, const char *path,
                             struct common_errmsg *e)
{
    if (w->f)
        return common_errmsg_set(e, COMMON_EINVAL, "gguf writer: already begun");
    struct gguf_wbuf hdr = {0};
    int              rc;
    if ((rc = writer_serialize(w, &hdr)))
        goto out_free;
    w->f = fopen(path, "wb");
    if (!w->f) {
        rc = common_errmsg_set(e, common_err_from_errno(errno), "%s: cannot create: %s", path,
                               strerror(errno));
        goto out_free;
    }
    if ((rc = writer_io(w, hdr.data, hdr.len, e)) || (rc = writer_pad(w, hdr.len, e)))
        goto out_free;
    w->cur = 0;
    w->cur_done = 0;
    w->written = 0;
out_free:
    free(hdr.data);
    return rc;
}

int common_gguf_writer_write_data(struct common_gguf_writer *w, const void *data, size_t len,
                                  struct common_errmsg *e)
{
    const uint8_t *p = data;
    if (!w->f)
        return common_errmsg_set(e, COMMON_EINVAL, "gguf writer: not begun");
    while (len > 0) {
        while (w->cur < w->n_tensors && w->tensors[w->cur].size == 0)
            w->cur++; /* zero-sized tensors take no data */
        if (w->cur >= w->n_tensors)
            return common_errmsg_set(e, COMMON_EINVAL, "gguf writer: more data than tensors");
        const struct gguf_wtensor *t = &w->tensors[w->cur];
        uint64_t                   left = t->size - w->cur_done;
        size_t                     n = len < left ? len : (size_t)left;
        int                        rc = writer_io(w, p, n, e);
        if (rc)
            return rc;
        p += n;
        len -= n;
        w->cur_done += n;
        if (w->cur_done == t->size) {
            if ((rc = writer_pad(w, t->size, e)))
                return rc;
            w->cur++;
            w->cur_done = 0;
        }
    }
    return COMMON_OK;
}

int common_gguf_writer_finish(struct common_gguf_writer *w, struct common_errmsg *e)
{
    if (!w->f)
        return common_errmsg_set(e, COMMON_EINVAL, "gguf writer: not begun");
    /* Zero-sized tensors at the end need no data calls. */
    while (w->cur < w->n_tensors && w->tensors[w->cur].size == 0)
        w->cur++;
    if (w->cur != w->n_tensors)
        return common_errmsg_set(
            e, COMMON_EINVAL, "gguf writer: tensor '%s' not written (%llu of %llu tensors)",
            w->tensors[w->cur].name, (unsigned long long)w->cur, (unsigned long long)w->n_tensors);
    int rc = fclose(w->f) == 0
                 ? COMMON_OK
                 : common_errmsg_set(e, COMMON_EIO, "close failed: %s", strerror(errno));
    w->f = NULL;
    return rc;
}
