/* router/tok.h - scratch state and encoders shared by router/tokenize.c, spm.c and bpe.c. */
#ifndef ROUTER_TOK_H
#define ROUTER_TOK_H

#include "bigram.h"
#include "pretok.h"
#include "vocab.h"

/* A run of bytes of the text being merged; a linked list in text order. */
struct router_symbol {
    int32_t  prev, next; /* symbol indices, -1 at the ends */
    uint32_t off;        /* byte offset in the text */
    uint32_t n;          /* bytes; 0 once merged into its left neighbour */
};

/* Per-call scratch (one per router_tokenize() call, so a vocabulary can be shared). */
struct router_tok_scratch {
    struct router_symbol     *syms; /* owned */
    size_t                    n_syms, cap_syms;
    struct router_bigram_heap heap;
    struct router_pretok      pretok;
    struct router_text        word; /* escaped (SPM) or byte-encoded (BPE) text */
    struct router_text        key;  /* BPE merge lookup key "left right" */
};

void router_tok_scratch_fini(struct router_tok_scratch *s);
/* Makes room for n symbols. Returns 0 or COMMON_ENOMEM. */
int router_tok_reserve_syms(struct router_tok_scratch *s, size_t n);

/* SentencePiece encoding of one text fragment (llm_tokenizer_spm_session): `space_prefix` puts
 * a space before it; spaces become U+2581. Appends ids to out. Returns 0 or a negative error. */
int router_spm_encode(const struct router_vocab *v, struct router_tok_scratch *s, const char *text,
                      size_t len, bool space_prefix, struct router_tokens *out);

/* Byte-level BPE encoding of one text fragment (llm_tokenizer_bpe_session): pre-tokenize, map
 * bytes through the GPT-2 table, merge by rank. Returns 0 or a negative error. */
int router_bpe_encode(const struct router_vocab *v, struct router_tok_scratch *s, const char *text,
                      size_t len, struct router_tokens *out);

#endif /* ROUTER_TOK_H */
