/* router/bigram.c - priority queue of candidate merges (bigrams) for the SPM and BPE tokenizers. */
#include "bigram.h"

#include <stdlib.h>

#include "common.h"

/* True when a must come out before b. */
static bool bigram_before(enum router_bigram_order order, const struct router_bigram *a,
                          const struct router_bigram *b)
{
    if (order == ROUTER_BIGRAM_BY_SCORE) {
        if (a->score != b->score)
            return a->score > b->score;
    } else if (a->rank != b->rank) {
        return a->rank < b->rank;
    }
    return a->left < b->left;
}

int router_bigram_push(struct router_bigram_heap *h, const struct router_bigram *b)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof(*h->items))
            return COMMON_ENOMEM;
        struct router_bigram *p = realloc(h->items, cap * sizeof(*p));
        if (!p)
            return COMMON_ENOMEM;
        h->items = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(h->order, b, &h->items[parent]))
            break;
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = *b;
    return 0;
}

bool router_bigram_pop(struct router_bigram_heap *h, struct router_bigram *out)
{
    if (h->n == 0)
        return false;
    *out = h->items[0];
    const struct router_bigram last = h->items[--h->n];
    size_t                     i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && bigram_before(h->order, &h->items[c + 1], &h->items[c]))
            c++;
        if (!bigram_before(h->order, &h->items[c], &last))
            break;
        h->items[i] = h->items[c];
        i = c;
    }
    if (h->n > 0)
        h->items[i] = last;
    return true;
}

void router_bigram_fini(struct router_bigram_heap *h)
{
    free(h->items);
    h->items = NULL;
    h->n = h->cap = 0;
}
