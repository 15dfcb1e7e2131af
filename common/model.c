/* common/model.c - model description over a GGUF: architecture, hyper-parameters, roles, experts.
 */
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* How an architecture normalises Q and K after their projections (llama.cpp's graphs). */
enum model_qk_norm {
    MODEL_QK_NORM_NONE = 0, /* no attn_q_norm / attn_k_norm */
    MODEL_QK_NORM_HEAD,     /* RMSNorm of each head, weights of head_dim_k (qwen3, qwen3moe) */
    MODEL_QK_NORM_FULL,     /* RMSNorm of the whole projection, weights of its width (olmoe) */
};

/* The one table of architectures: what the model description reads, what the executor runs
 * and what error messages and `inspect` name. Every entry is supported end to end. */
struct model_arch_info {
    const char        *name;
    uint32_t           rope_neox;      /* rotary ordering used by llama.cpp for this architecture */
    uint32_t           norm_topk_prob; /* llama.cpp renormalises the top-k gate weights */
    bool               moe;            /* the architecture always has routed experts */
    enum model_qk_norm qk_norm;        /* where attn_q_norm / attn_k_norm apply, when present */
    bool               shexp_gate;     /* shared expert scaled by sigmoid(ffn_gate_inp_shexp . x) */
    bool               mla;            /* multi-head latent attention (deepseek2) */
    bool routing; /* DeepSeek-style routing keys: gating, groups, bias, norm, scale, dense lead */
    enum common_expert_gating gating;    /* when the file has no expert_gating_func */
    bool                      post_norm; /* the FFN norm is post_attention_norm (glm4moe) */
    bool                      gptoss;    /* sinks, sliding window, biases, clamped SwiGLU */
    bool                      bitnet;    /* sub-norms required, per-tensor scales */
    bool                      relu2;     /* FFN relu(g)^2 * u (bitnet-b1.58) */
};

static const struct model_arch_info arch_table[COMMON_ARCH_COUNT] = {
    [COMMON_ARCH_LLAMA] = {.name = "llama", .norm_topk_prob = 1},
    [COMMON_ARCH_QWEN2] = {.name = "qwen2", .rope_neox = 1},
    [COMMON_ARCH_QWEN3] = {.name = "qwen3", .rope_neox = 1, .qk_norm = MODEL_QK_NORM_HEAD},
    [COMMON_ARCH_QWEN2MOE] = {.name = "qwen2moe", .rope_neox = 1, .moe = true, .shexp_gate = true},
    [COMMON_ARCH_QWEN3MOE] = {.name = "qwen3moe",
                              .rope_neox = 1,
                              .norm_topk_prob = 1,
                              .moe = true,
                              .qk_norm = MODEL_QK_NORM_HEAD},
    [COMMON_ARCH_OLMOE] = {.name = "olmoe",
                           .rope_neox = 1,
                           .moe = true,
                           .qk_norm = MODEL_QK_NORM_FULL},
    [COMMON_ARCH_DEEPSEEK2] = {.name = "deepseek2",
                               .moe = true,
                               .mla = true,
                               .routing = true,
                               .gating = COMMON_GATING_SOFTMAX},
    [COMMON_ARCH_GLM4MOE] = {.name = "glm4moe",
                             .rope_neox = 1,
                             .moe = true,
                             .qk_norm = MODEL_QK_NORM_HEAD,
                             .routing = true,
                             .gating = COMMON_GATING_SIGMOID,
                             .post_norm = true},
    [COMMON_ARCH_GPTOSS] = {.name = "gpt-oss",
                            .rope_neox = 1,
                            .moe = true,
                            .gating = COMMON_GATING_SOFTMAX_WEIGHT,
                            .post_norm = true,
                            .gptoss = true},
    [COMMON_ARCH_BITNET] = {.name = "bitnet", .rope_neox = 1, .bitnet = true},
    [COMMON_ARCH_BITNET_B158] = {.name = "bitnet-b1.58",
                                 .rope_neox = 1,
                                 .bitnet = true,
                                 .relu2 = true},
};

static const char *role_names[COMMON_ROLE_COUNT] = {
    [COMMON_ROLE_ATTN_NORM] = "attn_norm.weight",
    [COMMON_ROLE_ATTN_Q] = "attn_q.weight",
    [COMMON_ROLE_ATTN_K] = "attn_k.weight",
    [COMMON_ROLE_ATTN_V] = "attn_v.weight",
    [COMMON_ROLE_ATTN_OUT] = "attn_output.weight",
    [COMMON_ROLE_ATTN_Q_BIAS] = "attn_q.bias",
    [COMMON_ROLE_ATTN_K_BIAS] = "attn_k.bias",
    [COMMON_ROLE_ATTN_V_BIAS] = "attn_v.bias",
    [COMMON_ROLE_ATTN_Q_NORM] = "attn_q_norm.weight",
    [COMMON_ROLE_ATTN_K_NORM] = "attn_k_norm.weight",
    [COMMON_ROLE_FFN_NORM] = "ffn_norm.weight",
    [COMMON_ROLE_FFN_GATE] = "ffn_gate.weight",
    [COMMON_ROLE_FFN_UP] = "ffn_up.weight",
    [COMMON_ROLE_FFN_DOWN] = "ffn_down.weight",
    [COMMON_ROLE_FFN_GATE_INP] = "ffn_gate_inp.weight",
    [COMMON_ROLE_FFN_GATE_EXPS] = "ffn_gate_exps.weight",
    [COMMON_ROLE_FFN_UP_EXPS] = "ffn_up_exps.weight",
    [COMMON_ROLE_FFN_DOWN_EXPS] = "ffn_down_exps.weight",
    [COMMON_ROLE_FFN_GATE_INP_SHEXP] = "ffn_gate_inp_shexp.weight",
    [COMMON_ROLE_FFN_GATE_SHEXP] = "ffn_gate_shexp.weight",
    [COMMON_ROLE_FFN_UP_SHEXP] = "ffn_up_shexp.weight",
    [COMMON_ROLE_FFN_DOWN_SHEXP] = "ffn_down_shexp.weight",
    [COMMON_ROLE_ATTN_Q_A] = "attn_q_a.weight",
    [COMMON_ROLE_ATTN_Q_A_NORM] = "attn_q_a_norm.weight",
    [COMMON_ROLE_ATTN_Q_B] = "attn_q_b.weight",
    [COMMON_ROLE_ATTN_KV_A_MQA] = "attn_kv_a_mqa.weight",
    [COMMON_ROLE_ATTN_KV_A_NORM] = "attn_kv_a_norm.weight",
    [COMMON_ROLE_ATTN_K_B] = "attn_k_b.weight",
    [COMMON_ROLE_ATTN_V_B] = "attn_v_b.weight",
    [COMMON_ROLE_FFN_EXP_PROBS_B] = "exp_probs_b.bias",
    [COMMON_ROLE_ATTN_OUT_BIAS] = "attn_output.bias",
    [COMMON_ROLE_ATTN_SINKS] = "attn_sinks.weight",
    [COMMON_ROLE_FFN_GATE_INP_BIAS] = "ffn_gate_inp.bias",
    [COMMON_ROLE_FFN_GATE_EXPS_BIAS] = "ffn_gate_exps.bias",
    [COMMON_ROLE_FFN_UP_EXPS_BIAS] = "ffn_up_exps.bias",
    [COMMON_ROLE_FFN_DOWN_EXPS_BIAS] = "ffn_down_exps.bias",
    [COMMON_ROLE_ATTN_SUB_NORM] = "attn_sub_norm.weight",
    [COMMON_ROLE_FFN_SUB_NORM] = "ffn_sub_norm.weight",
    [COMMON_ROLE_ATTN_Q_SCALE] = "attn_q.scale",
    [COMMON_ROLE_ATTN_K_SCALE] = "attn_k.scale",
    [COMMON_ROLE_ATTN_V_SCALE] = "attn_v.scale",
    [COMMON_ROLE_ATTN_OUT_SCALE] = "attn_output.scale",
    [COMMON_ROLE_FFN_GATE_SCALE] = "ffn_gate.scale",
    [COMMON_ROLE_FFN_UP_SCALE] = "ffn_up.scale",
    [COMMON_ROLE_FFN_DOWN_SCALE] = "ffn_down.scale",
};

static const char *grole_names[COMMON_GROLE_COUNT] = {
    [COMMON_GROLE_TOKEN_EMBD] = "token_embd.weight",
    [COMMON_GROLE_OUTPUT_NORM] = "output_norm.weight",
    [COMMON_GROLE_OUTPUT] = "output.weight",
    [COMMON_GROLE_ROPE_FREQS] = "rope_freqs.weight",
};

const char *common_arch_name(enum common_arch arch)
{
    return (unsigned)arch < COMMON_ARCH_COUNT ? arch_table[arch].name : "unknown";
}

const char *common_arch_list(char *buf, size_t len)
{
    size_t at = 0;
    if (len)
        buf[0] = '\0';
    for (int a = 0; a < COMMON_ARCH_COUNT && at < len; a++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", a ? ", " : "", arch_table[a].name);
    return buf;
}

bool common_arch_from_name(const char *name, size_t len, enum common_arch *out)
{
    for (int a = 0; a < COMMON_ARCH_COUNT; a++)
        if (strlen(arch_table[a].name) == len && memcmp(arch_table[a].name, name, len) == 0) {
            *out = (enum common_arch)a;
            return true;
        }
    return false;
}

bool common_arch_is_moe(enum common_arch arch)
{
    return (unsigned)arch < COMMON_ARCH_COUNT && arch_table[arch].moe;
}

const char *common_layer_role_name(enum common_layer_role role)
{
    return (unsigned)role < COMMON_ROLE_COUNT ? role_names[role] : "unknown";
}

bool common_model_is_moe(const struct common_model *m)
{
    return m->hp.n_expert > 0;
}

bool common_model_tensor_is_unused(const struct common_model *m, uint64_t index)
{
    const struct common_gguf_tensor *t = common_gguf_tensor_at(m->gguf, index);
    if (!t || strncmp(t->name, "blk.", 4) != 0)
        return false;
    unsigned long long b = 0;
    const char        *p = t->name + 4;
    if (*p < '0' || *p > '9')
        return false;
    while (*p >= '0' && *p <= '9' && b < UINT32_MAX)
        b = b * 10 + (unsigned long long)(*p++ - '0');
    return *p == '.' && b >= m->hp.n_layer;
}

bool common_hparams_layer_is_swa(const struct common_hparams *hp, uint32_t il)
{
    if (hp->n_swa == 0)
        return false;
    return hp->swa_period == 0 || il % hp->swa_period < hp->swa_period - 1;
}

uint32_t common_kv_layer_positions(const struct common_hparams *hp, uint32_t n_ctx,
                                   uint32_t n_batch, uint32_t il)
{
    if (!common_hparams_layer_is_swa(hp, il))
        return n_ctx;
    const uint64_t ring = (uint64_t)hp->n_swa + n_batch;
    return ring < n_ctx ? (uint32_t)ring : n_ctx;
}

bool common_model_layer_is_moe(const struct common_model *m, uint32_t il)
{
    return m->hp.n_expert > 0 && il >= m->hp.n_layer_dense_lead && il < m->hp.n_layer;
}

/* Reads "<arch>.<suffix>" as u32; absent keys keep *out and return COMMON_ENOENT. */
static int model_u32(const struct common_model *m, const char *suffix, uint32_t *out)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", m->arch_name, suffix);
    return common_gguf_get_u32(m->gguf, key, out);
}

static int model_f32(const struct common_model *m, const char *suffix, float *out)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", m->arch_name, suffix);
    return common_gguf_get_f32(m->gguf, key, out);
}

static int model_need_u32(const struct common_model *m, const char *suffix, uint32_t *out,
                          struct common_errmsg *e)
{
    int rc = model_u32(m, suffix, out);
    if (rc == COMMON_ENOENT)
        return common_errmsg_set(e, COMMON_ECORRUPT, "missing metadata key '%s.%s'", m->arch_name,
                                 suffix);
    if (rc != COMMON_OK)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "metadata key '%s.%s' is not an unsigned "
                                 "32-bit integer",
                                 m->arch_name, suffix);
    return COMMON_OK;
}

static int64_t model_find(const struct common_gguf *g, const char *name)
{
    const struct common_gguf_tensor *t = common_gguf_tensor_find(g, name);
    return t ? (int64_t)(t - common_gguf_tensor_at(g, 0)) : -1;
}

/* Checks that tensor `idx` has shape ne[0..n) (trailing dims 1). */
static int model_check_shape(const struct common_model *m, int64_t idx, uint32_t n,
                             const uint64_t *ne, struct common_errmsg *e)
{
    const struct common_gguf_tensor *t = common_gguf_tensor_at(m->gguf, (uint64_t)idx);
    for (uint32_t d = 0; d < COMMON_GGUF_MAX_DIMS; d++) {
        uint64_t want = d < n ? ne[d] : 1;
        if (t->ne[d] != want)
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "tensor '%s' has shape [%llu, %llu, %llu, %llu]; dim %u "
                                     "should be %llu",
                                     t->name, (unsigned long long)t->ne[0],
                                     (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                                     (unsigned long long)t->ne[3], d, (unsigned long long)want);
    }
    return COMMON_OK;
}

/* YaRN's magnitude correction of a scaling factor (llama.cpp's get_mscale). */
static float model_yarn_mscale(float scale, float mscale)
{
    return scale <= 1.0f ? 1.0f : 0.1f * mscale * logf(scale) + 1.0f;
}

/* rope.scaling.*: the frequency scale and YaRN's parameters as llama.cpp's context derives them
 * from the file (type "none" never scales; "linear" and "yarn" divide by the factor; YaRN mixes
 * interpolation and extrapolation per dimension and corrects the magnitude). */
static int model_rope_scaling(struct common_model *m, struct common_errmsg *e)
{
    struct common_hparams *hp = &m->hp;
    char                   key[128];
    struct common_gguf_str type = {.ptr = "linear", .len = 6};
    snprintf(key, sizeof(key), "%s.rope.scaling.type", m->arch_name);
    (void)common_gguf_get_str(m->gguf, key, &type);
    const bool none = type.len == 4 && memcmp(type.ptr, "none", 4) == 0;
    const bool yarn = type.len == 4 && memcmp(type.ptr, "yarn", 4) == 0;
    if (!none && !yarn && !(type.len == 6 && memcmp(type.ptr, "linear", 6) == 0))
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "metadata key '%s' is '%.*s' (supported: none, linear, yarn)", key,
                                 (int)(type.len > 32 ? 32 : type.len), type.ptr);
    float factor = 0.0f;
    hp->rope_freq_scale = 1.0f;
    if (!none && model_f32(m, "rope.scaling.factor", &factor) == COMMON_OK && factor > 0.0f)
        hp->rope_freq_scale = 1.0f / factor;
    if (!(hp->rope_freq_scale > 0.0f) || isinf(hp->rope_freq_scale))
        return common_errmsg_set(e, COMMON_ECORRUPT, "bad %s.rope.scaling.factor", m->arch_name);
    hp->yarn_beta_fast = 32.0f;
    hp->yarn_beta_slow = 1.0f;
    hp->n_ctx_orig_yarn = hp->n_ctx_train;
    model_u32(m, "rope.scaling.original_context_length", &hp->n_ctx_orig_yarn);
    hp->yarn_ext_factor = yarn ? 1.0f : 0.0f;
    hp->yarn_attn_factor = 1.0f;
    float log_mul = 0.0f;
    /* deepseek2 files store 0.1 * mscale_all_dim (llama.cpp divides it back). */
    if (arch_table[m->arch].mla &&
        model_f32(m, "rope.scaling.yarn_log_multiplier", &log_mul) == COMMON_OK)
        log_mul /= 0.1f;
    hp->yarn_log_mul = log_mul;
    if (yarn) {
        const float f = 1.0f / hp->rope_freq_scale;
        if (log_mul != 0.0f) {
            const float mscale = log_mul != 1.0f && arch_table[m->arch].mla ? log_mul : 1.0f;
            hp->yarn_attn_factor = model_yarn_mscale(f, mscale) / model_yarn_mscale(f, log_mul);
        } else {
            hp->yarn_attn_factor = model_yarn_mscale(f, 1.0f);
        }
        hp->yarn_attn_factor *= 1.0f / (1.0f + 0.1f * logf(f));
    }
    float attn_factor = 1.0f;
    if (model_f32(m, "rope.scaling.attn_factor", &attn_factor) == COMMON_OK)
        hp->yarn_attn_factor *= attn_factor;
    if (hp->n_ctx_orig_yarn == 0 || !isfinite(hp->yarn_attn_factor))
        return common_errmsg_set(e, COMMON_ECORRUPT, "bad YaRN parameters in %s.rope.scaling.*",
                                 m->arch_name);
    return COMMON_OK;
}

/* Reads "<arch>.<suffix>" as a bool into *out when present. */
static void model_bool(const struct common_model *m, const char *suffix, bool *out)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", m->arch_name, suffix);
    (void)common_gguf_get_bool(m->gguf, key, out);
}

/* DeepSeek-style routing (deepseek2, glm4moe): leading dense layers, shared experts, the gating
 * function (the architecture's default when absent), renormalisation, scale and expert groups. */
static int model_read_routing(struct common_model *m, struct common_errmsg *e)
{
    struct common_hparams *hp = &m->hp;
    model_u32(m, "leading_dense_block_count", &hp->n_layer_dense_lead);
    model_u32(m, "expert_shared_count", &hp->n_expert_shared);
    if (hp->n_layer_dense_lead > hp->n_layer)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "%s.leading_dense_block_count %u exceeds block_count %u",
                                 m->arch_name, hp->n_layer_dense_lead, hp->n_layer);
    uint32_t gating = 0;
    model_u32(m, "expert_gating_func", &gating);
    if (gating > 2)
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "%s.expert_gating_func %u is not supported (1 softmax, 2 sigmoid)",
                                 m->arch_name, gating);
    hp->expert_gating = gating == 2   ? COMMON_GATING_SIGMOID
                        : gating == 1 ? COMMON_GATING_SOFTMAX
                                      : arch_table[m->arch].gating;
    bool norm = false;
    model_bool(m, "expert_weights_norm", &norm);
    hp->norm_topk_prob = norm;
    model_f32(m, "expert_weights_scale", &hp->expert_weights_scale);
    if (!isfinite(hp->expert_weights_scale))
        return common_errmsg_set(e, COMMON_ECORRUPT, "bad %s.expert_weights_scale", m->arch_name);
    model_u32(m, "expert_group_count", &hp->n_expert_groups);
    model_u32(m, "expert_group_used_count", &hp->n_group_used);
    if (hp->n_expert_groups > 1 &&
        (hp->n_expert_groups > COMMON_MAX_EXPERT_GROUPS ||
         hp->n_expert % hp->n_expert_groups != 0 || hp->n_group_used == 0 ||
         hp->n_group_used >= hp->n_expert_groups ||
         hp->n_expert_used > hp->n_group_used * (hp->n_expert / hp->n_expert_groups)))
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "%s.expert_group_count %u must divide expert_count %u and "
                                 "expert_group_used_count %u be in 1..%u with room for %u experts",
                                 m->arch_name, hp->n_expert_groups, hp->n_expert, hp->n_group_used,
                                 hp->n_expert_groups - 1, hp->n_expert_used);
    return COMMON_OK;
}

/* gpt-oss: the sliding window (required) and the period of sliding layers (2 by default: the
 * even layers slide); a different RoPE base for sliding layers is refused. */
static int model_read_gptoss(struct common_model *m, struct common_errmsg *e)
{
    struct common_hparams *hp = &m->hp;
    int                    rc;
    if ((rc = model_need_u32(m, "attention.sliding_window", &hp->n_swa, e)))
        return rc;
    if (hp->n_swa == 0)
        return common_errmsg_set(e, COMMON_ECORRUPT, "%s.attention.sliding_window is 0",
                                 m->arch_name);
    hp->swa_period = 2;
    char key[128];
    snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", m->arch_name);
    const struct common_gguf_kv *kv = common_gguf_find(m->gguf, key);
    if (kv && common_gguf_get_u32(m->gguf, key, &hp->swa_period) != COMMON_OK)
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "metadata key '%s': only one period for every layer is supported",
                                 key);
    float base_swa = hp->rope_freq_base;
    model_f32(m, "rope.freq_base_swa", &base_swa);
    if (base_swa != hp->rope_freq_base)
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "%s.rope.freq_base_swa %g differs from rope.freq_base %g: not "
                                 "supported",
                                 m->arch_name, (double)base_swa, (double)hp->rope_freq_base);
    hp->swiglu_oai = true;
    return COMMON_OK;
}

/* deepseek2: the latent attention's ranks and widths, with the KQ scale llama.cpp derives from
 * YaRN's magnitude. */
static int model_read_mla(struct common_model *m, struct common_errmsg *e)
{
    struct common_hparams *hp = &m->hp;
    int                    rc;
    model_u32(m, "attention.q_lora_rank", &hp->n_lora_q);
    if ((rc = model_need_u32(m, "attention.kv_lora_rank", &hp->n_lora_kv, e)) ||
        (rc = model_need_u32(m, "attention.key_length_mla", &hp->head_dim_k_mla, e)) ||
        (rc = model_need_u32(m, "attention.value_length_mla", &hp->head_dim_v_mla, e)))
        return rc;
    if (hp->n_lora_kv == 0 || hp->n_head_kv != 1 || hp->head_dim_k != hp->n_lora_kv + hp->n_rot ||
        hp->head_dim_v != hp->n_lora_kv || hp->head_dim_k_mla <= hp->n_rot ||
        hp->head_dim_v_mla == 0 || hp->n_lora_kv > 65536 || hp->head_dim_k_mla > 65536 ||
        hp->head_dim_v_mla > 65536 || hp->n_lora_q > 65536)
        return common_errmsg_set(
            e, COMMON_ECORRUPT,
            "inconsistent latent attention: head_count_kv %u (want 1), key_length %u (want "
            "kv_lora_rank %u + rope.dimension_count %u), value_length %u (want %u), "
            "key_length_mla %u, value_length_mla %u",
            hp->n_head_kv, hp->head_dim_k, hp->n_lora_kv, hp->n_rot, hp->head_dim_v, hp->n_lora_kv,
            hp->head_dim_k_mla, hp->head_dim_v_mla);
    /* KQ scale: YaRN's magnitude, before its own correction, squared over sqrt of the per-head
     * query width (llama.cpp's deepseek2 graph). */
    const float fs = hp->rope_freq_scale;
    const float attn_org = hp->yarn_attn_factor * (1.0f + 0.1f * logf(1.0f / fs));
    const float mscale = attn_org * (1.0f + 0.1f * hp->yarn_log_mul * logf(1.0f / fs));
    hp->attn_scale = mscale * mscale / sqrtf((float)hp->head_dim_k_mla);
    return COMMON_OK;
}

static int model_read_hparams(struct common_model *m, struct common_errmsg *e)
{
    struct common_hparams *hp = &m->hp;
    int                    rc;
    if ((rc = model_need_u32(m, "embedding_length", &hp->n_embd, e)) ||
        (rc = model_need_u32(m, "block_count", &hp->n_layer, e)) ||
        (rc = model_need_u32(m, "attention.head_count", &hp->n_head, e)))
        return rc;
    if (hp->n_embd == 0 || hp->n_layer == 0 || hp->n_head == 0 || hp->n_layer > 4096 ||
        hp->n_head > 4096)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "implausible geometry: embedding_length %u, block_count %u, "
                                 "head_count %u",
                                 hp->n_embd, hp->n_layer, hp->n_head);
    uint32_t nextn = 0;
    model_u32(m, "nextn_predict_layers", &nextn);
    if (nextn >= hp->n_layer)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "%s.nextn_predict_layers %u leaves no layer of block_count %u",
                                 m->arch_name, nextn, hp->n_layer);
    hp->n_layer -= nextn; /* the prediction layers at the end are not run */
    hp->n_head_kv = hp->n_head;
    model_u32(m, "attention.head_count_kv", &hp->n_head_kv);
    if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "attention.head_count %u is not a multiple of head_count_kv %u",
                                 hp->n_head, hp->n_head_kv);
    hp->head_dim_k = hp->n_embd / hp->n_head;
    model_u32(m, "attention.key_length", &hp->head_dim_k);
    hp->head_dim_v = hp->head_dim_k;
    model_u32(m, "attention.value_length", &hp->head_dim_v);
    hp->n_rot = hp->head_dim_k;
    model_u32(m, "rope.dimension_count", &hp->n_rot);
    if (hp->head_dim_k == 0 || hp->head_dim_v == 0 || hp->n_rot > hp->head_dim_k ||
        hp->n_rot % 2 != 0)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "bad head geometry: key_length %u, value_length %u, "
                                 "rope.dimension_count %u",
                                 hp->head_dim_k, hp->head_dim_v, hp->n_rot);
    hp->n_ctx_train = 2048;
    model_u32(m, "context_length", &hp->n_ctx_train);
    model_u32(m, "feed_forward_length", &hp->n_ff);
    model_u32(m, "expert_count", &hp->n_expert);
    model_u32(m, "expert_used_count", &hp->n_expert_used);
    model_u32(m, "expert_shared_feed_forward_length", &hp->n_ff_shexp);
    if (hp->n_expert > 0 && (hp->n_expert_used == 0 || hp->n_expert_used > hp->n_expert))
        return common_errmsg_set(e, COMMON_ECORRUPT, "expert_used_count %u is not in 1..%u",
                                 hp->n_expert_used, hp->n_expert);
    if (arch_table[m->arch].moe && hp->n_expert == 0)
        return common_errmsg_set(e, COMMON_ECORRUPT, "missing metadata key '%s.expert_count'",
                                 m->arch_name);
    hp->rope_freq_base = 10000.0f;
    model_f32(m, "rope.freq_base", &hp->rope_freq_base);
    if ((rc = model_rope_scaling(m, e)) != COMMON_OK)
        return rc;
    char sect[128];
    snprintf(sect, sizeof(sect), "%s.rope.dimension_sections", m->arch_name);
    if (common_gguf_find(m->gguf, sect))
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "metadata key '%s': multimodal rotary sections are not supported",
                                 sect);
    if ((rc = model_f32(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps)) != COMMON_OK)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "missing metadata key '%s.attention.layer_norm_rms_epsilon'",
                                 m->arch_name);
    if (!(hp->rope_freq_base > 0.0f) || !(hp->rms_eps >= 0.0f) || isinf(hp->rope_freq_base))
        return common_errmsg_set(e, COMMON_ECORRUPT, "bad rope.freq_base or rms epsilon");
    hp->rope_neox = arch_table[m->arch].rope_neox;
    hp->sub_norms = arch_table[m->arch].bitnet;
    hp->ffn_relu2 = arch_table[m->arch].relu2;
    /* llama.cpp fixes the renormalisation per architecture for these (no key is read). */
    hp->norm_topk_prob = arch_table[m->arch].norm_topk_prob;
    if (arch_table[m->arch].routing && (rc = model_read_routing(m, e)))
        return rc;
    if (arch_table[m->arch].gptoss && (rc = model_read_gptoss(m, e)))
        return rc;
    if (!arch_table[m->arch].routing)
        hp->expert_gating = arch_table[m->arch].gating;
    if (arch_table[m->arch].mla)
        return model_read_mla(m, e);
    return COMMON_OK;
}

/* Assigns and checks the tensors of layer il. */
/* Checks that the tensors named in `roles` are present in layer il. */
static int model_require(const struct common_model *m, uint32_t il,
                         const enum common_layer_role *roles, size_t n, struct common_errmsg *e)
{
    for (size_t i = 0; i < n; i++)
        if (m->layers[il].tensor[roles[i]] < 0)
            return common_errmsg_set(e, COMMON_ECORRUPT, "missing tensor 'blk.%u.%s'", il,
                                     role_names[roles[i]]);
    return COMMON_OK;
}

/* Checks an optional tensor's shape (absent is fine). */
static int model_check_opt(const struct common_model *m, int64_t idx, uint32_t n,
                           const uint64_t *ne, struct common_errmsg *e)
{
    return idx < 0 ? COMMON_OK : model_check_shape(m, idx, n, ne, e);
}

/* Attention of layer il: q, k, v and output projections, optional biases and q/k norms. */
static int model_layer_attention(struct common_model *m, uint32_t il, struct common_errmsg *e)
{
    struct common_hparams              *hp = &m->hp;
    struct common_model_layer          *L = &m->layers[il];
    static const enum common_layer_role required[] = {COMMON_ROLE_ATTN_Q, COMMON_ROLE_ATTN_K,
                                                      COMMON_ROLE_ATTN_V, COMMON_ROLE_ATTN_OUT};
    int rc = model_require(m, il, required, sizeof(required) / sizeof(required[0]), e);
    if (rc)
        return rc;
    uint64_t q = (uint64_t)hp->n_head * hp->head_dim_k;
    uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim_k;
    uint64_t vv = (uint64_t)hp->n_head_kv * hp->head_dim_v;
    uint64_t o = (uint64_t)hp->n_head * hp->head_dim_v;
    if ((rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_Q], 2, (uint64_t[]){hp->n_embd, q},
                                e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_K], 2, (uint64_t[]){hp->n_embd, kv},
                                e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_V], 2, (uint64_t[]){hp->n_embd, vv},
                                e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_OUT], 2, (uint64_t[]){o, hp->n_embd},
                                e)))
        return rc;
    const enum model_qk_norm qkn = arch_table[m->arch].qk_norm;
    if (qkn == MODEL_QK_NORM_NONE &&
        (L->tensor[COMMON_ROLE_ATTN_Q_NORM] >= 0 || L->tensor[COMMON_ROLE_ATTN_K_NORM] >= 0))
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "blk.%u: architecture '%s' has no attn_q_norm/attn_k_norm", il,
                                 m->arch_name);
    if ((rc = model_check_opt(m, L->tensor[COMMON_ROLE_ATTN_Q_NORM], 1,
                              (uint64_t[]){qkn == MODEL_QK_NORM_FULL ? q : hp->head_dim_k}, e)) ||
        (rc = model_check_opt(m, L->tensor[COMMON_ROLE_ATTN_K_NORM], 1,
                              (uint64_t[]){qkn == MODEL_QK_NORM_FULL ? kv : hp->head_dim_k}, e)) ||
        (rc = model_check_opt(m, L->tensor[COMMON_ROLE_ATTN_Q_BIAS], 1, (uint64_t[]){q}, e)) ||
        (rc = model_check_opt(m, L->tensor[COMMON_ROLE_ATTN_K_BIAS], 1, (uint64_t[]){kv}, e)) ||
        (rc = model_check_opt(m, L->tensor[COMMON_ROLE_ATTN_V_BIAS], 1, (uint64_t[]){vv}, e)))
        return rc;
    return COMMON_OK;
}

/* Multi-head latent attention of layer il (deepseek2): the query through a low-rank pair
 * (q_a, its norm, q_b) or one attn_q, the compressed key/value with its rotary part (kv_a_mqa),
 * the latent's norm, and the per-head k_b / v_b that absorb and expand the latent. */
static int model_layer_mla(struct common_model *m, uint32_t il, struct common_errmsg *e)
{
    struct common_hparams     *hp = &m->hp;
    struct common_model_layer *L = &m->layers[il];
    if (L->tensor[COMMON_ROLE_ATTN_K_B] < 0 || L->tensor[COMMON_ROLE_ATTN_V_B] < 0) {
        char name[96];
        snprintf(name, sizeof(name), "blk.%u.attn_kv_b.weight", il);
        if (common_gguf_tensor_find(m->gguf, name))
            return common_errmsg_set(e, COMMON_ENOTSUP,
                                     "blk.%u: attn_kv_b without attn_k_b/attn_v_b is the old "
                                     "deepseek2 layout: convert the model again with a recent "
                                     "llama.cpp",
                                     il);
    }
    static const enum common_layer_role required[] = {
        COMMON_ROLE_ATTN_KV_A_MQA, COMMON_ROLE_ATTN_KV_A_NORM, COMMON_ROLE_ATTN_K_B,
        COMMON_ROLE_ATTN_V_B, COMMON_ROLE_ATTN_OUT};
    int rc = model_require(m, il, required, sizeof(required) / sizeof(required[0]), e);
    if (rc)
        return rc;
    const uint64_t qk = (uint64_t)hp->n_head * hp->head_dim_k_mla;
    const uint64_t nope = hp->head_dim_k_mla - hp->n_rot;
    if (hp->n_lora_q) {
        static const enum common_layer_role qa[] = {COMMON_ROLE_ATTN_Q_A, COMMON_ROLE_ATTN_Q_A_NORM,
                                                    COMMON_ROLE_ATTN_Q_B};
        if ((rc = model_require(m, il, qa, 3, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_Q_A], 2,
                                    (uint64_t[]){hp->n_embd, hp->n_lora_q}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_Q_A_NORM], 1,
                                    (uint64_t[]){hp->n_lora_q}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_Q_B], 2,
                                    (uint64_t[]){hp->n_lora_q, qk}, e)))
            return rc;
    } else if ((rc = model_require(m, il, (const enum common_layer_role[]){COMMON_ROLE_ATTN_Q}, 1,
                                   e)) ||
               (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_Q], 2,
                                       (uint64_t[]){hp->n_embd, qk}, e))) {
        return rc;
    }
    if ((rc =
             model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_KV_A_MQA], 2,
                               (uint64_t[]){hp->n_embd, (uint64_t)hp->n_lora_kv + hp->n_rot}, e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_KV_A_NORM], 1,
                                (uint64_t[]){hp->n_lora_kv}, e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_K_B], 3,
                                (uint64_t[]){nope, hp->n_lora_kv, hp->n_head}, e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_V_B], 3,
                                (uint64_t[]){hp->n_lora_kv, hp->head_dim_v_mla, hp->n_head}, e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_OUT], 2,
                                (uint64_t[]){(uint64_t)hp->n_head * hp->head_dim_v_mla, hp->n_embd},
                                e)))
        return rc;
    return COMMON_OK;
}

/* bitnet's sub-norms (required) and the optional per-tensor scales of its seven projections. */
static int model_layer_bitnet(struct common_model *m, uint32_t il, struct common_errmsg *e)
{
    const struct common_hparams        *hp = &m->hp;
    const struct common_model_layer    *L = &m->layers[il];
    static const enum common_layer_role subs[] = {COMMON_ROLE_ATTN_SUB_NORM,
                                                  COMMON_ROLE_FFN_SUB_NORM};
    int                                 rc = model_require(m, il, subs, 2, e);
    if (rc ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_SUB_NORM], 1,
                                (uint64_t[]){(uint64_t)hp->n_head * hp->head_dim_v}, e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_SUB_NORM], 1, (uint64_t[]){hp->n_ff},
                                e)))
        return rc;
    for (int r = COMMON_ROLE_ATTN_Q_SCALE; r <= COMMON_ROLE_FFN_DOWN_SCALE; r++)
        if ((rc = model_check_opt(m, L->tensor[r], 1, (uint64_t[]){1}, e)))
            return rc;
    return COMMON_OK;
}

/* Assigns and checks the tensors of layer il. */
static int model_layer(struct common_model *m, uint32_t il, struct common_errmsg *e)
{
    struct common_hparams     *hp = &m->hp;
    struct common_model_layer *L = &m->layers[il];
    char                       name[96];
    for (int r = 0; r < COMMON_ROLE_COUNT; r++) {
        const bool post = r == COMMON_ROLE_FFN_NORM && arch_table[m->arch].post_norm;
        snprintf(name, sizeof(name), "blk.%u.%s", il,
                 post ? "post_attention_norm.weight" : role_names[r]);
        L->tensor[r] = model_find(m->gguf, name);
    }
    static const enum common_layer_role norms[] = {COMMON_ROLE_ATTN_NORM, COMMON_ROLE_FFN_NORM};
    int                                 rc = model_require(m, il, norms, 2, e);
    if (rc ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_NORM], 1, (uint64_t[]){hp->n_embd},
                                e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_NORM], 1, (uint64_t[]){hp->n_embd},
                                e)) ||
        (rc =
             arch_table[m->arch].mla ? model_layer_mla(m, il, e) : model_layer_attention(m, il, e)))
        return rc;

    if (!common_model_layer_is_moe(m, il)) {
        static const enum common_layer_role dense[] = {COMMON_ROLE_FFN_GATE, COMMON_ROLE_FFN_UP,
                                                       COMMON_ROLE_FFN_DOWN};
        for (size_t i = 0; i < 3; i++)
            if (L->tensor[dense[i]] < 0)
                return common_errmsg_set(e, COMMON_ECORRUPT, "missing tensor 'blk.%u.%s'", il,
                                         role_names[dense[i]]);
        if (hp->n_ff == 0)
            hp->n_ff =
                (uint32_t)common_gguf_tensor_at(m->gguf, (uint64_t)L->tensor[COMMON_ROLE_FFN_UP])
                    ->ne[1];
        if ((rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_GATE], 2,
                                    (uint64_t[]){hp->n_embd, hp->n_ff}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_UP], 2,
                                    (uint64_t[]){hp->n_embd, hp->n_ff}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_DOWN], 2,
                                    (uint64_t[]){hp->n_ff, hp->n_embd}, e)))
            return rc;
        return arch_table[m->arch].bitnet ? model_layer_bitnet(m, il, e) : COMMON_OK;
    }
    if (arch_table[m->arch].bitnet)
        return common_errmsg_set(e, COMMON_ENOTSUP, "blk.%u: %s layers with experts", il,
                                 m->arch_name);

    static const enum common_layer_role moe[] = {COMMON_ROLE_FFN_GATE_INP,
                                                 COMMON_ROLE_FFN_GATE_EXPS, COMMON_ROLE_FFN_UP_EXPS,
                                                 COMMON_ROLE_FFN_DOWN_EXPS};
    for (size_t i = 0; i < 4; i++)
        if (L->tensor[moe[i]] < 0)
            return common_errmsg_set(e, COMMON_ECORRUPT, "missing tensor 'blk.%u.%s'", il,
                                     role_names[moe[i]]);
    if (hp->n_ff_exp == 0)
        hp->n_ff_exp =
            (uint32_t)common_gguf_tensor_at(m->gguf, (uint64_t)L->tensor[COMMON_ROLE_FFN_UP_EXPS])
                ->ne[1];
    if (hp->n_ff_exp == 0)
        return common_errmsg_set(e, COMMON_ECORRUPT, "blk.%u: expert FFN width is 0", il);
    if ((rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_GATE_INP], 2,
                                (uint64_t[]){hp->n_embd, hp->n_expert}, e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_GATE_EXPS], 3,
                                (uint64_t[]){hp->n_embd, hp->n_ff_exp, hp->n_expert}, e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_UP_EXPS], 3,
                                (uint64_t[]){hp->n_embd, hp->n_ff_exp, hp->n_expert}, e)) ||
        (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_DOWN_EXPS], 3,
                                (uint64_t[]){hp->n_ff_exp, hp->n_embd, hp->n_expert}, e)))
        return rc;
    if (L->tensor[COMMON_ROLE_FFN_UP_SHEXP] >= 0) {
        const struct common_gguf_tensor *t =
            common_gguf_tensor_at(m->gguf, (uint64_t)L->tensor[COMMON_ROLE_FFN_UP_SHEXP]);
        if (hp->n_ff_shexp == 0)
            hp->n_ff_shexp = (uint32_t)t->ne[1];
        if (L->tensor[COMMON_ROLE_FFN_GATE_SHEXP] < 0 || L->tensor[COMMON_ROLE_FFN_DOWN_SHEXP] < 0)
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "blk.%u: shared expert needs gate, up and down", il);
        if ((rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_GATE_SHEXP], 2,
                                    (uint64_t[]){hp->n_embd, hp->n_ff_shexp}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_UP_SHEXP], 2,
                                    (uint64_t[]){hp->n_embd, hp->n_ff_shexp}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_DOWN_SHEXP], 2,
                                    (uint64_t[]){hp->n_ff_shexp, hp->n_embd}, e)))
            return rc;
    }
    const int64_t sg = L->tensor[COMMON_ROLE_FFN_GATE_INP_SHEXP];
    if (arch_table[m->arch].shexp_gate && L->tensor[COMMON_ROLE_FFN_UP_SHEXP] >= 0 && sg < 0)
        return common_errmsg_set(e, COMMON_ECORRUPT, "missing tensor 'blk.%u.%s'", il,
                                 role_names[COMMON_ROLE_FFN_GATE_INP_SHEXP]);
    if (sg >= 0 && (!arch_table[m->arch].shexp_gate || L->tensor[COMMON_ROLE_FFN_UP_SHEXP] < 0))
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "blk.%u: a shared expert gate without a shared expert of a "
                                 "gated architecture",
                                 il);
    if (sg >= 0 && (rc = model_check_shape(m, sg, 1, (uint64_t[]){hp->n_embd}, e)))
        return rc;
    if (arch_table[m->arch].routing && hp->n_expert_shared &&
        (L->tensor[COMMON_ROLE_FFN_UP_SHEXP] < 0 ||
         hp->n_ff_shexp != (uint64_t)hp->n_ff_exp * hp->n_expert_shared))
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "blk.%u: %u shared experts of width %u need ffn_*_shexp tensors "
                                 "%u wide",
                                 il, hp->n_expert_shared, hp->n_ff_exp,
                                 hp->n_ff_exp * hp->n_expert_shared);
    if ((rc = model_check_opt(m, L->tensor[COMMON_ROLE_FFN_EXP_PROBS_B], 1,
                              (uint64_t[]){hp->n_expert}, e)))
        return rc;
    if (arch_table[m->arch].gptoss) {
        static const enum common_layer_role need[] = {
            COMMON_ROLE_ATTN_SINKS,        COMMON_ROLE_ATTN_OUT_BIAS,
            COMMON_ROLE_FFN_GATE_INP_BIAS, COMMON_ROLE_FFN_GATE_EXPS_BIAS,
            COMMON_ROLE_FFN_UP_EXPS_BIAS,  COMMON_ROLE_FFN_DOWN_EXPS_BIAS};
        if ((rc = model_require(m, il, need, sizeof(need) / sizeof(need[0]), e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_SINKS], 1,
                                    (uint64_t[]){hp->n_head}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_ATTN_OUT_BIAS], 1,
                                    (uint64_t[]){hp->n_embd}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_GATE_INP_BIAS], 1,
                                    (uint64_t[]){hp->n_expert}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_GATE_EXPS_BIAS], 2,
                                    (uint64_t[]){hp->n_ff_exp, hp->n_expert}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_UP_EXPS_BIAS], 2,
                                    (uint64_t[]){hp->n_ff_exp, hp->n_expert}, e)) ||
            (rc = model_check_shape(m, L->tensor[COMMON_ROLE_FFN_DOWN_EXPS_BIAS], 2,
                                    (uint64_t[]){hp->n_embd, hp->n_expert}, e)))
            return rc;
    }
    return COMMON_OK;
}

/* Sums the byte totals once roles are known. */
static void model_totals(struct common_model *m)
{
    const struct common_gguf *g = m->gguf;
    m->bytes_total = m->bytes_experts = m->bytes_expert_bundle = 0;
    m->bytes_unused = m->bytes_resident = m->bytes_active = 0;
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++)
        m->bytes_total += common_gguf_tensor_at(g, i)->size;
    uint64_t active_experts = 0;
    for (uint32_t il = 0; il < m->hp.n_layer && m->hp.n_expert; il++) {
        if (!common_model_layer_is_moe(m, il))
            continue;
        uint64_t bundle = 0;
        for (int r = COMMON_ROLE_FFN_GATE_EXPS; r <= COMMON_ROLE_FFN_DOWN_EXPS; r++) {
            uint64_t sz = common_gguf_tensor_at(g, (uint64_t)m->layers[il].tensor[r])->size;
            m->bytes_experts += sz;
            bundle += sz / m->hp.n_expert;
        }
        if (bundle > m->bytes_expert_bundle)
            m->bytes_expert_bundle = bundle;
        active_experts += bundle * m->hp.n_expert_used;
    }
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++)
        if (common_model_tensor_is_unused(m, i))
            m->bytes_unused += common_gguf_tensor_at(g, i)->size;
    m->bytes_resident = m->bytes_total - m->bytes_experts - m->bytes_unused;
    /* A token reads one embedding row, unless the output head is tied to the embedding. */
    uint64_t active = m->bytes_resident;
    if (m->global[COMMON_GROLE_OUTPUT] >= 0) {
        const struct common_gguf_tensor *emb =
            common_gguf_tensor_at(g, (uint64_t)m->global[COMMON_GROLE_TOKEN_EMBD]);
        uint64_t row = emb->ne[1] ? emb->size / emb->ne[1] : 0;
        active = active - emb->size + row;
    }
    m->bytes_active = active + active_experts;
}

/* Widths that no tensor backs are cleared: feed_forward_length of a model without a dense FFN
 * layer (a MoE file may carry any number there, and buffers are sized from it) and the shared
 * expert width of a model without shared experts. Every width left is checked against the
 * tensors of its layers. */
static void model_drop_unbacked(struct common_model *m)
{
    bool dense = false, shexp = false;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        dense = dense || m->layers[il].tensor[COMMON_ROLE_FFN_GATE] >= 0;
        shexp = shexp || m->layers[il].tensor[COMMON_ROLE_FFN_UP_SHEXP] >= 0;
    }
    if (!dense)
        m->hp.n_ff = 0;
    if (!shexp)
        m->hp.n_ff_shexp = 0;
}

int common_model_init(struct common_model *m, const struct common_gguf *g, struct common_errmsg *e)
{
    memset(m, 0, sizeof(*m));
    m->gguf = g;
    struct common_gguf_str arch;
    int                    rc = common_gguf_get_str(g, "general.architecture", &arch);
    if (rc != COMMON_OK)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "missing or non-string metadata key 'general.architecture'");
    char list[256];
    if (!common_arch_from_name(arch.ptr, arch.len, &m->arch))
        return common_errmsg_set(
            e, COMMON_ENOTSUP, "architecture '%.*s' is not supported (supported: %s)",
            (int)(arch.len > 64 ? 64 : arch.len), arch.ptr, common_arch_list(list, sizeof(list)));
    m->arch_name = arch_table[m->arch].name;
    if ((rc = model_read_hparams(m, e)) != COMMON_OK)
        return rc;

    for (int r = 0; r < COMMON_GROLE_COUNT; r++)
        m->global[r] = model_find(g, grole_names[r]);
    if (m->global[COMMON_GROLE_TOKEN_EMBD] < 0)
        return common_errmsg_set(e, COMMON_ECORRUPT, "missing tensor 'token_embd.weight'");
    if (m->global[COMMON_GROLE_OUTPUT_NORM] < 0)
        return common_errmsg_set(e, COMMON_ECORRUPT, "missing tensor 'output_norm.weight'");
    const struct common_gguf_tensor *emb =
        common_gguf_tensor_at(g, (uint64_t)m->global[COMMON_GROLE_TOKEN_EMBD]);
    if (emb->n_dims != 2 || emb->ne[0] != m->hp.n_embd || emb->ne[1] == 0 ||
        emb->ne[1] > UINT32_MAX)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "tensor 'token_embd.weight' has shape [%llu, %llu]; want "
                                 "[%u, n_vocab]",
                                 (unsigned long long)emb->ne[0], (unsigned long long)emb->ne[1],
                                 m->hp.n_embd);
    m->hp.n_vocab = (uint32_t)emb->ne[1];
    if ((rc = model_check_shape(m, m->global[COMMON_GROLE_OUTPUT_NORM], 1,
                                (uint64_t[]){m->hp.n_embd}, e)))
        return rc;
    if (m->global[COMMON_GROLE_OUTPUT] >= 0 &&
        (rc = model_check_shape(m, m->global[COMMON_GROLE_OUTPUT], 2,
                                (uint64_t[]){m->hp.n_embd, m->hp.n_vocab}, e)))
        return rc;

    m->layers = calloc(m->hp.n_layer, sizeof(*m->layers));
    if (!m->layers)
        return COMMON_ENOMEM;
    /* Expert width: per-arch key first, then the tensor shape (checked per layer). */
    if (m->hp.n_expert) {
        m->hp.n_ff_exp = 0;
        model_u32(m, "expert_feed_forward_length", &m->hp.n_ff_exp);
    }
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        if ((rc = model_layer(m, il, e)) != COMMON_OK) {
            common_model_fini(m);
            return rc;
        }
    }
    model_drop_unbacked(m);
    model_totals(m);
    return COMMON_OK;
}

int common_model_stream_dense(struct common_model *m)
{
    if (m->hp.n_expert)
        return COMMON_EINVAL;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        int64_t *t = m->layers[il].tensor;
        t[COMMON_ROLE_FFN_GATE_EXPS] = t[COMMON_ROLE_FFN_GATE];
        t[COMMON_ROLE_FFN_UP_EXPS] = t[COMMON_ROLE_FFN_UP];
        t[COMMON_ROLE_FFN_DOWN_EXPS] = t[COMMON_ROLE_FFN_DOWN];
        t[COMMON_ROLE_FFN_GATE] = t[COMMON_ROLE_FFN_UP] = t[COMMON_ROLE_FFN_DOWN] = -1;
    }
    m->hp.n_expert = m->hp.n_expert_used = 1;
    m->hp.n_ff_exp = m->hp.n_ff;
    m->ffn_streamed = true;
    model_totals(m);
    return COMMON_OK;
}

void common_model_fini(struct common_model *m)
{
    if (!m)
        return;
    free(m->layers);
    m->layers = NULL;
}

int common_model_expert_span(const struct common_model *m, uint32_t layer, uint32_t expert,
                             enum common_expert_part part, struct common_span *out)
{
    if (!common_model_layer_is_moe(m, layer) || expert >= m->hp.n_expert ||
        (unsigned)part >= COMMON_EXPERT_PART_COUNT)
        return COMMON_EINVAL;
    int64_t idx = m->layers[layer].tensor[COMMON_ROLE_FFN_GATE_EXPS + (int)part];
    const struct common_gguf_tensor *t = common_gguf_tensor_at(m->gguf, (uint64_t)idx);
    uint64_t                         per = t->size / m->hp.n_expert;
    out->split = t->split;
    out->type = t->type;
    out->offset = t->offset + per * expert;
    if (common_gguf_tensor_bundled(m->gguf, (uint64_t)idx)) {
        /* QSF: the part inside its expert's bundle; an LZ4 bundle has no file offset for it
         * (UINT64_MAX: only a reader that decodes the bundle, the fetcher, can serve it). */
        struct common_qsf_bundle b;
        if (common_gguf_bundle(m->gguf, layer, expert, &b) != COMMON_OK || b.part_size[part] != per)
            return COMMON_EINVAL;
        out->split = b.file;
        out->offset = b.codec == COMMON_QSF_RAW ? b.offset + b.part_off[part] : UINT64_MAX;
    }
    out->size = per;
    out->rows = t->ne[1];
    out->cols = t->ne[0];
    return COMMON_OK;
}
