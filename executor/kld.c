/* executor/kld.c - llama-perplexity's KL-divergence files: the base log-probabilities of one
 * model (--kl-divergence-base) and their comparison with another's (--kl-divergence). */
#include "executor.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KLD_MAGIC     "_logits_"
#define KLD_MAGIC_LEN 8
#define KLD_HDR_BYTES (KLD_MAGIC_LEN + 3 * 4) /* magic, n_ctx, n_vocab, n_chunk */
#define KLD_MAX_CTX   (1u << 20)
#define KLD_MAX_VOCAB (1u << 24)
#define KLD_LOG_FLOOR 16.0f /* log-probabilities below max - 16 are stored as the minimum */

size_t executor_kld_row_len(uint32_t n_vocab)
{
    return 2u * (((size_t)n_vocab + 1u) / 2u) + 4u;
}

uint32_t executor_kld_rows_per_chunk(uint32_t n_ctx)
{
    return n_ctx - 1u - n_ctx / 2u;
}

/* ggml's round-to-nearest through the float mantissa (valid below 2^22). */
static int kld_nearest_int(float v)
{
    float   f = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &f, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

double executor_kld_encode_row(const float *logits, uint32_t n_vocab, int32_t tok, uint16_t *row)
{
    float max = logits[0], min = logits[0];
    for (uint32_t i = 1; i < n_vocab; i++) {
        max = logits[i] > max ? logits[i] : max;
        min = logits[i] < min ? logits[i] : min;
    }
    min = min > max - KLD_LOG_FLOOR ? min : max - KLD_LOG_FLOOR;
    double sum = 0.0;
    for (uint32_t i = 0; i < n_vocab; i++)
        sum += (double)expf(logits[i] - max);
    const float log_sum = (float)log(sum);
    const float min_log_prob = min - max - log_sum;
    const float scale = (max - min) / 65535.0f;
    memcpy(row, &scale, sizeof(scale));
    memcpy(row + 2, &min_log_prob, sizeof(min_log_prob));
    uint16_t *q = row + 4;
    if (scale > 0.0f) {
        const float inv = 1.0f / scale;
        for (uint32_t i = 0; i < n_vocab; i++)
            q[i] = logits[i] > min ? (uint16_t)kld_nearest_int(inv * (logits[i] - min)) : 0;
    } else {
        memset(q, 0, (size_t)n_vocab * sizeof(*q));
    }
    if (n_vocab % 2)
        q[n_vocab] = 0; /* the pad to an even count */
    return (double)(max + log_sum - logits[tok]);
}

int executor_kld_stats_init(struct executor_kld_stats *s, uint64_t capacity)
{
    memset(s, 0, sizeof(*s));
    s->kld_values = malloc((capacity ? capacity : 1) * sizeof(*s->kld_values));
    s->p_diff_values = malloc((capacity ? capacity : 1) * sizeof(*s->p_diff_values));
    s->capacity = capacity;
    if (!s->kld_values || !s->p_diff_values) {
        executor_kld_stats_fini(s);
        return COMMON_ENOMEM;
    }
    return COMMON_OK;
}

void executor_kld_stats_fini(struct executor_kld_stats *s)
{
    free(s->kld_values);
    free(s->p_diff_values);
    s->kld_values = s->p_diff_values = NULL;
}

void executor_kld_accumulate(struct executor_kld_stats *s, const float *logits, uint32_t n_vocab,
                             const uint16_t *base_row, int32_t tok)
{
    float    max = logits[0];
    uint32_t imax = 0;
    for (uint32_t i = 1; i < n_vocab; i++)
        if (logits[i] > max) {
            max = logits[i];
            imax = i;
        }
    double sum_exp = 0.0;
    for (uint32_t i = 0; i < n_vocab; i++)
        sum_exp += (double)expf(logits[i] - max);
    const float log_sum = (float)log(sum_exp);
    float       scale, min_log_prob;
    memcpy(&scale, base_row, sizeof(scale));
    memcpy(&min_log_prob, base_row + 2, sizeof(min_log_prob));
    const uint16_t *q = base_row + 4;

    const float nll = max + log_sum - logits[tok];
    s->sum_nll += (double)nll;
    s->sum_nll2 += (double)(nll * nll);
    const float nll_base = -(scale * q[tok] + min_log_prob);
    s->sum_nll_base += (double)nll_base;
    s->sum_nll_base2 += (double)(nll_base * nll_base);
    s->sum_nll_nll_base += (double)(nll * nll_base);

    /* KL(base || this) over the base's tokens above e^-16, as llama-perplexity sums it. */
    const float lse = max + log_sum;
    double      kld = 0.0;
    uint32_t    imax_base = 0;
    float       base_max = 0.0f;
    for (uint32_t i = 0; i < n_vocab; i++) {
        const float lp_base = scale * q[i] + min_log_prob;
        if (i == 0 || lp_base > base_max) {
            base_max = lp_base;
            imax_base = i;
        }
        if (lp_base > -KLD_LOG_FLOOR)
            kld += (double)expf(lp_base) * (double)(lp_base - logits[i] + lse);
    }
    s->sum_kld += kld;
    s->sum_kld2 += kld * kld;
    s->n_same_top += imax == imax_base;
    const float p_diff = expf(-nll) - expf(-nll_base);
    s->sum_p_diff += (double)p_diff;
    const double p_diff2 = (double)(p_diff * p_diff);
    s->sum_p_diff2 += p_diff2;
    s->sum_p_diff4 += p_diff2 * p_diff2;
    s->max_p_diff = fabsf(p_diff) > s->max_p_diff ? fabsf(p_diff) : s->max_p_diff;
    if (s->count < s->capacity) {
        s->kld_values[s->count] = (float)kld;
        s->p_diff_values[s->count] = p_diff;
    }
    s->count++;
}

/* ------------------------------------------------------------------------------------------ */
/* The base file                                                                               */
/* ------------------------------------------------------------------------------------------ */

struct executor_kld_base {
    FILE    *f;     /* owned unless borrowed */
    bool     owned; /* f is closed by executor_kld_base_close */
    uint32_t n_ctx, n_vocab, n_chunk;
    int32_t *tokens; /* owned: n_chunk * n_ctx */
    uint32_t next;   /* chunk whose rows are read next */
};

static int kld_read(FILE *f, void *dst, size_t n)
{
    return fread(dst, 1, n, f) == n ? COMMON_OK : COMMON_EIO;
}

int executor_kld_base_read(FILE *f, uint64_t size, struct executor_kld_base **out,
                           struct common_errmsg *e)
{
    uint8_t hdr[KLD_HDR_BYTES];
    *out = NULL;
    if (size < KLD_HDR_BYTES || kld_read(f, hdr, sizeof(hdr)) != COMMON_OK ||
        memcmp(hdr, KLD_MAGIC, KLD_MAGIC_LEN) != 0)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "not a file of log-probabilities (no '_logits_' header)");
    int32_t v[3];
    memcpy(v, hdr + KLD_MAGIC_LEN, sizeof(v));
    if (v[0] < 3 || (uint32_t)v[0] > KLD_MAX_CTX || v[1] < 1 || (uint32_t)v[1] > KLD_MAX_VOCAB ||
        v[2] < 1)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "implausible header: n_ctx %d, n_vocab %d, n_chunk %d", v[0], v[1],
                                 v[2]);
    const uint32_t n_ctx = (uint32_t)v[0], n_vocab = (uint32_t)v[1], n_chunk = (uint32_t)v[2];
    /* The size must be exactly the header, the tokens and every chunk's rows. */
    const uint64_t tok_bytes = (uint64_t)n_chunk * n_ctx * 4u;
    const uint64_t chunk_bytes =
        (uint64_t)executor_kld_rows_per_chunk(n_ctx) * executor_kld_row_len(n_vocab) * 2u;
    uint64_t want = 0;
    if (!common_mul_u64(chunk_bytes, n_chunk, &want) ||
        !common_add_u64(want, tok_bytes + KLD_HDR_BYTES, &want) || want != size)
        return common_errmsg_set(
            e, COMMON_ECORRUPT, "%llu bytes, but n_ctx %u, n_vocab %u and %u chunks need %llu",
            (unsigned long long)size, n_ctx, n_vocab, n_chunk, (unsigned long long)want);
    struct executor_kld_base *b = calloc(1, sizeof(*b));
    if (!b)
        return COMMON_ENOMEM;
    b->f = f;
    b->n_ctx = n_ctx;
    b->n_vocab = n_vocab;
    b->n_chunk = n_chunk;
    b->tokens = malloc((size_t)tok_bytes);
    if (!b->tokens) {
        free(b);
        return COMMON_ENOMEM;
    }
    if (kld_read(f, b->tokens, (size_t)tok_bytes) != COMMON_OK) {
        executor_kld_base_close(b);
        return common_errmsg_set(e, COMMON_EIO, "reading the evaluation tokens failed");
    }
    for (uint64_t i = 0; i < (uint64_t)n_chunk * n_ctx; i++)
        if (b->tokens[i] < 0 || (uint32_t)b->tokens[i] >= n_vocab) {
            int32_t t = b->tokens[i];
            executor_kld_base_close(b);
            return common_errmsg_set(e, COMMON_ECORRUPT, "token %llu is %d, not in 0..%u",
                                     (unsigned long long)i, t, n_vocab - 1);
        }
    *out = b;
    return COMMON_OK;
}

int executor_kld_base_open(const char *path, struct executor_kld_base **out,
                           struct common_errmsg *e)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return common_errmsg_set(e, COMMON_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return common_errmsg_set(e, COMMON_EINVAL, "%s is not a regular file", path);
    }
    int rc = executor_kld_base_read(f, (uint64_t)st.st_size, out, e);
    if (rc < 0) {
        fclose(f);
        return rc;
    }
    (*out)->owned = true;
    return COMMON_OK;
}

void executor_kld_base_close(struct executor_kld_base *b)
{
    if (!b)
        return;
    if (b->owned && b->f)
        fclose(b->f);
    free(b->tokens);
    free(b);
}

void executor_kld_base_info(const struct executor_kld_base *b, uint32_t *n_ctx, uint32_t *n_vocab,
                            uint32_t *n_chunk, const int32_t **tokens)
{
    *n_ctx = b->n_ctx;
    *n_vocab = b->n_vocab;
    *n_chunk = b->n_chunk;
    *tokens = b->tokens;
}

int executor_kld_base_next(struct executor_kld_base *b, uint16_t *rows, struct common_errmsg *e)
{
    const size_t len = executor_kld_rows_per_chunk(b->n_ctx) * executor_kld_row_len(b->n_vocab);
    if (b->next >= b->n_chunk)
        return common_errmsg_set(e, COMMON_ERANGE, "the file holds %u chunks", b->n_chunk);
    if (kld_read(b->f, rows, len * sizeof(*rows)) != COMMON_OK)
        return common_errmsg_set(e, COMMON_EIO, "reading the log-probabilities of chunk %u failed",
                                 b->next + 1);
    /* A row's two floats must be usable: a finite scale >= 0 and a finite minimum. */
    const size_t nv = executor_kld_row_len(b->n_vocab);
    for (uint32_t r = 0; r < executor_kld_rows_per_chunk(b->n_ctx); r++) {
        float scale, min;
        memcpy(&scale, rows + (size_t)r * nv, sizeof(scale));
        memcpy(&min, rows + (size_t)r * nv + 2, sizeof(min));
        if (!isfinite(scale) || scale < 0.0f || !isfinite(min))
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "chunk %u, row %u: bad scale %g or minimum %g", b->next + 1, r,
                                     (double)scale, (double)min);
    }
    b->next++;
    return COMMON_OK;
}

int executor_kld_write_header(FILE *f, uint32_t n_ctx, uint32_t n_vocab, uint32_t n_chunk,
                              const int32_t *tokens)
{
    int32_t v[3] = {(int32_t)n_ctx, (int32_t)n_vocab, (int32_t)n_chunk};
    size_t  n = (size_t)n_chunk * n_ctx;
    if (fwrite(KLD_MAGIC, 1, KLD_MAGIC_LEN, f) != KLD_MAGIC_LEN ||
        fwrite(v, sizeof(v[0]), 3, f) != 3 || fwrite(tokens, sizeof(*tokens), n, f) != n)
        return COMMON_EIO;
    return COMMON_OK;
}
