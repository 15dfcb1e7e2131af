/* router/strmap.c - open-addressing hash map from byte strings to int32 values. */
#include "strmap.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

/* FNV-1a; good enough for vocabulary strings and cheap on short keys. */
static uint32_t strmap_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 16777619u;
    }
    return h;
}

int router_strmap_init(struct router_strmap *m, size_t n_expected)
{
    size_t cap = 16;
    while (cap < n_expected * 2 + 16) {
        if (cap > SIZE_MAX / 4 / sizeof(*m->slots))
            return COMMON_ENOMEM;
        cap *= 2;
    }
    m->slots = calloc(cap, sizeof(*m->slots));
    if (!m->slots)
        return COMMON_ENOMEM;
    m->cap = cap;
    m->n = 0;
    return 0;
}

void router_strmap_fini(struct router_strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = 0;
    m->n = 0;
}

int router_strmap_put(struct router_strmap *m, const char *key, size_t len, int32_t val,
                      int32_t *old)
{
    if (len > UINT32_MAX || m->n + 1 >= m->cap)
        return COMMON_ENOMEM;
    const uint32_t h = strmap_hash(key, len);
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        struct router_strmap_slot *sl = &m->slots[i];
        if (!sl->key) {
            sl->key = key;
            sl->len = (uint32_t)len;
            sl->hash = h;
            sl->val = val;
            m->n++;
            return 1;
        }
        if (sl->hash == h && sl->len == len && memcmp(sl->key, key, len) == 0) {
            if (old)
                *old = sl->val;
            return 0;
        }
    }
}

int32_t router_strmap_get(const struct router_strmap *m, const char *key, size_t len)
{
    if (!m->cap)
        return -1;
    const uint32_t h = strmap_hash(key, len);
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const struct router_strmap_slot *sl = &m->slots[i];
        if (!sl->key)
            return -1;
        if (sl->hash == h && sl->len == len && memcmp(sl->key, key, len) == 0)
            return sl->val;
    }
}
