/* executor/perplexity.c - llama-perplexity's protocol: BOS-led chunks, second half scored. */
#include "executor.h"

#include <math.h>
#include <stdlib.h>

/* log P(tok) from raw logits as llama-perplexity computes it: max in float, sum of expf in
 * double, logit - max - log(sum). */
static double ppl_log_softmax(const float *logits, uint32_t n_vocab, int32_t tok)
{
    float max = logits[0];
    for (uint32_t i = 1; i < n_vocab; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    for (uint32_t i = 0; i < n_vocab; i++)
        sum += (double)expf(logits[i] - max);
    return (double)(logits[tok] - max) - log(sum);
}

int executor_perplexity(struct executor_ctx *c, const int32_t *tokens, size_t n_tokens,
                        const struct executor_ppl_opts *o, struct executor_ppl_result *out,
                        struct common_errmsg *e)
{
    struct executor_ppl_opts def = {.bos = -1};
    if (!o)
        o = &def;
    const uint32_t n_ctx = o->n_ctx ? o->n_ctx : executor_ctx_n_ctx(c);
    if (n_ctx > executor_ctx_n_ctx(c) || n_ctx < 4)
        return common_errmsg_set(e, COMMON_ERANGE,
                                 "chunk length %u is not in 4..%u (the context size)", n_ctx,
                                 executor_ctx_n_ctx(c));
    if (n_tokens < 2 * (size_t)n_ctx)
        return common_errmsg_set(e, COMMON_ERANGE,
                                 "you need at least %u tokens to evaluate perplexity with a "
                                 "context of %u (have %zu)",
                                 2 * n_ctx, n_ctx, n_tokens);
    int32_t *chunk = malloc(n_ctx * sizeof(*chunk));
    if (!chunk)
        return COMMON_ENOMEM;
    size_t n_chunks = n_tokens / n_ctx;
    if (o && o->max_chunks && o->max_chunks < n_chunks)
        n_chunks = o->max_chunks; /* llama-perplexity --chunks */
    const uint32_t first = n_ctx / 2;
    uint32_t       n_vocab = 0;
    float         *logits = NULL;
    double         nll = 0.0, nll2 = 0.0;
    uint64_t       count = 0;
    int            rc = 0;
    for (size_t i = 0; i < n_chunks; i++) {
        const int32_t *src = tokens + i * n_ctx;
        for (uint32_t j = 0; j < n_ctx; j++)
            chunk[j] = src[j];
        if (o->bos >= 0)
            chunk[0] = o->bos;
        if (!logits) {
            n_vocab = executor_ctx_n_vocab(c);
            logits = malloc((size_t)n_ctx * n_vocab * sizeof(*logits));
            if (!logits) {
                rc = COMMON_ENOMEM;
                break;
            }
        }
        executor_ctx_reset(c);
        rc = executor_ctx_decode(c, chunk, n_ctx, logits,
                                 &(struct executor_decode_opts){.all_logits = true}, e);
        if (rc < 0)
            break;
        if (o->on_logits &&
            (rc = o->on_logits(o->arg, (uint32_t)i, logits + (size_t)first * n_vocab,
                               src + first + 1, n_ctx - 1 - first, n_vocab)) < 0)
            break;
        for (uint32_t j = first; j + 1 < n_ctx; j++) {
            /* The prediction at j is scored against the original next token. */
            const double v = -ppl_log_softmax(logits + (size_t)j * n_vocab, n_vocab, src[j + 1]);
            nll += v;
            nll2 += v * v;
            count++;
        }
        if (o->on_chunk)
            o->on_chunk(o->arg, (uint32_t)i, exp(nll / (double)count));
    }
    free(logits);
    free(chunk);
    if (rc < 0)
        return rc;
    double mean = nll / (double)count;
    double mean2 = nll2 / (double)count - mean * mean;
    out->nll = mean;
    out->ppl = exp(mean);
    out->ppl_err = mean2 > 0 && count > 1 ? sqrt(mean2 / (double)(count - 1)) * out->ppl : 0.0;
    out->n_chunks = (uint32_t)n_chunks;
    out->n_scored = count;
    return 0;
}
