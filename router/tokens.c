/* router/tokens.c - struct router_tokens: a growable list of token ids. */
#include "router.h"

#include <stdlib.h>

void router_tokens_fini(struct router_tokens *t)
{
    free(t->ids);
    t->ids = NULL;
    t->n = 0;
    t->cap = 0;
}

int router_tokens_push(struct router_tokens *t, int32_t id)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof(*t->ids))
            return COMMON_ENOMEM;
        int32_t *p = realloc(t->ids, cap * sizeof(*t->ids));
        if (!p)
            return COMMON_ENOMEM;
        t->ids = p;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    return 0;
}

void router_tokens_clear(struct router_tokens *t)
{
    t->n = 0;
}
