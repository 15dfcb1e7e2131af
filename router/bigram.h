/* router/bigram.h - priority queue of candidate merges (bigrams) for the SPM and BPE tokenizers. */
#ifndef ROUTER_BIGRAM_H
#define ROUTER_BIGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A candidate merge of symbol `left` with symbol `right`, as seen when it was queued. */
struct router_bigram {
    int32_t  left, right; /* symbol indices */
    uint32_t size;        /* bytes of left + right when queued (stale check) */
    float    score;       /* SPM: score of the merged token (higher first) */
    int32_t  rank;        /* BPE: merge rank (lower first) */
};

enum router_bigram_order {
    ROUTER_BIGRAM_BY_SCORE, /* highest score first, then leftmost (llama.cpp llm_bigram_spm) */
    ROUTER_BIGRAM_BY_RANK,  /* lowest rank first, then leftmost (llama.cpp llm_bigram_bpe) */
};

/* Binary heap; caller-owned storage, zeroed = empty. */
struct router_bigram_heap {
    struct router_bigram    *items; /* owned: cap entries */
    size_t                   n, cap;
    enum router_bigram_order order;
};

/* Returns 0 or COMMON_ENOMEM. */
int router_bigram_push(struct router_bigram_heap *h, const struct router_bigram *b);
/* Removes the first bigram into *out; returns false when empty. */
bool router_bigram_pop(struct router_bigram_heap *h, struct router_bigram *out);
void router_bigram_fini(struct router_bigram_heap *h);

#endif /* ROUTER_BIGRAM_H */
