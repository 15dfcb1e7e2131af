/* executor/synth.c - writes GGUF models of every supported architecture with random weights,
 * streaming. */
#include "executor.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"

#define SYNTH_CHUNK_BYTES   (512u << 10) /* written bytes per chunk of rows (or one longer row) */
#define SYNTH_MAX_ROW       (2u << 20)   /* elements of a row: bounds each thread's row scratch */
#define SYNTH_SLOTS_PER_THR 2u           /* chunks in flight per thread */
#define SYNTH_MAX_THREADS   256u         /* as executor_threadpool_create */
#define SYNTH_BYTE_VOCAB    259u         /* <unk>, <s>, </s>, 256 byte tokens */

/* One tensor of the synthetic model. */
struct synth_tensor {
    char     name[64];
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[3];
    float    std;  /* standard deviation of the random values */
    float    mean; /* added to every value (norm weights are ~1) */
    /* I2_S: the layout, the tensor's power-of-two scale, bytes per row and after the rows. */
    enum executor_synth_i2s i2s;
    float                   i2s_scale;
    uint64_t                i2s_row, i2s_tail;
    bool     derived; /* a split I2_S tensor's scales: constant, takes no seed of its own */
    uint64_t seed;    /* RNG seed of the values (synth_plan_seed); row r's stream is its own */
};

/* xoshiro256** seeded with splitmix64: the same stream on every machine. */
struct synth_rng {
    uint64_t s[4];
};

static uint64_t synth_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void synth_rng_seed(struct synth_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = synth_splitmix(&seed);
}

static uint64_t synth_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t synth_next(struct synth_rng *r)
{
    uint64_t *s = r->s;
    uint64_t  result = synth_rotl(s[1] * 5, 7) * 9;
    uint64_t  t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = synth_rotl(s[3], 45);
    return result;
}

/* Approximately normal values (Irwin-Hall of four 16-bit uniforms): cheap enough for tens of GB. */
static void synth_fill(struct synth_rng *r, float *dst, size_t n, float mean, float std)
{
    const float scale = std * 1.7320508f / 32768.0f; /* var of the 4-sum is 4/12 of 65536^2 */
    for (size_t i = 0; i < n; i++) {
        uint64_t x = synth_next(r);
        int32_t  s = (int32_t)(x & 0xFFFF) + (int32_t)((x >> 16) & 0xFFFF) +
                    (int32_t)((x >> 32) & 0xFFFF) + (int32_t)(x >> 48) - 2 * 65535;
        dst[i] = mean + (float)s * scale * 0.5f;
    }
}

/* The llama.cpp file-type code of a weight type (general.file_type). */
static uint32_t synth_file_type(uint32_t type)
{
    switch (type) {
    case COMMON_GGML_TYPE_F32:
        return 0;
    case COMMON_GGML_TYPE_F16:
        return 1;
    case COMMON_GGML_TYPE_Q4_0:
        return 2;
    case COMMON_GGML_TYPE_Q4_1:
        return 3;
    case COMMON_GGML_TYPE_Q8_0:
        return 7;
    case COMMON_GGML_TYPE_Q5_0:
        return 8;
    case COMMON_GGML_TYPE_Q5_1:
        return 9;
    case COMMON_GGML_TYPE_Q2_K:
        return 10;
    case COMMON_GGML_TYPE_Q3_K:
        return 12;
    case COMMON_GGML_TYPE_Q4_K:
        return 15;
    case COMMON_GGML_TYPE_Q5_K:
        return 17;
    case COMMON_GGML_TYPE_Q6_K:
        return 18;
    case COMMON_GGML_TYPE_BF16:
        return 32;
    case COMMON_GGML_TYPE_TQ1_0:
        return 36;
    case COMMON_GGML_TYPE_TQ2_0:
        return 37;
    case COMMON_GGML_TYPE_MXFP4:
        return 38; /* llama.cpp's MXFP4_MOE */
    case COMMON_GGML_TYPE_I2_S:
        return 40; /* Microsoft's fork: MOSTLY_I2_S */
    default:
        return 0;
    }
}

/* The model plan: every tensor with its geometry. */
struct synth_plan {
    struct synth_tensor    *t; /* owned */
    size_t                  n;
    size_t                  cap;
    enum executor_synth_i2s i2s;   /* layout of I2_S tensors */
    bool                    quick; /* K-quants without the scale search */
};

static int synth_add(struct synth_plan *p, uint32_t type, float mean, float std, uint32_t n_dims,
                     uint64_t ne0, uint64_t ne1, uint64_t ne2, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));

static int synth_add(struct synth_plan *p, uint32_t type, float mean, float std, uint32_t n_dims,
                     uint64_t ne0, uint64_t ne1, uint64_t ne2, const char *fmt, ...)
{
    if (p->n == p->cap) {
        size_t               cap = p->cap ? p->cap * 2 : 64;
        struct synth_tensor *t = realloc(p->t, cap * sizeof(*t));
        if (!t)
            return COMMON_ENOMEM;
        p->t = t;
        p->cap = cap;
    }
    struct synth_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof(*t));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    /* Rows a block type cannot hold (deepseek2's narrow heads under a K-quant) fall back to
     * q8_0, or f32, as llama-quantize does. */
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    if (ti && ne0 % ti->blck != 0)
        type = ne0 % 32 == 0 ? COMMON_GGML_TYPE_Q8_0 : COMMON_GGML_TYPE_F32;
    t->type = type;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->mean = mean;
    t->std = std;
    if (type != COMMON_GGML_TYPE_I2_S)
        return COMMON_OK;
    /* Ternary weights t * s, s the power of two nearest the requested deviation (exact in f16,
     * and applied after a whole dot or per block alike: the layouts agree to the bit). */
    t->i2s = p->i2s;
    t->i2s_scale = exp2f(roundf(log2f(std > 0.0f ? std : 1.0f)));
    t->i2s_row = p->i2s == EXECUTOR_SYNTH_I2S_BITNET32 ? ne0 / 32 * 10 : ne0 / 4;
    t->i2s_tail = p->i2s == EXECUTOR_SYNTH_I2S_QK256 ? 32 : 0;
    if (p->i2s == EXECUTOR_SYNTH_I2S_SPLIT32) {
        const float sc = t->i2s_scale;
        char        base[64];
        snprintf(base, sizeof(base), "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
        int rc = synth_add(p, COMMON_GGML_TYPE_F32, sc, 0.0f, 2, ne0 / 32, ne1 * ne2, 1,
                           "%s.scales", base);
        if (rc == COMMON_OK)
            p->t[p->n - 1].derived = true;
        return rc;
    }
    return COMMON_OK;
}

/* Resolved geometry with defaults applied. */
struct synth_geom {
    enum common_arch arch;
    uint32_t n_vocab, n_ctx, n_embd, n_layer, n_head, n_head_kv, n_ff, n_expert, n_expert_used;
    uint32_t n_ff_shexp; /* shared expert width (qwen2moe, deepseek2), else 0 */
    /* deepseek2: latent attention ranks and widths, dense leading layers, V3 or V2-Lite routing */
    uint32_t q_lora, kv_lora, rot, nope, v_mla, n_dense_lead, n_ff_dense;
    bool     lite;
    float    embd_std;  /* token embeddings (larger for balanced routing) */
    float    embd_mean; /* their component common to all tokens (--routing-skew) */
    float    reuse;     /* --routing-reuse: the attention output's scale over embd_std; 0 = off */
    float    qk_bias;   /* with reuse: the constant of every q and k bias element */
    uint32_t
        head_dim; /* attention head width (gpt-oss: twice n_embd / n_head), else n_embd/n_head */
    uint32_t type;
    float    rope_freq_base, rms_eps;
};

/* The attention tensors of layer il as llama.cpp's converter names and shapes them: biases on
 * q/k/v for qwen2 and qwen2moe, per-head q/k norms for qwen3 and qwen3moe, whole-projection q/k
 * norms for olmoe. */
/* deepseek2's latent attention tensors of layer il, as the converter writes them (attn_kv_b
 * already split into attn_k_b, transposed, and attn_v_b). */
static int synth_plan_mla(const struct synth_geom *g, struct synth_plan *p, uint32_t il)
{
    const float    s_e = 1.0f / sqrtf((float)g->n_embd);
    const uint64_t kq = (uint64_t)g->n_head * (g->nope + g->rot);
    int            rc;
    if ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, g->n_embd, 1, 1,
                        "blk.%u.attn_norm.weight", il)))
        return rc;
    if (g->q_lora) {
        if ((rc = synth_add(p, g->type, 0.0f, s_e, 2, g->n_embd, g->q_lora, 1,
                            "blk.%u.attn_q_a.weight", il)) ||
            (rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, g->q_lora, 1, 1,
                            "blk.%u.attn_q_a_norm.weight", il)) ||
            (rc = synth_add(p, g->type, 0.0f, 1.0f / sqrtf((float)g->q_lora), 2, g->q_lora, kq, 1,
                            "blk.%u.attn_q_b.weight", il)))
            return rc;
    } else if ((rc = synth_add(p, g->type, 0.0f, s_e, 2, g->n_embd, kq, 1, "blk.%u.attn_q.weight",
                               il))) {
        return rc;
    }
    if ((rc = synth_add(p, g->type, 0.0f, s_e, 2, g->n_embd, (uint64_t)g->kv_lora + g->rot, 1,
                        "blk.%u.attn_kv_a_mqa.weight", il)) ||
        (rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, g->kv_lora, 1, 1,
                        "blk.%u.attn_kv_a_norm.weight", il)) ||
        (rc = synth_add(p, g->type, 0.0f, 1.0f / sqrtf((float)g->nope), 3, g->nope, g->kv_lora,
                        g->n_head, "blk.%u.attn_k_b.weight", il)) ||
        (rc = synth_add(p, g->type, 0.0f, 1.0f / sqrtf((float)g->kv_lora), 3, g->kv_lora, g->v_mla,
                        g->n_head, "blk.%u.attn_v_b.weight", il)) ||
        (rc = synth_add(p, g->type, 0.0f, 1.0f / sqrtf((float)(g->n_head * g->v_mla)), 2,
                        (uint64_t)g->n_head * g->v_mla, g->n_embd, 1, "blk.%u.attn_output.weight",
                        il)))
        return rc;
    return COMMON_OK;
}

static int synth_plan_attention(const struct synth_geom *g, struct synth_plan *p, uint32_t il)
{
    if (g->arch == COMMON_ARCH_DEEPSEEK2)
        return synth_plan_mla(g, p, il);
    const uint32_t hd = g->head_dim ? g->head_dim : g->n_embd / g->n_head;
    const uint64_t kv = (uint64_t)g->n_head_kv * hd, qd = (uint64_t)g->n_head * hd;
    const float    s_e = 1.0f / sqrtf((float)g->n_embd);
    /* --routing-reuse: q and k are their biases alone, the same constant c in every element, so
     * that after RoPE a score depends on the distance d alone: 2 c^2 / sqrt(hd) times the sum
     * over the hd/2 rotated pairs of cos(theta_i d), about (hd/2)(1 - ln d / ln base) (the
     * frequencies spread evenly in log). Softmax weights then fall as d^-a with
     * a = c^2 hd / (sqrt(hd) ln base): a = 1.5 spreads them over the last few tokens. The
     * output projection scales what they carry to `reuse` times the embeddings' spread. */
    const float s_qk = g->reuse > 0.0f ? 0.0f : s_e;
    const float s_o = (g->reuse > 0.0f ? g->reuse * g->embd_std : 1.0f) / sqrtf((float)qd);
    const float c_qk = sqrtf(1.5f * sqrtf((float)hd) * logf(g->rope_freq_base) / (float)hd);
    int         rc;
    if ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, g->n_embd, 1, 1,
                        "blk.%u.attn_norm.weight", il)) ||
        (rc = synth_add(p, g->type, 0.0f, s_qk, 2, g->n_embd, qd, 1, "blk.%u.attn_q.weight", il)) ||
        (rc = synth_add(p, g->type, 0.0f, s_qk, 2, g->n_embd, kv, 1, "blk.%u.attn_k.weight", il)) ||
        (rc = synth_add(p, g->type, 0.0f, s_e, 2, g->n_embd, kv, 1, "blk.%u.attn_v.weight", il)) ||
        (rc = synth_add(p, g->type, 0.0f, s_o, 2, qd, g->n_embd, 1, "blk.%u.attn_output.weight",
                        il)))
        return rc;
    switch (g->arch) {
    case COMMON_ARCH_BITNET:
        /* llama.cpp's per-tensor scales (wq_s ...): well away from 1, so a missed one shows. */
        for (int k = 0; k < 4; k++)
            if ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.5f, 0.25f, 1, 1, 1, 1,
                                "blk.%u.attn_%s.scale", il,
                                (const char *[]){"q", "k", "v", "output"}[k])))
                return rc;
        __attribute__((fallthrough));
    case COMMON_ARCH_BITNET_B158:
        if ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, qd, 1, 1,
                            "blk.%u.attn_sub_norm.weight", il)))
            return rc;
        break;
    case COMMON_ARCH_GPTOSS:
        if ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 0.1f, 1, g->n_embd, 1, 1,
                            "blk.%u.attn_output.bias", il)) ||
            (rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 1.0f, 1, g->n_head, 1, 1,
                            "blk.%u.attn_sinks.weight", il)))
            return rc;
        __attribute__((fallthrough)); /* q/k/v biases as qwen2 */
    case COMMON_ARCH_QWEN2:
    case COMMON_ARCH_QWEN2MOE:
    case COMMON_ARCH_GLM4MOE:
        if ((rc =
                 synth_add(p, COMMON_GGML_TYPE_F32, g->reuse > 0.0f ? c_qk : 0.0f,
                           g->reuse > 0.0f ? 0.0f : 0.1f, 1, qd, 1, 1, "blk.%u.attn_q.bias", il)) ||
            (rc =
                 synth_add(p, COMMON_GGML_TYPE_F32, g->reuse > 0.0f ? c_qk : 0.0f,
                           g->reuse > 0.0f ? 0.0f : 0.1f, 1, kv, 1, 1, "blk.%u.attn_k.bias", il)) ||
            (rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 0.1f, 1, kv, 1, 1, "blk.%u.attn_v.bias",
                            il)))
            return rc;
        break;
    case COMMON_ARCH_QWEN3:
    case COMMON_ARCH_QWEN3MOE:
    case COMMON_ARCH_OLMOE: {
        const bool     full = g->arch == COMMON_ARCH_OLMOE;
        const uint64_t qn = full ? g->n_embd : hd, kn = full ? kv : hd;
        if ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, qn, 1, 1,
                            "blk.%u.attn_q_norm.weight", il)) ||
            (rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, kn, 1, 1,
                            "blk.%u.attn_k_norm.weight", il)))
            return rc;
        break;
    }
    default:
        break;
    }
    return COMMON_OK;
}

static int synth_plan_build(const struct synth_geom *g, struct synth_plan *p)
{
    float      s_e = 1.0f / sqrtf((float)g->n_embd);
    float      s_ff = 1.0f / sqrtf((float)g->n_ff);
    int        rc;
    const bool bitnet = g->arch == COMMON_ARCH_BITNET || g->arch == COMMON_ARCH_BITNET_B158;
    /* I2_S files keep the embedding (the tied head) in f16, as Microsoft's converter does. */
    if ((rc = synth_add(p, g->type == COMMON_GGML_TYPE_I2_S ? COMMON_GGML_TYPE_F16 : g->type,
                        g->embd_mean, g->embd_std, 2, g->n_embd, g->n_vocab, 1,
                        "token_embd.weight")))
        return rc;
    /* glm4moe files carry a next-token prediction block after the last layer (not run). */
    const uint32_t n_blocks = g->n_layer + (g->arch == COMMON_ARCH_GLM4MOE ? 1 : 0);
    for (uint32_t il = 0; il < n_blocks; il++) {
        if (il == g->n_layer &&
            ((rc = synth_add(p, g->type, 0.0f, s_e, 2, 2 * (uint64_t)g->n_embd, g->n_embd, 1,
                             "blk.%u.nextn.eh_proj.weight", il)) ||
             (rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, g->n_embd, 1, 1,
                             "blk.%u.nextn.enorm.weight", il)) ||
             (rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, g->n_embd, 1, 1,
                             "blk.%u.nextn.hnorm.weight", il)) ||
             (rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, g->n_embd, 1, 1,
                             "blk.%u.nextn.shared_head_norm.weight", il))))
            return rc;
        if ((rc = synth_plan_attention(g, p, il)) ||
            (rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, g->n_embd, 1, 1,
                            g->arch == COMMON_ARCH_GLM4MOE || g->arch == COMMON_ARCH_GPTOSS
                                ? "blk.%u.post_attention_norm.weight"
                                : "blk.%u.ffn_norm.weight",
                            il)))
            return rc;
        if (g->n_expert == 0 || il < g->n_dense_lead) {
            const uint32_t ff = il < g->n_dense_lead ? g->n_ff_dense : g->n_ff;
            if ((rc = synth_add(p, g->type, 0.0f, s_e, 2, g->n_embd, ff, 1,
                                "blk.%u.ffn_gate.weight", il)) ||
                (rc = synth_add(p, g->type, 0.0f, s_e, 2, ff, g->n_embd, 1,
                                "blk.%u.ffn_down.weight", il)) ||
                (rc = synth_add(p, g->type, 0.0f, s_e, 2, g->n_embd, ff, 1, "blk.%u.ffn_up.weight",
                                il)))
                return rc;
            if (bitnet && (rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, ff, 1, 1,
                                          "blk.%u.ffn_sub_norm.weight", il)))
                return rc;
            for (int k = 0; g->arch == COMMON_ARCH_BITNET && k < 3; k++)
                if ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.5f, 0.25f, 1, 1, 1, 1,
                                    "blk.%u.ffn_%s.scale", il,
                                    (const char *[]){"gate", "down", "up"}[k])))
                    return rc;
            continue;
        }
        if (((g->arch == COMMON_ARCH_DEEPSEEK2 && !g->lite) || g->arch == COMMON_ARCH_GLM4MOE) &&
            (rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 0.05f, 1, g->n_expert, 1, 1,
                            "blk.%u.exp_probs_b.bias", il)))
            return rc;
        if ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 4.0f * s_e, 2, g->n_embd, g->n_expert, 1,
                            "blk.%u.ffn_gate_inp.weight", il)) ||
            (rc = synth_add(p, g->type, 0.0f, s_e, 3, g->n_embd, g->n_ff, g->n_expert,
                            "blk.%u.ffn_gate_exps.weight", il)) ||
            (rc = synth_add(p, g->type, 0.0f, s_ff, 3, g->n_ff, g->n_embd, g->n_expert,
                            "blk.%u.ffn_down_exps.weight", il)) ||
            (rc = synth_add(p, g->type, 0.0f, s_e, 3, g->n_embd, g->n_ff, g->n_expert,
                            "blk.%u.ffn_up_exps.weight", il)))
            return rc;
        if (g->arch == COMMON_ARCH_GPTOSS &&
            ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 0.5f, 1, g->n_expert, 1, 1,
                             "blk.%u.ffn_gate_inp.bias", il)) ||
             (rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 0.1f, 2, g->n_ff, g->n_expert, 1,
                             "blk.%u.ffn_gate_exps.bias", il)) ||
             (rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 0.1f, 2, g->n_ff, g->n_expert, 1,
                             "blk.%u.ffn_up_exps.bias", il)) ||
             (rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 0.1f, 2, g->n_embd, g->n_expert, 1,
                             "blk.%u.ffn_down_exps.bias", il))))
            return rc;
        if (g->n_ff_shexp == 0)
            continue;
        const float s_sh = 1.0f / sqrtf((float)g->n_ff_shexp);
        if ((g->arch == COMMON_ARCH_QWEN2MOE &&
             (rc = synth_add(p, COMMON_GGML_TYPE_F32, 0.0f, 4.0f * s_e, 1, g->n_embd, 1, 1,
                             "blk.%u.ffn_gate_inp_shexp.weight", il))) ||
            (rc = synth_add(p, g->type, 0.0f, s_e, 2, g->n_embd, g->n_ff_shexp, 1,
                            "blk.%u.ffn_gate_shexp.weight", il)) ||
            (rc = synth_add(p, g->type, 0.0f, s_sh, 2, g->n_ff_shexp, g->n_embd, 1,
                            "blk.%u.ffn_down_shexp.weight", il)) ||
            (rc = synth_add(p, g->type, 0.0f, s_e, 2, g->n_embd, g->n_ff_shexp, 1,
                            "blk.%u.ffn_up_shexp.weight", il)))
            return rc;
    }
    if ((rc = synth_add(p, COMMON_GGML_TYPE_F32, 1.0f, 0.05f, 1, g->n_embd, 1, 1,
                        "output_norm.weight")))
        return rc;
    /* bitnet's head is the embedding (llama.cpp's bitnet graph reads no output tensor). */
    if (!bitnet &&
        (rc = synth_add(p, g->type, 0.0f, s_e, 2, g->n_embd, g->n_vocab, 1, "output.weight")))
        return rc;
    return COMMON_OK;
}

/* Bytes of one row of t as written (an I2_S layout's own size). */
static uint64_t synth_row_bytes(const struct synth_tensor *t)
{
    uint64_t row = 0;
    if (t->type == COMMON_GGML_TYPE_I2_S)
        return t->i2s_row;
    common_ggml_row_size(t->type, t->ne[0], &row);
    return row;
}

static uint64_t synth_tensor_bytes(const struct synth_tensor *t)
{
    return synth_row_bytes(t) * t->ne[1] * t->ne[2] + t->i2s_tail;
}

/* Piece k of the self-made vocabulary beyond the bytes: syllables of a made-up language
 * ("ka", "▁tore", ...), so a random model prints readable gibberish. Returns false past the
 * syllable space (the caller then writes an unused filler). */
static bool synth_syllable_piece(uint32_t k, char *s, size_t len)
{
    static const char cons[] = "bdfghklmnprstvwzjc";
    static const char vow[] = "aeiou";
    const uint32_t    n_syl = (sizeof(cons) - 1) * (sizeof(vow) - 1); /* 90 */
    uint32_t          base = k / 2;
    const char       *space = k % 2 == 0 ? "\xE2\x96\x81" : ""; /* U+2581, SentencePiece's space */
    char              a[3] = {0}, b[3] = {0};
    if (base >= n_syl + n_syl * n_syl)
        return false;
    uint32_t first = base < n_syl ? base : (base - n_syl) / n_syl;
    a[0] = cons[first / 5];
    a[1] = vow[first % 5];
    if (base >= n_syl) {
        uint32_t second = (base - n_syl) % n_syl;
        b[0] = cons[second / 5];
        b[1] = vow[second % 5];
    }
    snprintf(s, len, "%s%s%s", space, a, b);
    return true;
}

/* Writes the self-made tokenizer: <unk>, <s>, </s>, <0x00>..<0xFF>, then syllable pieces. */
static int synth_byte_vocab(struct common_gguf_writer *w, uint32_t n_vocab)
{
    int                     rc = COMMON_ENOMEM;
    struct common_gguf_str *toks = calloc(n_vocab, sizeof(*toks));
    char                   *names = calloc(n_vocab, 24);
    float                  *scores = calloc(n_vocab, sizeof(*scores));
    int32_t                *types = calloc(n_vocab, sizeof(*types));
    if (!toks || !names || !scores || !types)
        goto out_free;
    for (uint32_t i = 0; i < n_vocab; i++) {
        char *s = names + (size_t)i * 24;
        if (i == 0)
            snprintf(s, 24, "<unk>");
        else if (i == 1)
            snprintf(s, 24, "<s>");
        else if (i == 2)
            snprintf(s, 24, "</s>");
        else if (i < SYNTH_BYTE_VOCAB)
            snprintf(s, 24, "<0x%02X>", i - 3);
        else if (!synth_syllable_piece(i - SYNTH_BYTE_VOCAB, s, 24))
            snprintf(s, 24, "[UNUSED%u]", i);
        toks[i].ptr = s;
        toks[i].len = strlen(s);
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < SYNTH_BYTE_VOCAB ? 6 : s[0] == '[' ? 5 : 1;
    }
    if ((rc = common_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama")) ||
        (rc = common_gguf_writer_set_arr(w, "tokenizer.ggml.tokens", COMMON_GGUF_STRING, toks,
                                         n_vocab)) ||
        (rc = common_gguf_writer_set_arr(w, "tokenizer.ggml.scores", COMMON_GGUF_FLOAT32, scores,
                                         n_vocab)) ||
        (rc = common_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", COMMON_GGUF_INT32, types,
                                         n_vocab)) ||
        (rc = common_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
        (rc = common_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2)) ||
        (rc = common_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0)) ||
        (rc = common_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true)) ||
        (rc = common_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false)))
        goto out_free;
out_free:
    free(toks);
    free(names);
    free(scores);
    free(types);
    return rc;
}

/* Copies every tokenizer.* key of `src`; sets *n_vocab to its token count. */
static int synth_copy_vocab(struct common_gguf_writer *w, const char *src, uint32_t *n_vocab,
                            struct common_errmsg *e)
{
    struct common_gguf *g = NULL;
    int                 rc = common_gguf_open(src, NULL, &g, e);
    if (rc)
        return rc;
    const struct common_gguf_value *toks;
    if (common_gguf_get_arr(g, "tokenizer.ggml.tokens", COMMON_GGUF_STRING, &toks) != COMMON_OK ||
        toks->v.arr.n == 0 || toks->v.arr.n > UINT32_MAX) {
        rc = common_errmsg_set(e, COMMON_EINVAL, "%s has no tokenizer.ggml.tokens", src);
        goto out_close;
    }
    *n_vocab = (uint32_t)toks->v.arr.n;
    for (uint64_t i = 0; i < common_gguf_n_kv(g); i++) {
        const struct common_gguf_kv *kv = common_gguf_kv_at(g, i);
        if (strncmp(kv->key, "tokenizer.", 10) == 0 && (rc = common_gguf_writer_copy_kv(w, kv)))
            goto out_close;
    }
out_close:
    common_gguf_close(g);
    return rc;
}

/* Applies defaults and checks the geometry; names the bad field. */
static int synth_geometry(const struct executor_synth_opts *o, struct synth_geom *g,
                          struct common_errmsg *e)
{
    memset(g, 0, sizeof(*g));
    g->arch = o->arch;
    if ((unsigned)g->arch >= COMMON_ARCH_COUNT)
        return common_errmsg_set(e, COMMON_EINVAL, "unknown architecture id %d", (int)g->arch);
    const bool moe = common_arch_is_moe(g->arch);
    const bool qwen = g->arch == COMMON_ARCH_QWEN2 || g->arch == COMMON_ARCH_QWEN3 ||
                      g->arch == COMMON_ARCH_QWEN2MOE || g->arch == COMMON_ARCH_QWEN3MOE;
    const bool glm = g->arch == COMMON_ARCH_GLM4MOE;
    g->n_ctx = o->n_ctx ? o->n_ctx : 2048;
    g->n_embd = o->n_embd ? o->n_embd : 256;
    if ((unsigned)o->routing > EXECUTOR_SYNTH_ROUTING_BALANCED)
        return common_errmsg_set(e, COMMON_EINVAL, "unknown routing mode %d", (int)o->routing);
    if (o->routing == EXECUTOR_SYNTH_ROUTING_BALANCED && !moe && o->n_expert == 0)
        return common_errmsg_set(e, COMMON_EINVAL, "balanced routing needs experts (--n-expert)");
    /* bitnet's head is its embedding: small embeddings keep each token's own row from winning
     * every step over what the layers add (a random model would only repeat its input). */
    g->embd_std = o->routing == EXECUTOR_SYNTH_ROUTING_BALANCED                         ? 32.0f
                  : g->arch == COMMON_ARCH_BITNET || g->arch == COMMON_ARCH_BITNET_B158 ? 0.05f
                                                                                        : 1.0f;
    if (!(o->routing_skew >= 0.0f) || !isfinite(o->routing_skew))
        return common_errmsg_set(e, COMMON_EINVAL, "routing skew %g is not a number >= 0",
                                 (double)o->routing_skew);
    if (o->routing_skew > 0.0f && o->routing != EXECUTOR_SYNTH_ROUTING_BALANCED)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "a routing skew applies to balanced routing (--routing balanced)");
    /* A constant added to every element: the all-ones direction, common to all tokens, whose
     * dot with expert e's gate row is e's offset. Its spread over experts against that of the
     * token part: mean / std, as both see the same random gate rows. */
    g->embd_mean = o->routing_skew * g->embd_std;
    if (!(o->routing_reuse >= 0.0f) || !isfinite(o->routing_reuse))
        return common_errmsg_set(e, COMMON_EINVAL, "routing reuse %g is not a number >= 0",
                                 (double)o->routing_reuse);
    if (o->routing_reuse > 0.0f && o->routing != EXECUTOR_SYNTH_ROUTING_BALANCED)
        return common_errmsg_set(
            e, COMMON_EINVAL, "a routing reuse applies to balanced routing (--routing balanced)");
    if (o->routing_reuse > 0.0f && g->arch != COMMON_ARCH_QWEN2MOE && g->arch != COMMON_ARCH_GPTOSS)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "a routing reuse needs attention biases: --arch qwen2moe or "
                                 "gpt-oss");
    g->reuse = o->routing_reuse;
    g->n_layer = o->n_layer ? o->n_layer : 2;
    g->n_head = o->n_head ? o->n_head : 8;
    g->n_head_kv = o->n_head_kv ? o->n_head_kv : g->n_head;
    g->n_ff = o->n_ff ? o->n_ff : ((4u * g->n_embd + 255u) / 256u) * 256u;
    g->n_expert = o->n_expert ? o->n_expert : moe ? 8 : 0;
    g->n_expert_used = o->n_expert_used ? o->n_expert_used : (g->n_expert < 2 ? g->n_expert : 2);
    g->n_ff_shexp =
        g->arch == COMMON_ARCH_QWEN2MOE ? (o->n_ff_shexp ? o->n_ff_shexp : 2 * g->n_ff) : 0;
    if (g->arch == COMMON_ARCH_DEEPSEEK2) {
        /* Scaled from the head width: DeepSeek V3 has nope 128, rope 64, v 128, kv rank 512. */
        const uint32_t hd = g->n_embd / g->n_head;
        g->lite = o->lite;
        g->nope = hd;
        g->rot = hd / 2 < 2 ? 2 : hd / 2 / 2 * 2;
        g->v_mla = hd;
        g->kv_lora = 2 * hd;
        g->q_lora = g->lite ? 0 : g->n_embd / 2;
        g->n_dense_lead = g->n_layer > 1 ? 1 : 0;
        g->n_ff_dense = 2 * g->n_ff;
        g->n_ff_shexp = g->n_ff; /* one shared expert */
        if (g->n_head_kv != g->n_head)
            return common_errmsg_set(e, COMMON_EINVAL,
                                     "deepseek2 has latent attention: leave n_head_kv at n_head");
    } else if (g->arch == COMMON_ARCH_GPTOSS) {
        /* gpt-oss's heads are wider than n_embd / n_head (64 of 2880 / 64 = 45). */
        g->head_dim = 2 * (g->n_embd / g->n_head);
        g->rot = g->head_dim;
    } else if (glm) {
        /* GLM-4.5's layout: a dense first layer, one shared expert, rotary on half the head. */
        g->n_dense_lead = g->n_layer > 1 ? 1 : 0;
        g->n_ff_dense = 2 * g->n_ff;
        g->n_ff_shexp = g->n_ff;
        g->rot = (g->n_embd / g->n_head) / 2;
    }
    if (o->lite && g->arch != COMMON_ARCH_DEEPSEEK2) {
        return common_errmsg_set(e, COMMON_EINVAL, "--lite is a deepseek2 shape");
    }
    g->type = o->type;
    g->rope_freq_base = o->rope_freq_base > 0.0f        ? o->rope_freq_base
                        : qwen || glm                   ? 1000000.0f
                        : g->arch == COMMON_ARCH_GPTOSS ? 150000.0f
                                                        : 10000.0f;
    g->rms_eps = qwen || g->arch == COMMON_ARCH_DEEPSEEK2 ? 1e-6f : 1e-5f;
    const struct common_ggml_type_info *ti = common_ggml_type_get(g->type);
    if (!ti)
        return common_errmsg_set(e, COMMON_EINVAL, "unknown weight type id %u", g->type);
    if (!executor_type_is_supported(g->type) && g->type != COMMON_GGML_TYPE_I2_S)
        return common_errmsg_set(e, COMMON_ENOTSUP, "no quantizer for type %s", ti->name);
    if ((unsigned)o->i2s_layout > EXECUTOR_SYNTH_I2S_SPLIT32)
        return common_errmsg_set(e, COMMON_EINVAL, "unknown i2_s layout %d", (int)o->i2s_layout);
    if (g->type == COMMON_GGML_TYPE_I2_S && o->i2s_layout == EXECUTOR_SYNTH_I2S_QK256 &&
        (g->n_embd % 128 != 0 || g->n_ff % 128 != 0))
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "i2_s in Microsoft's layout needs n_embd %u and n_ff %u to be "
                                 "multiples of 128",
                                 g->n_embd, g->n_ff);
    if (g->n_embd % g->n_head != 0 || (g->n_embd / g->n_head) % 2 != 0)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "n_embd %u must be a multiple of n_head %u with an even head size",
                                 g->n_embd, g->n_head);
    if (g->n_head % g->n_head_kv != 0)
        return common_errmsg_set(e, COMMON_EINVAL, "n_head %u is not a multiple of n_head_kv %u",
                                 g->n_head, g->n_head_kv);
    if (g->n_embd % ti->blck != 0 || g->n_ff % ti->blck != 0)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "n_embd %u and n_ff %u must be multiples of the %s block size %u",
                                 g->n_embd, g->n_ff, ti->name, ti->blck);
    if (g->type == COMMON_GGML_TYPE_I2_S && g->n_expert > 0)
        return common_errmsg_set(e, COMMON_EINVAL, "i2_s weights are written for dense models");
    if (g->n_expert > 0 && !moe && g->arch != COMMON_ARCH_LLAMA)
        return common_errmsg_set(e, COMMON_EINVAL, "architecture %s has no experts (n_expert %u)",
                                 common_arch_name(g->arch), g->n_expert);
    if (o->n_ff_shexp && g->arch != COMMON_ARCH_QWEN2MOE)
        return common_errmsg_set(e, COMMON_EINVAL, "architecture %s has no shared expert",
                                 common_arch_name(g->arch));
    if (g->n_ff_shexp % ti->blck != 0)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "n_ff_shexp %u must be a multiple of the %s block size %u",
                                 g->n_ff_shexp, ti->name, ti->blck);
    if (g->arch == COMMON_ARCH_OLMOE && g->n_head_kv != g->n_head)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "olmoe has no grouped-query attention: n_head_kv %u must equal "
                                 "n_head %u",
                                 g->n_head_kv, g->n_head);
    if (g->n_expert > 0 && g->n_expert_used > g->n_expert)
        return common_errmsg_set(e, COMMON_EINVAL, "n_expert_used %u exceeds n_expert %u",
                                 g->n_expert_used, g->n_expert);
    return COMMON_OK;
}

/* One row of an I2_S tensor from random values `row` (overwritten): ternary at +-0.7 standard
 * deviations (about half the weights non-zero), times the tensor's scale in the inline and split
 * layouts (Microsoft's keeps the scale after the codes: synth_tensors writes it). */
static int synth_i2s_row(const struct synth_tensor *t, float *row, uint8_t *dst)
{
    const int64_t ne = (int64_t)t->ne[0];
    const float   s = t->i2s_scale, cut = 0.7f * t->std;
    for (int64_t i = 0; i < ne; i++) {
        const float v = row[i] > cut ? 1.0f : row[i] < -cut ? -1.0f : 0.0f;
        row[i] = t->i2s == EXECUTOR_SYNTH_I2S_QK256 ? v : v * s;
    }
    if (t->i2s == EXECUTOR_SYNTH_I2S_QK256)
        return executor_quantize_row_ref(COMMON_GGML_TYPE_I2S_Q128, row, dst, ne);
    if (t->i2s == EXECUTOR_SYNTH_I2S_BITNET32)
        return executor_quantize_row_ref(COMMON_GGML_TYPE_I2S_B32H, row, dst, ne);
    /* Split: the codes of 12-byte blocks (8 of codes, an f32 scale); the scales are the
     * "<name>.scales" tensor (all s: an all-zero block's scale does not matter). */
    uint8_t blk[12];
    for (int64_t b = 0; b < ne / 32; b++) {
        int rc = executor_quantize_row_ref(COMMON_GGML_TYPE_I2S_B32F, row + b * 32, blk, 32);
        if (rc)
            return rc;
        memcpy(dst + b * 8, blk, 8);
    }
    return COMMON_OK;
}

/* The tokenizer of the model (copied from o->vocab_from, or a byte-level one) into `w`; sets
 * g->n_vocab, which its size fixes. Returns 0 or a negative common_err with a message. */
static int synth_vocab(const struct executor_synth_opts *o, struct common_gguf_writer *w,
                       struct synth_geom *g, struct common_errmsg *e)
{
    uint32_t n_vocab = o->n_vocab ? o->n_vocab : SYNTH_BYTE_VOCAB;
    int      rc;
    if (o->vocab_from) {
        uint32_t have = 0;
        if ((rc = synth_copy_vocab(w, o->vocab_from, &have, e)))
            return rc;
        if (o->n_vocab && o->n_vocab != have)
            return common_errmsg_set(e, COMMON_EINVAL,
                                     "--n-vocab %u differs from the %u tokens of %s", o->n_vocab,
                                     have, o->vocab_from);
        n_vocab = have;
    } else {
        if (n_vocab < SYNTH_BYTE_VOCAB)
            return common_errmsg_set(e, COMMON_EINVAL, "n_vocab must be at least %u (byte vocab)",
                                     SYNTH_BYTE_VOCAB);
        if ((rc = synth_byte_vocab(w, n_vocab)))
            return rc;
    }
    g->n_vocab = n_vocab;
    return COMMON_OK;
}

/* With a target size, the layer count that approaches it, from the bytes of one layer. */
static int synth_layers_for_target(struct synth_geom *g, uint64_t target_bytes)
{
    /* One repeating layer after the leading dense ones (deepseek2, glm4moe); everything else
     * (embeddings, head, dense layers, glm4moe's prediction block) is fixed. */
    struct synth_geom one = *g;
    one.n_layer = g->n_dense_lead + 1;
    struct synth_plan p1 = {0};
    int               rc = synth_plan_build(&one, &p1);
    if (rc) {
        free(p1.t);
        return rc;
    }
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "blk.%u.", g->n_dense_lead);
    uint64_t fixed = 0, layer = 0;
    for (size_t i = 0; i < p1.n; i++) {
        if (strncmp(p1.t[i].name, prefix, strlen(prefix)) == 0)
            layer += synth_tensor_bytes(&p1.t[i]);
        else
            fixed += synth_tensor_bytes(&p1.t[i]);
    }
    free(p1.t);
    uint64_t n = target_bytes > fixed ? (target_bytes - fixed + layer / 2) / layer : 1;
    n += g->n_dense_lead;
    g->n_layer = (uint32_t)(n < 1 ? 1 : n > 4096 ? 4096 : n);
    return COMMON_OK;
}

/* deepseek2's keys as the converter writes them: the latent attention as one key/value "head"
 * (MQA) of the latent and rotary widths, the per-head widths after decompression, leading dense
 * layers, one shared expert; V3 routing (sigmoid, selection bias, 4 groups of which 2 are kept,
 * renormalised weights scaled by 2.5) unless lite (V2-Lite: softmax, no groups, no scale); YaRN
 * with factor 4 over an original context of a quarter of n_ctx. */
static int synth_metadata_deepseek2(struct common_gguf_writer *w, const struct synth_geom *g)
{
    char       key[96];
    const bool groups = !g->lite && g->n_expert >= 8 && g->n_expert % 4 == 0;
    int        rc;
#define DS_KEY(suffix) (snprintf(key, sizeof(key), "deepseek2.%s", suffix), key)
    if ((rc = common_gguf_writer_set_u32(w, DS_KEY("vocab_size"), g->n_vocab)) ||
        (rc =
             common_gguf_writer_set_u32(w, DS_KEY("leading_dense_block_count"), g->n_dense_lead)) ||
        (rc = common_gguf_writer_set_u32(w, DS_KEY("attention.kv_lora_rank"), g->kv_lora)) ||
        (rc = common_gguf_writer_set_u32(w, DS_KEY("attention.key_length"), g->kv_lora + g->rot)) ||
        (rc = common_gguf_writer_set_u32(w, DS_KEY("attention.value_length"), g->kv_lora)) ||
        (rc =
             common_gguf_writer_set_u32(w, DS_KEY("attention.key_length_mla"), g->nope + g->rot)) ||
        (rc = common_gguf_writer_set_u32(w, DS_KEY("attention.value_length_mla"), g->v_mla)) ||
        (rc = common_gguf_writer_set_u32(w, DS_KEY("expert_shared_count"), 1)) ||
        (rc = common_gguf_writer_set_u32(w, DS_KEY("rope.dimension_count"), g->rot)) ||
        (rc = common_gguf_writer_set_str(w, DS_KEY("rope.scaling.type"), "yarn")) ||
        (rc = common_gguf_writer_set_f32(w, DS_KEY("rope.scaling.factor"), 4.0f)) ||
        (rc = common_gguf_writer_set_u32(w, DS_KEY("rope.scaling.original_context_length"),
                                         g->n_ctx / 4 ? g->n_ctx / 4 : 1)) ||
        (rc = common_gguf_writer_set_f32(w, DS_KEY("rope.scaling.yarn_log_multiplier"),
                                         g->lite ? 0.0707f : 0.1f)) ||
        (rc = common_gguf_writer_set_u32(w, DS_KEY("expert_gating_func"), g->lite ? 1 : 2)) ||
        (rc = common_gguf_writer_set_f32(w, DS_KEY("expert_weights_scale"), g->lite ? 1.0f : 2.5f)))
        return rc;
    if (g->q_lora &&
        (rc = common_gguf_writer_set_u32(w, DS_KEY("attention.q_lora_rank"), g->q_lora)))
        return rc;
    if (!g->lite && (rc = common_gguf_writer_set_bool(w, DS_KEY("expert_weights_norm"), true)))
        return rc;
    if (groups && ((rc = common_gguf_writer_set_u32(w, DS_KEY("expert_group_count"), 4)) ||
                   (rc = common_gguf_writer_set_u32(w, DS_KEY("expert_group_used_count"), 2))))
        return rc;
#undef DS_KEY
    return COMMON_OK;
}

/* The hyper-parameter keys of geometry `g` under "<arch>.", the ones llama.cpp's converter
 * writes for that architecture. */
static int synth_metadata(struct common_gguf_writer *w, const struct synth_geom *g,
                          const char *name)
{
    const char    *a = common_arch_name(g->arch);
    const uint32_t hd = g->n_embd / g->n_head;
    const bool     glm = g->arch == COMMON_ARCH_GLM4MOE;
    char           key[96];
    int            rc;
#define SYNTH_KEY(suffix) (snprintf(key, sizeof(key), "%s.%s", a, suffix), key)
    if ((rc = common_gguf_writer_set_str(w, "general.architecture", a)) ||
        (rc = common_gguf_writer_set_str(w, "general.name", name)) ||
        (rc = common_gguf_writer_set_u32(w, "general.file_type", synth_file_type(g->type))) ||
        (rc = common_gguf_writer_set_u32(w, "general.quantization_version", 2)) ||
        (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("context_length"), g->n_ctx)) ||
        (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("embedding_length"), g->n_embd)) ||
        (rc =
             common_gguf_writer_set_u32(w, SYNTH_KEY("block_count"), g->n_layer + (glm ? 1 : 0))) ||
        (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("feed_forward_length"),
                                         g->n_ff_dense   ? g->n_ff_dense
                                         : g->n_ff_shexp ? g->n_ff_shexp
                                                         : g->n_ff)) ||
        (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("attention.head_count"), g->n_head)) ||
        (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("attention.head_count_kv"),
                                         g->arch == COMMON_ARCH_DEEPSEEK2 ? 1 : g->n_head_kv)) ||
        (rc = common_gguf_writer_set_f32(w, SYNTH_KEY("rope.freq_base"), g->rope_freq_base)) ||
        (rc = common_gguf_writer_set_f32(w, SYNTH_KEY("attention.layer_norm_rms_epsilon"),
                                         g->rms_eps)))
        return rc;
    if (g->arch == COMMON_ARCH_LLAMA &&
        ((rc = common_gguf_writer_set_u32(w, SYNTH_KEY("vocab_size"), g->n_vocab)) ||
         (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("rope.dimension_count"), hd))))
        return rc;
    if ((g->arch == COMMON_ARCH_QWEN3 || g->arch == COMMON_ARCH_QWEN3MOE) &&
        ((rc = common_gguf_writer_set_u32(w, SYNTH_KEY("attention.key_length"), hd)) ||
         (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("attention.value_length"), hd))))
        return rc;
    if (g->n_expert &&
        ((rc = common_gguf_writer_set_u32(w, SYNTH_KEY("expert_count"), g->n_expert)) ||
         (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("expert_used_count"), g->n_expert_used))))
        return rc;
    if ((g->arch == COMMON_ARCH_QWEN2MOE || g->arch == COMMON_ARCH_QWEN3MOE ||
         g->arch == COMMON_ARCH_DEEPSEEK2 || g->arch == COMMON_ARCH_GPTOSS || glm) &&
        (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("expert_feed_forward_length"), g->n_ff)))
        return rc;
    if (g->arch == COMMON_ARCH_DEEPSEEK2 && (rc = synth_metadata_deepseek2(w, g)))
        return rc;
    if (g->arch == COMMON_ARCH_GPTOSS &&
        ((rc = common_gguf_writer_set_u32(w, SYNTH_KEY("attention.key_length"), g->head_dim)) ||
         (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("attention.value_length"), g->head_dim)) ||
         (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("rope.dimension_count"), g->head_dim)) ||
         (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("attention.sliding_window"), 16)) ||
         (rc = common_gguf_writer_set_str(w, SYNTH_KEY("rope.scaling.type"), "yarn")) ||
         (rc = common_gguf_writer_set_f32(w, SYNTH_KEY("rope.scaling.factor"), 4.0f)) ||
         (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("rope.scaling.original_context_length"),
                                          g->n_ctx / 4 ? g->n_ctx / 4 : 1))))
        return rc;
    if (glm && ((rc = common_gguf_writer_set_u32(w, SYNTH_KEY("leading_dense_block_count"),
                                                 g->n_dense_lead)) ||
                (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("expert_shared_count"), 1)) ||
                (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("expert_gating_func"), 2)) ||
                (rc = common_gguf_writer_set_f32(w, SYNTH_KEY("expert_weights_scale"), 2.5f)) ||
                (rc = common_gguf_writer_set_bool(w, SYNTH_KEY("expert_weights_norm"), true)) ||
                (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("nextn_predict_layers"), 1)) ||
                (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("rope.dimension_count"), g->rot)) ||
                (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("attention.key_length"), hd)) ||
                (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("attention.value_length"), hd))))
        return rc;
    if (g->arch == COMMON_ARCH_QWEN2MOE &&
        (rc = common_gguf_writer_set_u32(w, SYNTH_KEY("expert_shared_feed_forward_length"),
                                         g->n_ff_shexp)))
        return rc;
#undef SYNTH_KEY
    return COMMON_OK;
}

/* Progress of the tensor data: on a terminal one line rewritten in place each percent; in a log
 * (not a terminal) a plain line every 10 percent, so no carriage returns reach a file. */
struct synth_progress {
    bool     on;       /* o->progress */
    bool     tty;      /* stderr is a terminal */
    uint64_t total;    /* bytes of tensor data */
    uint64_t next;     /* bytes at which to report again */
    uint64_t step;     /* bytes between reports */
    bool     reported; /* something was printed */
};

static void synth_progress_report(struct synth_progress *p, uint64_t done)
{
    if (!p->on || done < p->next)
        return;
    char b1[32], b2[32];
    fprintf(stderr, p->tty ? "\rmkmodel: %3.0f%% (%s of %s)" : "mkmodel: %3.0f%% (%s of %s)\n",
            100.0 * (double)done / (double)p->total, common_format_size(done, b1, sizeof(b1)),
            common_format_size(p->total, b2, sizeof(b2)));
    p->next = done + p->step;
    p->reported = true;
}

/* Tensor k of the plan (derived ones not counted) gets seed k: the split layout's scale tensors
 * leave every other tensor's values as in the other layouts. */
static void synth_plan_seed(struct synth_plan *plan, uint64_t seed)
{
    size_t k = 0;
    for (size_t i = 0; i < plan->n; i++) {
        plan->t[i].seed = seed ^ (0x9E3779B97F4A7C15ull * (k + 1));
        k += plan->t[i].derived ? 0 : 1;
    }
}

/* Rows per chunk of t: SYNTH_CHUNK_BYTES of output, at least one row. */
static uint64_t synth_chunk_rows(const struct synth_tensor *t)
{
    const uint64_t rb = synth_row_bytes(t);
    return rb == 0 || rb >= SYNTH_CHUNK_BYTES ? 1 : SYNTH_CHUNK_BYTES / rb;
}

/* Tensor data is made in chunks of rows: any thread claims the next chunk in plan order,
 * generates and quantizes it into a slot, and the calling thread writes the slots in plan order.
 * Row r of a tensor draws from its own stream (the tensor's seed, r), so the bytes depend neither
 * on the thread count nor on the chunking. */
struct synth_slot {
    size_t   tensor; /* index in the plan */
    uint64_t row0;   /* first row of the chunk */
    uint64_t n_rows;
    uint8_t *data;  /* owned: the rows as written (slot_bytes), allocated on first use */
    int      rc;    /* result of generating the chunk */
    bool     ready; /* data and rc are final; under synth_pipe.mu */
};

/* The chunks in flight: chunk c lives in slot c % n_slots until it is written, so at most n_slots
 * chunks are held whatever the model's size. */
struct synth_pipe {
    const struct synth_plan *plan;         /* borrowed: outlives the pipe */
    pthread_mutex_t          mu;           /* guards what is marked "under mu" */
    pthread_cond_t           cv_free;      /* a slot was freed, or stop: claimers wait */
    pthread_cond_t           cv_ready;     /* a chunk became ready: the writer waits */
    struct synth_slot       *slots;        /* owned: n_slots */
    uint32_t                 n_slots;      /* SYNTH_SLOTS_PER_THR per thread */
    size_t                   slot_bytes;   /* the largest chunk */
    size_t                   row_floats;   /* the longest row: each thread's scratch */
    uint64_t                 n_chunks;     /* chunks of the whole plan */
    uint64_t                 n_claimed;    /* under mu: chunks handed out */
    uint64_t                 n_written;    /* under mu: chunks written */
    size_t                   next_tensor;  /* under mu: the next chunk to hand out */
    uint64_t                 next_row;     /* under mu */
    bool                     stop;         /* under mu: claim nothing more */
    bool                     writer_fills; /* no worker started: the writer generates too */
};

/* The next chunk in plan order, once its slot is free; NULL if none is claimable now. Called with
 * mu held. */
static struct synth_slot *synth_pipe_claim_locked(struct synth_pipe *p)
{
    if (p->stop || p->n_claimed == p->n_chunks || p->n_claimed >= p->n_written + p->n_slots)
        return NULL;
    const struct synth_tensor *t = &p->plan->t[p->next_tensor];
    const uint64_t             rows = t->ne[1] * t->ne[2], per = synth_chunk_rows(t);
    struct synth_slot         *s = &p->slots[p->n_claimed % p->n_slots];
    s->tensor = p->next_tensor;
    s->row0 = p->next_row;
    s->n_rows = rows - s->row0 < per ? rows - s->row0 : per;
    s->rc = COMMON_OK;
    s->ready = false;
    p->next_row += s->n_rows;
    if (p->next_row == rows) {
        p->next_tensor++;
        p->next_row = 0;
    }
    p->n_claimed++;
    return s;
}

/* Generates and quantizes the rows of slot s (claimed by this thread) with scratch `row`. */
static int synth_slot_fill(const struct synth_pipe *p, struct synth_slot *s, float *row)
{
    if (!s->data && !(s->data = malloc(p->slot_bytes)))
        return COMMON_ENOMEM;
    const struct synth_tensor *t = &p->plan->t[s->tensor];
    const uint64_t             ne = t->ne[0], rb = synth_row_bytes(t);
    for (uint64_t k = 0; k < s->n_rows; k++) {
        struct synth_rng rng;
        uint8_t         *dst = s->data + k * rb;
        synth_rng_seed(&rng, t->seed + 0xD1B54A32D192ED03ull * (s->row0 + k));
        synth_fill(&rng, row, (size_t)ne, t->mean, t->std);
        int rc = t->type == COMMON_GGML_TYPE_I2_S ? synth_i2s_row(t, row, dst)
                 : p->plan->quick ? executor_quantize_row_quick(t->type, row, dst, (int64_t)ne)
                                  : executor_quantize_row_ref(t->type, row, dst, (int64_t)ne);
        if (rc)
            return rc;
    }
    return COMMON_OK;
}

/* Fills claimed slot s and publishes it. Called with mu held; drops it while working. */
static void synth_pipe_fill_locked(struct synth_pipe *p, struct synth_slot *s, float *row)
{
    pthread_mutex_unlock(&p->mu);
    int rc = synth_slot_fill(p, s, row);
    pthread_mutex_lock(&p->mu);
    s->rc = rc;
    s->ready = true;
    pthread_cond_signal(&p->cv_ready);
}

/* One generating thread. */
struct synth_worker {
    struct synth_pipe *pipe; /* borrowed: outlives the thread */
    float             *row;  /* borrowed: row_floats of scratch, this thread's alone */
};

/* A generating thread: claims chunks until none is left or the writer stops. */
static void *synth_worker_run(void *arg)
{
    const struct synth_worker *wk = arg;
    struct synth_pipe         *p = wk->pipe;
    pthread_mutex_lock(&p->mu);
    while (!p->stop && p->n_claimed < p->n_chunks) {
        struct synth_slot *s = synth_pipe_claim_locked(p);
        if (s)
            synth_pipe_fill_locked(p, s, wk->row);
        else
            pthread_cond_wait(&p->cv_free, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Writes the ready chunk in slot s: its rows, then after a tensor's last rows the tail of
 * Microsoft's I2_S layout (the tensor scale, padding to 32 bytes). */
static int synth_slot_write(const struct synth_pipe *p, const struct synth_slot *s,
                            struct common_gguf_writer *w, struct common_errmsg *e)
{
    const struct synth_tensor *t = &p->plan->t[s->tensor];
    int                        rc;
    if (s->rc)
        return common_errmsg_set(e, s->rc, "quantizing %s failed", t->name);
    if ((rc = common_gguf_writer_write_data(w, s->data, (size_t)(s->n_rows * synth_row_bytes(t)),
                                            e)))
        return rc;
    if (t->i2s_tail && s->row0 + s->n_rows == t->ne[1] * t->ne[2]) {
        uint8_t tail[32] = {0};
        memcpy(tail, &t->i2s_scale, sizeof(float));
        if ((rc = common_gguf_writer_write_data(w, tail, sizeof(tail), e)))
            return rc;
    }
    return COMMON_OK;
}

/* The writer's loop on the calling thread: writes the oldest chunk once it is ready, else waits
 * (or, with no worker, generates it). */
static int synth_pipe_run(struct synth_pipe *p, struct common_gguf_writer *w,
                          struct synth_progress *pr, float *row, struct common_errmsg *e)
{
    uint64_t done = 0;
    int      rc = COMMON_OK;
    pthread_mutex_lock(&p->mu);
    while (rc == COMMON_OK && p->n_written < p->n_chunks) {
        struct synth_slot *head = &p->slots[p->n_written % p->n_slots];
        if (p->n_written < p->n_claimed && head->ready) {
            pthread_mutex_unlock(&p->mu);
            rc = synth_slot_write(p, head, w, e);
            done += head->n_rows * synth_row_bytes(&p->plan->t[head->tensor]);
            synth_progress_report(pr, done);
            pthread_mutex_lock(&p->mu);
            p->n_written++;
            pthread_cond_signal(&p->cv_free); /* one more chunk may be claimed */
            continue;
        }
        struct synth_slot *s = p->writer_fills ? synth_pipe_claim_locked(p) : NULL;
        if (s)
            synth_pipe_fill_locked(p, s, row);
        else
            pthread_cond_wait(&p->cv_ready, &p->mu);
    }
    p->stop = true;
    pthread_cond_broadcast(&p->cv_free);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Generates and quantizes every tensor's data with n_threads threads while the calling thread
 * writes it in plan order. */
static int synth_tensors(const struct synth_plan *plan, uint32_t n_threads,
                         struct common_gguf_writer *w, struct synth_progress *pr,
                         struct common_errmsg *e)
{
    struct synth_pipe    p = {.plan = plan};
    pthread_t           *tid = NULL;
    struct synth_worker *wk = NULL;
    float               *scratch = NULL; /* rows: the writer's, then each worker's */
    uint32_t             n_started = 0;
    int                  rc = COMMON_ENOMEM;
    for (size_t i = 0; i < plan->n; i++) {
        const struct synth_tensor *t = &plan->t[i];
        const uint64_t             per = synth_chunk_rows(t), rows = t->ne[1] * t->ne[2];
        if (t->ne[0] > SYNTH_MAX_ROW)
            return common_errmsg_set(e, COMMON_EINVAL, "tensor %s rows are too long", t->name);
        if (per * synth_row_bytes(t) > p.slot_bytes)
            p.slot_bytes = (size_t)(per * synth_row_bytes(t));
        if (t->ne[0] > p.row_floats)
            p.row_floats = (size_t)t->ne[0];
        p.n_chunks += (rows + per - 1) / per;
    }
    if (n_threads > p.n_chunks)
        n_threads = p.n_chunks > 0 ? (uint32_t)p.n_chunks : 1;
    p.n_slots = SYNTH_SLOTS_PER_THR * n_threads;
    p.slots = calloc(p.n_slots, sizeof(*p.slots));
    tid = calloc(n_threads, sizeof(*tid));
    wk = calloc(n_threads, sizeof(*wk));
    p.row_floats = p.row_floats ? p.row_floats : 1;
    scratch = malloc(((size_t)n_threads + 1) * p.row_floats * sizeof(float));
    if (!p.slots || !tid || !wk || !scratch)
        goto out_free;
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv_free, NULL);
    pthread_cond_init(&p.cv_ready, NULL);
    /* A thread that fails to start leaves its share to the others; with none, to the caller. */
    for (uint32_t i = 0; i < n_threads; i++) {
        wk[n_started] = (struct synth_worker){.pipe = &p, .row = scratch + (i + 1) * p.row_floats};
        if (pthread_create(&tid[n_started], NULL, synth_worker_run, &wk[n_started]) == 0)
            n_started++;
    }
    p.writer_fills = n_started == 0;
    rc = synth_pipe_run(&p, w, pr, scratch, e);
    for (uint32_t i = 0; i < n_started; i++)
        pthread_join(tid[i], NULL);
    pthread_cond_destroy(&p.cv_ready);
    pthread_cond_destroy(&p.cv_free);
    pthread_mutex_destroy(&p.mu);
out_free:
    for (uint32_t i = 0; p.slots && i < p.n_slots; i++)
        free(p.slots[i].data);
    free(p.slots);
    free(tid);
    free(wk);
    free(scratch);
    return rc;
}

int executor_synth_write(const struct executor_synth_opts *o, struct common_errmsg *e)
{
    struct synth_geom          g;
    struct synth_plan          plan = {0};
    struct common_gguf_writer *w = NULL;
    bool                       begun = false;
    int                        rc;
    if (!o || !o->path)
        return common_errmsg_set(e, COMMON_EINVAL, "mkmodel: no output path");
    if (o->n_threads > SYNTH_MAX_THREADS)
        return common_errmsg_set(e, COMMON_EINVAL, "n_threads %u exceeds %u", o->n_threads,
                                 SYNTH_MAX_THREADS);
    executor_kernels_init();
    if ((rc = synth_geometry(o, &g, e)))
        return rc;
    if ((rc = common_gguf_writer_create(&w, 32)))
        return rc;
    if ((rc = synth_vocab(o, w, &g, e)))
        goto out_free;
    if (o->target_bytes && (rc = synth_layers_for_target(&g, o->target_bytes)))
        goto out_free;
    plan.i2s = o->i2s_layout;
    plan.quick = o->quick_quant;
    if ((rc = synth_plan_build(&g, &plan)))
        goto out_free;
    synth_plan_seed(&plan, o->seed ? o->seed : 1);
    if ((rc = synth_metadata(w, &g, o->name ? o->name : "sluice-synth")))
        goto out_free;
    struct synth_progress pr = {.on = o->progress, .tty = isatty(STDERR_FILENO) == 1};
    for (size_t i = 0; i < plan.n; i++) {
        const struct synth_tensor *t = &plan.t[i];
        if ((rc = common_gguf_writer_add_tensor_sized(
                 w, t->name, t->type, t->n_dims, t->ne,
                 t->type == COMMON_GGML_TYPE_I2_S ? synth_tensor_bytes(t) : 0)))
            goto out_free;
        pr.total += synth_tensor_bytes(t);
    }
    pr.step = pr.total / (pr.tty ? 100 : 10);
    if ((rc = common_gguf_writer_begin(w, o->path, e)))
        goto out_free;
    begun = true;
    if ((rc = synth_tensors(&plan, o->n_threads ? o->n_threads : executor_physical_cores(), w, &pr,
                            e)))
        goto out_free;
    if (pr.reported && pr.tty)
        fprintf(stderr, "\n");
    rc = common_gguf_writer_finish(w, e);

out_free:
    free(plan.t);
    common_gguf_writer_destroy(w);
    if (rc && begun)
        remove(o->path); /* never leave a half-written model behind */
    return rc;
}
