/* common/gguf_impl.h - private to common/: the parsed GGUF object, shared by gguf.c (parsing)
 * and gguf_get.c (accessors and typed getters). */
#ifndef COMMON_GGUF_IMPL_H
#define COMMON_GGUF_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* A chunk of the arena holding NUL-terminated names (gguf.c). */
struct gguf_arena_chunk {
    struct gguf_arena_chunk *next; /* owned */
    size_t                   used;
    size_t                   cap;
    char                     data[];
};

/* ---- name -> index hash table (open addressing) ------------------------------------------ */

struct gguf_index {
    uint64_t *slots; /* owned: index + 1, 0 = empty */
    uint64_t  mask;
};

static inline uint64_t gguf_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static inline int gguf_index_init(struct gguf_index *ix, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < n * 2)
        cap <<= 1;
    ix->slots = calloc(cap, sizeof(*ix->slots));
    if (!ix->slots)
        return COMMON_ENOMEM;
    ix->mask = cap - 1;
    return COMMON_OK;
}

/* Finds the slot holding `name`, or the empty slot where it would go; names(i) gives the name
 * of entry i. */
static inline uint64_t gguf_index_slot(const struct gguf_index *ix, const char *name,
                                       const char *(*names)(const void *, uint64_t),
                                       const void *ctx)
{
    uint64_t h = gguf_hash(name) & ix->mask;
    while (ix->slots[h] != 0 && strcmp(names(ctx, ix->slots[h] - 1), name) != 0)
        h = (h + 1) & ix->mask;
    return h;
}

/* Returns the entry named `name`, or -1. */
static inline int64_t gguf_index_lookup(const struct gguf_index *ix, const char *name,
                                        const char *(*names)(const void *, uint64_t),
                                        const void *ctx)
{
    uint64_t v = ix->slots[gguf_index_slot(ix, name, names, ctx)];
    return v ? (int64_t)(v - 1) : -1;
}

/* Adds entry `idx` named `name`; returns false when the name is already present. */
static inline bool gguf_index_insert(struct gguf_index *ix, const char                        *name,
                                     const char *(*names)(const void *, uint64_t), const void *ctx,
                                     uint64_t idx)
{
    uint64_t h = gguf_index_slot(ix, name, names, ctx);
    if (ix->slots[h] != 0)
        return false;
    ix->slots[h] = idx + 1;
    return true;
}

/* ---- the parsed model ---------------------------------------------------------------------- */

struct gguf_split {
    char    *path;        /* owned; NULL for an in-memory image */
    int      fd;          /* owned; -1 for an in-memory image */
    uint64_t size;        /* file bytes */
    uint64_t data_offset; /* start of the tensor data section */
    uint8_t *hdr;         /* owned: the header bytes; strings point into it */
};

struct common_gguf {
    uint32_t                   version;
    uint64_t                   alignment;
    struct common_gguf_kv     *kvs; /* owned: n_kv, from split 0 */
    uint64_t                   n_kv;
    struct common_gguf_tensor *tensors; /* owned: n_tensors across all splits */
    uint64_t                   n_tensors;
    struct gguf_split         *splits; /* owned: n_splits */
    uint32_t                   n_splits;
    struct gguf_index          kv_index; /* over kvs */
    struct gguf_index          t_index;  /* over tensors */
    struct gguf_arena_chunk   *arena;    /* owned: names and string-array tables */
    struct qsf_info           *qsf;      /* owned: the QSF index (qsf.c); NULL for GGUF */
};

/* Frees a QSF index (qsf.c); accepts NULL. */
void qsf_info_free(struct qsf_info *q);
/* Opens the QSF file at `path` (its magic already seen) as a model (qsf.c). */
int qsf_open(const char *path, uint64_t max_hdr, struct common_gguf **out, struct common_errmsg *e);

static inline const char *gguf_kv_name(const void *ctx, uint64_t i)
{
    return ((const struct common_gguf_kv *)ctx)[i].key;
}

static inline const char *gguf_tensor_name(const void *ctx, uint64_t i)
{
    return ((const struct common_gguf_tensor *)ctx)[i].name;
}

/* Decodes one little-endian scalar of value type t at p into *v (gguf.c). */
void common_gguf_decode_scalar(uint32_t t, const uint8_t *p, struct common_gguf_value *v);

#endif /* COMMON_GGUF_IMPL_H */
