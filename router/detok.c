/* router/detok.c - token ids back to UTF-8 text: whole sequences and a streaming detokenizer. */
#include "vocab.h"

#include <string.h>

static const struct router_detok_opts k_detok_default = {0};

int router_token_piece(const struct router_vocab *v, int32_t id, const struct router_detok_opts *o,
                       const char **p, size_t *len)
{
    if (id < 0 || (uint32_t)id >= v->n_tokens)
        return COMMON_EINVAL;
    if (!o)
        o = &k_detok_default;
    if (!o->render_special && (v->attr[id] & (ROUTER_ATTR_UNKNOWN | ROUTER_ATTR_CONTROL))) {
        *p = v->piece + v->piece_off[id];
        *len = 0;
        return 0;
    }
    *p = v->piece + v->piece_off[id];
    *len = v->piece_len[id];
    return 0;
}

/* llama.cpp's clean_spaces passes of llama_detokenize(), applied in place to t[0..*n):
 * " ?", " !", " .", " ," lose the space; a lone " ' " loses both spaces; " 's", " 'm", " 're",
 * " 've" lose the space. */
static void clean_spaces(char *t, size_t *n)
{
    size_t total1 = *n, total = total1 ? 1 : 0;
    for (size_t i = 1; i < total1; i++) {
        const char x = t[i];
        if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
            total--;
        t[total++] = x;
    }
    const size_t total2 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total2; i++) {
        const char x = t[i];
        if (x == '\'' && i + 1 < total2 && t[i - 1] == ' ' && t[i + 1] == ' ') {
            total--;
            t[++i] = '\0';
        }
        t[total++] = x;
    }
    const size_t total3 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total3; i++) {
        const char x = t[i];
        if (t[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
            const char x1 = t[i + 1];
            if (x1 == 's' || x1 == 'm') {
                total--;
            } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
                const char x2 = t[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e'))
                    total--;
            }
        }
        t[total++] = x;
    }
    *n = total;
}

int router_detokenize(const struct router_vocab *v, const int32_t *ids, size_t n,
                      const struct router_detok_opts *o, struct router_text *out)
{
    if (!o)
        o = &k_detok_default;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= v->n_tokens)
            return COMMON_EINVAL;
    }
    bool remove_space = v->add_space_prefix && !o->keep_leading_space;
    if (o->remove_special && v->add_bos && n > 0 && ids[0] == v->bos) {
        remove_space = false; /* llama.cpp keeps the space after a removed BOS */
        ids++;
        n--;
    }
    if (o->remove_special && v->add_eos && n > 0 && ids[n - 1] == v->eos)
        n--;

    const size_t start = out->len;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t      len;
        router_token_piece(v, ids[i], o, &p, &len);
        if (remove_space && len > 0 && p[0] == ' ') {
            p++;
            len--;
        }
        remove_space = false;
        int rc = router_text_append(out, p, len);
        if (rc < 0) {
            out->len = start;
            if (out->ptr)
                out->ptr[start] = '\0';
            return rc;
        }
    }
    if (v->clean_spaces && !o->no_clean_spaces && out->len > start) {
        size_t m = out->len - start;
        clean_spaces(out->ptr + start, &m);
        out->len = start + m;
        out->ptr[out->len] = '\0';
    }
    return 0;
}

void router_detok_stream_init(struct router_detok_stream *s, const struct router_vocab *v,
                              const struct router_detok_opts *o)
{
    memset(s, 0, sizeof(*s));
    s->vocab = v;
    s->opts = o ? *o : k_detok_default;
}

/* Bytes a sequence led by `b` needs (0 when b cannot start one). */
static unsigned utf8_need(uint8_t b)
{
    if (b < 0x80u)
        return 1;
    if (b >= 0xC2u && b <= 0xDFu)
        return 2;
    if (b >= 0xE0u && b <= 0xEFu)
        return 3;
    if (b >= 0xF0u && b <= 0xF4u)
        return 4;
    return 0;
}

/* Whether c may follow held[0..n) (rules out overlongs, surrogates, > U+10FFFF). */
static bool utf8_may_follow(const uint8_t *held, unsigned n, uint8_t c)
{
    if ((c & 0xC0u) != 0x80u)
        return false;
    if (n == 1) {
        switch (held[0]) {
        case 0xE0:
            return c >= 0xA0u;
        case 0xED:
            return c <= 0x9Fu;
        case 0xF0:
            return c >= 0x90u;
        case 0xF4:
            return c <= 0x8Fu;
        default:
            return true;
        }
    }
    return true;
}

static const char k_replacement[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* Output staging for the stream, so bytes go to the text in runs. */
struct stage {
    char   buf[256];
    size_t n;
    int    rc;
};

static void stage_put(struct stage *st, struct router_text *out, const char *b, size_t n)
{
    if (st->n + n > sizeof(st->buf)) {
        if (st->rc == 0)
            st->rc = router_text_append(out, st->buf, st->n);
        st->n = 0;
    }
    memcpy(st->buf + st->n, b, n);
    st->n += n;
}

int router_detok_stream_push(struct router_detok_stream *s, int32_t id, struct router_text *out)
{
    const char *p;
    size_t      len;
    if (router_token_piece(s->vocab, id, &s->opts, &p, &len) < 0)
        return COMMON_EINVAL;
    if (!s->started) {
        s->started = true;
        if (s->vocab->add_space_prefix && !s->opts.keep_leading_space && len > 0 && p[0] == ' ') {
            p++;
            len--;
        }
    }
    const size_t start = out->len;
    struct stage st = {.n = 0, .rc = 0};
    for (size_t i = 0; i < len; i++) {
        const uint8_t c = (uint8_t)p[i];
        if (s->n_held > 0) {
            if (utf8_may_follow(s->held, s->n_held, c)) {
                s->held[s->n_held++] = c;
                if (s->n_held == utf8_need(s->held[0])) {
                    stage_put(&st, out, (const char *)s->held, s->n_held);
                    s->n_held = 0;
                }
                continue;
            }
            /* The held character is broken: one U+FFFD, then c starts afresh. */
            stage_put(&st, out, k_replacement, 3);
            s->n_held = 0;
        }
        const unsigned need = utf8_need(c);
        if (need == 1) {
            stage_put(&st, out, (const char *)&c, 1);
        } else if (need == 0) {
            stage_put(&st, out, k_replacement, 3);
        } else {
            s->held[0] = c;
            s->n_held = 1;
        }
    }
    if (st.rc == 0 && st.n > 0)
        st.rc = router_text_append(out, st.buf, st.n);
    if (st.rc < 0)
        return st.rc;
    return (int)(out->len - start);
}

int router_detok_stream_flush(struct router_detok_stream *s, struct router_text *out)
{
    if (s->n_held == 0)
        return 0;
    s->n_held = 0;
    int rc = router_text_append(out, k_replacement, 3);
    return rc < 0 ? rc : 3;
}
