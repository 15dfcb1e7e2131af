/* router/stop.c - struct router_stop: ends a sequence on EOS, a stop string or the token cap. */
#include "vocab.h"

#include <stdlib.h>
#include <string.h>

int router_stop_init(struct router_stop *st, const struct router_vocab *v,
                     const struct router_stop_opts *o)
{
    const struct router_stop_opts dflt = {0};
    memset(st, 0, sizeof(*st));
    if (!o)
        o = &dflt;
    if (o->n_stop && !o->stop)
        return COMMON_EINVAL;
    for (size_t i = 0; i < o->n_stop; i++) {
        if (!o->stop[i] || !o->stop[i][0])
            return COMMON_EINVAL;
    }
    /* Generated text continues the prompt: keep the first piece's leading space. */
    router_detok_stream_init(&st->detok, v,
                             &(struct router_detok_opts){.keep_leading_space = true});
    st->max_tokens = o->max_tokens;
    st->ignore_eos = o->ignore_eos;
    if (o->n_stop) {
        st->stop = calloc(o->n_stop, sizeof(*st->stop));
        if (!st->stop)
            return COMMON_ENOMEM;
        for (size_t i = 0; i < o->n_stop; i++) {
            st->stop[i] = strdup(o->stop[i]);
            if (!st->stop[i]) {
                st->n_stop = i;
                router_stop_fini(st);
                return COMMON_ENOMEM;
            }
            const size_t len = strlen(st->stop[i]);
            if (len > st->max_stop_len)
                st->max_stop_len = len;
        }
        st->n_stop = o->n_stop;
    }
    return 0;
}

void router_stop_fini(struct router_stop *st)
{
    for (size_t i = 0; i < st->n_stop; i++)
        free(st->stop[i]);
    free(st->stop);
    st->stop = NULL;
    st->n_stop = 0;
    router_text_fini(&st->pending);
}

/* Length of the longest suffix of t[0..n) that is a proper prefix of some stop string. */
static size_t stop_partial(const struct router_stop *st, const char *t, size_t n)
{
    size_t best = 0;
    for (size_t k = 0; k < st->n_stop; k++) {
        const size_t sl = strlen(st->stop[k]);
        for (size_t m = sl - 1 < n ? sl - 1 : n; m > best; m--) {
            if (memcmp(t + n - m, st->stop[k], m) == 0) {
                best = m;
                break;
            }
        }
    }
    return best;
}

/* Moves pending[0..n) to out and keeps the rest pending. */
static int stop_release(struct router_stop *st, size_t n, struct router_text *out)
{
    if (!st->pending.ptr)
        return 0;
    int rc = router_text_append(out, st->pending.ptr, n);
    if (rc < 0)
        return rc;
    memmove(st->pending.ptr, st->pending.ptr + n, st->pending.len - n + 1);
    st->pending.len -= n;
    return 0;
}

int router_stop_push(struct router_stop *st, int32_t id, struct router_text *out)
{
    if (st->reason != ROUTER_STOP_NONE)
        return (int)st->reason;
    if (id < 0 || (uint32_t)id >= router_vocab_n_tokens(st->detok.vocab))
        return COMMON_EINVAL;
    st->n_tokens++;
    if (!st->ignore_eos && router_vocab_is_eog(st->detok.vocab, id)) {
        int rc = router_stop_finish(st, out);
        if (rc < 0)
            return rc;
        st->reason = ROUTER_STOP_EOS;
        return (int)st->reason;
    }
    const size_t before = st->pending.len;
    int          rc = router_detok_stream_push(&st->detok, id, &st->pending);
    if (rc < 0)
        return rc;
    /* A stop string can only end in the new text; search from where it could start. */
    for (size_t k = 0; k < st->n_stop; k++) {
        const size_t sl = strlen(st->stop[k]);
        const size_t from = before > sl ? before - sl + 1 : 0;
        if (st->pending.len < sl)
            continue;
        const char *m = memmem(st->pending.ptr + from, st->pending.len - from, st->stop[k], sl);
        if (m) {
            /* Text before the earliest stop string is released; the rest is dropped. */
            size_t cut = (size_t)(m - st->pending.ptr);
            for (size_t j = 0; j < st->n_stop; j++) {
                const char *m2 = memmem(st->pending.ptr, cut + strlen(st->stop[j]), st->stop[j],
                                        strlen(st->stop[j]));
                if (m2 && (size_t)(m2 - st->pending.ptr) < cut)
                    cut = (size_t)(m2 - st->pending.ptr);
            }
            rc = stop_release(st, cut, out);
            if (rc < 0)
                return rc;
            router_text_clear(&st->pending);
            st->reason = ROUTER_STOP_STRING;
            return (int)st->reason;
        }
    }
    const size_t hold = stop_partial(st, st->pending.ptr ? st->pending.ptr : "", st->pending.len);
    rc = stop_release(st, st->pending.len - hold, out);
    if (rc < 0)
        return rc;
    if (st->max_tokens && st->n_tokens >= st->max_tokens) {
        rc = router_stop_finish(st, out);
        if (rc < 0)
            return rc;
        st->reason = ROUTER_STOP_MAX_TOKENS;
        return (int)st->reason;
    }
    return ROUTER_STOP_NONE;
}

int router_stop_finish(struct router_stop *st, struct router_text *out)
{
    int rc = router_detok_stream_flush(&st->detok, &st->pending);
    if (rc < 0)
        return rc;
    rc = router_text_append(out, st->pending.ptr ? st->pending.ptr : "", st->pending.len);
    if (rc < 0)
        return rc;
    router_text_clear(&st->pending);
    return 0;
}
