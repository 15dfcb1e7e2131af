/* executor/model_impl.h - private to executor/: the loaded model's tensor views, for forward.c. */
#ifndef EXECUTOR_MODEL_IMPL_H
#define EXECUTOR_MODEL_IMPL_H

/* Not for use outside executor/: other folders go through executor.h. */

#include "executor.h"

/* A weight matrix as the kernels read it: `rows` rows of `cols` elements of `type`. */
struct executor_mat {
    const void *data;      /* borrowed: from the weight source, valid while the model lives */
    uint32_t    type;      /* enum common_ggml_type */
    int64_t     rows;      /* output features (ne1) */
    int64_t     cols;      /* input features (ne0) */
    size_t      row_bytes; /* bytes of one row */
    /* Multiplies every output of the product, 0 = none: an I2_S tensor's scale (Microsoft's
     * layout keeps one per tensor after its codes) times bitnet's per-tensor `.scale`. */
    float out_scale;
};

/* Geometry of one part (gate, up, down) of every routed expert of a layer. */
struct executor_expert_geom {
    uint32_t type;      /* enum common_ggml_type */
    int64_t  rows;      /* output features */
    int64_t  cols;      /* input features */
    size_t   row_bytes; /* bytes of one row */
};

/* "vec" fields are 1-D tensors as f32: the resident tensor bytes themselves when the file holds
 * f32, else a converted copy owned by the model (executor_model.vecs). */
struct executor_layer_w {
    const float *attn_norm;                      /* vec: (n_embd) */
    const float *ffn_norm;                       /* vec: (n_embd) */
    const float *q_norm;                         /* vec: (head_dim_k) per head (qwen3), (q width)
                                              over the whole projection (olmoe), or NULL */
    const float        *k_norm;                  /* vec: as q_norm, (head_dim_k) or (k width) */
    uint32_t            q_norm_n;                /* elements of q_norm */
    uint32_t            k_norm_n;                /* elements of k_norm */
    const float        *bq;                      /* vec: (n_head * head_dim_k) or NULL (qwen2) */
    const float        *bk;                      /* vec: (n_head_kv * head_dim_k) or NULL */
    const float        *bv;                      /* vec: (n_head_kv * head_dim_v) or NULL */
    struct executor_mat wq, wk, wv, wo;          /* wk, wv: data NULL with latent attention */
    struct executor_mat gate, up, down;          /* dense FFN (data NULL for MoE layers) */
    struct executor_mat gate_inp;                /* MoE router (data NULL for dense layers) */
    struct executor_mat sh_gate, sh_up, sh_down; /* shared expert (data NULL: none) */
    struct executor_mat sh_gate_inp;             /* 1 row: its sigmoid gate (data NULL: ungated) */
    const float        *exp_probs_b;             /* vec: (n_expert) selection bias, or NULL */
    /* gpt-oss (vectors, NULL otherwise): attention sinks (n_head), output bias (n_embd), router
     * bias (n_expert), expert biases (n_expert rows of n_ff_exp, n_ff_exp, n_embd). */
    const float *sinks, *bo, *gate_inp_b, *gate_exps_b, *up_exps_b, *down_exps_b;
    bool         swa; /* this layer attends to a sliding window of n_swa positions */
    /* Multi-head latent attention (deepseek2): wq or wq_a + q_a_norm + wq_b; wkv_a gives the
     * latent and the rotary key; wk_b and wv_b hold n_head blocks of rows, one per head. */
    struct executor_mat wq_a, wq_b, wkv_a, wk_b, wv_b;
    const float        *q_a_norm;  /* vec: (q_lora_rank) or NULL */
    const float        *kv_a_norm; /* vec: (kv_lora_rank) or NULL */
    /* bitnet: RMSNorm weights applied before wo (n_head * head_dim_v) and before down (n_ff). */
    const float                *attn_sub_norm, *ffn_sub_norm;
    struct executor_expert_geom exp[COMMON_EXPERT_PART_COUNT]; /* MoE expert parts */
    /* A dense FFN streamed as expert 0 (common_model_stream_dense): each part's output scale
     * (bitnet's .scale; 0 = none) and the offset of an I2_S tensor scale in its bytes (0 =
     * none: Microsoft's layout keeps it after the codes). */
    bool     ffn_streamed;
    float    exp_scale[COMMON_EXPERT_PART_COUNT];
    uint64_t exp_tail[COMMON_EXPERT_PART_COUNT];
};

struct executor_model {
    const struct common_model *desc;     /* borrowed, or own_desc when opened here */
    struct executor_weights   *w;        /* borrowed, or owned when opened here */
    struct common_gguf        *own_gguf; /* owned: set by executor_model_open */
    struct common_model       *own_desc; /* owned: set by executor_model_open */
    bool                       owns;     /* own_gguf, own_desc and w are owned */
    struct executor_layer_w   *layers;   /* owned: n_layer */
    float                    **vecs;     /* owned: converted vectors (non-f32 tensors) */
    size_t                     n_vecs;
    void                     **bufs; /* owned: I2_S matrices rebuilt with their sibling scales */
    size_t                     n_bufs;
    struct executor_mat        tok_embd;    /* (n_vocab rows of n_embd) */
    struct executor_mat        output;      /* head; token_embd when tied */
    const float               *output_norm; /* vec: (n_embd) */
    const float               *rope_freqs;  /* vec: (n_rot / 2) frequency divisors, or NULL */
};

#endif /* EXECUTOR_MODEL_IMPL_H */
