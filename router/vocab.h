/* router/vocab.h - struct router_vocab internals shared by the tokenizer modules of router/. */
#ifndef ROUTER_VOCAB_H
#define ROUTER_VOCAB_H

#include "router.h"

#include "pretok.h"
#include "strmap.h"

struct router_vocab {
    enum router_vocab_type type;
    enum router_pre        pre;      /* BPE only */
    const char            *pre_name; /* static: "spm" or the pre-tokenizer name */
    uint32_t               n_tokens;

    char                *text;      /* owned: all token strings, each NUL-terminated */
    uint64_t            *text_off;  /* owned: n_tokens offsets into text */
    uint32_t            *text_len;  /* owned: n_tokens lengths */
    float               *scores;    /* owned: n_tokens (0 when the model has none) */
    uint32_t            *attr;      /* owned: n_tokens enum router_token_attr bit sets */
    uint8_t             *eog;       /* owned: n_tokens, 1 = ends generation */
    struct router_strmap token_map; /* token string -> id; keys point into text */

    char                *merges;        /* owned: merge strings "left right", NUL-separated */
    struct router_strmap merge_map;     /* "left right" -> rank; keys point into merges */
    size_t               max_merge_len; /* longest merge string, bytes */

    char     *piece;     /* owned: detokenized text of every token (special tokens rendered) */
    uint64_t *piece_off; /* owned: n_tokens offsets into piece */
    uint32_t *piece_len; /* owned: n_tokens lengths */

    int32_t *special; /* owned: control / user-defined / unknown ids, longest text first */
    uint32_t n_special;

    int32_t bos, eos, eot, pad, unk; /* ROUTER_TOKEN_NULL when absent */
    bool    add_bos, add_eos, add_space_prefix;
    bool    clean_spaces;       /* detokenizer space clean-up (BPE families that want it) */
    bool    ignore_merges;      /* BPE: a word that is a token is taken whole (llama3) */
    bool    spm_split_at_space; /* SPM: no token has U+2581 after another character */

    int32_t byte_token[256];  /* SPM: id of <0xXX> (or of the 1-byte string); BPE unused */
    char    byte_enc[256][2]; /* BPE: UTF-8 of the GPT-2 code point of each byte */
    uint8_t byte_enc_len[256];
};

/* Token string of a valid id. */
static inline const char *router_vocab_str(const struct router_vocab *v, int32_t id, size_t *len)
{
    *len = v->text_len[id];
    return v->text + v->text_off[id];
}

#endif /* ROUTER_VOCAB_H */
