/* router/text.c - struct router_text: a growable, NUL-terminated byte string. */
#include "router.h"

#include <stdlib.h>
#include <string.h>

void router_text_fini(struct router_text *t)
{
    free(t->ptr);
    t->ptr = NULL;
    t->len = 0;
    t->cap = 0;
}

int router_text_append(struct router_text *t, const char *s, size_t n)
{
    if (n > SIZE_MAX - t->len - 1)
        return COMMON_ENOMEM;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 64;
        while (cap < t->len + n + 1)
            cap = cap > SIZE_MAX / 2 ? t->len + n + 1 : cap * 2;
        char *p = realloc(t->ptr, cap);
        if (!p)
            return COMMON_ENOMEM;
        t->ptr = p;
        t->cap = cap;
    }
    if (n)
        memcpy(t->ptr + t->len, s, n);
    t->len += n;
    t->ptr[t->len] = '\0';
    return 0;
}

void router_text_clear(struct router_text *t)
{
    t->len = 0;
    if (t->ptr)
        t->ptr[0] = '\0';
}
