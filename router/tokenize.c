/* router/tokenize.c - router_tokenize(): special-token partition, then SPM or BPE encoding. */
#include "tok.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* A piece of the input: raw text to encode, or a special token found in it. */
struct fragment {
    int32_t id;  /* ROUTER_TOKEN_NULL for raw text */
    size_t  off; /* raw text: byte range in the input */
    size_t  len;
};

struct frag_list {
    struct fragment *items; /* owned */
    size_t           n, cap;
};

static int frag_push(struct frag_list *l, int32_t id, size_t off, size_t len)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        if (cap > SIZE_MAX / sizeof(*l->items))
            return COMMON_ENOMEM;
        struct fragment *p = realloc(l->items, cap * sizeof(*p));
        if (!p)
            return COMMON_ENOMEM;
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n++] = (struct fragment){id, off, len};
    return 0;
}

/* Cuts the raw-text fragments of `in` at every occurrence of special token `id` into `out`, as
 * llama.cpp's tokenizer_st_partition() does: left text (trailing white space eaten when the
 * token has LSTRIP), the token, then the search goes on in the right text (leading white space
 * eaten when RSTRIP). */
static int partition_one(const struct router_vocab *v, int32_t id, const char *text,
                         const struct frag_list *in, struct frag_list *out)
{
    size_t         tlen;
    const char    *t = router_vocab_str(v, id, &tlen);
    const uint32_t attr = v->attr[id];
    int            rc = 0;
    out->n = 0;
    for (size_t f = 0; f < in->n && rc == 0; f++) {
        const struct fragment *fr = &in->items[f];
        if (fr->id != ROUTER_TOKEN_NULL || fr->len < tlen) {
            rc = frag_push(out, fr->id, fr->off, fr->len);
            continue;
        }
        size_t off = fr->off, len = fr->len;
        while (rc == 0) {
            const char *m = len >= tlen ? memmem(text + off, len, t, tlen) : NULL;
            if (!m) {
                if (len > 0)
                    rc = frag_push(out, ROUTER_TOKEN_NULL, off, len);
                break;
            }
            const size_t match = (size_t)(m - text);
            size_t       llen = match - off;
            if (attr & ROUTER_ATTR_LSTRIP) {
                while (llen > 0 && isspace((unsigned char)text[off + llen - 1]))
                    llen--;
            }
            if (llen > 0)
                rc = frag_push(out, ROUTER_TOKEN_NULL, off, llen);
            if (rc == 0)
                rc = frag_push(out, id, 0, 0);
            size_t roff = match + tlen, rlen = off + len - roff;
            if (attr & ROUTER_ATTR_RSTRIP) {
                while (rlen > 0 && isspace((unsigned char)text[roff])) {
                    roff++;
                    rlen--;
                }
            }
            off = roff;
            len = rlen;
        }
    }
    return rc;
}

void router_tok_scratch_fini(struct router_tok_scratch *s)
{
    free(s->syms);
    router_bigram_fini(&s->heap);
    router_pretok_fini(&s->pretok);
    router_text_fini(&s->word);
    router_text_fini(&s->key);
    memset(s, 0, sizeof(*s));
}

int router_tok_reserve_syms(struct router_tok_scratch *s, size_t n)
{
    if (n <= s->cap_syms)
        return 0;
    if (n > SIZE_MAX / sizeof(*s->syms))
        return COMMON_ENOMEM;
    struct router_symbol *p = realloc(s->syms, n * sizeof(*p));
    if (!p)
        return COMMON_ENOMEM;
    s->syms = p;
    s->cap_syms = n;
    return 0;
}

int router_tokenize(const struct router_vocab *v, const char *text, size_t len,
                    const struct router_tokenize_opts *o, struct router_tokens *out)
{
    const struct router_tokenize_opts dflt = {0};
    struct frag_list                  a = {0}, b = {0};
    struct router_tok_scratch         s = {0};
    int                               rc = 0;
    if (!o)
        o = &dflt;

    if (len > 0) {
        rc = frag_push(&a, ROUTER_TOKEN_NULL, 0, len);
        for (uint32_t k = 0; k < v->n_special && rc == 0; k++) {
            const int32_t id = v->special[k];
            if (!o->parse_special && (v->attr[id] & (ROUTER_ATTR_CONTROL | ROUTER_ATTR_UNKNOWN)))
                continue; /* user-defined tokens are matched even so, as in llama.cpp */
            rc = partition_one(v, id, text, &a, &b);
            struct frag_list t = a;
            a = b;
            b = t;
        }
    }
    if (rc == 0 && o->add_special && v->add_bos)
        rc = router_tokens_push(out, v->bos);

    bool prev_special = true; /* SPM: a space goes before text that starts the input or
                                 follows a special token */
    for (size_t f = 0; f < a.n && rc == 0; f++) {
        const struct fragment *fr = &a.items[f];
        if (fr->id != ROUTER_TOKEN_NULL) {
            rc = router_tokens_push(out, fr->id);
            prev_special = true;
        } else if (v->type == ROUTER_VOCAB_SPM) {
            rc = router_spm_encode(v, &s, text + fr->off, fr->len,
                                   v->add_space_prefix && prev_special, out);
            prev_special = false;
        } else {
            rc = router_bpe_encode(v, &s, text + fr->off, fr->len, out);
        }
    }
    if (rc == 0 && o->add_special && v->add_eos)
        rc = router_tokens_push(out, v->eos);

    free(a.items);
    free(b.items);
    router_tok_scratch_fini(&s);
    return rc;
}
