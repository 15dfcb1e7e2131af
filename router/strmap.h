/* router/strmap.h - open-addressing hash map from byte strings to int32 values. */
#ifndef ROUTER_STRMAP_H
#define ROUTER_STRMAP_H

#include <stddef.h>
#include <stdint.h>

struct router_strmap_slot {
    const char *key;  /* borrowed: bytes owned by the map's user; NULL = empty slot */
    uint32_t    len;  /* key bytes */
    uint32_t    hash; /* cached hash */
    int32_t     val;
};

/* Keys are not copied: they must outlive the map. Not thread-safe for writes; lookups on a map
 * no longer written are safe from any number of threads. */
struct router_strmap {
    struct router_strmap_slot *slots; /* owned: cap slots */
    size_t                     cap;   /* power of two */
    size_t                     n;     /* keys stored */
};

/* Sizes the map for `n_expected` keys. Returns 0 or COMMON_ENOMEM. */
int  router_strmap_init(struct router_strmap *m, size_t n_expected);
void router_strmap_fini(struct router_strmap *m);
/* Inserts key -> val unless the key is present. Returns 1 inserted, 0 already present (*old set
 * when old != NULL), COMMON_ENOMEM when the map is full (sized too small). */
int router_strmap_put(struct router_strmap *m, const char *key, size_t len, int32_t val,
                      int32_t *old);
/* Returns the value of key, or -1 when absent. */
int32_t router_strmap_get(const struct router_strmap *m, const char *key, size_t len);

#endif /* ROUTER_STRMAP_H */
