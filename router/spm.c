/* router/spm.c - SentencePiece-style encoding: scores-driven bigram merges, byte fallback. */
#include "tok.h"

#include <string.h>

#include "unicode.h"

/* Queues the merge of symbols left and right when their concatenation is a token. */
static int spm_try_bigram(const struct router_vocab *v, struct router_tok_scratch *s, int32_t left,
                          int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    const struct router_symbol *l = &s->syms[left];
    const uint32_t              n = l->n + s->syms[right].n;
    const int32_t               id = router_strmap_get(&v->token_map, s->word.ptr + l->off, n);
    if (id < 0)
        return 0;
    const struct router_bigram b = {
        .left = left, .right = right, .size = n, .score = v->scores[id]};
    return router_bigram_push(&s->heap, &b);
}

/* Emits a final symbol: its token, or one byte token per byte when it is not in the vocabulary.
 * (llama.cpp also keeps a reverse-merge map for symbols that are not tokens, but a merged symbol
 * is always a token, so only single characters can fall back, and they fall back to bytes.) */
static int spm_emit(const struct router_vocab *v, const struct router_tok_scratch *s,
                    const struct router_symbol *sym, struct router_tokens *out)
{
    const char   *t = s->word.ptr + sym->off;
    const int32_t id = router_strmap_get(&v->token_map, t, sym->n);
    if (id >= 0)
        return router_tokens_push(out, id);
    for (uint32_t k = 0; k < sym->n; k++) {
        int32_t b = v->byte_token[(uint8_t)t[k]];
        /* No <0xXX> token: llama.cpp throws; sluice uses <unk>, or drops the byte without one. */
        if (b < 0)
            b = v->unk;
        if (b >= 0) {
            int rc = router_tokens_push(out, b);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* Merges and emits the escaped text s->word[a..b). */
static int spm_chunk(const struct router_vocab *v, struct router_tok_scratch *s, size_t a, size_t b,
                     struct router_tokens *out)
{
    int rc;
    if ((rc = router_tok_reserve_syms(s, b - a)) < 0)
        return rc;
    /* One symbol per UTF-8 character (by lead byte, clipped: invalid bytes stand alone). */
    size_t n = 0;
    for (size_t off = a; off < b;) {
        size_t cl = router_utf8_len((uint8_t)s->word.ptr[off]);
        if (cl > b - off)
            cl = b - off;
        s->syms[n] = (struct router_symbol){
            .prev = (int32_t)n - 1,
            .next = off + cl == b ? -1 : (int32_t)n + 1,
            .off = (uint32_t)off,
            .n = (uint32_t)cl,
        };
        off += cl;
        n++;
    }
    s->n_syms = n;
    s->heap.n = 0;
    s->heap.order = ROUTER_BIGRAM_BY_SCORE;
    for (size_t i = 1; i < n && rc == 0; i++)
        rc = spm_try_bigram(v, s, (int32_t)i - 1, (int32_t)i);

    struct router_bigram bg;
    while (rc == 0 && router_bigram_pop(&s->heap, &bg)) {
        struct router_symbol *l = &s->syms[bg.left];
        struct router_symbol *r = &s->syms[bg.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size)
            continue; /* stale: one side was merged since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->syms[r->next].prev = bg.left;
        rc = spm_try_bigram(v, s, l->prev, bg.left);
        if (rc == 0)
            rc = spm_try_bigram(v, s, bg.left, l->next);
    }
    for (int32_t i = 0; i != -1 && rc == 0; i = s->syms[i].next)
        rc = spm_emit(v, s, &s->syms[i], out);
    return rc;
}

int router_spm_encode(const struct router_vocab *v, struct router_tok_scratch *s, const char *text,
                      size_t len, bool space_prefix, struct router_tokens *out)
{
    static const char k_space[] = "\xE2\x96\x81"; /* U+2581 */
    int               rc = 0;

    router_text_clear(&s->word);
    if (space_prefix)
        rc = router_text_append(&s->word, k_space, 3);
    for (size_t i = 0, run = 0; i <= len && rc == 0; i++) {
        if (i == len || text[i] == ' ') {
            rc = router_text_append(&s->word, text + run, i - run);
            run = i + 1;
            if (i < len && rc == 0)
                rc = router_text_append(&s->word, k_space, 3);
        }
    }
    if (rc < 0)
        return rc;
    const size_t n_bytes = s->word.len;
    if (n_bytes > INT32_MAX)
        return COMMON_ERANGE;
    if (!v->spm_split_at_space)
        return n_bytes ? spm_chunk(v, s, 0, n_bytes, out) : 0;
    /* No token holds U+2581 after another character, so no merge can cross the start of a run
     * of U+2581 that follows other text: each such piece is merged on its own (same result as
     * the whole text, with small heaps instead of one huge one). */
    size_t a = 0;
    bool   prev_space = false;
    for (size_t off = 0; off < n_bytes && rc == 0;) {
        size_t cl = router_utf8_len((uint8_t)s->word.ptr[off]);
        if (cl > n_bytes - off)
            cl = n_bytes - off;
        /* cut only where the whole-text split into characters has a boundary */
        const bool space = cl == 3 && memcmp(s->word.ptr + off, k_space, 3) == 0;
        if (space && off > 0 && !prev_space) {
            rc = spm_chunk(v, s, a, off, out);
            a = off;
        }
        prev_space = space;
        off += cl;
    }
    if (rc == 0 && a < n_bytes)
        rc = spm_chunk(v, s, a, n_bytes, out);
    return rc;
}
