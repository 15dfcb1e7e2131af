/* router/sampler.c - struct router_sampler: bias, penalties, top-k/p, min-p, temperature, draw. */
#include "router.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One candidate token while the chain runs. */
struct router_sampler_cand {
    int32_t id;
    float   logit;
    double  p; /* probability after the last softmax */
};

#define SAMPLER_HIST_MAX     4096u /* penalty window cap for penalty_last_n = -1 */
#define SAMPLER_DEFAULT_LAST 64u   /* llama.cpp's default penalty_last_n */

/* ---- PRNG: xoshiro256** seeded through splitmix64 (same sequence on every machine) ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4])
{
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform double in [0, 1) from the top 53 bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(xoshiro_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- exp of our own: libm's exp may differ in the last bit between machines ---- */

/* e^x for x <= 0 (softmax inputs are shifted by the max), using only +, -, *, / and ldexp, which
 * IEEE 754 makes exact or correctly rounded everywhere: x = k ln2 + r, |r| <= ln2/2, then a
 * degree-13 Taylor polynomial of e^r (error < 1e-16 relative). */
static double det_exp(double x)
{
    if (x < -745.0)
        return 0.0;
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double k = (double)(long)(x / 0.6931471805599453 + (x < 0 ? -0.5 : 0.5));
    const double r = (x - k * ln2_hi) - k * ln2_lo;
    double       sum = 1.0, term = 1.0;
    for (int i = 1; i <= 13; i++) {
        term = term * r / (double)i;
        sum = sum + term;
    }
    return ldexp(sum, (int)k);
}

/* ---- chain stages ---- */

/* Candidates by logit, highest first; ties by lower id so the order is total. */
static int cand_cmp(const void *a, const void *b)
{
    const struct router_sampler_cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Softmax over cand[0..n) (sorted, cand[0] the largest). */
static void softmax(struct router_sampler_cand *c, size_t n)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        c[i].p = det_exp((double)c[i].logit - (double)c[0].logit);
        sum += c[i].p;
    }
    for (size_t i = 0; i < n; i++)
        c[i].p /= sum;
}

int router_sampler_init(struct router_sampler *s, const struct router_sampler_opts *o,
                        uint32_t n_vocab)
{
    const struct router_sampler_opts dflt = {0};
    memset(s, 0, sizeof(*s));
    if (!o)
        o = &dflt;
    if (n_vocab == 0 || o->top_k < 0 || isnan(o->temperature) || isnan(o->top_p) ||
        isnan(o->min_p) || o->min_p < 0.0f || o->min_p > 1.0f || o->top_p < 0.0f ||
        isnan(o->repeat_penalty) || o->repeat_penalty < 0.0f || isnan(o->frequency_penalty) ||
        isnan(o->presence_penalty) || o->penalty_last_n < -1 || (o->n_bias && !o->bias))
        return COMMON_EINVAL;
    for (size_t i = 0; i < o->n_bias; i++) {
        if (o->bias[i].id < 0 || (uint32_t)o->bias[i].id >= n_vocab || isnan(o->bias[i].bias))
            return COMMON_EINVAL;
    }
    s->opts = *o;
    s->n_vocab = n_vocab;
    s->hist_cap = o->penalty_last_n == 0                           ? SAMPLER_DEFAULT_LAST
                  : o->penalty_last_n == -1                        ? SAMPLER_HIST_MAX
                  : (uint32_t)o->penalty_last_n > SAMPLER_HIST_MAX ? SAMPLER_HIST_MAX
                                                                   : (uint32_t)o->penalty_last_n;
    s->cand = calloc(n_vocab, sizeof(*s->cand));
    s->counts = calloc(n_vocab, sizeof(*s->counts));
    s->hist = calloc(s->hist_cap, sizeof(*s->hist));
    s->bias = o->n_bias ? calloc(o->n_bias, sizeof(*s->bias)) : NULL;
    if (!s->cand || !s->counts || !s->hist || (o->n_bias && !s->bias)) {
        router_sampler_fini(s);
        return COMMON_ENOMEM;
    }
    if (o->n_bias)
        memcpy(s->bias, o->bias, o->n_bias * sizeof(*s->bias));
    s->opts.bias = s->bias;

    uint64_t seed = o->seed ? o->seed : common_now_ns();
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&seed);
    return 0;
}

void router_sampler_fini(struct router_sampler *s)
{
    free(s->cand);
    free(s->counts);
    free(s->hist);
    free(s->bias);
    s->cand = NULL;
    s->counts = NULL;
    s->hist = NULL;
    s->bias = NULL;
}

void router_sampler_accept(struct router_sampler *s, int32_t id)
{
    if (id < 0 || (uint32_t)id >= s->n_vocab || s->hist_cap == 0)
        return;
    s->hist[s->hist_head] = id;
    s->hist_head = (s->hist_head + 1) % s->hist_cap;
    if (s->hist_n < s->hist_cap)
        s->hist_n++;
}

void router_sampler_replay(struct router_sampler *s, int32_t id)
{
    if (s->opts.temperature > 0.0f)
        (void)rng_uniform(s->rng); /* router_sampler_pick's one draw */
    router_sampler_accept(s, id);
}

void router_sampler_reset(struct router_sampler *s)
{
    s->hist_n = 0;
    s->hist_head = 0;
}

/* The argmax of the logits as they are (ties -> lowest id, -inf and NaN never win): what the
 * chain gives at temperature <= 0 without bias or penalties, without copying the candidates. */
static int sampler_argmax(const float *logits, uint32_t n, int32_t *id)
{
    int64_t best = -1;
    for (uint32_t i = 0; i < n; i++) {
        if (!(logits[i] > -INFINITY)) /* -inf and NaN */
            continue;
        if (best < 0 || logits[i] > logits[best])
            best = i;
    }
    if (best < 0)
        return COMMON_EINVAL;
    *id = (int32_t)best;
    return 0;
}

int router_sampler_pick(struct router_sampler *s, const float *logits, int32_t *id)
{
    const struct router_sampler_opts *o = &s->opts;
    struct router_sampler_cand       *c = s->cand;
    const uint32_t                    n = s->n_vocab;

    /* Greedy is this sampler's temperature-0 case, for every caller (the router daemon and the
     * one-process session alike). Without bias or penalties it needs no candidate list. */
    const bool penalised =
        s->hist_n && ((o->repeat_penalty != 0.0f && o->repeat_penalty != 1.0f) ||
                      o->frequency_penalty != 0.0f || o->presence_penalty != 0.0f);
    if (o->temperature <= 0.0f && o->n_bias == 0 && !penalised)
        return sampler_argmax(logits, n, id);

    /* Working logits live in cand[].logit indexed by id until sorting. */
    for (uint32_t i = 0; i < n; i++)
        c[i] = (struct router_sampler_cand){.id = (int32_t)i, .logit = logits[i]};
    for (size_t i = 0; i < o->n_bias; i++)
        c[o->bias[i].id].logit += o->bias[i].bias;
    /* Penalties over the window: cand[] is still indexed by id here. counts[] is all zero
     * between calls (each count is cleared once used). */
    {
        const bool has_repeat = o->repeat_penalty != 0.0f && o->repeat_penalty != 1.0f;
        if (s->hist_n &&
            (has_repeat || o->frequency_penalty != 0.0f || o->presence_penalty != 0.0f)) {
            for (uint32_t k = 0; k < s->hist_n; k++)
                s->counts[s->hist[k]]++;
            for (uint32_t k = 0; k < s->hist_n; k++) {
                const int32_t  t = s->hist[k];
                const uint32_t count = s->counts[t];
                if (count == 0)
                    continue;
                float *l = &c[t].logit;
                if (has_repeat)
                    *l = *l <= 0.0f ? *l * o->repeat_penalty : *l / o->repeat_penalty;
                *l -= (float)count * o->frequency_penalty + o->presence_penalty;
                s->counts[t] = 0;
            }
        }
    }
    /* Drop what can never be picked (-inf, NaN) and sort the rest. */
    size_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (c[i].logit > -INFINITY && !isnan(c[i].logit))
            c[m++] = c[i];
    }
    if (m == 0)
        return COMMON_EINVAL;
    if (o->temperature <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < m; i++) {
            if (c[i].logit > c[best].logit)
                best = i; /* strict: the lowest id wins ties (ids ascend here) */
        }
        *id = c[best].id;
        return 0;
    }
    qsort(c, m, sizeof(*c), cand_cmp);
    if (o->top_k > 0 && (size_t)o->top_k < m)
        m = (size_t)o->top_k;
    if (o->top_p > 0.0f && o->top_p < 1.0f) {
        softmax(c, m);
        double cum = 0.0;
        size_t keep = m;
        for (size_t i = 0; i < m; i++) {
            cum += c[i].p;
            if (cum >= (double)o->top_p) {
                keep = i + 1;
                break;
            }
        }
        m = keep;
    }
    if (o->min_p > 0.0f) {
        /* keep p >= min_p * p_max, i.e. logit >= max + ln(min_p) */
        softmax(c, m);
        const double thr = c[0].p * (double)o->min_p;
        size_t       keep = 1;
        while (keep < m && c[keep].p >= thr)
            keep++;
        m = keep;
    }
    for (size_t i = 0; i < m; i++)
        c[i].logit /= o->temperature;
    softmax(c, m);
    const double r = rng_uniform(s->rng);
    double       cum = 0.0;
    for (size_t i = 0; i < m; i++) {
        cum += c[i].p;
        if (r < cum) {
            *id = c[i].id;
            return 0;
        }
    }
    *id = c[m - 1].id; /* rounding left r above the last sum */
    return 0;
}
