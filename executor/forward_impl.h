/* executor/forward_impl.h - private to executor/: the context of one sequence, shared by the
 * forward pass (forward.c) and its MoE layer (moe.c). */
#ifndef EXECUTOR_FORWARD_IMPL_H
#define EXECUTOR_FORWARD_IMPL_H

/* Not for use outside executor/: other folders go through struct executor_ctx in executor.h. */

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "executor.h"
#include "kernels/kernels.h"
#include "kv.h"
#include "model_impl.h"

#define FWD_N_ACT             3 /* activation buffers: q/k/v may need three vec_dot types */
#define FWD_ALIGN             COMMON_CTX_ALIGN /* scratch alignment, bytes */
#define FWD_MIN_CHUNK         8                /* fewest matrix rows handed to a thread at once */
#define FWD_NEXT_TOKEN_LAYERS 2 /* layers of the next token prefetched after the last layer */
#define FWD_TORN_RETRIES      8 /* computations of one expert whose unpinned bytes changed */

/* Where one row of a batch belongs: the cache of its sequence and its position there. A batch
 * of one sequence has every row in the context's own cache; a batch of several sequences
 * (executor_ctx_decode_batch) mixes the caches of their contexts. */
struct fwd_row {
    struct executor_kv *kv; /* borrowed */
    uint32_t            pos;
};

/* Guess ranks of the gate predictor with their own precision (executor_ctx.pf_rank_*). */
#define FWD_PF_RANKS 16u

struct executor_ctx {
    const struct executor_model *m;    /* borrowed: must outlive the ctx */
    struct executor_threadpool  *pool; /* borrowed: may be NULL */
    uint32_t                     nth;  /* threads of the pool */
    uint32_t                     n_ctx, n_batch, n_past;
    struct executor_kv           kv;
    /* Scratch, row-major (n_batch, width); allocated once in executor_ctx_create. */
    float          *x;         /* owned: (n_batch, n_embd) residual stream */
    float          *xn;        /* owned: (n_batch, n_embd) normalised input of a block */
    float          *q, *k, *v; /* owned: (n_batch, q_dim), (n_batch, k_dim), (n_batch, v_dim) */
    float          *att;       /* owned: (n_batch, n_head * head_dim_v) attention output */
    float          *tmp;       /* owned: (n_batch, n_embd) block output */
    float          *ga, *up;   /* owned: (n_batch, n_ff_max) FFN gate and up */
    uint8_t        *act[FWD_N_ACT]; /* owned: act_cap bytes each, activations in vec_dot types */
    size_t          act_cap;
    float          *rope;      /* owned: (n_batch, n_rot) cos, sin pairs per token */
    struct fwd_row *rows;      /* owned: (n_batch) cache and position of each row */
    uint32_t       *head_rows; /* owned: (n_batch) rows whose logits the head computes */
    int32_t        *btok;      /* owned: (n_batch) tokens of a multi-sequence batch */
    float          *head_out;  /* owned, grown on demand: logits of a multi-sequence batch */
    size_t          head_cap;  /* floats in head_out */
    /* Per-thread attention scratch, indexed by the pool's thread index. */
    float    *th_scores;  /* owned: (nth, n_ctx) */
    uint16_t *th_p16;     /* owned: (nth, n_ctx) f16 probabilities */
    uint8_t  *th_q;       /* owned: (nth, th_q_bytes) query in the cache's dot type */
    size_t    th_q_bytes; /* bytes of one query in th_q */
    uint32_t  att_heads;  /* queries per thread in th_scores and th_q (COMMON_CTX_MLA_HEADS) */
    float    *th_v;       /* owned: (nth, head_dim_v) dequantized V row (q8_0 cache) */
    /* Latent attention (deepseek2), see COMMON_CTX_MLA_*. */
    float *mla_qa, *mla_q, *mla_kv, *mla_o; /* owned */
    /* MoE routing, (n_batch, n_expert_used) unless said otherwise. */
    float   *router;   /* owned: (n_batch, n_expert) gate logits, then probabilities */
    int32_t *sel;      /* owned: chosen experts */
    float   *sel_w;    /* owned: their weights */
    int32_t *ex_count; /* owned: (n_expert) tokens routed to each expert */
    int32_t *ex_start; /* owned: (n_expert + 1) offsets into ex_items */
    int32_t *ex_items; /* owned: (n_batch * n_expert_used) t * n_expert_used + slot, by expert */
    float   *gx;       /* owned: (n_batch, n_embd) rows gathered for one expert */
    float   *moe_out;  /* owned: (n_batch, n_expert_used, n_embd) weighted expert outputs */
    float   *sh_out;   /* owned: (n_batch, n_embd) the shared expert's output */
    int32_t *ex_order; /* owned: (n_expert) experts of the batch in compute order */
    /* Post-fetch and prefetch (only with a source that takes hints). */
    bool     hints;        /* the weight source has expert_request */
    bool     no_postfetch; /* from the options */
    bool     no_prefetch;  /* from the options */
    bool     history;      /* from the options: prefetch_history */
    uint32_t pf_top;       /* from the options: prefetch_top */
    /* Gate predictor's guesses by rank (the last counts every rank from there on), scored on
     * every batch it guessed for and halved now and then so they follow the run: with prefetch_top
     * 0 a rank is hinted while at least 85% of its guesses were picked. */
    uint32_t  pf_rank_pred[FWD_PF_RANKS], pf_rank_hit[FWD_PF_RANKS];
    uint32_t  window;          /* experts asked for ahead at once; 0 = all */
    float    *pred_logits;     /* owned: (n_batch, n_expert) selection scores (scratch) */
    int32_t  *pred_gate;       /* owned: (n_batch, n_expert_used) gate predictor's guess */
    int32_t   pred_gate_layer; /* layer pred_gate is for; -1 = none */
    int32_t  *prev_sel;        /* owned: (n_layer, n_expert_used) last token's choices */
    uint8_t  *have_prev;       /* owned: (n_layer) prev_sel of the layer is set */
    uint32_t *hint_mark;       /* owned: (n_expert) hint_stamp when last hinted */
    uint32_t  hint_stamp;
    struct executor_predictor_stats pred_stats[EXECUTOR_PRED_COUNT];
    /* The layers on a CUDA device (-ngl; gpu.c), NULL = all on the CPU. */
    struct executor_gpu *gpu; /* owned */
    /* Why the CPU's layers failed in the pass under way (an expert that could not be had);
     * cleared by fwd_batch and fwd_run_members, empty when the failure left no text. */
    struct common_errmsg err;
};

/* ---- small numeric helpers (llama.cpp CPU semantics) ------------------------------------- */

/* y = x / sqrt(mean(x^2) + eps) * w, the sum of squares accumulated in double as ggml does. */
static inline void fwd_rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps)
{
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (uint32_t i = 0; i < n; i++)
        y[i] = (x[i] * scale) * w[i];
}

static inline float fwd_silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* In-place softmax as ggml_soft_max: exp in float, sum in double, scaled by (float)(1/sum). */
static inline void fwd_softmax(float *x, uint32_t n)
{
    float max = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += (double)x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (uint32_t i = 0; i < n; i++)
        x[i] *= inv;
}

/* fwd_softmax with an attention sink: the sink logit takes part in the max and the sum, not in
 * the output (ggml_soft_max_add_sinks). */
static inline void fwd_softmax_sink(float *x, uint32_t n, float sink)
{
    float max = sink;
    for (uint32_t i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += (double)x[i];
    }
    sum += (double)expf(sink - max);
    const float inv = (float)(1.0 / sum);
    for (uint32_t i = 0; i < n; i++)
        x[i] *= inv;
}

/* ---- parallel building blocks (forward.c) ------------------------------------------------- */

/* One matrix product of a job: y[j * y_stride + r] = W[r] . act_j. */
struct fwd_mm {
    const void *w;
    uint32_t    type;
    int64_t     rows, cols;
    size_t      row_bytes;
    const void *act;
    size_t      act_stride;
    int64_t     n_act;
    float      *y;
    size_t      y_stride;
    float       out_scale; /* multiplies every output; 0 = none (struct executor_mat) */
};

/* Up to three products sharing one parallel loop over their concatenated rows. */
struct fwd_mm_job {
    struct fwd_mm t[3];
    int           n;
    int64_t       start[4]; /* first concatenated row of each product, start[n] = total */
};

/* The product of weights `w` with n_act activation rows, into y. */
static inline struct fwd_mm fwd_mm_of(const struct executor_mat *w, const void *act,
                                      size_t act_stride, int64_t n_act, float *y, size_t y_stride)
{
    return (struct fwd_mm){.w = w->data,
                           .type = w->type,
                           .rows = w->rows,
                           .cols = w->cols,
                           .row_bytes = w->row_bytes,
                           .act = act,
                           .act_stride = act_stride,
                           .n_act = n_act,
                           .y = y,
                           .y_stride = y_stride,
                           .out_scale = w->out_scale};
}

/* Runs the products of `job` as one parallel loop over their concatenated rows. */
void executor_fwd_mm_run(struct executor_ctx *c, struct fwd_mm_job *job);
/* Converts n rows of x to the activation type of weights of `type` into act slot `slot`;
 * returns the row stride in bytes. */
size_t executor_fwd_quantize(struct executor_ctx *c, int slot, uint32_t type, const float *x,
                             size_t x_stride, int64_t n, int64_t cols);
/* gate/up products of rows `xin` (n rows of n_embd) into c->ga / c->up, then ga = silu(ga) * up. */
void executor_fwd_swiglu_gate_up(struct executor_ctx *c, const float *xin, uint32_t n,
                                 const struct executor_mat *gate, const struct executor_mat *up);
/* gpt-oss's expert gate/up with the expert's biases gb, ub (n_ff each) and the clamped SwiGLU
 * into c->ga. */
void executor_fwd_oai_gate_up(struct executor_ctx *c, const float *xin, uint32_t n,
                              const struct executor_mat *gate, const struct executor_mat *up,
                              const float *gb, const float *ub);
/* The down product of c->ga (n rows of down->cols) into c->tmp. */
void executor_fwd_swiglu_down(struct executor_ctx *c, uint32_t n, const struct executor_mat *down);
/* A dense FFN's gate/up into c->ga: silu(g) * u or relu(g)^2 * u (ffn_relu2), then the
 * ffn_sub_norm over each row when sub_norm is not NULL (bitnet). */
void executor_fwd_dense_gate_up(struct executor_ctx *c, const float *xin, uint32_t n,
                                const struct executor_mat *gate, const struct executor_mat *up,
                                const float *sub_norm);
/* A dense FFN streamed as expert 0 of layer il (common_model_stream_dense) for the n rows of
 * c->xn, added to c->x; the next layers' FFNs asked for ahead. Returns 0 or an error of the
 * weight source. */
int executor_fwd_ffn_streamed(struct executor_ctx *c, uint32_t il, uint32_t n);

/* ---- the MoE layer (moe.c) ---------------------------------------------------------------- */

/* The MoE feed-forward of layer `il` for the n normalised rows in c->xn: routing, post-fetch,
 * prefetch hints, the experts computed in waves, their weighted sum added to c->x. Returns 0 or
 * an error of the weight source. */
int executor_fwd_moe(struct executor_ctx *c, uint32_t il, uint32_t n);
/* The CPU's whole feed-forward block of layer il for the n rows of c->x (its norm, then MoE or
 * dense FFN, added to x): the layers of --n-cpu-moe run it between the device's attention
 * blocks. Returns 0 or an error of the weight source (text in c->err). */
int executor_fwd_cpu_ffn(struct executor_ctx *c, uint32_t il, uint32_t n);
/* Says in c->err which part of which expert could not be had (rc), and why when the weight
 * source knows (the file, offset and checksum of a failed load); returns rc. */
int executor_moe_acquire_failed(struct executor_ctx *c, uint32_t il, uint32_t e, int part, int rc);
/* Routed expert e of layer il over the cnt rows of c->gx (cnt <= n_batch): its outputs, its
 * bias added, unweighted, in c->tmp (cnt rows of n_embd). Returns 0 or the weight source's
 * error (message in c->err). */
int executor_moe_expert_rows(struct executor_ctx *c, uint32_t il, uint32_t e, int32_t cnt);

#endif /* EXECUTOR_FORWARD_IMPL_H */
