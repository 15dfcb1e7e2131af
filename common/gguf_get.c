/* common/gguf_get.c - accessors of a parsed GGUF: metadata by key with typed getters, tensors,
 * splits, and blocking reads of spans. */
#include "common.h"
#include "gguf_impl.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

uint32_t common_gguf_version(const struct common_gguf *g)
{
    return g->version;
}

uint64_t common_gguf_alignment(const struct common_gguf *g)
{
    return g->alignment;
}

uint64_t common_gguf_n_kv(const struct common_gguf *g)
{
    return g->n_kv;
}

const struct common_gguf_kv *common_gguf_kv_at(const struct common_gguf *g, uint64_t i)
{
    return i < g->n_kv ? &g->kvs[i] : NULL;
}

const struct common_gguf_kv *common_gguf_find(const struct common_gguf *g, const char *key)
{
    if (!g->kv_index.slots) { /* during the split scan, before indexes exist */
        for (uint64_t i = 0; i < g->n_kv; i++)
            if (strcmp(g->kvs[i].key, key) == 0)
                return &g->kvs[i];
        return NULL;
    }
    int64_t i = gguf_index_lookup(&g->kv_index, key, gguf_kv_name, g->kvs);
    return i >= 0 ? &g->kvs[i] : NULL;
}

static bool gguf_is_uint(uint32_t t)
{
    return t == COMMON_GGUF_UINT8 || t == COMMON_GGUF_UINT16 || t == COMMON_GGUF_UINT32 ||
           t == COMMON_GGUF_UINT64;
}

static bool gguf_is_sint(uint32_t t)
{
    return t == COMMON_GGUF_INT8 || t == COMMON_GGUF_INT16 || t == COMMON_GGUF_INT32 ||
           t == COMMON_GGUF_INT64;
}

int common_gguf_get_u64(const struct common_gguf *g, const char *key, uint64_t *out)
{
    const struct common_gguf_kv *kv = common_gguf_find(g, key);
    if (!kv)
        return COMMON_ENOENT;
    if (gguf_is_uint(kv->value.type)) {
        *out = kv->value.v.u64;
        return COMMON_OK;
    }
    if (gguf_is_sint(kv->value.type) && kv->value.v.i64 >= 0) {
        *out = (uint64_t)kv->value.v.i64;
        return COMMON_OK;
    }
    return COMMON_EINVAL;
}

int common_gguf_get_u32(const struct common_gguf *g, const char *key, uint32_t *out)
{
    uint64_t v;
    int      rc = common_gguf_get_u64(g, key, &v);
    if (rc != COMMON_OK)
        return rc;
    if (v > UINT32_MAX)
        return COMMON_EINVAL;
    *out = (uint32_t)v;
    return COMMON_OK;
}

int common_gguf_get_i64(const struct common_gguf *g, const char *key, int64_t *out)
{
    const struct common_gguf_kv *kv = common_gguf_find(g, key);
    if (!kv)
        return COMMON_ENOENT;
    if (gguf_is_sint(kv->value.type)) {
        *out = kv->value.v.i64;
        return COMMON_OK;
    }
    if (gguf_is_uint(kv->value.type) && kv->value.v.u64 <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->value.v.u64;
        return COMMON_OK;
    }
    return COMMON_EINVAL;
}

int common_gguf_get_f32(const struct common_gguf *g, const char *key, float *out)
{
    const struct common_gguf_kv *kv = common_gguf_find(g, key);
    if (!kv)
        return COMMON_ENOENT;
    if (kv->value.type == COMMON_GGUF_FLOAT32 || kv->value.type == COMMON_GGUF_FLOAT64)
        *out = (float)kv->value.v.f64;
    else if (gguf_is_uint(kv->value.type))
        *out = (float)kv->value.v.u64;
    else if (gguf_is_sint(kv->value.type))
        *out = (float)kv->value.v.i64;
    else
        return COMMON_EINVAL;
    return COMMON_OK;
}

int common_gguf_get_bool(const struct common_gguf *g, const char *key, bool *out)
{
    const struct common_gguf_kv *kv = common_gguf_find(g, key);
    if (!kv)
        return COMMON_ENOENT;
    if (kv->value.type != COMMON_GGUF_BOOL)
        return COMMON_EINVAL;
    *out = kv->value.v.u64 != 0;
    return COMMON_OK;
}

int common_gguf_get_str(const struct common_gguf *g, const char *key, struct common_gguf_str *out)
{
    const struct common_gguf_kv *kv = common_gguf_find(g, key);
    if (!kv)
        return COMMON_ENOENT;
    if (kv->value.type != COMMON_GGUF_STRING)
        return COMMON_EINVAL;
    *out = kv->value.v.str;
    return COMMON_OK;
}

int common_gguf_get_arr(const struct common_gguf *g, const char *key, uint32_t elem_type,
                        const struct common_gguf_value **out)
{
    const struct common_gguf_kv *kv = common_gguf_find(g, key);
    if (!kv)
        return COMMON_ENOENT;
    if (kv->value.type != COMMON_GGUF_ARRAY || kv->value.v.arr.type != elem_type)
        return COMMON_EINVAL;
    *out = &kv->value;
    return COMMON_OK;
}

double common_gguf_arr_f64(const struct common_gguf_value *arr, uint64_t i)
{
    struct common_gguf_value v;
    uint64_t                 es = common_gguf_vtype_size(arr->v.arr.type);
    if (i >= arr->v.arr.n || es == 0)
        return 0.0;
    common_gguf_decode_scalar(arr->v.arr.type, (const uint8_t *)arr->v.arr.data + i * es, &v);
    if (v.type == COMMON_GGUF_FLOAT32 || v.type == COMMON_GGUF_FLOAT64)
        return v.v.f64;
    if (gguf_is_sint(v.type))
        return (double)v.v.i64;
    return (double)v.v.u64;
}

int64_t common_gguf_arr_i64(const struct common_gguf_value *arr, uint64_t i)
{
    struct common_gguf_value v;
    uint64_t                 es = common_gguf_vtype_size(arr->v.arr.type);
    if (i >= arr->v.arr.n || es == 0)
        return 0;
    common_gguf_decode_scalar(arr->v.arr.type, (const uint8_t *)arr->v.arr.data + i * es, &v);
    if (v.type == COMMON_GGUF_FLOAT32 || v.type == COMMON_GGUF_FLOAT64)
        return (int64_t)v.v.f64;
    if (gguf_is_sint(v.type))
        return v.v.i64;
    return (int64_t)v.v.u64;
}

uint64_t common_gguf_n_tensors(const struct common_gguf *g)
{
    return g->n_tensors;
}

const struct common_gguf_tensor *common_gguf_tensor_at(const struct common_gguf *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct common_gguf_tensor *common_gguf_tensor_find(const struct common_gguf *g,
                                                         const char               *name)
{
    if (!g->t_index.slots)
        return NULL;
    int64_t i = gguf_index_lookup(&g->t_index, name, gguf_tensor_name, g->tensors);
    return i >= 0 ? &g->tensors[i] : NULL;
}

uint32_t common_gguf_n_splits(const struct common_gguf *g)
{
    return g->n_splits;
}

const char *common_gguf_split_path(const struct common_gguf *g, uint32_t split)
{
    return split < g->n_splits ? g->splits[split].path : NULL;
}

int common_gguf_split_fd(const struct common_gguf *g, uint32_t split)
{
    return split < g->n_splits ? g->splits[split].fd : -1;
}

uint64_t common_gguf_split_size(const struct common_gguf *g, uint32_t split)
{
    return split < g->n_splits ? g->splits[split].size : 0;
}

uint64_t common_gguf_split_data_offset(const struct common_gguf *g, uint32_t split)
{
    return split < g->n_splits ? g->splits[split].data_offset : 0;
}

int common_gguf_check_files(const struct common_gguf *g, struct common_errmsg *e)
{
    for (uint32_t i = 0; i < g->n_splits; i++) {
        struct stat st;
        if (g->splits[i].fd < 0)
            continue;
        if (fstat(g->splits[i].fd, &st) != 0)
            return common_errmsg_set(e, COMMON_EIO, "%s: %s", g->splits[i].path, strerror(errno));
        if ((uint64_t)st.st_size < g->splits[i].size)
            return common_errmsg_set(
                e, COMMON_EIO, "model file truncated while open (%llu of %llu bytes left): %s",
                (unsigned long long)st.st_size, (unsigned long long)g->splits[i].size,
                g->splits[i].path);
    }
    return COMMON_OK;
}

int common_gguf_read_span(const struct common_gguf *g, const struct common_span *span, void *dst,
                          struct common_errmsg *e)
{
    int      fd = common_gguf_split_fd(g, span->split);
    uint8_t *p = dst;
    uint64_t off = span->offset;
    uint64_t left = span->size;
    if (fd < 0)
        return common_errmsg_set(e, COMMON_EINVAL, "split %u has no open file", span->split);
    while (left > 0) {
        size_t  want = left > (1u << 30) ? (1u << 30) : (size_t)left;
        ssize_t r = pread(fd, p, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return common_errmsg_set(
                e, COMMON_EIO, "%s: read of %zu bytes at offset %llu failed: %s",
                common_gguf_split_path(g, span->split), want, (unsigned long long)off,
                r < 0 ? strerror(errno) : "end of file");
        p += r;
        off += (uint64_t)r;
        left -= (uint64_t)r;
    }
    return COMMON_OK;
}
