/* router/bpe.c - byte-level BPE encoding: pre-tokenized words, GPT-2 byte map, merges by rank. */
#include "tok.h"

#include <string.h>

#include "unicode.h"

/* Queues the merge of symbols left and right when "left right" is a merge rule. */
static int bpe_try_bigram(const struct router_vocab *v, struct router_tok_scratch *s, int32_t left,
                          int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    const struct router_symbol *l = &s->syms[left], *r = &s->syms[right];
    const size_t                klen = (size_t)l->n + 1 + r->n;
    if (klen > v->max_merge_len)
        return 0; /* longer than every merge rule */
    router_text_clear(&s->key);
    int rc = router_text_append(&s->key, s->word.ptr + l->off, l->n);
    if (rc == 0)
        rc = router_text_append(&s->key, " ", 1);
    if (rc == 0)
        rc = router_text_append(&s->key, s->word.ptr + r->off, r->n);
    if (rc < 0)
        return rc;
    const int32_t rank = router_strmap_get(&v->merge_map, s->key.ptr, klen);
    if (rank < 0)
        return 0;
    const struct router_bigram b = {
        .left = left, .right = right, .size = l->n + r->n, .rank = rank};
    return router_bigram_push(&s->heap, &b);
}

/* Emits a merged symbol: its token or, when it is not in the vocabulary, the tokens of its single
 * bytes that exist (llama.cpp drops the others). */
static int bpe_emit(const struct router_vocab *v, const char *t, uint32_t n,
                    struct router_tokens *out)
{
    const int32_t id = router_strmap_get(&v->token_map, t, n);
    if (id >= 0)
        return router_tokens_push(out, id);
    for (uint32_t k = 0; k < n; k++) {
        const int32_t b = router_strmap_get(&v->token_map, t + k, 1);
        if (b >= 0) {
            int rc = router_tokens_push(out, b);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* Merges one byte-encoded word held in s->word and appends its tokens. */
static int bpe_word(const struct router_vocab *v, struct router_tok_scratch *s,
                    struct router_tokens *out)
{
    const size_t n_bytes = s->word.len;
    int          rc;
    if (n_bytes == 0)
        return 0;
    if (v->ignore_merges) {
        const int32_t id = router_strmap_get(&v->token_map, s->word.ptr, n_bytes);
        if (id >= 0)
            return router_tokens_push(out, id);
    }
    if ((rc = router_tok_reserve_syms(s, n_bytes)) < 0)
        return rc;
    size_t n = 0;
    for (size_t off = 0; off < n_bytes;) {
        size_t cl = router_utf8_len((uint8_t)s->word.ptr[off]);
        if (cl > n_bytes - off)
            cl = n_bytes - off;
        s->syms[n] = (struct router_symbol){
            .prev = (int32_t)n - 1,
            .next = off + cl == n_bytes ? -1 : (int32_t)n + 1,
            .off = (uint32_t)off,
            .n = (uint32_t)cl,
        };
        off += cl;
        n++;
    }
    s->heap.n = 0;
    s->heap.order = ROUTER_BIGRAM_BY_RANK;
    rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        rc = bpe_try_bigram(v, s, (int32_t)i - 1, (int32_t)i);
    struct router_bigram b;
    while (rc == 0 && router_bigram_pop(&s->heap, &b)) {
        struct router_symbol *l = &s->syms[b.left];
        struct router_symbol *r = &s->syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* outdated */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->syms[r->next].prev = b.left;
        rc = bpe_try_bigram(v, s, l->prev, b.left);
        if (rc == 0)
            rc = bpe_try_bigram(v, s, b.left, l->next);
    }
    for (int32_t i = 0; i != -1 && rc == 0; i = s->syms[i].next)
        rc = bpe_emit(v, s->word.ptr + s->syms[i].off, s->syms[i].n, out);
    return rc;
}

int router_bpe_encode(const struct router_vocab *v, struct router_tok_scratch *s, const char *text,
                      size_t len, struct router_tokens *out)
{
    if (len > INT32_MAX / 8)
        return COMMON_ERANGE;
    int rc = router_pretok_split(&s->pretok, v->pre, text, len);
    if (rc < 0)
        return rc;
    size_t cp = 0;
    for (size_t w = 0; w < s->pretok.n_words && rc == 0; w++) {
        const size_t end = cp + s->pretok.words[w];
        router_text_clear(&s->word);
        /* Each code point back to UTF-8 (invalid input bytes became U+FFFD), then each byte
         * through the GPT-2 byte map. */
        for (; cp < end && rc == 0; cp++) {
            char         u[4];
            const size_t nu = router_utf8_encode(s->pretok.cpts[cp], u);
            for (size_t k = 0; k < nu && rc == 0; k++) {
                const uint8_t byte = (uint8_t)u[k];
                rc = router_text_append(&s->word, v->byte_enc[byte], v->byte_enc_len[byte]);
            }
        }
        if (rc == 0)
            rc = bpe_word(v, s, out);
    }
    return rc;
}
