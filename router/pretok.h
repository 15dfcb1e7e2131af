/* router/pretok.h - BPE pre-tokenizers: hand-written splitters equal to llama.cpp's regexes. */
#ifndef ROUTER_PRETOK_H
#define ROUTER_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One pre-tokenizer per family of tokenizer.ggml.pre values (names in pretok.c). */
enum router_pre {
    ROUTER_PRE_DEFAULT = 0,    /* "default" (and a missing key) */
    ROUTER_PRE_GPT2,           /* "gpt-2", "mpt", "gpt-neox", "olmo", "phi-2", ... */
    ROUTER_PRE_LLAMA3,         /* "llama-bpe", "llama3", "llama-v3" */
    ROUTER_PRE_QWEN2,          /* "qwen2", "deepseek-r1-qwen", "megrez" */
    ROUTER_PRE_STARCODER,      /* "starcoder", "refact" */
    ROUTER_PRE_DEEPSEEK_CODER, /* "deepseek-coder" */
    ROUTER_PRE_DEEPSEEK_LLM,   /* "deepseek-llm" */
    ROUTER_PRE_FALCON,         /* "falcon" */
    ROUTER_PRE_DEEPSEEK3,      /* "deepseek-v3" */
    ROUTER_PRE_GPT4O,          /* "gpt-4o", "llama4" (gpt-oss, o200k) */
    ROUTER_PRE_KIMI_K2,        /* "kimi-k2" */
};

/* Per-pre-tokenizer flags llama.cpp sets in llama_vocab::load(). */
struct router_pre_info {
    const char     *name; /* the tokenizer.ggml.pre value */
    enum router_pre pre;
    bool            clean_spaces;  /* detokenizer clean-up of " ," " 's" ... */
    bool            ignore_merges; /* a word that is a token is emitted whole */
    bool            add_bos;       /* default of add_bos_token before the key is read */
};

/* Looks up a tokenizer.ggml.pre value; returns NULL when unknown. */
const struct router_pre_info *router_pre_find(const char *name, size_t len);

/* Scratch of one split, reusable across calls (caller-owned; zeroed = empty). */
struct router_pretok {
    uint32_t *cpts;  /* owned: code points of the text (invalid bytes -> U+FFFD) */
    uint8_t  *flags; /* owned: class and white-space bits per code point */
    size_t    n_cpts;
    size_t    cap_cpts;
    uint32_t *words; /* owned: word lengths in code points, in order, summing to n_cpts */
    size_t    n_words;
    uint32_t *tmp;       /* owned: the previous pass's lengths */
    size_t    cap_words; /* capacity of words and tmp */
};

/* Splits text[0..len) into words with pre-tokenizer `pre`, as llama.cpp's unicode_regex_split()
 * does with that pre-tokenizer's regex list. Results in p->cpts / p->words. Returns 0 or
 * COMMON_ENOMEM. */
int router_pretok_split(struct router_pretok *p, enum router_pre pre, const char *text, size_t len);
void router_pretok_fini(struct router_pretok *p);

#endif /* ROUTER_PRETOK_H */
