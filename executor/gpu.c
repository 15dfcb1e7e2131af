/* executor/gpu.c - the forward pass's last layers (and the head) on a CUDA device: weights
 * uploaded once, an f16 KV cache and scratch in device memory, one kernel of cuda/gpu.h per step.
 * The layers before the device's run on the CPU (forward.c), as llama.cpp's -ngl places them. */
#include "gpu.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpu.h"

/* Device d's name ("CUDA0", "CPU") for a message. */
#define GPU_DEVNAME(d) gpu_device_name((d), (char[16]){0}, 16)

#define GPU_GEMM_MIN_N   17   /* from this many rows on, products go through the f16 matmul */
#define GPU_GEMM_ROWS    4096 /* weight rows dequantized to f16 at once for the matmul */
#define GPU_MARGIN_BYTES ((size_t)256 << 20) /* device memory left free (CUDA context, graphs) */

/* A weight matrix in device memory. */
struct gpu_mat {
    void    *d; /* NULL: absent */
    uint32_t type;
    int64_t  rows, cols;
    size_t   row_bytes;
    float    scale; /* multiplies every output; 0 = none (bitnet's per-tensor scales) */
};

/* A decode step's graph (executor_gpu.shapes): its members' parts by serial, in row
 * order; graph NULL = none captured yet. */
#define GPU_GRAPH_SHAPES 8
struct gpu_shape_graph {
    struct gpu_graph *graph;
    uint32_t          n_mb;
    uint64_t          serial[EXECUTOR_GPU_ROW_EXACT];
    uint64_t          used;  /* shape_clock when it last ran */
    bool              stale; /* graph is another set's of as many members: captured again, it is
                                updated in place (cheaper than a new one) */
};

/* Every routed expert of one part of a layer, expert e at d + e * bytes; in a pool
 * (--vram-budget), the part of the expert in slot s at d + s * bytes (d: the pool plus the
 * part's offset in a slot, bytes: a slot's). */
struct gpu_experts {
    void    *d;
    uint32_t type;
    int64_t  rows, cols;
    size_t   row_bytes, bytes;
};

struct gpu_layer {
    float         *attn_norm, *ffn_norm, *q_norm, *k_norm, *bq, *bk, *bv, *exp_probs_b;
    float         *attn_sub_norm, *ffn_sub_norm; /* bitnet: before wo, before down */
    uint32_t       q_norm_n, k_norm_n;
    struct gpu_mat wq, wk, wv, wo, gate, up, down, gate_inp, sh_gate, sh_up, sh_down;
    struct gpu_mat sh_gate_inp; /* qwen2moe: the shared expert's sigmoid gate (one row) */
    /* Latent attention (deepseek2, as executor_layer_w): wq or wq_a, q_a_norm, wq_b; wkv_a and
     * kv_a_norm; wk_b and wv_b of n_head blocks of rows. */
    struct gpu_mat wq_a, wq_b, wkv_a, wk_b, wv_b;
    float         *q_a_norm, *kv_a_norm;
    float         *sinks, *bo; /* gpt-oss: attention sinks (n_head), the output's bias */
    float         *gate_inp_b; /* gpt-oss: the router's bias (n_expert) */
    /* gpt-oss: the routed experts' biases (n_expert rows of n_ff_exp, n_ff_exp, n_embd); with
     * gate's, the clamped SwiGLU (gpu_swiglu_oai) as the CPU's executor_fwd_oai_gate_up */
    float             *gate_exps_b, *up_exps_b, *down_exps_b;
    struct gpu_experts exps[COMMON_EXPERT_PART_COUNT];
    bool               swa;
    /* --n-cpu-moe, or the CPU backend's streamed experts or dense FFN (gpu_ffn_streamed): its
     * FFN runs on the CPU's path (nothing of it here) */
    bool               cpu_moe;
    bool               pooled;  /* its experts are in the pool, by slot */
};

#define GPU_POOL_LOANS 3  /* weight-source loans held while their copies are in flight */
#define GPU_POOL_PINS  64 /* regions of the weight source registered at once (one per fetcher) */
#define GPU_POOL_TRIES 8  /* rounds done again when a loan's bytes changed during its copy */
/* A lost fetchers' pool: how soon a failed retake is tried again, and how many failed tries in a
 * row end the tries. */
#define GPU_POOL_RETAKE_NS    250000000ull
#define GPU_POOL_RETAKE_TRIES 3
/* The pool's copy events by index: the loans', then the round's gate/up and down. */
enum { GPU_EV_GU = GPU_POOL_LOANS, GPU_EV_D, GPU_POOL_EVENTS };

/* A part of an expert lent by the weight source while its copy into the pool is in flight. */
struct gpu_loan {
    struct gpu_event *ev; /* recorded after its copy */
    uint32_t          k;  /* its event index */
    uint32_t          src_slot, slot;
    bool              on;
};

/* --vram-budget: the routed experts of the device's layers in a pool of slots, one expert's
 * parts each (at its layer's offsets), copied in from the weight source when the router picks
 * an expert that is not there, into an empty slot or the least recently used one. A step's
 * tokens are computed in rounds whose experts fit in the pool together; a round pins its slots,
 * so that none of them is given up for another of the same round. A round's missing experts are
 * copied on the copy stream, gate and up first (event gu) then down (event d); the kernels wait
 * for gu, compute gate and up while down is in flight, wait for d; event k after them orders
 * the copies of the next round (which may give up these slots) behind them. The weight source's
 * loans are held until their copies are done, at most GPU_POOL_LOANS at once. The lock is held
 * from the lookup to the last kernel over the slots. */
struct gpu_xpool {
    pthread_mutex_t mu;
    uint8_t        *d;
    size_t          slot_bytes;
    uint32_t        n_slots, n_expert;
    int32_t        *slot_of; /* il * n_expert + x -> its slot, or -1 */
    uint32_t       *owner;   /* slot -> il * n_expert + x, or UINT32_MAX: empty */
    uint64_t       *last;    /* slot -> the tick of its last use */
    /* --policy lfu: slot -> its expert's use count, decayed by half every lfu_half ticks, as of
     * tick lfu_at (the fetcher's pool counts the same way); NULL under lru */
    double           *lfu;
    uint64_t         *lfu_at;
    double            lfu_half;
    uint64_t         *pin;                     /* slot -> the round that uses it */
    uint64_t         *mark;                    /* expert -> the round that counted it */
    uint32_t         *miss_x, *miss_s, n_miss; /* this round's experts to copy in, their slots */
    struct gpu_event *ev_gu, *ev_d, *ev_k;
    struct gpu_loan   loans[GPU_POOL_LOANS];
    uint32_t          loan_next;
    uint64_t          tick, round;
    uint64_t          hits, misses, copied, redone;
    /* --expert-miss: a decode round's missing experts computed on the CPU instead. */
    enum executor_expert_miss miss_mode;
    uint64_t                 *cpu_mark;  /* expert -> the round that computes it on the CPU */
    bool                     *cpu_clean; /* expert -> it was in RAM when chosen: a clean sample
                                            of the CPU's rate (no storage wait in it) */
    double   copy_ns_b;                  /* measured ns per byte copied in (auto) */
    double   cpu_ns_b;                   /* the CPU's ns per expert byte; 0 = not measured */
    uint64_t cpu_misses;                 /* picks computed on the CPU */
    /* The weight source's regions (its RAM pools: one in a process, one per fetcher through the
     * daemons, remapped when a fetcher restarts) registered as pinned memory: copies from them go
     * by DMA, copies from elsewhere read pageable memory (pin_err says why the last registration
     * failed). reg_mu guards them; it is taken under mu or a weight source's lock, and takes no
     * other lock. */
    pthread_mutex_t reg_mu;
    struct gpu_pin {
        const void *base;
        size_t      bytes;
    } pins[GPU_POOL_PINS];
    uint32_t n_pins;
    uint64_t pinned_bytes, pin_adds, pin_removes;
    char     pin_err[160];
    /* gpu_copy_times when the pool was made (the backend's are the process's). */
    uint64_t busy0_ns, stall0_ns;
    /* The slots' device memory: address space for all of them reserved once and backed chunk
     * by chunk, in slot order, as slots are first filled (va_chunk 0: one plain allocation). */
    size_t   va_chunk, va_bytes;
    uint32_t va_mapped; /* chunks backed */
    /* The pool in the fetchers (DESIGN section 8): its memory the fetchers' device pool, mapped
     * here (dev_mem; pieces made here once they are gone), its copies run by the fetchers on
     * their copy streams (dev, while they live): copy, record and wait go through the weight
     * source's device ops. remote[k]: event k's last record is the fetchers' marks, else this
     * process's. lost: a fetcher went away during the round, which is then done again with
     * every slot emptied (its copies may not have happened). */
    const struct executor_dev_ops *dev, *dev_mem;
    void                          *dev_arg;
    struct executor_dev_pool       dp;
    bool                           remote[GPU_POOL_EVENTS];
    bool                           lost;
    /* A pool that stages (dp.stages): a miss not in the fetchers' RAM pools is read from storage
     * by its fetcher (dev->read), not asked of the weight source. A mark that says a read or copy
     * failed (stage_failed) has the round done again through the RAM pools (stage_off), where
     * the source says what is wrong; failing again there, the executor copies from then on. */
    bool                           stage, stage_failed, stage_off;
    uint64_t                       staged, stage_failures;
    /* Once lost, the fetchers' pool is taken back when they all run again (dev_mem->retake,
     * gpu_pool_retake). */
    uint64_t retake_at; /* the last failed try (0: none) */
    uint64_t retakes;
    uint32_t retake_fails; /* failed tries in a row */
    bool     retake_off;   /* given up (copies failed twice, or GPU_POOL_RETAKE_TRIES failed
                              tries): never taken back */
    uint64_t                       dev_losses;
    uint64_t                       dev_wait_ns;  /* in gpu_pool_wait for the fetcher's marks */
    char                           dev_why[160]; /* why the pool is not the fetcher's */
    /* The pool holding the weight source's region hooks (the pins, made portable, serve every
     * device's copies): the first device's pool, itself; the others point to it. */
    struct gpu_xpool *pin_src;
    int32_t           dev_id;  /* its device */
};

/* The fetcher's copies end: from now on this process copies into the pool's memory itself. */
static void gpu_pool_lose(struct gpu_xpool *px)
{
    if (px->dev) {
        px->dev = NULL;
        px->lost = true;
        px->dev_losses++;
        snprintf(px->dev_why, sizeof(px->dev_why), "the fetcher that filled it went away");
    }
}

/* A lost fetchers' pool taken back when every fetcher runs again (restarted): they copy from the
 * next copies on. Tried at each round while a fetcher is down (a cheap look), at most every
 * GPU_POOL_RETAKE_NS after a failed try, and no more after GPU_POOL_RETAKE_TRIES failed tries in
 * a row (a retake that cannot work, such as a device that does not export what it imported, is
 * not tried forever). The caller holds the pool's lock at a round's start. */
static void gpu_pool_retake(struct gpu_xpool *px)
{
    if (px->dev || !px->dev_mem || !px->dev_mem->retake || px->retake_off ||
        (px->retake_at && common_now_ns() - px->retake_at < GPU_POOL_RETAKE_NS))
        return;
    struct common_errmsg     e = {{0}};
    struct executor_dev_pool dp = px->dp;
    const int                rc = px->dev_mem->retake(px->dev_arg, &dp, &e);
    if (rc != 0) {
        if (rc != COMMON_EAGAIN) {
            px->retake_at = common_now_ns();
            px->retake_off = ++px->retake_fails >= GPU_POOL_RETAKE_TRIES;
            COMMON_LOG_WARN("executor.gpu", "the fetchers' device pool is not taken back: %s%s",
                            e.text,
                            px->retake_off ? "; the executor fills it itself from now on" : "");
        }
        return;
    }
    px->retake_fails = 0;
    px->dp = dp;
    px->dev = px->dev_mem;
    px->stage = dp.stages && px->dev->read;
    px->stage_off = px->stage_failed = false;
    memset(px->remote, 0, sizeof(px->remote));
    px->dev_why[0] = '\0';
    px->retakes++;
    COMMON_LOG_INFO("executor.gpu",
                    "the fetchers run again: they copy the experts into the device "
                    "pool again%s",
                    px->stage ? " (from their RAM pools or from storage)" : "");
}

/* Whether a round's misses not in the fetchers' RAM pools are read from storage by them now. */
static bool gpu_pool_stages(const struct gpu_xpool *px)
{
    return px->dev && px->stage && !px->stage_off && px->dev->read;
}

static struct gpu_event *gpu_pool_event(struct gpu_xpool *px, uint32_t k)
{
    return k < GPU_POOL_LOANS ? px->loans[k].ev : k == GPU_EV_GU ? px->ev_gu : px->ev_d;
}

/* Queues a copy into the pool: the fetcher's, or this process's. */
static int gpu_pool_copy(struct gpu_xpool *px, void *dst, const void *src, size_t bytes)
{
    if (px->dev) {
        if (px->dev->copy(px->dev_arg, (size_t)((uint8_t *)dst - px->d), src, bytes) == 0)
            return 0;
        gpu_pool_lose(px);
    }
    return gpu_copy_async(dst, src, bytes);
}

/* Records event k after the copies queued so far. */
static int gpu_pool_record(struct gpu_xpool *px, uint32_t k)
{
    px->remote[k] = false;
    if (px->dev) {
        if (px->dev->mark(px->dev_arg, k) == 0) {
            px->remote[k] = true;
            return 0;
        }
        gpu_pool_lose(px);
    }
    return gpu_event_record_copy(gpu_pool_event(px, k));
}

/* The kernels queued next wait for event k (host: the caller waits for it). A fetcher gone
 * meanwhile waits for nothing: the round is done again. */
static int gpu_pool_wait(struct gpu_xpool *px, uint32_t k, bool host)
{
    if (!px->remote[k])
        return host ? gpu_event_sync(gpu_pool_event(px, k))
                    : gpu_stream_wait(gpu_pool_event(px, k));
    if (host)
        px->remote[k] = false;
    const uint64_t              t0 = common_now_ns();
    int                         rc = -2;
    struct common_devmem_event *evs[EXECUTOR_DEV_MAX_FETCHERS];
    uint32_t                    n = 0;
    const int ready = px->dev ? px->dev->ready(px->dev_arg, k, evs, &n) : COMMON_ECLOSED;
    if (ready == COMMON_EIO) { /* a staged read failed: the round is done again */
        px->stage_failed = true;
        px->stage_failures++;
    }
    if (ready == 0 || ready == COMMON_EIO) {
        rc = 0;
        for (uint32_t i = 0; i < n && rc == 0; i++)
            if (!host)
                rc = gpu_stream_wait_shared(evs[i]); /* -2: its fetcher died meanwhile */
            else if (common_devmem_event_sync(evs[i], NULL) != 0)
                rc = -2;
    }
    px->dev_wait_ns += common_now_ns() - t0;
    if (rc != -2)
        return rc;
    gpu_pool_lose(px);
    return 0;
}

/* The copies queued next wait for the kernels queued so far (event k of the round's end). */
static int gpu_pool_after_kernels(struct gpu_xpool *px)
{
    if (px->dev) {
        if (px->dev->after(px->dev_arg) == 0)
            return 0;
        gpu_pool_lose(px);
    }
    return gpu_copy_wait(px->ev_k);
}

/* Device allocations freed together. */
struct gpu_allocs {
    void **p;
    size_t n, cap;
};

/* The weights on the device, shared by every ctx of the model. */
struct executor_gpu_weights {
    const struct executor_model *m;
    int32_t                      dev;
    struct gpu_info              info;
    uint32_t                     il0, il1;  /* the device's layers: il0 .. il1 - 1 */
    uint32_t                     n_cpu_moe; /* layers below it keep their MoE on the CPU */
    bool                         streamed;  /* gpu_ffn_streamed: the FFNs streamed on the CPU */
    bool                         head;
    /* The next device's layers (owned), from il1 on; NULL on the last device (several devices:
     * --device, --tensor-split). */
    struct executor_gpu_weights *next;
    struct gpu_layer            *layers; /* n_layer entries; those from il0 to il1 are filled */
    struct gpu_mat               output;
    float                       *output_norm;
    struct gpu_allocs            mem;
    size_t                       bytes;
    size_t                       expert_bytes; /* every routed expert of the device's layers */
    struct gpu_xpool            *pool;         /* NULL: every expert uploaded */
};

/* One sequence's side: its KV cache and the scratch of a batch. */
struct executor_gpu {
    const struct executor_gpu_weights *w;     /* borrowed, or own_w */
    struct executor_gpu_weights       *own_w; /* owned when made for this ctx alone */
    const struct executor_model       *m;
    int32_t                            dev;
    uint32_t                           il0, il1;
    bool                               head;
    uint32_t                           n_ctx, n_batch;
    struct executor_gpu *next; /* the sequence on the next device's weights (owned), or NULL */
    struct executor_gpu_member *h_mb; /* a step's members on the next devices (n_batch) */
    void **k_cache, **v_cache; /* per layer (from il0): (n_ctx, kd), (n_ctx, vd) f16 values, or
                                  with kv_q8 their q8_0 blocks (gpu_kv_store_q8) */
    bool      kv_q8;              /* --cache-type q8_0 */
    uint32_t *kv_cap;             /* per layer: positions its cache holds, a ring of them (p in
                                     cell p % cap) where fewer than n_ctx (gpu_attention_ring) */
    /* Scratch (n_batch rows of the widths in gpu_need). */
    float   *x, *xn, *q, *k, *v, *att, *tmp, *ga, *up, *gx, *moe_y, *router, *sel_w, *cs;
    float   *att_scratch, *logits, *xq;
    float   *mla_qa, *mla_q, *mla_kv, *mla_o; /* latent attention (gpu_widths.mla), else NULL */
    int32_t *mla_heads; /* latent attention: item i's head, i % n_head (gpu_heads_of) */
    uint8_t *xq8;       /* the q8 image of activations for gpu_matvec_q8 (gpu_q8_for) */
    /* What g->xq8 holds (gpu_q8_for): rows x_src .. of cols, quantized as q8_vdt; reused by the
     * next product over the same rows only while q8_reuse is set (the callers set it around
     * products that share their input: q, k, v; gate, up). */
    const float *q8_src;
    int64_t      q8_stride, q8_cols;
    uint32_t     q8_n, q8_vdt;
    bool         q8_reuse;
    /* The image is of g->xn as the last norm wrote it (gpu_norm_xn fused the two): every product
     * over g->xn reuses it until another image is made. */
    bool         q8_keep;
    bool         fuse_off; /* SLUICE_NO_FUSION: norms, RoPE and quantization in separate kernels */
    bool         mv_only;    /* products of any row count on the matvec kernels (gpu_moe_grouped) */
    bool         gemm_q_off; /* SLUICE_NO_GEMM_Q: matmuls over f16 copies of the weights */
    bool         mm_only;    /* products of any row count on the matmul (gpu_moe_grouped) */
    bool         device_sort; /* SLUICE_MOE_DEVICE_SORT: gpu_moe_tiles sorts on the device */
    /* From this many rows on, products go through the matmul: GPU_GEMM_MIN_N, or never where the
     * backend's int8 products take any row count (gpu_matvec_any_rows, the CPU's); the rows of
     * one int8 product call: GPU_MATVEC_MAX_N, or all of them there. */
    uint32_t gemm_min_n, mv_max_n;
    /* Decode steps (one token a sequence) this part leads, as CUDA graphs (gpu_graph_step): a
     * graph per set of members (one per shape; this sequence alone is one), captured at its first
     * step and replayed after, the least recently used one replaced; member i's position read
     * from pos_d[i]. */
    struct gpu_shape_graph shapes[GPU_GRAPH_SHAPES];
    uint64_t               shape_clock;
    uint64_t               serial;    /* this part's, unique in the process (a shape's key) */
    uint32_t              *pos_d;     /* n_batch positions */
    uint32_t              *h_pos;     /* their host copy (n_batch), at the start of h_in */
    /* A step's inputs, uploaded from here: the positions, then up to in_rows rows of x and of
     * the RoPE table (h_x, h_cs). Registered with the device (in_pinned), the uploads of a step
     * of up to in_rows rows are queued without a wait (gpu_upload_queued) and run before its
     * kernels; in_queued: such copies may still be in flight (synchronised before h_in is
     * written again). Not registered, every upload waits, as gpu_upload does. */
    uint8_t          *h_in;
    float            *h_x, *h_cs;
    uint32_t          in_rows;
    bool              in_pinned, in_queued;
    int32_t          *n_tiles_d; /* gpu_moe_sort's count of tiles */
    bool              capturing, graph_off;
    uint64_t          graph_steps;
    int32_t          *sel, *items, *rows;
    uint16_t         *x16, *w16;
    /* Host copies for the grouping of a prefill's experts. */
    int32_t *h_sel, *h_items, *h_rows, *h_start, *h_count;
    /* A prefill's (token, expert) items in groups of up to GPU_GROUP_MAX per expert, twice:
     * rows of xn for gate and up, then rows of the items for down (gpu_moe_groups). */
    struct gpu_group *groups, *h_groups;
    struct gpu_allocs mem;
    size_t            bytes_kv, bytes_scratch;
};

/* ------------------------------------------------------------------------------------------ */
/* What runs on the device                                                                     */
/* ------------------------------------------------------------------------------------------ */

static const char *gpu_type_name(uint32_t type)
{
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    return ti ? ti->name : "unknown";
}

static bool gpu_mat_ok(const struct executor_mat *w)
{
    return !w->data || gpu_type_supported(w->type);
}

#define GPU_LAYER_MATS     17
#define GPU_LAYER_MATS_ATT 12 /* the first ones: attention and a dense FFN */

/* The matrices of a layer but its routed experts into ms (GPU_LAYER_MATS), those of attention
 * and of a dense FFN first (GPU_LAYER_MATS_ATT), then the router and the shared expert. */
static size_t gpu_layer_mats(const struct executor_layer_w *lw, const struct executor_mat **ms)
{
    const struct executor_mat *all[GPU_LAYER_MATS] = {
        &lw->wq,       &lw->wk,      &lw->wv,    &lw->wo,      &lw->gate,       &lw->up,
        &lw->down,     &lw->wq_a,    &lw->wq_b,  &lw->wkv_a,   &lw->wk_b,       &lw->wv_b,
        &lw->gate_inp, &lw->sh_gate, &lw->sh_up, &lw->sh_down, &lw->sh_gate_inp};
    memcpy(ms, all, sizeof(all));
    return GPU_LAYER_MATS;
}

/* Whether layer il's MoE stays on the CPU (--n-cpu-moe): a layer with routed experts, below
 * n_cpu_moe. */
static bool gpu_cpu_moe(const struct executor_model *m, uint32_t il, uint32_t n_cpu_moe)
{
    return il < n_cpu_moe && m->layers[il].gate_inp.data != NULL;
}

const char *executor_gpu_unsupported(const struct executor_model *m, int32_t n_cpu_moe, char *buf,
                                     size_t len)
{
    const struct common_hparams *hp = &m->desc->hp;
    const uint32_t               cpu_moe = n_cpu_moe > 0 ? (uint32_t)n_cpu_moe : 0;
    /* Whether some layer's MoE would run on the device (the rest of the checks below that are
     * about the MoE concern those layers only). */
    bool moe_here = false;
    for (uint32_t il = 0; il < hp->n_layer; il++)
        moe_here = moe_here || (m->layers[il].gate_inp.data && !gpu_cpu_moe(m, il, cpu_moe));
    if (moe_here && (hp->sub_norms || hp->ffn_relu2) && hp->n_expert)
        return "routed experts with sub-norms or relu^2 are not on the CUDA path yet";
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const struct executor_layer_w *lw = &m->layers[il];
        const bool                     moe = lw->gate_inp.data && !gpu_cpu_moe(m, il, cpu_moe);
        if (moe && (!lw->gate_exps_b) != (!lw->up_exps_b))
            return "routed experts with a bias on gate or up alone are not on the CUDA path";
        /* the CPU backend leaves a streamed FFN to the CPU's path (gpu_ffn_streamed) */
        for (int p = 0; lw->ffn_streamed && !gpu_weights_in_place() && p < COMMON_EXPERT_PART_COUNT;
             p++) {
            if (lw->exp_tail[p])
                return "a dense FFN streamed under --ram-budget with per-tensor I2_S scales is "
                       "not on the CUDA path yet";
            if (!gpu_type_supported(lw->exp[p].type)) {
                snprintf(buf, len,
                         "layer %u has a %s FFN matrix, which the CUDA path cannot read "
                         "yet",
                         il, gpu_type_name(lw->exp[p].type));
                return buf;
            }
        }
        const struct executor_mat *ms[GPU_LAYER_MATS];
        for (size_t i = 0; i < gpu_layer_mats(lw, ms); i++)
            if ((i < GPU_LAYER_MATS_ATT || moe) && !gpu_mat_ok(ms[i])) {
                snprintf(buf, len, "layer %u has a %s matrix, which the CUDA path cannot read yet",
                         il, gpu_type_name(ms[i]->type));
                return buf;
            }
        for (int p = 0; moe && p < COMMON_EXPERT_PART_COUNT; p++)
            if (lw->exp_scale[p] != 0.0f)
                return "per-tensor scales of routed experts are not on the CUDA path yet";
            else if (!gpu_type_supported(lw->exp[p].type)) {
                snprintf(buf, len, "layer %u's experts are %s, which the CUDA path cannot read yet",
                         il, gpu_type_name(lw->exp[p].type));
                return buf;
            }
    }
    if (!gpu_mat_ok(&m->output)) {
        snprintf(buf, len, "the output head is %s, which the CUDA path cannot read yet",
                 gpu_type_name(m->output.type));
        return buf;
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Creation                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static void *gpu_take(struct gpu_allocs *a, size_t bytes, size_t *counter)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        void **p = realloc(a->p, cap * sizeof(*p));
        if (!p)
            return NULL;
        a->p = p;
        a->cap = cap;
    }
    void *p = gpu_malloc(bytes);
    if (p) {
        a->p[a->n++] = p;
        *counter += bytes;
    }
    return p;
}

static void gpu_allocs_free(struct gpu_allocs *a)
{
    for (size_t i = 0; i < a->n; i++)
        gpu_free(a->p[i]);
    free(a->p);
    *a = (struct gpu_allocs){0};
}

/* A host buffer of the model uploaded to fresh device memory, or used where it is on a backend
 * that reads host memory (gpu_weights_in_place: the model outlives gw); NULL for a NULL source.
 * *ok is cleared on failure. */
static void *gpu_put(struct executor_gpu_weights *gw, const void *src, size_t bytes, bool *ok)
{
    if (!src || !*ok)
        return NULL;
    if (gpu_weights_in_place())
        return (void *)(uintptr_t)src; /* read only, as every weight is */
    void *d = gpu_take(&gw->mem, bytes, &gw->bytes);
    if (!d || gpu_upload(d, src, bytes) < 0) {
        *ok = false;
        return NULL;
    }
    return d;
}

static struct gpu_mat gpu_put_mat(struct executor_gpu_weights *gw, const struct executor_mat *w,
                                  bool *ok)
{
    struct gpu_mat d = {.type = w->type,
                        .rows = w->rows,
                        .cols = w->cols,
                        .row_bytes = w->row_bytes,
                        .scale = w->out_scale};
    d.d = gpu_put(gw, w->data, (size_t)w->rows * w->row_bytes, ok);
    return d;
}

static size_t gpu_mat_bytes(const struct executor_mat *w)
{
    return w->data ? (size_t)w->rows * w->row_bytes : 0;
}

/* Widths of the scratch, from the hyper-parameters. */
struct gpu_widths {
    size_t ne, qd, kd, vd, ad, ff, cols, n_vocab, E, K;
    size_t mla; /* the four scratch rows of latent attention together (gpu_put_scratch), or 0 */
};

static struct gpu_widths gpu_widths_of(const struct common_hparams *hp)
{
    struct gpu_widths w = {.ne = hp->n_embd,
                           .qd = (size_t)hp->n_head * hp->head_dim_k,
                           .kd = (size_t)hp->n_head_kv * hp->head_dim_k,
                           .vd = (size_t)hp->n_head_kv * hp->head_dim_v,
                           .ad = (size_t)hp->n_head * hp->head_dim_v,
                           .n_vocab = hp->n_vocab,
                           .E = hp->n_expert,
                           .K = hp->n_expert_used ? hp->n_expert_used : 1};
    size_t            ff = hp->n_ff;
    ff = (size_t)hp->n_ff_exp * w.K > ff ? (size_t)hp->n_ff_exp * w.K : ff;
    ff = hp->n_ff_shexp > ff ? hp->n_ff_shexp : ff;
    w.ff = ff;
    size_t cols = w.ne > w.ad ? w.ne : w.ad;
    cols = hp->n_ff > cols ? hp->n_ff : cols;
    cols = hp->n_ff_exp > cols ? hp->n_ff_exp : cols;
    cols = hp->n_ff_shexp > cols ? hp->n_ff_shexp : cols;
    cols = hp->n_lora_q > cols ? hp->n_lora_q : cols;
    cols = hp->n_lora_kv > cols ? hp->n_lora_kv : cols;
    cols = (size_t)hp->n_head * hp->head_dim_v_mla > cols ? (size_t)hp->n_head * hp->head_dim_v_mla
                                                          : cols;
    /* the latent path's per-head products: n_head rows of q_nope (or of the latent) a token */
    cols = (size_t)hp->n_head * hp->head_dim_k_mla > cols ? (size_t)hp->n_head * hp->head_dim_k_mla
                                                          : cols;
    w.cols = cols;
    if (hp->n_lora_kv)
        w.mla = hp->n_lora_q + (size_t)hp->n_head * hp->head_dim_k_mla + hp->n_lora_kv + hp->n_rot +
                (size_t)hp->n_head * hp->head_dim_v_mla + hp->n_head; /* + the heads' ids */
    return w;
}

/* Bytes of one routed expert of layer il, its parts together. */
static size_t gpu_expert_bytes(const struct executor_model *m, uint32_t il)
{
    const struct executor_layer_w *lw = &m->layers[il];
    size_t                         b = 0;
    for (int p = 0; lw->gate_inp.data && p < COMMON_EXPERT_PART_COUNT; p++)
        b += (size_t)lw->exp[p].rows * lw->exp[p].row_bytes;
    return b;
}

/* The slots of a pool of `budget` bytes for the routed experts of the layers il0 .. il1 - 1 but
 * the first n_cpu_moe, each the size of the largest expert (*slot_bytes); -1 when there is no pool:
 * no budget, or every expert fits in it (they are then all uploaded). *all: those experts'
 * bytes. */
static int64_t gpu_pool_slots(const struct executor_model *m, uint32_t il0, uint32_t il1,
                              uint32_t n_cpu_moe, uint64_t budget, size_t *slot_bytes, size_t *all)
{
    const struct common_hparams *hp = &m->desc->hp;
    size_t                       largest = 0, sum = 0;
    for (uint32_t il = il0; il < il1; il++) {
        if (gpu_cpu_moe(m, il, n_cpu_moe))
            continue;
        const size_t b = gpu_expert_bytes(m, il);
        sum += b * hp->n_expert;
        largest = b > largest ? b : largest;
    }
    *all = sum;
    *slot_bytes = largest;
    if (!budget || !largest || budget >= sum)
        return -1;
    return (int64_t)(budget / largest); /* fewer than the experts: budget < sum */
}

/* Device bytes of the weights of the layers il0 .. il1 - 1 (and of the head), without the MoE of
 * the layers below n_cpu_moe, the routed experts in a pool of vram_budget bytes when they do not
 * all fit in it. */
static size_t gpu_need_weights(const struct executor_model *m, uint32_t il0, uint32_t il1,
                               bool head, uint32_t n_cpu_moe, uint64_t vram_budget)
{
    const struct common_hparams *hp = &m->desc->hp;
    const struct gpu_widths      w = gpu_widths_of(hp);
    size_t                       slot_bytes, all;
    const int64_t n_slots = gpu_pool_slots(m, il0, il1, n_cpu_moe, vram_budget, &slot_bytes, &all);
    size_t        wb = n_slots > 0 ? (size_t)n_slots * slot_bytes : 0;
    if (gpu_weights_in_place()) /* the model's memory: only the pool's slots are the device's */
        return wb;
    for (uint32_t il = il0; il < il1; il++) {
        const struct executor_layer_w *lw = &m->layers[il];
        const bool                     cpu = gpu_cpu_moe(m, il, n_cpu_moe);
        const struct executor_mat     *ms[GPU_LAYER_MATS];
        /* Attention and a dense FFN always; the router and the shared expert only with the MoE
         * on the device. */
        for (size_t i = 0; i < gpu_layer_mats(lw, ms); i++)
            wb += i < GPU_LAYER_MATS_ATT || !cpu ? gpu_mat_bytes(ms[i]) : 0;
        for (int p = 0; lw->ffn_streamed && p < COMMON_EXPERT_PART_COUNT; p++)
            wb += (size_t)lw->exp[p].rows * lw->exp[p].row_bytes; /* uploaded from the source */
        if (!cpu && n_slots < 0)
            wb += (size_t)hp->n_expert * gpu_expert_bytes(m, il);
        wb += (4 * w.ne + w.qd + w.kd + w.vd + 2 * w.E) * sizeof(float);
        if (lw->attn_sub_norm)
            wb += w.ad * sizeof(float);
        if (lw->ffn_sub_norm)
            wb += (size_t)hp->n_ff * sizeof(float);
        if (lw->q_a_norm)
            wb += (size_t)hp->n_lora_q * sizeof(float);
        if (lw->kv_a_norm)
            wb += (size_t)hp->n_lora_kv * sizeof(float);
        if (lw->sinks)
            wb += (size_t)hp->n_head * sizeof(float);
        if (lw->bo)
            wb += w.ne * sizeof(float);
        if (!cpu && lw->gate_exps_b)
            wb += 2 * (size_t)hp->n_ff_exp * w.E * sizeof(float);
        if (!cpu && lw->down_exps_b)
            wb += w.ne * w.E * sizeof(float);
    }
    if (head)
        wb += gpu_mat_bytes(&m->output) + w.ne * sizeof(float);
    return wb;
}

/* The most groups of a batch of n_batch tokens (gpu_moe_groups): each expert's items in groups
 * of GPU_GROUP_MAX, the last of each expert partial. */
static size_t gpu_max_groups(size_t n_batch, const struct gpu_widths *w)
{
    return n_batch * (w->K ? w->K : 1) / GPU_GROUP_MAX + w->E + 1;
}

/* Bytes of the q8 image scratch (g->xq8): as many activation rows as g->xq holds. */
static size_t gpu_q8_bytes(size_t n_batch, const struct gpu_widths *w)
{
    const size_t cols = w->ff > w->cols ? w->ff : w->cols;
    return n_batch * gpu_q8_row_bytes((int64_t)cols) + 16;
}

/* The device keeps a q8_0 KV cache: asked for, with head dims of multiples of 32 (the CPU
 * refuses q8_0 for others). */
static bool gpu_kv_is_q8(const struct common_hparams *hp, enum common_cache_type kv)
{
    return kv == COMMON_CACHE_Q8_0 && hp->head_dim_k % 32 == 0 && hp->head_dim_v % 32 == 0;
}

/* Bytes of one position's `width` cached values: f16, or q8_0 blocks of 32 (34 bytes). */
static size_t gpu_kv_bytes(size_t width, bool q8)
{
    return q8 ? width / 32 * 34 : width * sizeof(uint16_t);
}

/* Device bytes of one sequence's scratch (the KV cache aside). own_att: the CPU's kernels, whose
 * attention keeps its scores itself and which multiply any rows without the f16 buffers of the
 * matmul (no expert pool). */
static size_t gpu_need_scratch(const struct common_hparams *hp, bool head, uint32_t n_ctx,
                               uint32_t n_batch, bool own_att)
{
    const struct gpu_widths w = gpu_widths_of(hp);
    const size_t            B = n_batch;
    size_t f = B * (5 * w.ne + w.qd + w.kd + w.vd + w.ad + 2 * w.ff + w.K * w.ne + w.E + w.K +
                    hp->n_rot + (w.ff > w.cols ? w.ff : w.cols) + w.mla);
    f += own_att ? 1 : B * hp->n_head * (size_t)n_ctx; /* attention scores */
    if (head)
        f += B * w.n_vocab;
    return f * sizeof(float) + 3 * B * w.K * sizeof(int32_t) +
           (own_att ? 2 : B * (w.ff > w.cols ? w.ff : w.cols) + GPU_GEMM_ROWS * w.cols) *
               sizeof(uint16_t) +
           gpu_q8_bytes(B, &w) + 2 * gpu_max_groups(B, &w) * sizeof(struct gpu_group);
}

/* Positions layer il's cache holds on the calling thread's device: a sliding-window layer's ring
 * (the CPU's: n_swa + n_batch, common_kv_layer_positions) where the backend attends over one
 * (gpu_attention_ring_supported), else the whole context. */
static size_t gpu_kv_positions(const struct executor_model *m, uint32_t il, uint32_t n_ctx,
                               uint32_t n_batch)
{
    return gpu_attention_ring_supported() && !getenv("SLUICE_NO_KV_RING")
               ? common_kv_layer_positions(&m->desc->hp, n_ctx, n_batch, il)
               : n_ctx;
}

/* Device bytes of one sequence: the KV cache of the layers il0 .. il1 - 1 and the scratch. */
static size_t gpu_need_ctx(const struct executor_model *m, uint32_t il0, uint32_t il1, bool head,
                           uint32_t n_ctx, uint32_t n_batch, enum common_cache_type kv)
{
    const struct common_hparams *hp = &m->desc->hp;
    const struct gpu_widths      w = gpu_widths_of(hp);
    const bool                   q8 = gpu_kv_is_q8(hp, kv);
    size_t                       kb = 0;
    for (uint32_t il = il0; il < il1; il++)
        kb += gpu_kv_positions(m, il, n_ctx, n_batch) *
              (gpu_kv_bytes(w.kd, q8) + (w.mla ? 0 : gpu_kv_bytes(w.vd, q8)));
    return kb + gpu_need_scratch(hp, head, n_ctx, n_batch, gpu_attention_own_scratch());
}

uint64_t executor_gpu_scratch_bytes(const struct common_hparams *hp, uint32_t n_ctx,
                                    uint32_t n_batch)
{
    return gpu_need_scratch(hp, true, n_ctx, n_batch, true); /* the CPU's kernels' */
}

/* Copies part p of expert x of layer il from the weight source to device memory at dst.
 * Returns 0, COMMON_EDEVICE (the copy failed) or the weight source's error, message in e. */
static int gpu_copy_expert(const struct executor_gpu_weights *gw, uint32_t il, uint32_t x,
                           enum common_expert_part p, void *dst, struct common_errmsg *e)
{
    const struct executor_expert_geom *geo = &gw->m->layers[il].exp[p];
    struct executor_weights           *w = gw->m->w;
    for (;;) {
        const void *data;
        uint32_t    slot;
        int         rc = w->ops->expert_acquire(w->impl, il, x, p, &data, &slot);
        if (rc < 0) {
            struct common_errmsg why = {{0}};
            if ((rc == COMMON_EIO || rc == COMMON_ECORRUPT) && w->ops->expert_error)
                w->ops->expert_error(w->impl, il, x, &why);
            if (why.text[0]) /* it names the file, the layer and the expert */
                return common_errmsg_set(e, rc, "%s", why.text);
            return common_errmsg_set(e, rc, "layer %u expert %u: %s", il, x, common_strerror(rc));
        }
        int up = gpu_upload(dst, data, (size_t)geo->rows * geo->row_bytes);
        /* A loan whose bytes changed meanwhile is read again. */
        if (w->ops->expert_release(w->impl, slot) == COMMON_EAGAIN)
            continue;
        if (up < 0)
            return common_errmsg_set(e, COMMON_EDEVICE, "%s: %s", GPU_DEVNAME(gw->dev),
                                     gpu_last_error());
        return 0;
    }
}

/* Where part p of every routed expert of layer il lies in host memory, one expert after another
 * `bytes` apart, when the weight source keeps them there (no pool: a loan stays where it is, as
 * the mapped file's do); NULL otherwise, or when an acquire fails (the copy then says why). */
static void *gpu_experts_in_place(const struct executor_gpu_weights *gw, uint32_t il,
                                  enum common_expert_part p, size_t bytes)
{
    struct executor_weights *w = gw->m->w;
    const uint8_t           *base = NULL;
    if (w->ops->expert_request)
        return NULL;
    for (uint32_t x = 0; x < gw->m->desc->hp.n_expert; x++) {
        const void *data;
        uint32_t    slot;
        if (w->ops->expert_acquire(w->impl, il, x, p, &data, &slot) < 0)
            return NULL;
        const bool moved = w->ops->expert_release(w->impl, slot) == COMMON_EAGAIN;
        base = x == 0 ? data : base;
        if (moved || (const uint8_t *)data != base + (size_t)x * bytes)
            return NULL;
    }
    return (void *)(uintptr_t)base;
}

/* Uploads every routed expert of one part of layer il, acquiring each from the weight source
 * (or, gpu_weights_in_place, uses them where they are). */
static int gpu_put_experts(struct executor_gpu_weights *gw, uint32_t il, enum common_expert_part p,
                           struct gpu_experts *out, struct common_errmsg *e)
{
    const struct executor_model       *m = gw->m;
    const struct executor_expert_geom *geo = &m->layers[il].exp[p];
    const uint32_t                     E = m->desc->hp.n_expert;
    *out = (struct gpu_experts){.type = geo->type,
                                .rows = geo->rows,
                                .cols = geo->cols,
                                .row_bytes = geo->row_bytes,
                                .bytes = (size_t)geo->rows * geo->row_bytes};
    if (gpu_weights_in_place() && (out->d = gpu_experts_in_place(gw, il, p, out->bytes)))
        return 0;
    if (!(out->d = gpu_take(&gw->mem, out->bytes * E, &gw->bytes)))
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: %s", GPU_DEVNAME(gw->dev),
                                 gpu_last_error());
    for (uint32_t x = 0; x < E; x++) {
        int rc = gpu_copy_expert(gw, il, x, p, (uint8_t *)out->d + (size_t)x * out->bytes, e);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Ends a loan: waits for its copy and gives the part back; a loan whose bytes changed during the
 * copy (*torn set) leaves its slot empty, so that the round copies it again. -1: the device
 * failed. */
static int gpu_loan_end(struct gpu_xpool *px, const struct executor_weights *w, struct gpu_loan *ln,
                        bool *torn)
{
    if (!ln->on)
        return 0;
    ln->on = false;
    const int rc = gpu_pool_wait(px, ln->k, true);
    if (w->ops->expert_release(w->impl, ln->src_slot) == COMMON_EAGAIN) {
        *torn = true;
        if (px->owner[ln->slot] != UINT32_MAX)
            px->slot_of[px->owner[ln->slot]] = -1;
        px->owner[ln->slot] = UINT32_MAX;
    }
    return rc;
}

/* Ends every loan. */
static int gpu_loans_end(struct gpu_xpool *px, const struct executor_weights *w, bool *torn)
{
    int rc = 0;
    for (uint32_t i = 0; i < GPU_POOL_LOANS; i++)
        rc |= gpu_loan_end(px, w, &px->loans[i], torn);
    return rc < 0 ? -1 : 0;
}

static void gpu_pool_destroy(struct gpu_xpool *px, const struct executor_weights *w)
{
    if (!px)
        return;
    bool torn = false;
    (void)gpu_loans_end(px, w, &torn);
    if (w->ops->expert_regions && px->pin_src == px)
        w->ops->expert_regions(w->impl, NULL); /* no more calls to the hooks below */
    if (px->dev_mem) {
        /* the fetcher's memory, once no kernel reads it */
        (void)gpu_sync();
        px->dev_mem->close(px->dev_arg);
    } else if (px->va_chunk) { /* once no kernel reads it (the copies ended with the loans above) */
        (void)gpu_sync();
        for (uint32_t k = 0; k < px->va_mapped; k++)
            gpu_va_unmap(px->d + (size_t)k * px->va_chunk, px->va_chunk);
        gpu_va_free(px->d, px->va_bytes);
    }
    for (uint32_t i = 0; i < px->n_pins; i++)
        gpu_host_unregister(px->pins[i].base);
    pthread_mutex_destroy(&px->reg_mu);
    for (uint32_t i = 0; i < GPU_POOL_LOANS; i++)
        gpu_event_free(px->loans[i].ev);
    gpu_event_free(px->ev_gu);
    gpu_event_free(px->ev_d);
    gpu_event_free(px->ev_k);
    pthread_mutex_destroy(&px->mu);
    free(px->slot_of);
    free(px->owner);
    free(px->last);
    free(px->lfu);
    free(px->lfu_at);
    free(px->pin);
    free(px->mark);
    free(px->miss_x);
    free(px->miss_s);
    free(px->cpu_mark);
    free(px->cpu_clean);
    free(px);
}

/* The weight source mapped a region expert loans point into: registered as pinned memory. */
static int gpu_pin_add(void *arg, const void *base, size_t bytes, bool read_only)
{
    struct gpu_xpool *px = arg;
    int               rc = -1;
    pthread_mutex_lock(&px->reg_mu);
    if (gpu_use(px->dev_id) < 0) { /* a fetcher link's thread: the pool's device */
        snprintf(px->pin_err, sizeof(px->pin_err), "%s", gpu_last_error());
    } else if (px->n_pins == GPU_POOL_PINS) {
        snprintf(px->pin_err, sizeof(px->pin_err), "more than %d regions", GPU_POOL_PINS);
    } else if (gpu_host_register(base, bytes, read_only) == 0) {
        px->pins[px->n_pins++] = (struct gpu_pin){base, bytes};
        px->pinned_bytes += bytes;
        px->pin_adds++;
        rc = 0;
    } else {
        snprintf(px->pin_err, sizeof(px->pin_err), "%s", gpu_last_error());
    }
    pthread_mutex_unlock(&px->reg_mu);
    return rc;
}

/* The weight source unmaps a region (no loan out on it, so no copy reads it): unregistered. */
static void gpu_pin_remove(void *arg, const void *base)
{
    struct gpu_xpool *px = arg;
    pthread_mutex_lock(&px->reg_mu);
    for (uint32_t i = 0; i < px->n_pins; i++)
        if (px->pins[i].base == base) {
            gpu_host_unregister(base);
            px->pinned_bytes -= px->pins[i].bytes;
            px->pins[i] = px->pins[--px->n_pins];
            px->pin_removes++;
            break;
        }
    pthread_mutex_unlock(&px->reg_mu);
}

/* ns per byte of a copy into the pool from where its copies come: the best of three copies of
 * one slot from the start of the weight source's first pinned region, else from a pageable
 * buffer (as the weight source's are), each waited for; 0 when it fails. reg_mu is held
 * throughout, so the region stays mapped. */
static double gpu_pool_copy_rate(struct gpu_xpool *px)
{
    struct gpu_xpool *pp = px->pin_src;
    pthread_mutex_lock(&pp->reg_mu);
    const bool     from_pinned = pp->n_pins > 0 && pp->pins[0].bytes >= px->slot_bytes;
    const uint8_t *pinned = from_pinned ? pp->pins[0].base : NULL;
    uint8_t       *own = from_pinned ? NULL : malloc(px->slot_bytes);
    const uint8_t *buf = from_pinned ? pinned : own;
    double         best = 0;
    if (!buf) {
        pthread_mutex_unlock(&pp->reg_mu);
        return 0;
    }
    if (own)
        memset(own, 1, px->slot_bytes);
    for (int k = 0; k < 3; k++) {
        const uint64_t t0 = common_now_ns();
        if (gpu_copy_async(px->d, buf, px->slot_bytes) < 0 ||
            gpu_event_record_copy(px->ev_gu) < 0 || gpu_event_sync(px->ev_gu) < 0) {
            best = 0;
            break;
        }
        const double ns_b = (double)(common_now_ns() - t0) / (double)px->slot_bytes;
        best = k == 0 || ns_b < best ? ns_b : best;
    }
    free(own);
    pthread_mutex_unlock(&pp->reg_mu);
    return best;
}

/* Backs the pool's slots up to slot s with device memory, a chunk at a time (slots are taken
 * empty in index order, so the backed chunks are a prefix). 0, or -1 (error recorded). */
static int gpu_pool_back(struct gpu_xpool *px, uint32_t s)
{
    const size_t end = ((size_t)s + 1) * px->slot_bytes;
    while (px->va_chunk && (size_t)px->va_mapped * px->va_chunk < end) {
        if (px->dev_mem
                ? px->dev_mem->back(px->dev_arg, px->va_mapped, NULL) < 0
                : gpu_va_map(px->d + (size_t)px->va_mapped * px->va_chunk, px->va_chunk) < 0)
            return -1;
        px->va_mapped++;
    }
    return 0;
}

/* The expert pool of n_slots slots of slot_bytes, empty (its device memory among gw's, or its
 * own reservation). */
static int gpu_pool_create(struct executor_gpu_weights *gw, struct gpu_xpool *pins_of,
                           uint32_t n_slots, size_t slot_bytes, enum executor_expert_miss miss_mode,
                           enum executor_pool_policy policy, struct common_errmsg *e)
{
    const bool                   first = pins_of == NULL;
    const struct common_hparams *hp = &gw->m->desc->hp;
    const size_t                 n_keys = (size_t)hp->n_layer * hp->n_expert;
    struct gpu_xpool            *px = calloc(1, sizeof(*px));
    if (!px || pthread_mutex_init(&px->mu, NULL) != 0) {
        free(px);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    if (pthread_mutex_init(&px->reg_mu, NULL) != 0) {
        pthread_mutex_destroy(&px->mu);
        free(px);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    gw->pool = px;
    px->pin_src = first ? px : pins_of;
    px->dev_id = gw->dev;
    px->slot_bytes = slot_bytes;
    px->n_slots = n_slots;
    px->n_expert = hp->n_expert;
    px->slot_of = malloc(n_keys * sizeof(*px->slot_of));
    px->owner = malloc((size_t)n_slots * sizeof(*px->owner));
    px->last = calloc(n_slots, sizeof(*px->last));
    px->pin = calloc(n_slots, sizeof(*px->pin));
    px->mark = calloc(hp->n_expert, sizeof(*px->mark));
    px->miss_x = calloc(hp->n_expert, sizeof(*px->miss_x));
    px->miss_s = calloc(hp->n_expert, sizeof(*px->miss_s));
    px->cpu_mark = calloc(hp->n_expert, sizeof(*px->cpu_mark));
    px->cpu_clean = calloc(hp->n_expert, sizeof(*px->cpu_clean));
    px->miss_mode = miss_mode;
    if (policy == EXECUTOR_POOL_LFU) {
        px->lfu = calloc(n_slots, sizeof(*px->lfu));
        px->lfu_at = calloc(n_slots, sizeof(*px->lfu_at));
        px->lfu_half = 4.0 * (double)n_slots;
    }
    if (!px->slot_of || !px->owner || !px->last || !px->pin || !px->mark || !px->miss_x ||
        !px->miss_s || !px->cpu_mark || !px->cpu_clean ||
        (policy == EXECUTOR_POOL_LFU && (!px->lfu || !px->lfu_at)))
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    for (size_t i = 0; i < n_keys; i++)
        px->slot_of[i] = -1;
    for (uint32_t s = 0; s < n_slots; s++)
        px->owner[s] = UINT32_MAX;
    bool ok = (px->ev_gu = gpu_event_new()) && (px->ev_d = gpu_event_new()) &&
              (px->ev_k = gpu_event_new());
    for (uint32_t i = 0; ok && i < GPU_POOL_LOANS; i++) {
        px->loans[i].k = i;
        ok = (px->loans[i].ev = gpu_event_new()) != NULL;
    }
    if (!ok)
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: the expert pool: %s", GPU_DEVNAME(gw->dev),
                                 gpu_last_error());
    /* Address space for every slot, backed as slots are first used (the first now, for the
     * probe below); a plain allocation where virtual memory management is not to be had. */
    const size_t gran = gpu_va_granularity(), want = (size_t)n_slots * slot_bytes;
    const struct executor_weights *ws = gw->m->w;
    void                          *darg = NULL;
    const struct executor_dev_ops *dops =
        ws->ops->expert_device ? ws->ops->expert_device(ws->impl, &darg) : NULL;
    if (dops && !getenv("SLUICE_DEVPOOL_OWN")) { /* the fetchers' device pool */
        struct common_errmsg de = {{0}};
        void                *pool = NULL;
        if (dops->open(darg, gw->dev, gw->il0, gw->il1 - gw->il0, want, GPU_POOL_EVENTS, &px->dp,
                       &pool, &de) != 0) {
            snprintf(px->dev_why, sizeof(px->dev_why), "%.159s", de.text);
        } else if (strcmp(px->dp.backend, gpu_backend_name()) != 0) {
            snprintf(px->dev_why, sizeof(px->dev_why), "the fetcher's pool is %s memory",
                     px->dp.backend);
            dops->close(pool);
        } else {
            px->dev = px->dev_mem = dops;
            px->dev_arg = pool;
            px->stage = px->dp.stages && dops->read;
            px->d = px->dp.base;
            px->va_chunk = px->dp.gran;
            px->va_bytes = px->dp.bytes;
            if (gpu_pool_back(px, 0) < 0)
                return common_errmsg_set(e, COMMON_EDEVICE, "%s: the fetcher's expert pool: %s",
                                         GPU_DEVNAME(gw->dev), gpu_last_error());
            gw->bytes += want;
        }
    } else if (dops) {
        snprintf(px->dev_why, sizeof(px->dev_why), "SLUICE_DEVPOOL_OWN is set");
    }
    if (gran && !px->d) {
        px->va_chunk = gran; /* the slots' bytes rounded up to it at most: within a piece of
                                the budget */
        px->va_bytes = (want + gran - 1) / gran * gran;
        if ((px->d = gpu_va_reserve(px->va_bytes)) != NULL && gpu_pool_back(px, 0) == 0) {
            gw->bytes += want;
        } else {
            if (px->d)
                gpu_va_free(px->d, px->va_bytes);
            px->d = NULL;
            px->va_chunk = px->va_bytes = 0;
        }
    }
    if (!px->d && !(px->d = gpu_take(&gw->mem, want, &gw->bytes)))
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: the expert pool: %s", GPU_DEVNAME(gw->dev),
                                 gpu_last_error());
    /* The weight source's RAM pools as pinned memory, now and as they are remapped: their
     * copies go by DMA, without staging. */
    const struct executor_weights *w = gw->m->w;
    if (w->ops->expert_regions && first)
        w->ops->expert_regions(w->impl, &(struct executor_region_hooks){.add = gpu_pin_add,
                                                                        .remove = gpu_pin_remove,
                                                                        .arg = px});
    if (!(px->copy_ns_b = gpu_pool_copy_rate(px)))
        return common_errmsg_set(e, COMMON_EDEVICE, "%s: a copy into the expert pool: %s",
                                 GPU_DEVNAME(gw->dev), gpu_last_error());
    (void)gpu_copy_times(&px->busy0_ns, &px->stall0_ns); /* the probe's copies not counted */
    return 0;
}

/* Slot s's decayed use count now (--policy lfu). */
static double gpu_pool_lfu_now(const struct gpu_xpool *px, uint32_t s)
{
    return px->lfu[s] * exp2(-(double)(px->tick - px->lfu_at[s]) / px->lfu_half);
}

/* True when slot i should be given up before slot s (-1: none chosen yet): the least recently
 * used, or under --policy lfu the least frequently used (the less recent of equals). */
static bool gpu_pool_before(const struct gpu_xpool *px, uint32_t i, int32_t s)
{
    if (s < 0)
        return true;
    if (px->lfu) {
        const double fi = gpu_pool_lfu_now(px, i), fs = gpu_pool_lfu_now(px, (uint32_t)s);
        if (fi != fs)
            return fi < fs;
    }
    return px->last[i] < px->last[s];
}

/* The slot of expert x of layer il, pinned for this round: where it is, or one taken for it
 * (an empty slot, else the one gpu_pool_before gives up first that no expert of this round holds)
 * and put on the round's list of copies. The caller holds the lock, and keeps the round's experts
 * within the slots. */
static int32_t gpu_pool_take(struct gpu_xpool *px, uint32_t il, uint32_t x)
{
    const uint32_t key = il * px->n_expert + x;
    int32_t        s = px->slot_of[key];
    const bool     hit = s >= 0;
    px->tick++;
    if (!hit) {
        for (uint32_t i = 0; i < px->n_slots; i++) {
            if (px->owner[i] == UINT32_MAX) {
                s = (int32_t)i;
                break;
            }
            if (px->pin[i] != px->round && gpu_pool_before(px, i, s))
                s = (int32_t)i;
        }
        if (px->owner[s] != UINT32_MAX)
            px->slot_of[px->owner[s]] = -1;
        px->owner[s] = key;
        px->slot_of[key] = s;
        px->miss_x[px->n_miss] = x;
        px->miss_s[px->n_miss++] = (uint32_t)s;
        px->misses++;
    } else {
        px->hits++;
    }
    if (px->lfu) { /* a new expert's count starts at this use */
        px->lfu[s] = (hit ? gpu_pool_lfu_now(px, (uint32_t)s) : 0.0) + 1.0;
        px->lfu_at[s] = px->tick;
    }
    px->last[s] = px->tick;
    px->pin[s] = px->round;
    return s;
}

/* Queues the copy of part p of expert x of layer il into pool slot s, the weight source's loan
 * held until it is done (the oldest loan ended first when GPU_POOL_LOANS are out). Returns 0,
 * COMMON_EDEVICE, or the source's error (message in c->err). */
static int gpu_pool_copy_part(const struct executor_gpu_weights *gw, uint32_t il, uint32_t x,
                              uint32_t s, enum common_expert_part p, struct executor_ctx *c,
                              bool *torn)
{
    struct gpu_xpool              *px = gw->pool;
    const struct executor_weights *w = gw->m->w;
    const struct gpu_experts      *xe = &gw->layers[il].exps[p];
    struct gpu_loan               *ln = &px->loans[px->loan_next];
    const void                    *data;
    uint32_t                       src_slot;
    const size_t                   bytes = (size_t)xe->rows * xe->row_bytes;
    uint8_t                       *dst = (uint8_t *)xe->d + (size_t)s * px->slot_bytes;
    if (gpu_pool_stages(px) &&
        !(w->ops->expert_is_ready && w->ops->expert_is_ready(w->impl, il, x))) {
        if (px->dev->read(px->dev_arg, il, x, p, (size_t)(dst - px->d), bytes) == 0) {
            px->copied += bytes;
            px->staged++;
            return 0;
        }
        gpu_pool_lose(px); /* through the weight source, as below */
    }
    px->loan_next = (px->loan_next + 1) % GPU_POOL_LOANS;
    if (gpu_loan_end(px, w, ln, torn) < 0)
        return COMMON_EDEVICE;
    int rc = w->ops->expert_acquire(w->impl, il, x, p, &data, &src_slot);
    if (rc < 0)
        return executor_moe_acquire_failed(c, il, x, (int)p, rc);
    *ln = (struct gpu_loan){.ev = ln->ev, .k = ln->k, .src_slot = src_slot, .slot = s, .on = true};
    if (gpu_pool_copy(px, dst, data, bytes) < 0 || gpu_pool_record(px, ln->k) < 0)
        return COMMON_EDEVICE;
    px->copied += bytes;
    return 0;
}

/* Queues the copies of the round's missing experts (after the kernels that may still read the
 * slots they take): every gate and up, event gu, every down, event d. On a failure the loans
 * are ended and the round's slots left empty. Returns 0, -1 (device), or -2 (the weight source
 * failed: *cpu_rc, text in c->err). */
static int gpu_pool_fill(const struct executor_gpu_weights *gw, uint32_t il, struct executor_ctx *c,
                         int *cpu_rc, bool *torn)
{
    struct gpu_xpool *px = gw->pool;
    int               rc = 0;
    if (!px->n_miss)
        return 0;
    if (gpu_pool_after_kernels(px) < 0)
        rc = COMMON_EDEVICE;
    for (uint32_t i = 0; i < px->n_miss && rc == 0; i++)
        if (gpu_pool_back(px, px->miss_s[i]) < 0)
            rc = COMMON_EDEVICE;
    static const enum common_expert_part order[] = {COMMON_EXPERT_GATE, COMMON_EXPERT_UP,
                                                    COMMON_EXPERT_DOWN};
    for (int k = 0; k < COMMON_EXPERT_PART_COUNT && rc == 0; k++) {
        for (uint32_t i = 0; i < px->n_miss && rc == 0; i++)
            rc = gpu_pool_copy_part(gw, il, px->miss_x[i], px->miss_s[i], order[k], c, torn);
        if (rc == 0 && order[k] == COMMON_EXPERT_UP && gpu_pool_record(px, GPU_EV_GU) < 0)
            rc = COMMON_EDEVICE;
        if (rc == 0 && order[k] == COMMON_EXPERT_DOWN && gpu_pool_record(px, GPU_EV_D) < 0)
            rc = COMMON_EDEVICE;
    }
    if (rc == 0)
        return 0;
    (void)gpu_loans_end(px, gw->m->w, torn);
    for (uint32_t i = 0; i < px->n_miss; i++) {
        const uint32_t sl = px->miss_s[i];
        if (px->owner[sl] != UINT32_MAX)
            px->slot_of[px->owner[sl]] = -1;
        px->owner[sl] = UINT32_MAX;
    }
    if (rc == COMMON_EDEVICE)
        return -1;
    *cpu_rc = rc;
    return -2;
}

static int gpu_put_layer(struct executor_gpu_weights *gw, uint32_t il, struct common_errmsg *e)
{
    const struct executor_model   *m = gw->m;
    const struct common_hparams   *hp = &m->desc->hp;
    const struct executor_layer_w *lw = &m->layers[il];
    const struct gpu_widths        w = gpu_widths_of(hp);
    struct gpu_layer              *gl = &gw->layers[il];
    bool                           ok = true;
    int                            rc;
    gl->attn_norm = gpu_put(gw, lw->attn_norm, w.ne * sizeof(float), &ok);
    gl->ffn_norm = gpu_put(gw, lw->ffn_norm, w.ne * sizeof(float), &ok);
    gl->q_norm = gpu_put(gw, lw->q_norm, lw->q_norm_n * sizeof(float), &ok);
    gl->k_norm = gpu_put(gw, lw->k_norm, lw->k_norm_n * sizeof(float), &ok);
    gl->attn_sub_norm = gpu_put(gw, lw->attn_sub_norm, w.ad * sizeof(float), &ok);
    gl->ffn_sub_norm = gpu_put(gw, lw->ffn_sub_norm, (size_t)hp->n_ff * sizeof(float), &ok);
    gl->q_norm_n = lw->q_norm_n;
    gl->k_norm_n = lw->k_norm_n;
    gl->bq = gpu_put(gw, lw->bq, w.qd * sizeof(float), &ok);
    gl->bk = gpu_put(gw, lw->bk, w.kd * sizeof(float), &ok);
    gl->bv = gpu_put(gw, lw->bv, w.vd * sizeof(float), &ok);
    gl->sinks = gpu_put(gw, lw->sinks, (size_t)hp->n_head * sizeof(float), &ok);
    gl->bo = gpu_put(gw, lw->bo, w.ne * sizeof(float), &ok);
    gl->cpu_moe = gpu_cpu_moe(m, il, gw->n_cpu_moe) || (gw->streamed && lw->ffn_streamed);
    if (!gl->cpu_moe) {
        gl->exp_probs_b = gpu_put(gw, lw->exp_probs_b, w.E * sizeof(float), &ok);
        gl->gate_inp_b = gpu_put(gw, lw->gate_inp_b, w.E * sizeof(float), &ok);
        const size_t nfx = (size_t)hp->n_ff_exp * w.E * sizeof(float);
        gl->gate_exps_b = gpu_put(gw, lw->gate_exps_b, nfx, &ok);
        gl->up_exps_b = gpu_put(gw, lw->up_exps_b, nfx, &ok);
        gl->down_exps_b = gpu_put(gw, lw->down_exps_b, w.ne * w.E * sizeof(float), &ok);
    }
    gl->wq = gpu_put_mat(gw, &lw->wq, &ok);
    gl->wk = gpu_put_mat(gw, &lw->wk, &ok);
    gl->wv = gpu_put_mat(gw, &lw->wv, &ok);
    gl->wo = gpu_put_mat(gw, &lw->wo, &ok);
    gl->wq_a = gpu_put_mat(gw, &lw->wq_a, &ok);
    gl->wq_b = gpu_put_mat(gw, &lw->wq_b, &ok);
    gl->wkv_a = gpu_put_mat(gw, &lw->wkv_a, &ok);
    gl->wk_b = gpu_put_mat(gw, &lw->wk_b, &ok);
    gl->wv_b = gpu_put_mat(gw, &lw->wv_b, &ok);
    gl->q_a_norm = gpu_put(gw, lw->q_a_norm, (size_t)hp->n_lora_q * sizeof(float), &ok);
    gl->kv_a_norm = gpu_put(gw, lw->kv_a_norm, (size_t)hp->n_lora_kv * sizeof(float), &ok);
    gl->gate = gpu_put_mat(gw, &lw->gate, &ok);
    gl->up = gpu_put_mat(gw, &lw->up, &ok);
    gl->down = gpu_put_mat(gw, &lw->down, &ok);
    /* A dense FFN streamed under --ram-budget (its matrices not in RAM): read from the weight
     * source once, as an expert's parts, and kept on the device. */
    struct gpu_mat *ffn[COMMON_EXPERT_PART_COUNT] = {&gl->gate, &gl->up, &gl->down};
    for (int p = 0; ok && lw->ffn_streamed && !gl->cpu_moe && p < COMMON_EXPERT_PART_COUNT; p++) {
        const struct executor_expert_geom *geo = &lw->exp[p];
        *ffn[p] = (struct gpu_mat){.type = geo->type,
                                   .rows = geo->rows,
                                   .cols = geo->cols,
                                   .row_bytes = geo->row_bytes,
                                   .scale = lw->exp_scale[p]};
        if (!(ffn[p]->d = gpu_take(&gw->mem, (size_t)geo->rows * geo->row_bytes, &gw->bytes)))
            ok = false;
        else if ((rc = gpu_copy_expert(gw, il, 0, (enum common_expert_part)p, ffn[p]->d, e)) < 0)
            return rc;
    }
    if (!gl->cpu_moe) {
        gl->gate_inp = gpu_put_mat(gw, &lw->gate_inp, &ok);
        gl->sh_gate = gpu_put_mat(gw, &lw->sh_gate, &ok);
        gl->sh_up = gpu_put_mat(gw, &lw->sh_up, &ok);
        gl->sh_down = gpu_put_mat(gw, &lw->sh_down, &ok);
        gl->sh_gate_inp = gpu_put_mat(gw, &lw->sh_gate_inp, &ok);
    }
    gl->swa = lw->swa;
    if (!ok)
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: layer %u: %s", GPU_DEVNAME(gw->dev), il,
                                 gpu_last_error());
    gl->pooled = gw->pool && lw->gate_inp.data && !gl->cpu_moe;
    size_t off = 0; /* a part's offset in a slot */
    for (int p = 0; lw->gate_inp.data && !gl->cpu_moe && p < COMMON_EXPERT_PART_COUNT; p++) {
        const struct executor_expert_geom *geo = &lw->exp[p];
        if (gl->pooled) {
            gl->exps[p] = (struct gpu_experts){.d = gw->pool->d + off,
                                               .type = geo->type,
                                               .rows = geo->rows,
                                               .cols = geo->cols,
                                               .row_bytes = geo->row_bytes,
                                               .bytes = gw->pool->slot_bytes};
            off += (size_t)geo->rows * geo->row_bytes;
            continue;
        }
        if ((rc = gpu_put_experts(gw, il, (enum common_expert_part)p, &gl->exps[p], e)) < 0)
            return rc;
    }
    return 0;
}

/* Refuses a placement over the free device memory, naming the most layers that fit (one device)
 * or the device's share (several). */
static int gpu_check_fit(const struct executor_model *m, int32_t n_layers, uint32_t n_cpu_moe,
                         uint64_t vram_budget, int32_t dev, const struct gpu_info *info,
                         size_t need, uint32_t n_ctx, uint32_t n_batch, uint32_t n_seq,
                         enum common_cache_type kv, bool several, uint32_t il0, uint32_t il1,
                         struct common_errmsg *e)
{
    const uint32_t nl = m->desc->hp.n_layer;
    if (need + GPU_MARGIN_BYTES <= info->free_bytes)
        return 0;
    if (several)
        return common_errmsg_set(e, COMMON_ENOMEM,
                                 "-ngl %d: %s (%s) gets layers %u..%u, which need %.0f MiB of "
                                 "device memory; it has %.0f MiB free: give it fewer "
                                 "(--tensor-split), or fewer layers (-ngl), or a smaller -c / -b%s",
                                 n_layers, GPU_DEVNAME(dev), info->name, il0, il1 - 1,
                                 (double)(need + GPU_MARGIN_BYTES) / 1048576.0,
                                 (double)info->free_bytes / 1048576.0,
                                 m->desc->hp.n_expert ? ", --vram-budget" : "");
    uint32_t fit = 0;
    for (uint32_t k = 1; k <= nl; k++)
        if (gpu_need_weights(m, nl - k, nl, false, n_cpu_moe, vram_budget) +
                n_seq * gpu_need_ctx(m, nl - k, nl, false, n_ctx, n_batch, kv) + GPU_MARGIN_BYTES <=
            info->free_bytes)
            fit = k;
    return common_errmsg_set(e, COMMON_ENOMEM,
                             "-ngl %d needs %.0f MiB of device memory; %s (%s) has %.0f MiB "
                             "free: at most -ngl %u fits (or a smaller -c / -b%s)",
                             n_layers, (double)(need + GPU_MARGIN_BYTES) / 1048576.0,
                             GPU_DEVNAME(dev), info->name, (double)info->free_bytes / 1048576.0,
                             fit, m->desc->hp.n_expert ? ", --vram-budget" : "");
}

/* Whether the FFNs that the weight source streams from its RAM pool (routed experts, or a dense
 * FFN under --ram-budget) stay with the CPU's FFN, which reads them there where they are: on a
 * backend that reads host memory (the CPU's), they would otherwise be copied whole into the
 * device's memory, which is RAM too; not with --vram-budget, whose pool the user asked for (a
 * dense streamed FFN goes to the CPU's path with it too). */
static bool gpu_ffn_streamed(const struct executor_model *m, const struct executor_gpu_place *pl)
{
    return gpu_weights_in_place() && m->w->ops->expert_request &&
           (!pl->vram_budget || !m->desc->hp.n_expert);
}

/* The weights of layers il0 .. il1 - 1 (and the head) on device dev, selected before: one
 * device's part of a placement (`several` when there are others); its expert pool, if any, uses
 * the registrations of pins_of's (NULL: it is the first pool, and takes them). */
static int gpu_weights_part(const struct executor_model *m, const struct executor_gpu_place *pl,
                            int32_t dev, const struct gpu_info *info, uint32_t il0, uint32_t il1,
                            bool head, struct gpu_xpool *pins_of, bool several, uint32_t n_ctx,
                            uint32_t n_batch, uint32_t n_seq, struct executor_gpu_weights **out,
                            struct common_errmsg *e)
{
    const uint32_t               cpu_moe = pl->n_cpu_moe > 0 ? (uint32_t)pl->n_cpu_moe : 0;
    const struct common_hparams *hp = &m->desc->hp;
    *out = NULL;
    if (gpu_use(dev) < 0)
        return common_errmsg_set(e, COMMON_EDEVICE, "%s: %s", GPU_DEVNAME(dev), gpu_last_error());
    size_t         slot_bytes, all;
    const int64_t  n_slots =
        gpu_pool_slots(m, il0, il1, cpu_moe, pl->vram_budget, &slot_bytes, &all);
    const uint32_t K = hp->n_expert_used ? hp->n_expert_used : 1;
    if (n_slots >= 0 && n_slots < K) {
        char b[32], x[32], need[32], sum[32], who[48] = "";
        if (several)
            snprintf(who, sizeof(who), " (per device: %s's)", GPU_DEVNAME(dev));
        return common_errmsg_set(
            e, COMMON_EINVAL,
            "--vram-budget %s%s holds %lld of the experts (%s each); a token uses %u: give it at "
            "least %s (all %s of them are uploaded without it)",
            common_format_size(pl->vram_budget, b, sizeof(b)), who, (long long)n_slots,
            common_format_size(slot_bytes, x, sizeof(x)), K,
            common_format_size((uint64_t)K * slot_bytes, need, sizeof(need)),
            common_format_size(all, sum, sizeof(sum)));
    }
    const size_t need =
        gpu_need_weights(m, il0, il1, head, cpu_moe, pl->vram_budget) +
        (size_t)n_seq * gpu_need_ctx(m, il0, il1, head, n_ctx, n_batch, pl->cache_type);
    int rc = gpu_check_fit(m, pl->n_gpu_layers, cpu_moe, pl->vram_budget, dev, info, need, n_ctx,
                           n_batch, n_seq, pl->cache_type, several, il0, il1, e);
    if (rc < 0)
        return rc;
    struct executor_gpu_weights *gw = calloc(1, sizeof(*gw));
    if (!gw || !(gw->layers = calloc(hp->n_layer, sizeof(*gw->layers)))) {
        free(gw);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    gw->m = m;
    gw->dev = dev;
    gw->info = *info;
    gw->il0 = il0;
    gw->il1 = il1;
    gw->n_cpu_moe = cpu_moe;
    gw->streamed = gpu_ffn_streamed(m, pl);
    gw->head = head;
    gw->expert_bytes = all;
    if (n_slots > 0)
        rc = gpu_pool_create(gw, pins_of, (uint32_t)n_slots, slot_bytes, pl->expert_miss,
                             pl->pool_policy, e);
    for (uint32_t il = il0; il < il1 && rc == 0; il++)
        rc = gpu_put_layer(gw, il, e);
    if (rc == 0 && head) {
        bool ok = true;
        gw->output = gpu_put_mat(gw, &m->output, &ok);
        gw->output_norm = gpu_put(gw, m->output_norm, hp->n_embd * sizeof(float), &ok);
        if (!ok)
            rc = common_errmsg_set(e, COMMON_ENOMEM, "%s: the output head: %s", GPU_DEVNAME(dev),
                                   gpu_last_error());
    }
    if (rc < 0) {
        executor_gpu_weights_destroy(gw);
        return rc;
    }
    *out = gw;
    return 0;
}

bool executor_gpu_in_ram(void)
{
    return gpu_backend_in_ram();
}

bool executor_gpu_one_pass(void)
{
    static _Atomic int on = -1; /* read once; threads that race read the same value */
    if (on < 0) {
        const char *v = getenv("SLUICE_ONE_PASS");
        on = v && *v && strcmp(v, "0") != 0;
    }
    return on == 1;
}

/* The first part on a device (not the CPU device), NULL when there is none. */
static const struct executor_gpu *gpu_first_device(const struct executor_gpu *g)
{
    while (g && g->dev == GPU_DEV_CPU)
        g = g->next;
    return g;
}

int executor_gpu_weights_create(const struct executor_model *m, const struct executor_gpu_place *pl,
                                uint32_t n_ctx, uint32_t n_batch, uint32_t n_seq,
                                struct executor_gpu_weights **out, struct common_errmsg *e)
{
    const struct common_hparams *hp = &m->desc->hp;
    char                         why[256] = "";
    int32_t                      ids[GPU_MAX_DEVICES];
    struct gpu_info              info[GPU_MAX_DEVICES];
    *out = NULL;
    /* One pass (executor_gpu_one_pass): the layers before the devices' on the CPU device, in a
     * part of their own ahead of the devices'; with no layer on a device, every layer and the
     * head there, and no device needed. */
    const bool     one = pl->one_pass || executor_gpu_one_pass();
    const uint32_t n_on = pl->n_gpu_layers > 0 ? (uint32_t)pl->n_gpu_layers : 0;
    const int      n_dev =
        one && n_on == 0 ? 0 : executor_devices_resolve(&pl->devices, ids, why, sizeof(why));
    if (n_dev <= 0 && !(one && n_on == 0))
        return common_errmsg_set(e, COMMON_ENOTSUP, "-ngl: no usable CUDA device: %s", why);
    for (int k = 0; k < n_dev; k++)
        if (gpu_select(ids[k], &info[k], why, sizeof(why)) < 0)
            return common_errmsg_set(e, COMMON_ENOTSUP, "-ngl: no usable CUDA device: %s", why);
    if (n_dev == 0 && gpu_select(GPU_DEV_CPU, NULL, why, sizeof(why)) < 0)
        return common_errmsg_set(e, COMMON_ENOTSUP, "the CPU device: %s", why);
    /* Streamed experts stay with the CPU's MoE (on a backend of the CPU's: gpu_ffn_streamed, of
     * the devices just selected): every layer's, as --n-cpu-moe would keep them. */
    struct executor_gpu_place streamed = *pl;
    if (gpu_ffn_streamed(m, pl) && hp->n_expert)
        streamed.n_cpu_moe = (int32_t)hp->n_layer;
    pl = &streamed;
    const char *no = executor_gpu_unsupported(m, pl->n_cpu_moe, why, sizeof(why));
    if (no)
        return common_errmsg_set(e, COMMON_ENOTSUP, "-ngl: %s", no);
    const int32_t  n_layers = pl->n_gpu_layers;
    const uint32_t on = (uint32_t)n_layers > hp->n_layer ? hp->n_layer : (uint32_t)n_layers;
    const uint32_t il0 = hp->n_layer - on;
    const bool     head = (uint32_t)n_layers > hp->n_layer;
    /* Each device's first layer: the layers in proportion to --tensor-split, else to the
     * devices' free memory (llama.cpp's split by layers). */
    uint32_t start[GPU_MAX_DEVICES + 1];
    double   share[GPU_MAX_DEVICES];
    for (int k = 0; k < n_dev; k++)
        share[k] = pl->devices.n_split
                       ? (k < (int)pl->devices.n_split ? (double)pl->devices.split[k] : 0.0)
                       : (double)info[k].free_bytes;
    common_shares_starts(share, (uint32_t)n_dev, on, start);
    for (int k = 0; k <= n_dev; k++)
        start[k] += il0;
    if (pl->devices.n_at == (uint32_t)n_dev) /* given: clamped to the -ngl layers, in order */
        for (int k = 1; k < n_dev; k++) {
            const uint32_t at = pl->devices.at[k];
            start[k] = at < il0 ? il0 : at > hp->n_layer ? hp->n_layer : at;
            start[k] = start[k] < start[k - 1] ? start[k - 1] : start[k];
        }
    start[n_dev] = hp->n_layer;
    int last = n_dev - 1; /* the last device with layers takes the head */
    while (last > 0 && start[last] == start[last + 1])
        last--;
    struct executor_gpu_weights *first = NULL, **tail = &first;
    struct gpu_xpool            *pins_of = NULL; /* the first pool */
    int                          rc = 0, n_parts = 0;
    for (int k = 0; k < n_dev; k++)
        n_parts += start[k + 1] > start[k];
    if (one && il0 > 0) {
        struct gpu_info ci;
        if (gpu_select(GPU_DEV_CPU, &ci, why, sizeof(why)) < 0)
            return common_errmsg_set(e, COMMON_ENOTSUP, "the CPU device: %s", why);
        /* no pool of copies there (--vram-budget is the devices'); streamed FFNs stay in the
         * RAM pool, read by the CPU's FFN path */
        struct executor_gpu_place cp = *pl;
        cp.vram_budget = 0;
        if (gpu_ffn_streamed(m, &cp) && hp->n_expert)
            cp.n_cpu_moe = (int32_t)hp->n_layer;
        if ((rc = gpu_weights_part(m, &cp, GPU_DEV_CPU, &ci, 0, il0, n_dev == 0, NULL, false, n_ctx,
                                   n_batch, n_seq, tail, e)) < 0)
            return rc;
        tail = &(*tail)->next;
    }
    for (int k = 0; k <= last && rc == 0; k++) {
        if (start[k + 1] == start[k])
            continue;
        rc = gpu_weights_part(m, pl, ids[k], &info[k], start[k], start[k + 1], head && k == last,
                              pins_of, n_parts > 1, n_ctx, n_batch, n_seq, tail, e);
        if (rc == 0) {
            pins_of = pins_of ? pins_of : (*tail)->pool;
            tail = &(*tail)->next;
        }
    }
    if (rc < 0) {
        executor_gpu_weights_destroy(first);
        return rc;
    }
    *out = first;
    return 0;
}

void executor_gpu_weights_destroy(struct executor_gpu_weights *gw)
{
    if (!gw)
        return;
    executor_gpu_weights_destroy(gw->next);
    (void)gpu_use(gw->dev); /* its memory freed, its pool's waits, on its device */
    gpu_pool_destroy(gw->pool, gw->m->w);
    gpu_allocs_free(&gw->mem);
    free(gw->layers);
    free(gw);
}

static int gpu_put_scratch(struct executor_gpu *g, struct common_errmsg *e)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const struct gpu_widths      w = gpu_widths_of(hp);
    const size_t                 B = g->n_batch, F = sizeof(float);
    struct gpu_allocs           *a = &g->mem;
    size_t                      *c = &g->bytes_scratch;
    bool                         ok = true;
    /* the f16 buffers of the matmul: not where every product is a matvec (the CPU's kernels)
     * and no expert pool takes the matmul */
    const bool f16 = g->gemm_min_n != UINT32_MAX || g->w->pool;
    for (uint32_t il = g->il0; il < g->il1 && ok; il++) {
        const size_t cap = g->kv_cap[il] = gpu_kv_positions(g->m, il, g->n_ctx, g->n_batch);
        ok = (g->k_cache[il] = gpu_take(a, cap * gpu_kv_bytes(w.kd, g->kv_q8), &g->bytes_kv)) &&
             (w.mla || /* latent attention: the values head the key rows */
              (g->v_cache[il] = gpu_take(a, cap * gpu_kv_bytes(w.vd, g->kv_q8), &g->bytes_kv)));
    }
    ok = ok && (g->x = gpu_take(a, B * w.ne * F, c)) && (g->xn = gpu_take(a, B * w.ne * F, c)) &&
         (g->tmp = gpu_take(a, B * w.ne * F, c)) && (g->gx = gpu_take(a, B * w.ne * F, c)) &&
         (g->q = gpu_take(a, B * w.qd * F, c)) && (g->k = gpu_take(a, B * w.kd * F, c)) &&
         (g->v = gpu_take(a, B * w.vd * F, c)) && (g->att = gpu_take(a, B * w.ad * F, c)) &&
         (g->ga = gpu_take(a, B * w.ff * F, c)) && (g->up = gpu_take(a, B * w.ff * F, c)) &&
         (g->moe_y = gpu_take(a, B * w.K * w.ne * F, c)) &&
         (g->router = gpu_take(a, B * (w.E ? w.E : 1) * F, c)) &&
         (g->sel_w = gpu_take(a, B * w.K * F, c)) &&
         (g->sel = gpu_take(a, B * w.K * sizeof(int32_t), c)) &&
         (g->items = gpu_take(a, B * w.K * sizeof(int32_t), c)) &&
         (g->rows = gpu_take(a, B * w.K * sizeof(int32_t), c)) &&
         (g->cs = gpu_take(a, B * (hp->n_rot ? hp->n_rot : 1) * F, c)) &&
         (g->att_scratch = gpu_take(
              a, gpu_attention_own_scratch() ? F : B * hp->n_head * (size_t)g->n_ctx * F, c)) &&
         (g->xq = gpu_take(a, B * (w.ff > w.cols ? w.ff : w.cols) * F, c)) &&
         (g->xq8 = gpu_take(a, gpu_q8_bytes(B, &w), c)) &&
         (g->pos_d = gpu_take(a, B * sizeof(uint32_t), c)) &&
         (g->n_tiles_d = gpu_take(a, sizeof(int32_t), c)) &&
         (g->groups = gpu_take(a, 2 * gpu_max_groups(B, &w) * sizeof(struct gpu_group), c)) &&
         (g->x16 =
              gpu_take(a, (f16 ? B * (w.ff > w.cols ? w.ff : w.cols) : 1) * sizeof(uint16_t), c)) &&
         (g->w16 = gpu_take(a, (f16 ? (size_t)GPU_GEMM_ROWS * w.cols : 1) * sizeof(uint16_t), c));
    if (ok && g->head)
        ok = (g->logits = gpu_take(a, B * w.n_vocab * F, c)) != NULL;
    if (ok && w.mla) {
        const size_t H = hp->n_head;
        ok = (g->mla_qa = gpu_take(a, B * (hp->n_lora_q ? hp->n_lora_q : 1) * F, c)) &&
             (g->mla_q = gpu_take(a, B * H * hp->head_dim_k_mla * F, c)) &&
             (g->mla_kv = gpu_take(a, B * ((size_t)hp->n_lora_kv + hp->n_rot) * F, c)) &&
             (g->mla_o = gpu_take(a, B * H * hp->head_dim_v_mla * F, c)) &&
             (g->mla_heads = gpu_take(a, B * H * sizeof(int32_t), c));
        int32_t *heads = ok ? malloc(B * H * sizeof(int32_t)) : NULL;
        for (size_t i = 0; heads && i < B * H; i++)
            heads[i] = (int32_t)(i % H);
        ok = heads && gpu_upload(g->mla_heads, heads, B * H * sizeof(int32_t)) == 0;
        free(heads);
    }
    if (!ok)
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: KV cache and scratch: %s",
                                 GPU_DEVNAME(g->dev), gpu_last_error());
    const size_t n = B * w.K;
    g->h_sel = calloc(n, sizeof(int32_t));
    g->h_items = calloc(n, sizeof(int32_t));
    g->h_rows = calloc(n, sizeof(int32_t));
    g->h_start = calloc(w.E + 1, sizeof(int32_t));
    g->h_count = calloc(w.E + 1, sizeof(int32_t));
    g->h_groups = calloc(2 * gpu_max_groups(B, &w), sizeof(struct gpu_group));
    if (!g->h_sel || !g->h_items || !g->h_rows || !g->h_start || !g->h_count || !g->h_groups)
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    return 0;
}

/* Makes g's step input buffer (h_in) and registers it with g's device; one that cannot be
 * registered stays pageable (its uploads wait). -1: out of host memory. */
static int gpu_step_inputs_make(struct executor_gpu *g)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const size_t                 page = 4096;
    g->in_rows = g->n_batch < EXECUTOR_GPU_ROW_EXACT ? g->n_batch : EXECUTOR_GPU_ROW_EXACT;
    const size_t pos_bytes =
        ((size_t)(g->n_batch ? g->n_batch : 1) * sizeof(uint32_t) + 63) / 64 * 64;
    const size_t x_bytes = (size_t)g->in_rows * hp->n_embd * sizeof(float);
    const size_t cs_bytes = (size_t)g->in_rows * hp->n_rot * sizeof(float);
    const size_t bytes = (pos_bytes + x_bytes + cs_bytes + page - 1) / page * page;
    if (!(g->h_in = aligned_alloc(page, bytes)))
        return -1;
    memset(g->h_in, 0, bytes);
    g->h_pos = (uint32_t *)(void *)g->h_in;
    g->h_x = (float *)(void *)(g->h_in + pos_bytes);
    g->h_cs = (float *)(void *)(g->h_in + pos_bytes + x_bytes);
    g->in_pinned = g->in_rows > 0 && getenv("SLUICE_NO_QUEUED_UPLOADS") == NULL &&
                   gpu_use(g->dev) == 0 && gpu_host_register(g->h_in, bytes, false) == 0;
    return 0;
}

/* Uploads a step's inputs: the n rows of c->x and of their RoPE table (c->rope), and with
 * n_pos the positions in g->h_pos. Through h_in without a wait when it is registered and the
 * rows fit it, else with plain uploads. 0 or -1 (device error recorded). */
static int gpu_step_inputs_put(struct executor_gpu *g, const struct executor_ctx *c, uint32_t n,
                               uint32_t n_pos)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const size_t                 xb = (size_t)n * hp->n_embd * sizeof(float);
    const size_t                 cb = (size_t)n * hp->n_rot * sizeof(float);
    const size_t                 pb = (size_t)n_pos * sizeof(uint32_t);
    if (!g->in_pinned || n > g->in_rows)
        return gpu_upload(g->x, c->x, xb) < 0 || (cb && gpu_upload(g->cs, c->rope, cb) < 0) ||
                       (pb && gpu_upload(g->pos_d, g->h_pos, pb) < 0)
                   ? -1
                   : 0;
    memcpy(g->h_x, c->x, xb);
    memcpy(g->h_cs, c->rope, cb);
    g->in_queued = true;
    return gpu_upload_queued(g->x, g->h_x, xb) < 0 ||
                   (cb && gpu_upload_queued(g->cs, g->h_cs, cb) < 0) ||
                   (pb && gpu_upload_queued(g->pos_d, g->h_pos, pb) < 0)
               ? -1
               : 0;
}

/* One sequence's side on the weights of one device (gw, a part of a placement). */
static int gpu_seq_part(const struct executor_model *m, const struct executor_gpu_weights *gw,
                        const struct executor_gpu_place *pl, uint32_t n_ctx, uint32_t n_batch,
                        struct executor_gpu **out, struct common_errmsg *e)
{
    const struct common_hparams *hp = &m->desc->hp;
    int                          rc;
    *out = NULL;
    if (gpu_use(gw->dev) < 0)
        return common_errmsg_set(e, COMMON_EDEVICE, "%s: %s", GPU_DEVNAME(gw->dev),
                                 gpu_last_error());
    struct executor_gpu *g = calloc(1, sizeof(*g));
    if (!g || !(g->k_cache = calloc(hp->n_layer, sizeof(*g->k_cache))) ||
        !(g->v_cache = calloc(hp->n_layer, sizeof(*g->v_cache))) ||
        !(g->kv_cap = calloc(hp->n_layer, sizeof(*g->kv_cap)))) {
        if (g) {
            free(g->k_cache);
            free(g->v_cache);
        }
        free(g);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    g->w = gw;
    g->m = m;
    g->dev = gw->dev;
    g->il0 = gw->il0;
    g->il1 = gw->il1;
    g->head = gw->head;
    g->gemm_q_off = getenv("SLUICE_NO_GEMM_Q") != NULL;
    g->fuse_off = getenv("SLUICE_NO_FUSION") != NULL;
    g->device_sort = getenv("SLUICE_MOE_DEVICE_SORT") != NULL;
    g->gemm_min_n = gpu_matvec_any_rows() ? UINT32_MAX : GPU_GEMM_MIN_N;
    g->mv_max_n = gpu_matvec_any_rows() ? UINT32_MAX : GPU_MATVEC_MAX_N;
    g->n_ctx = n_ctx;
    g->n_batch = n_batch;
    g->kv_q8 = gpu_kv_is_q8(hp, pl->cache_type);
    static _Atomic uint64_t serials;
    g->serial = ++serials;
    if (gpu_step_inputs_make(g) < 0) {
        executor_gpu_destroy(g);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    if ((rc = gpu_put_scratch(g, e)) < 0) {
        executor_gpu_destroy(g);
        return rc;
    }
    *out = g;
    return 0;
}

int executor_gpu_create(const struct executor_model *m, const struct executor_gpu_weights *shared,
                        const struct executor_gpu_place *pl, uint32_t n_ctx, uint32_t n_batch,
                        struct executor_gpu **out, struct common_errmsg *e)
{
    struct executor_gpu_weights *own = NULL;
    int                          rc = 0;
    *out = NULL;
    if (!shared) {
        if ((rc = executor_gpu_weights_create(m, pl, n_ctx, n_batch, 1, &own, e)) < 0)
            return rc;
        shared = own;
    }
    /* A part per device of the weights, chained as they are. */
    struct executor_gpu *first = NULL, **tail = &first;
    for (const struct executor_gpu_weights *gw = shared; gw && rc == 0; gw = gw->next)
        if ((rc = gpu_seq_part(m, gw, pl, n_ctx, n_batch, tail, e)) == 0)
            tail = &(*tail)->next;
    if (rc == 0 && first->next && !(first->h_mb = calloc(n_batch, sizeof(*first->h_mb))))
        rc = common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    if (rc < 0) {
        executor_gpu_destroy(first);
        executor_gpu_weights_destroy(own);
        return rc;
    }
    first->own_w = own;
    *out = first;
    return 0;
}

void executor_gpu_destroy(struct executor_gpu *g)
{
    if (!g)
        return;
    executor_gpu_destroy(g->next);
    (void)gpu_use(g->dev);
    for (uint32_t i = 0; i < GPU_GRAPH_SHAPES; i++)
        gpu_graph_free(g->shapes[i].graph);
    gpu_allocs_free(&g->mem);
    executor_gpu_weights_destroy(g->own_w);
    free(g->k_cache);
    free(g->v_cache);
    free(g->kv_cap);
    free(g->h_mb);
    if (g->in_pinned) {
        if (g->in_queued)
            (void)gpu_sync(); /* no copy from h_in left in flight */
        gpu_host_unregister(g->h_in);
    }
    free(g->h_in);
    free(g->h_groups);
    free(g->h_sel);
    free(g->h_items);
    free(g->h_rows);
    free(g->h_start);
    free(g->h_count);
    free(g);
}

bool executor_gpu_kv_q8(const struct executor_gpu *g)
{
    return g->kv_q8;
}

uint64_t executor_gpu_graph_steps(const struct executor_gpu *g)
{
    uint64_t n = 0;
    for (; g; g = g->next)
        n += g->graph_steps;
    return n;
}

uint32_t executor_gpu_first_layer(const struct executor_gpu *g)
{
    return g->il0;
}

int32_t executor_gpu_layers(const struct executor_gpu *g, char *name, size_t len)
{
    int32_t n = 0;
    size_t  at = 0;
    if (name && len)
        name[0] = '\0';
    for (g = gpu_first_device(g); g; g = g->next) {
        if (name && at < len) /* "CUDA0 NAME", or "CUDA0 NAME + CUDA1 NAME" */
            at += (size_t)snprintf(name + at, len - at, "%s%s %s", at ? " + " : "",
                                   GPU_DEVNAME(g->w->dev), g->w->info.name);
        n += (int32_t)(g->il1 - g->il0) + (g->head ? 1 : 0);
    }
    return n;
}

double executor_gpu_membw(const struct executor_gpu *g, size_t bytes)
{
    const struct executor_gpu *d = gpu_first_device(g);
    g = d ? d : g;
    return gpu_use(g->dev) < 0 ? 0.0 : gpu_membw_probe(bytes);
}

uint64_t executor_gpu_kv_bytes(const struct executor_gpu *g)
{
    uint64_t n = 0;
    for (; g; g = g->next)
        n += g->bytes_kv;
    return n;
}

uint32_t executor_gpu_device_layers(const struct executor_gpu *g)
{
    g = gpu_first_device(g);
    return g ? g->m->desc->hp.n_layer - g->il0 : 0;
}

/* One line on the part of one device. */
static void gpu_describe_part(const struct executor_gpu *g, char *buf, size_t len)
{
    const struct executor_gpu_weights *gw = g->w;
    const uint32_t                     nl = gw->il1;
    if (gw->dev == GPU_DEV_CPU)
        snprintf(buf, len,
                 "gpu: CPU (%s): layers %u..%u%s on the CPU device, its weights where they are: "
                 "%.0f MiB KV (%s), %.0f MiB scratch",
                 gw->info.name, gw->il0, nl - 1, gw->head ? " and the output head" : "",
                 (double)g->bytes_kv / 1048576.0, g->kv_q8 ? "q8_0" : "f16",
                 (double)g->bytes_scratch / 1048576.0);
    else
        snprintf(buf, len,
                 "gpu: %s (%s, %d.%d, %.0f MiB): layers %u..%u%s on the device: %.0f MiB weights, "
                 "%.0f MiB KV (%s), %.0f MiB scratch",
                 GPU_DEVNAME(gw->dev), gw->info.name, gw->info.cc_major, gw->info.cc_minor,
                 (double)gw->info.total_bytes / 1048576.0, gw->il0, nl - 1,
                 gw->head ? " and the output head" : "", (double)gw->bytes / 1048576.0,
                 (double)g->bytes_kv / 1048576.0, g->kv_q8 ? "q8_0" : "f16",
                 (double)g->bytes_scratch / 1048576.0);
    uint32_t on_cpu = 0;
    bool     moe = false;
    for (uint32_t il = gw->il0; il < nl; il++) {
        on_cpu += gw->layers[il].cpu_moe;
        moe = moe || gw->m->layers[il].gate_inp.data;
    }
    const size_t at = strlen(buf);
    if (on_cpu && at < len && gw->streamed)
        snprintf(buf + at, len - at,
                 "; the %s of %u of them on the CPU's path, streamed where they are",
                 moe ? "MoE" : "FFN", on_cpu);
    else if (on_cpu && at < len)
        snprintf(buf + at, len - at, "; the MoE of %u of them on the CPU (--n-cpu-moe %u)", on_cpu,
                 gw->n_cpu_moe);
    const size_t      at2 = strlen(buf);
    struct gpu_xpool *px = gw->pool;
    if (px && at2 < len) {
        const uint64_t pb = (uint64_t)px->n_slots * px->slot_bytes;
        char           a[32], b[32], from[64];
        const struct gpu_xpool *pp = px->pin_src;
        pthread_mutex_lock(&px->pin_src->reg_mu);
        if (pp->n_pins > 1)
            snprintf(from, sizeof(from), "the RAM pools of %u fetchers, pinned", pp->n_pins);
        else
            snprintf(from, sizeof(from), "%s",
                     pp->n_pins ? "the RAM pool, pinned" : "pageable memory");
        char vm[64] = "";
        if (px->va_chunk)
            snprintf(vm, sizeof(vm), ", reserved and mapped in %s pieces as slots fill",
                     common_format_size(px->va_chunk, b, sizeof(b)));
        char who[224] = ",";
        if (px->dev && px->dp.local)
            snprintf(who, sizeof(who),
                     ", in device memory (%s) that this process's fetcher fills on its own thread "
                     "and copy stream,%s",
                     px->dp.backend, px->stage ? " read from storage through its staging or" : "");
        else if (px->dev)
            snprintf(who, sizeof(who), ", in fetcher %u's device memory (%s, filled by %s),%s",
                     px->dp.lead, px->dp.backend,
                     px->dp.n_fetchers > 1 ? "the fetchers, each its experts" : "the fetcher",
                     px->stage ? " read from storage through their staging or" : "");
        else if (px->dev_why[0])
            snprintf(who, sizeof(who), ", in this process's device memory (%s),", px->dev_why);
        snprintf(buf + at2, len - at2,
                 "; the experts in a pool of %u slots (%s of --vram-budget%s, %.1f%% of their %s; "
                 "--expert-miss %s%s)%s copied in from %s%s%s%s",
                 px->n_slots, common_format_size(pb, a, sizeof(a)), vm,
                 100.0 * (double)pb / (double)gw->expert_bytes,
                 common_format_size(gw->expert_bytes, b, sizeof(b)),
                 executor_expert_miss_name(px->miss_mode), px->lfu ? ", --policy lfu" : "", who,
                 from, pp->pin_err[0] ? " (pinning the RAM pool failed: " : "", pp->pin_err,
                 pp->pin_err[0] ? ")" : "");
        pthread_mutex_unlock(&px->pin_src->reg_mu);
    }
}

void executor_gpu_describe(const struct executor_gpu *g, char *buf, size_t len)
{
    size_t at = 0;
    if (len)
        buf[0] = '\0';
    for (; g && at + 1 < len; g = g->next) {
        if (at) /* a line per device */
            buf[at++] = '\n';
        gpu_describe_part(g, buf + at, len - at);
        at += strlen(buf + at);
    }
}

/* The pool of one device's part. */
static void gpu_pool_stats_part(const struct executor_gpu *g, struct executor_gpu_pool_stats *out)
{
    struct gpu_xpool *px = g->w->pool;
    *out = (struct executor_gpu_pool_stats){.expert_bytes = g->w->expert_bytes};
    if (!px)
        return;
    pthread_mutex_lock(&px->mu);
    out->n_slots = px->n_slots;
    out->slot_bytes = px->slot_bytes;
    out->hits = px->hits;
    out->misses = px->misses;
    out->copied_bytes = px->copied;
    out->cpu_misses = px->cpu_misses;
    out->on_demand = px->va_chunk > 0;
    out->mapped_bytes = px->va_chunk ? (uint64_t)px->va_mapped * px->va_chunk
                                     : (uint64_t)px->n_slots * px->slot_bytes;
    const struct gpu_xpool *pp = px->pin_src; /* the registrations serve every device */
    pthread_mutex_lock(&px->pin_src->reg_mu);
    out->pinned_bytes = pp->pinned_bytes;
    out->pinned_regions = pp->n_pins;
    out->pin_adds = pp->pin_adds;
    out->pin_removes = pp->pin_removes;
    pthread_mutex_unlock(&px->pin_src->reg_mu);
    uint64_t busy, stall;
    if (gpu_copy_times(&busy, &stall)) {
        out->copy_busy_ns = busy - px->busy0_ns;
        out->copy_stall_ns = stall - px->stall0_ns;
        out->copy_timed = true;
    }
    if (px->dev_mem) { /* the fetcher's copies too (the kernels' waits for them are stalls) */
        uint64_t fetcher_ns = 0;
        px->dev_mem->copy_time(px->dev_arg, &fetcher_ns);
        out->copy_busy_ns += fetcher_ns;
        out->fetcher_copy_ns = fetcher_ns;
    }
    out->fetcher_memory = px->dev_mem != NULL;
    out->in_fetcher = px->dev != NULL;
    out->fetcher_losses = px->dev_losses;
    out->fetcher_wait_ns = px->dev_wait_ns;
    out->staged = px->staged;
    out->stage_failures = px->stage_failures;
    out->fetcher_retakes = px->retakes;
    out->copy_gbps = px->copy_ns_b > 0 ? 1.0 / px->copy_ns_b : 0;
    out->cpu_gbps = px->cpu_ns_b > 0 ? 1.0 / px->cpu_ns_b : 0;
    pthread_mutex_unlock(&px->mu);
}

void executor_gpu_pool_stats(const struct executor_gpu *g, struct executor_gpu_pool_stats *out)
{
    gpu_pool_stats_part(g, out);
    for (g = g->next; g; g = g->next) { /* the other devices' pools: their sums */
        struct executor_gpu_pool_stats o;
        gpu_pool_stats_part(g, &o);
        const bool had = out->n_slots > 0; /* a pool before this one */
        if (o.n_slots) {                   /* in the fetchers only when every pool is */
            out->fetcher_memory = (!had || out->fetcher_memory) && o.fetcher_memory;
            out->in_fetcher = (!had || out->in_fetcher) && o.in_fetcher;
        }
        out->n_slots += o.n_slots;
        out->slot_bytes = o.slot_bytes > out->slot_bytes ? o.slot_bytes : out->slot_bytes;
        out->expert_bytes += o.expert_bytes;
        out->hits += o.hits;
        out->misses += o.misses;
        out->copied_bytes += o.copied_bytes;
        out->cpu_misses += o.cpu_misses;
        out->mapped_bytes += o.mapped_bytes;
        out->staged += o.staged;
        out->stage_failures += o.stage_failures;
        out->fetcher_losses += o.fetcher_losses;
        out->fetcher_retakes += o.fetcher_retakes;
        out->fetcher_wait_ns += o.fetcher_wait_ns;
        out->fetcher_copy_ns += o.fetcher_copy_ns;
        out->copy_busy_ns += o.fetcher_copy_ns; /* the process's own copies are counted once */
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The forward pass                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* x rows rounded for weights of `type` into g->xq (stride cols), or x itself for f32 weights;
 * NULL on a device error. */
static const float *gpu_round_for(struct executor_gpu *g, uint32_t type, const float *x,
                                  int64_t x_stride, uint32_t n, int64_t cols)
{
    const uint32_t vdt = executor_vec_dot_type(type);
    if (vdt == COMMON_GGML_TYPE_F32)
        return x;
    return gpu_act_round(vdt, x, x_stride, n, cols, g->xq) < 0 ? NULL : g->xq;
}

/* The q8 image of x rows for weights of `type` in g->xq8 (gpu_act_q8), or the one already there
 * when g->q8_reuse is set and it holds these rows quantized alike; NULL on a device error. */
static const void *gpu_q8_for(struct executor_gpu *g, uint32_t type, const float *x,
                              int64_t x_stride, uint32_t n, int64_t cols)
{
    const uint32_t vdt = executor_vec_dot_type(type);
    if ((g->q8_reuse || g->q8_keep) && g->q8_src == x && g->q8_stride == x_stride && g->q8_n == n &&
        g->q8_cols == cols && g->q8_vdt == vdt)
        return g->xq8;
    g->q8_src = NULL;
    g->q8_keep = false;
    if (gpu_act_q8(vdt, x, x_stride, n, cols, g->xq8) < 0)
        return NULL;
    g->q8_src = x;
    g->q8_stride = x_stride;
    g->q8_n = n;
    g->q8_cols = cols;
    g->q8_vdt = vdt;
    return g->xq8;
}

/* Whether the products of `type` over cols columns take the int8 path (gpu_matvec_q8). */
static bool gpu_q8_path(uint32_t type, int64_t cols)
{
    return gpu_matvec_q8_supported(type) && cols % 32 == 0;
}

/* Whether a matmul of `type` over cols columns may read the quantized weights itself
 * (gpu_gemm_q) rather than row blocks dequantized to f16 first (SLUICE_NO_GEMM_Q=1: never). */
static bool gpu_gemm_q_path(const struct executor_gpu *g, uint32_t type, int64_t cols)
{
    return !g->gemm_q_off && gpu_matvec_q8_supported(type) && cols % 32 == 0;
}

/* y (n rows, y_stride apart) = W . x rows: matvec kernels for a few rows, the f16 tensor-core
 * matmul for more (over the quantized rows, or row blocks of W dequantized to f16). */
static int gpu_mm(struct executor_gpu *g, uint32_t type, const void *w, size_t row_bytes,
                  int64_t rows, int64_t cols, const float *x, int64_t x_stride, uint32_t n,
                  float *y, int64_t y_stride)
{
    const bool matvec = (n < g->gemm_min_n && !g->mm_only) || cols % 32 != 0 ||
                        (g->mv_only && gpu_q8_path(type, cols));
    if (matvec && gpu_q8_path(type, cols)) {
        /* int8 activations as the CPU quantizes them, integer products (dp4a). */
        const uint8_t *q8 = gpu_q8_for(g, type, x, x_stride, n, cols);
        if (!q8)
            return -1;
        const size_t xrb = gpu_q8_row_bytes(cols);
        for (uint32_t t = 0, k; t < n; t += k) {
            k = n - t < g->mv_max_n ? n - t : g->mv_max_n;
            if (gpu_matvec_q8(type, w, row_bytes, rows, cols, q8 + (size_t)t * xrb, k,
                              y + (size_t)t * y_stride, y_stride) < 0)
                return -1;
        }
        return 0;
    }
    if (!g->q8_keep)
        g->q8_src = NULL; /* the next product's image is not this one's */
    /* Activations rounded as the CPU quantizes them: the CPU's products up to the order of the
     * sums (greedy tokens as llama.cpp's). For F16 weights the matmul's own f16 conversion is
     * that rounding. */
    if (matvec || executor_vec_dot_type(type) != COMMON_GGML_TYPE_F16) {
        const float *xr = gpu_round_for(g, type, x, x_stride, n, cols);
        if (!xr)
            return -1;
        if (xr != x) {
            x = xr;
            x_stride = cols;
        }
    }
    if (matvec) {
        for (uint32_t t = 0; t < n; t += GPU_MATVEC_MAX_N) {
            const uint32_t k = n - t < GPU_MATVEC_MAX_N ? n - t : GPU_MATVEC_MAX_N;
            if (gpu_matvec(type, w, row_bytes, rows, cols, x + (size_t)t * x_stride, x_stride, k,
                           y + (size_t)t * y_stride, y_stride) < 0)
                return -1;
        }
        return 0;
    }
    if (gpu_f32_to_f16(x, x_stride, n, cols, g->x16) < 0)
        return -1;
    /* The pool's experts (g->mm_only): the quantized rows read by the matmul itself, as the
     * resident experts' tiles are (gpu_moe_tiles). A dense matrix is faster dequantized to f16
     * once per step, then multiplied (the matmul decodes a weight once per 64 rows of x). */
    if (g->mm_only && gpu_gemm_q_path(g, type, cols))
        return gpu_gemm_q(type, w, 0, row_bytes, rows, cols, g->x16, n, NULL, 0, NULL, 1, y,
                          y_stride);
    /* As many rows at once as the f16 scratch holds (GPU_GEMM_ROWS of the widest row): a whole
     * FFN matrix, one launch each. */
    const int64_t chunk =
        (int64_t)GPU_GEMM_ROWS * (int64_t)gpu_widths_of(&g->m->desc->hp).cols / cols;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t   nr = rows - r0 < chunk ? rows - r0 : chunk;
        const uint8_t  *wr = (const uint8_t *)w + (size_t)r0 * row_bytes;
        const uint16_t *w16 = (const uint16_t *)(const void *)wr;
        if (type != COMMON_GGML_TYPE_F16) {
            if (gpu_dequant_rows(type, wr, row_bytes, cols, NULL, nr, g->w16, cols, true) < 0)
                return -1;
            w16 = g->w16;
        }
        if (gpu_gemm_f16(w16, nr, cols, g->x16, n, y + r0, y_stride) < 0)
            return -1;
    }
    return 0;
}

/* gpu_mm of w, then its per-tensor scale (the CPU's executor_matvec, then out_scale). */
static int gpu_mm_mat(struct executor_gpu *g, const struct gpu_mat *w, const float *x,
                      int64_t x_stride, uint32_t n, float *y, int64_t y_stride)
{
    if (gpu_mm(g, w->type, w->d, w->row_bytes, w->rows, w->cols, x, x_stride, n, y, y_stride) < 0)
        return -1;
    return w->scale != 0.0f ? gpu_scale_rows(y, y_stride, n, w->rows, w->scale) : 0;
}

/* Whether gpu_mm takes the int8 matvec for these n rows of w. */
static bool gpu_mm_q8(const struct executor_gpu *g, const struct gpu_mat *w, uint32_t n)
{
    return ((n < g->gemm_min_n && !g->mm_only) || g->mv_only) && gpu_q8_path(w->type, w->cols);
}

/* The norm (weights nw) of n rows of x into g->xn. Where the first product over them, of
 * weights of `type` (0: none known), takes the int8 matvec, the norm writes their q8 image too,
 * in the same kernel (gpu_rmsnorm_q8), and the products over g->xn reuse it (q8_keep); else any
 * image of the old g->xn is forgotten. 0 or -1. */
static int gpu_norm_xn(struct executor_gpu *g, const float *x, const float *nw, uint32_t n,
                       uint32_t type)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const int64_t                ne = hp->n_embd;
    const uint32_t               vdt = type ? executor_vec_dot_type(type) : 0;
    g->q8_keep = false;
    g->q8_src = NULL;
    const bool fuse = !g->fuse_off && type && ((n < g->gemm_min_n && !g->mm_only) || g->mv_only) &&
                      gpu_q8_path(type, ne) && (vdt != COMMON_GGML_TYPE_Q8_K || ne % 256 == 0);
    if (!fuse)
        return gpu_rmsnorm(g->xn, ne, x, ne, nw, n, ne, hp->rms_eps);
    if (gpu_rmsnorm_q8(g->xn, ne, x, ne, nw, n, ne, hp->rms_eps, vdt, g->xq8) < 0)
        return -1;
    g->q8_src = g->xn;
    g->q8_stride = ne;
    g->q8_n = n;
    g->q8_cols = ne;
    g->q8_vdt = vdt;
    g->q8_keep = true;
    return 0;
}

/* Whether the int8 matvec of w may fuse what follows it (gpu_mv_q8_op): no scale after it. */
static bool gpu_mm_q8_fused(const struct executor_gpu *g, const struct gpu_mat *w, uint32_t n)
{
    return gpu_mm_q8(g, w, n) && w->scale == 0.0f;
}

/* The int8 matvec of w (and w2, GLU) over x's rows, fused as op says (gpu_matvec_q8_op), into y.
 * 0 or -1. */
static int gpu_mv_q8_op(struct executor_gpu *g, enum gpu_mv_op op, const struct gpu_mat *w,
                        const struct gpu_mat *w2, const float *x, int64_t x_stride, uint32_t n,
                        float *y, int64_t y_stride)
{
    const uint8_t *q8 = gpu_q8_for(g, w->type, x, x_stride, n, w->cols);
    const size_t   xrb = gpu_q8_row_bytes(w->cols);
    for (uint32_t t = 0, k; q8 && t < n; t += k) {
        k = n - t < g->mv_max_n ? n - t : g->mv_max_n;
        if (gpu_matvec_q8_op(op, w->type, w->d, w2 ? w2->d : NULL, w->row_bytes, w->rows, w->cols,
                             q8 + (size_t)t * xrb, k, y + (size_t)t * y_stride, y_stride) < 0)
            return -1;
    }
    return q8 ? 0 : -1;
}

/* y rows (the residual stream, y_stride apart) += W . x rows: in the int8 matvec's store where
 * it runs, else through g->tmp and gpu_add (y_stride = n_embd). */
static int gpu_mm_add(struct executor_gpu *g, const struct gpu_mat *w, const float *x,
                      int64_t x_stride, uint32_t n, float *y, int64_t y_stride)
{
    if (gpu_mm_q8_fused(g, w, n))
        return gpu_mv_q8_op(g, GPU_MV_ADD, w, NULL, x, x_stride, n, y, y_stride);
    return gpu_mm_mat(g, w, x, x_stride, n, g->tmp, y_stride) < 0
               ? -1
               : gpu_add(y, y, g->tmp, (int64_t)n * y_stride);
}

/* gpu_mm_mat over the rows of the product before it (same_x: x has not changed since), whose
 * int8 activations it may reuse. */
static int gpu_mm_shared(struct executor_gpu *g, const struct gpu_mat *w, const float *x,
                         int64_t x_stride, uint32_t n, float *y, int64_t y_stride, bool same_x)
{
    g->q8_reuse = same_x;
    const int rc = gpu_mm_mat(g, w, x, x_stride, n, y, y_stride);
    g->q8_reuse = false;
    return rc;
}

/* q, k and v of the n rows of g->xn. One row on the int8 matvec: the matrices of wq's type and
 * layout in one launch (gpu_matvec_q8_cat), the others alone. */
static int gpu_qkv(struct executor_gpu *g, const struct gpu_layer *gl, uint32_t n,
                   const struct gpu_widths *w)
{
    const int64_t         ne = (int64_t)w->ne;
    const struct gpu_mat *ms[3] = {&gl->wq, &gl->wk, &gl->wv};
    float                *ys[3] = {g->q, g->k, g->v};
    const int64_t         yw[3] = {(int64_t)w->qd, (int64_t)w->kd, (int64_t)w->vd};
    bool                  cat[3] = {false, false, false};
    int                   n_cat = 0;
    if (!g->fuse_off && n == 1 && gpu_mm_q8_fused(g, &gl->wq, 1))
        for (int i = 0; i < 3; i++) {
            cat[i] = ms[i]->d && ms[i]->type == gl->wq.type &&
                     ms[i]->row_bytes == gl->wq.row_bytes && ms[i]->cols == gl->wq.cols &&
                     ms[i]->scale == 0.0f;
            n_cat += cat[i];
        }
    if (n_cat < 2) {
        for (int i = 0; i < 3; i++)
            if (gpu_mm_shared(g, ms[i], g->xn, ne, n, ys[i], yw[i], i > 0) < 0)
                return -1;
        return 0;
    }
    const void *wp[GPU_CAT_MAX];
    int64_t     rows[GPU_CAT_MAX];
    float      *yp[GPU_CAT_MAX];
    int         k = 0;
    for (int i = 0; i < 3; i++)
        if (cat[i]) {
            wp[k] = ms[i]->d;
            rows[k] = ms[i]->rows;
            yp[k++] = ys[i];
        }
    const void *q8 = gpu_q8_for(g, gl->wq.type, g->xn, ne, 1, ne); /* the norm's, if it made one */
    if (!q8 || gpu_matvec_q8_cat(gl->wq.type, k, wp, rows, gl->wq.row_bytes, ne, q8, yp) < 0)
        return -1;
    for (int i = 0; i < 3; i++)
        if (!cat[i] && gpu_mm_shared(g, ms[i], g->xn, ne, n, ys[i], yw[i], true) < 0)
            return -1;
    return 0;
}

/* Stores n rows of k and v at positions p0.. of a ring of cap cells (p in cell p % cap). */
static int gpu_kv_store_ring(bool q8, void *kc, void *vc, uint32_t kd, uint32_t vd, const float *k,
                             const float *v, uint32_t p0, uint32_t n, uint32_t cap)
{
    for (uint32_t t = 0; t < n;) {
        const uint32_t cell = (p0 + t) % cap, run = n - t < cap - cell ? n - t : cap - cell;
        const float   *kt = k + (size_t)t * kd, *vt = v + (size_t)t * vd;
        if (q8 ? gpu_kv_store_q8(kc, vc, kd, vd, kt, vt, cell, NULL, run) < 0
               : gpu_kv_store(kc, vc, kd, vd, kt, vt, cell, run) < 0)
            return -1;
        t += run;
    }
    return 0;
}

/* The cache stores (unless stored: gpu_rope_qk made them) and attention of layer il, member by
 * member over each member's own cache and positions: g->k and g->v rows into the cache, g->q rows
 * over it into g->att. */
static int gpu_attend_members(struct executor_gpu *g, uint32_t il,
                              const struct executor_gpu_member *mb, uint32_t n_mb, bool stored)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const struct gpu_layer      *gl = &g->w->layers[il];
    const struct gpu_widths      w = gpu_widths_of(hp);
    const float                  scale =
        hp->attn_scale != 0.0f ? hp->attn_scale : 1.0f / sqrtf((float)hp->head_dim_k);
    const uint32_t window = gl->swa ? hp->n_swa : 0;
    for (uint32_t i = 0; i < n_mb; i++) {
        const struct executor_gpu_member *b = &mb[i];
        float                            *att = g->att + (size_t)b->row * w.ad;
        const float *q = g->q + (size_t)b->row * w.qd, *k = g->k + (size_t)b->row * w.kd,
                    *v = g->v + (size_t)b->row * w.vd;
        /* Latent attention has no value cache (its values head the key rows): vc NULL, vd 0. */
        void          *kc = b->g->k_cache[il], *vc = w.mla ? NULL : b->g->v_cache[il];
        const uint32_t kd = (uint32_t)w.kd, vd = w.mla ? 0 : (uint32_t)w.vd;
        /* A graph's kernels read the position from device memory (the same graph every step). */
        const uint32_t *pd = g->capturing ? g->pos_d + i : NULL;
        const uint32_t  cap = b->g->kv_cap[il];
        int             rc;
        if (cap < b->g->n_ctx) /* a ring: stored by runs of cells, which wrap once at most */
            rc = gpu_kv_store_ring(b->g->kv_q8, kc, vc, kd, vd, k, v, b->p0, b->n, cap) < 0 ||
                 gpu_attention_ring(b->g->kv_q8, att, q, kc, vc, b->n, b->p0, cap, hp->n_head,
                                    hp->n_head_kv, hp->head_dim_k, hp->head_dim_v, scale, window,
                                    gl->sinks) < 0;
        else if (b->g->kv_q8)
            rc = gpu_kv_store_q8(kc, vc, kd, vd, k, v, b->p0, pd, b->n) < 0 ||
                 gpu_attention_q8(att, q, kc, vc, b->n, b->p0, pd, pd ? g->n_ctx : 0, hp->n_head,
                                  hp->n_head_kv, hp->head_dim_k, hp->head_dim_v, scale, window,
                                  g->att_scratch, gl->sinks) < 0;
        else if (pd)
            rc = (!stored && gpu_kv_store_at(kc, vc, kd, vd, k, v, pd, b->n) < 0) ||
                 gpu_attention_at(att, q, kc, vc, b->n, pd, g->n_ctx, hp->n_head, hp->n_head_kv,
                                  hp->head_dim_k, hp->head_dim_v, scale, window, g->att_scratch,
                                  gl->sinks) < 0;
        else
            rc = (!stored && gpu_kv_store(kc, vc, kd, vd, k, v, b->p0, b->n) < 0) ||
                 gpu_attention(att, q, kc, vc, b->n, b->p0, hp->n_head, hp->n_head_kv,
                               hp->head_dim_k, hp->head_dim_v, scale, window, g->att_scratch,
                               gl->sinks) < 0;
        if (rc)
            return -1;
    }
    return 0;
}

static int gpu_experts_mv(struct executor_gpu *g, const struct gpu_experts *xe, const int32_t *ids,
                          int64_t items, const float *x, int64_t x_stride, int64_t cols,
                          uint32_t n_x, int64_t x_div, float *y, int64_t y_stride, bool same_x);

/* w's n_head blocks of rows (fwd_head_block's) as the "experts" of gpu_experts_mv: head h's
 * product over item i = t * n_head + h takes expert g->mla_heads[i] = h, so every head of every
 * token is one launch. */
static struct gpu_experts gpu_heads_of(const struct gpu_mat *w, uint32_t n_head)
{
    const int64_t rows = w->rows / n_head;
    return (struct gpu_experts){.d = w->d,
                                .type = w->type,
                                .rows = rows,
                                .cols = w->cols,
                                .row_bytes = w->row_bytes,
                                .bytes = (size_t)rows * w->row_bytes};
}

/* Multi-head latent attention of layer il (deepseek2) as the CPU's fwd_attention_mla, in its
 * absorbed form: the cache holds per position K = [the normalised latent, the rotated shared
 * key], whose head are the values (no value cache); head h's query is attn_k_b[h] . q_nope[h]
 * followed by its rotated q_pe; its output over the latent expands by attn_v_b[h]. g->xn holds
 * the normed rows. */
static int gpu_attention_mla(struct executor_gpu *g, uint32_t il, uint32_t n,
                             const struct executor_gpu_member *mb, uint32_t n_mb)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const struct gpu_layer      *gl = &g->w->layers[il];
    const int64_t                ne = hp->n_embd, H = hp->n_head, rot = hp->n_rot;
    const int64_t                kvr = hp->n_lora_kv, kq = hp->head_dim_k_mla, nope = kq - rot;
    const int64_t                hk = hp->head_dim_k, vm = hp->head_dim_v_mla, lq = hp->n_lora_q;
    const bool                   neox = hp->rope_neox != 0;
    if (gl->wq_a.d) {
        if (gpu_mm_mat(g, &gl->wq_a, g->xn, ne, n, g->mla_qa, lq) < 0 ||
            gpu_mm_shared(g, &gl->wkv_a, g->xn, ne, n, g->mla_kv, kvr + rot, true) < 0 ||
            gpu_rmsnorm(g->mla_qa, lq, g->mla_qa, lq, gl->q_a_norm, n, lq, hp->rms_eps) < 0 ||
            gpu_mm_mat(g, &gl->wq_b, g->mla_qa, lq, n, g->mla_q, H * kq) < 0)
            return -1;
    } else if (gpu_mm_mat(g, &gl->wq, g->xn, ne, n, g->mla_q, H * kq) < 0 ||
               gpu_mm_shared(g, &gl->wkv_a, g->xn, ne, n, g->mla_kv, kvr + rot, true) < 0) {
        return -1;
    }
    /* K = [norm(latent), rope(k_pe)] (V its head); q_pe of every head rotated. */
    if (gpu_rope(g->mla_kv + kvr, n, kvr + rot, 1, (uint32_t)rot, (uint32_t)rot, g->cs, neox) < 0 ||
        gpu_rmsnorm(g->k, hk, g->mla_kv, kvr + rot, gl->kv_a_norm, n, kvr, hp->rms_eps) < 0 ||
        gpu_gather_rows(g->k + kvr, hk, g->mla_kv + kvr, kvr + rot, NULL, n, rot) < 0 ||
        gpu_rope(g->mla_q + nope, n, H * kq, (uint32_t)H, (uint32_t)kq, (uint32_t)rot, g->cs,
                 neox) < 0)
        return -1;
    /* Absorb: head h's query over the latent is attn_k_b[h] . q_nope[h], then its q_pe; the
     * (token, head) rows of q_nope are kq apart, those of q hk apart. */
    const struct gpu_experts kb = gpu_heads_of(&gl->wk_b, (uint32_t)H);
    const struct gpu_experts vb = gpu_heads_of(&gl->wv_b, (uint32_t)H);
    const int64_t            items = (int64_t)n * H;
    if (gpu_experts_mv(g, &kb, g->mla_heads, items, g->mla_q, kq, nope, (uint32_t)items, 1, g->q,
                       hk, false) < 0 ||
        gpu_gather_rows(g->q + kvr, hk, g->mla_q + nope, kq, NULL, items, rot) < 0 ||
        gpu_attend_members(g, il, mb, n_mb, false) < 0)
        return -1;
    /* Expand: head h's value is attn_v_b[h] . its output over the latent. */
    if (gpu_experts_mv(g, &vb, g->mla_heads, items, g->att, kvr, kvr, (uint32_t)items, 1, g->mla_o,
                       vm, false) < 0)
        return -1;
    return gpu_mm_add(g, &gl->wo, g->mla_o, H * vm, n, g->x, ne);
}

/* Self-attention of layer il for the n rows of g->x (g: the batch's scratch), member by member
 * over each member's own cache and positions: adds its output. */
static int gpu_attention_block(struct executor_gpu *g, uint32_t il, uint32_t n,
                               const struct executor_gpu_member *mb, uint32_t n_mb)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const struct gpu_layer      *gl = &g->w->layers[il];
    const struct gpu_widths      w = gpu_widths_of(hp);
    const int64_t                ne = (int64_t)w.ne;
    /* the first product over the normed rows: wq, or latent attention's wq_a */
    const uint32_t first = hp->n_lora_kv ? (gl->wq_a.d ? gl->wq_a.type : 0) : gl->wq.type;
    if (gpu_norm_xn(g, g->x, gl->attn_norm, n, first) < 0)
        return -1;
    if (hp->n_lora_kv)
        return gpu_attention_mla(g, il, n, mb, n_mb);
    if (gpu_qkv(g, gl, n, &w) < 0)
        return -1;
    if ((gl->bq && gpu_add_bias(g->q, (int64_t)w.qd, gl->bq, n, (int64_t)w.qd) < 0) ||
        (gl->bk && gpu_add_bias(g->k, (int64_t)w.kd, gl->bk, n, (int64_t)w.kd) < 0) ||
        (gl->bv && gpu_add_bias(g->v, (int64_t)w.vd, gl->bv, n, (int64_t)w.vd) < 0))
        return -1;
    /* Per head (the norm as wide as a head: fused with RoPE) or over the whole projection
     * (olmoe). */
    const bool hq = !g->fuse_off && gl->q_norm && gl->q_norm_n == hp->head_dim_k;
    const bool hk = !g->fuse_off && gl->k_norm && gl->k_norm_n == hp->head_dim_k;
    const bool fuse = !g->fuse_off && (hp->n_rot || hq || hk);
    if (gl->q_norm && !hq &&
        gpu_rmsnorm(g->q, gl->q_norm_n, g->q, gl->q_norm_n, gl->q_norm,
                    (int64_t)(n * w.qd / gl->q_norm_n), gl->q_norm_n, hp->rms_eps) < 0)
        return -1;
    if (gl->k_norm && !hk &&
        gpu_rmsnorm(g->k, gl->k_norm_n, g->k, gl->k_norm_n, gl->k_norm,
                    (int64_t)(n * w.kd / gl->k_norm_n), gl->k_norm_n, hp->rms_eps) < 0)
        return -1;
    const bool neox = hp->rope_neox != 0;
    /* One member with an f16 cache: its cache store in the same kernel. */
    const bool store = fuse && n_mb == 1 && mb[0].row == 0 && mb[0].n == n && !mb[0].g->kv_q8 &&
                       mb[0].g->kv_cap[il] == mb[0].g->n_ctx; /* not a ring's */
    const struct gpu_kv_dst kv = {.k_cache = store ? mb[0].g->k_cache[il] : NULL,
                                  .v_cache = store ? mb[0].g->v_cache[il] : NULL,
                                  .v = g->v,
                                  .head_dim_v = hp->head_dim_v,
                                  .pos0 = mb[0].p0,
                                  .pos_dev = g->capturing ? g->pos_d : NULL};
    if (fuse ? gpu_rope_qk(g->q, (int64_t)w.qd, hp->n_head, g->k, (int64_t)w.kd, hp->n_head_kv, n,
                           hp->head_dim_k, hp->n_rot, g->cs, neox, hq ? gl->q_norm : NULL,
                           hk ? gl->k_norm : NULL, hp->rms_eps, store ? &kv : NULL) < 0
             : gpu_rope(g->q, n, (int64_t)w.qd, hp->n_head, hp->head_dim_k, hp->n_rot, g->cs,
                        neox) < 0 ||
                   gpu_rope(g->k, n, (int64_t)w.kd, hp->n_head_kv, hp->head_dim_k, hp->n_rot, g->cs,
                            neox) < 0)
        return -1;
    if (gpu_attend_members(g, il, mb, n_mb, store) < 0)
        return -1;
    if (gl->attn_sub_norm && gpu_rmsnorm(g->att, (int64_t)w.ad, g->att, (int64_t)w.ad,
                                         gl->attn_sub_norm, n, (int64_t)w.ad, hp->rms_eps) < 0)
        return -1;
    if (gl->bo) /* the bias added to the product before the residual, as the CPU's order */
        return gpu_mm_mat(g, &gl->wo, g->att, (int64_t)w.ad, n, g->tmp, ne) < 0 ||
                       gpu_add_bias(g->tmp, ne, gl->bo, n, ne) < 0 ||
                       gpu_add(g->x, g->x, g->tmp, (int64_t)n * ne) < 0
                   ? -1
                   : 0;
    return gpu_mm_add(g, &gl->wo, g->att, (int64_t)w.ad, n, g->x, ne);
}

/* One routed expert's biases (gpt-oss), device rows: gate's and up's (both or neither), down's
 * (or NULL). */
struct gpu_exp_bias {
    const float *g, *u, *d;
};

/* silu(gate . x) * (up . x) into g->ga (relu(gate . x)^2 * (up . x) with bitnet's relu2, then
 * its ffn_sub_norm when sub_norm is given, as executor_fwd_dense_gate_up; the clamped SwiGLU of
 * gpt-oss's experts when xb gives gate and up biases), then down (plus xb's down bias) into
 * `out` (n rows of ne). */
static int gpu_swiglu_ffn(struct executor_gpu *g, const struct gpu_mat *gate,
                          const struct gpu_mat *up, const struct gpu_mat *down, const float *x,
                          uint32_t n, float *out, struct gpu_xpool *wait_px, bool add,
                          const float *sub_norm, const struct gpu_exp_bias *xb)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const int64_t                ne = hp->n_embd, nf = gate->rows;
    const bool                   relu2 = hp->ffn_relu2 != 0, oai = xb && xb->g;
    /* gate and up in one int8 matvec and the product in its store where they are alike */
    const bool glu = !relu2 && !oai && gpu_mm_q8_fused(g, gate, n) && gpu_mm_q8_fused(g, up, n) &&
                     gate->type == up->type && gate->row_bytes == up->row_bytes &&
                     gate->rows == up->rows && gate->cols == up->cols;
    if (glu ? gpu_mv_q8_op(g, GPU_MV_GLU, gate, up, x, ne, n, g->ga, nf) < 0
            : gpu_mm_shared(g, gate, x, ne, n, g->ga, nf, false) < 0 ||
                  gpu_mm_shared(g, up, x, ne, n, g->up, nf, true) < 0 ||
                  (oai ? gpu_swiglu_oai(g->ga, g->up, n, nf, xb->g, xb->u, 1, NULL)
                       : gpu_swiglu(g->ga, g->up, (int64_t)n * nf, relu2)) < 0)
        return -1;
    if (sub_norm && gpu_rmsnorm(g->ga, nf, g->ga, nf, sub_norm, n, nf, hp->rms_eps) < 0)
        return -1;
    if (wait_px && gpu_pool_wait(wait_px, GPU_EV_D, false) < 0)
        return -1;
    if ((add ? gpu_mm_add(g, down, g->ga, nf, n, out, ne)
             : gpu_mm_mat(g, down, g->ga, nf, n, out, ne)) < 0)
        return -1;
    return xb && xb->d ? gpu_add_bias(out, ne, xb->d, n, ne) : 0;
}

/* Expert e's part p as a matrix. */
static struct gpu_mat gpu_expert(const struct gpu_experts *x, int32_t e)
{
    return (struct gpu_mat){.d = (uint8_t *)x->d + (size_t)e * x->bytes,
                            .type = x->type,
                            .rows = x->rows,
                            .cols = x->cols,
                            .row_bytes = x->row_bytes};
}

/* After a pooled round's kernels: event k (the next round's copies wait for it), the loans
 * ended. Returns 0 (*again when a loan's bytes changed, now or when `torn` says so before: the
 * round must be done again, at most GPU_POOL_TRIES times), -1 (device), -2 (a part kept
 * changing: *cpu_rc). */
static int gpu_pool_round_end(const struct executor_gpu_weights *gw, uint32_t tries, bool torn,
                              bool *again, struct executor_ctx *c, int *cpu_rc)
{
    struct gpu_xpool *px = gw->pool;
    *again = false;
    if (gpu_event_record_kernels(px->ev_k) < 0 ||
        (px->dev && gpu_event_record_kernels_shared(px->dp.kev) < 0) ||
        gpu_loans_end(px, gw->m->w, &torn) < 0)
        return -1;
    const bool stage_failed = px->stage_failed;
    px->stage_failed = false;
    if (stage_failed && px->stage_off && px->dev) { /* through the RAM pools too */
        gpu_pool_lose(px);                          /* the executor copies from now on */
        snprintf(px->dev_why, sizeof(px->dev_why), "the fetcher's copies failed twice");
        px->retake_off = true;
    }
    px->stage_off = stage_failed;   /* the next round (this one again) through the RAM pools */
    if (px->lost || stage_failed) { /* what the fetchers copied this round may be missing */
        px->lost = false;
        torn = true;
        for (uint32_t sl = 0; sl < px->n_slots; sl++) {
            if (px->owner[sl] != UINT32_MAX)
                px->slot_of[px->owner[sl]] = -1;
            px->owner[sl] = UINT32_MAX;
        }
    }
    if (!torn)
        return 0;
    px->redone++;
    if (tries + 1 < GPU_POOL_TRIES) {
        *again = true;
        return 0;
    }
    *cpu_rc = common_errmsg_set(&c->err, COMMON_EIO,
                                "an expert's bytes kept changing while they were copied to the "
                                "device (%u tries)",
                                GPU_POOL_TRIES);
    return -2;
}

/* The router's picks of the step's n rows brought to the host and sorted by expert: expert x's
 * (token, slot) items are g->h_items[h_start[x] .. h_start[x + 1]), in item order, and
 * g->h_rows holds each one's token. 0, or -1 (device, or a pick out of range). */
static int gpu_picks_by_expert(struct executor_gpu *g, uint32_t n)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const uint32_t               E = hp->n_expert, K = hp->n_expert_used, nk = n * K;
    if (gpu_download(g->h_sel, g->sel, (size_t)nk * sizeof(int32_t)) < 0)
        return -1;
    memset(g->h_count, 0, (E + 1) * sizeof(int32_t));
    for (uint32_t i = 0; i < nk; i++) {
        if (g->h_sel[i] < 0 || (uint32_t)g->h_sel[i] >= E)
            return -1; /* a routing kernel gone wrong: never index with it */
        g->h_count[g->h_sel[i]]++;
    }
    g->h_start[0] = 0;
    for (uint32_t x = 0; x < E; x++)
        g->h_start[x + 1] = g->h_start[x] + g->h_count[x];
    memset(g->h_count, 0, (E + 1) * sizeof(int32_t));
    for (uint32_t i = 0; i < nk; i++) {
        const int32_t x = g->h_sel[i], at = g->h_start[x] + g->h_count[x]++;
        g->h_items[at] = (int32_t)i;      /* its (token, slot) row of moe_y */
        g->h_rows[at] = (int32_t)(i / K); /* its token's row of xn */
    }
    return 0;
}

/* The activation of a MoE path's gate and up products, `items` rows of nf in ga and up, item i's
 * expert at experts[i] (device): gpt-oss's clamped SwiGLU with its experts' gate and up biases,
 * else silu(g) * u. */
static int gpu_moe_act(const struct executor_gpu *g, const struct gpu_layer *gl, float *ga,
                       const float *up, int64_t items, int64_t nf, const int32_t *experts)
{
    const int32_t E = (int32_t)g->m->desc->hp.n_expert;
    return gl->gate_exps_b
               ? gpu_swiglu_oai(ga, up, items, nf, gl->gate_exps_b, gl->up_exps_b, E, experts)
               : gpu_swiglu(ga, up, items * nf, false);
}

/* Down's biases (gpt-oss) added to a MoE path's `items` output rows y (ne apart), item i's
 * expert at experts[i] (device). */
static int gpu_moe_down_bias(const struct executor_gpu *g, const struct gpu_layer *gl, float *y,
                             int64_t items, const int32_t *experts)
{
    const int64_t ne = g->m->desc->hp.n_embd;
    return gl->down_exps_b ? gpu_add_bias_ids(y, ne, gl->down_exps_b,
                                              (int32_t)g->m->desc->hp.n_expert, experts, items, ne)
                           : 0;
}

/* Whether every part of a layer's routed experts takes int8 products (gpu_moe_groups, and
 * gpu_moe_grouped's per-expert products under the pool, which then give the same bits). */
static bool gpu_q8_experts(const struct gpu_layer *gl, int64_t ne)
{
    const struct gpu_experts *xg = &gl->exps[COMMON_EXPERT_GATE], *xu = &gl->exps[COMMON_EXPERT_UP],
                             *xd = &gl->exps[COMMON_EXPERT_DOWN];
    return gpu_q8_path(xg->type, ne) && gpu_q8_path(xu->type, ne) &&
           executor_vec_dot_type(xg->type) == executor_vec_dot_type(xu->type) &&
           gpu_q8_path(xd->type, xg->rows);
}

/* What the MoE prefill paths of layer il over n rows work with: the expert parts, the counts
 * of experts, picks per token and items, and the widths. */
struct gpu_moe_parts {
    const struct gpu_experts *xg, *xu, *xd;
    uint32_t                  E, K, nk;
    int64_t                   ne, nf;
};

static struct gpu_moe_parts gpu_moe_parts_of(const struct executor_gpu *g, uint32_t il, uint32_t n)
{
    const struct gpu_layer      *gl = &g->w->layers[il];
    const struct common_hparams *hp = &g->m->desc->hp;
    return (struct gpu_moe_parts){.xg = &gl->exps[COMMON_EXPERT_GATE],
                                  .xu = &gl->exps[COMMON_EXPERT_UP],
                                  .xd = &gl->exps[COMMON_EXPERT_DOWN],
                                  .E = hp->n_expert,
                                  .K = hp->n_expert_used,
                                  .nk = n * hp->n_expert_used,
                                  .ne = hp->n_embd,
                                  .nf = gl->exps[COMMON_EXPERT_GATE].rows};
}

/* The routed experts of a step of many rows (a prefill), every expert resident: the router's
 * picks brought to the host once, each expert's (token, slot) items in groups of up to
 * GPU_GROUP_MAX, then one launch per part over every group (gpu_matvec_groups_q8: each weight row
 * read once per group), swiglu over all items, outputs into g->moe_y by item. 0 or -1. */
static int gpu_moe_groups(struct executor_gpu *g, uint32_t il, uint32_t n)
{
    const struct gpu_moe_parts p = gpu_moe_parts_of(g, il, n);
    const uint32_t             E = p.E, K = p.K, nk = p.nk;
    const int64_t              ne = p.ne, nf = p.nf;
    const struct gpu_experts  *xg = p.xg, *xu = p.xu, *xd = p.xd;
    if (gpu_picks_by_expert(g, n) < 0)
        return -1;
    /* Groups for gate and up (activation rows: tokens), then the same for down (the items). */
    struct gpu_group *gu = g->h_groups;
    uint32_t          ng = 0;
    for (uint32_t x = 0; x < E; x++)
        for (int32_t at = g->h_start[x]; at < g->h_start[x + 1]; at += GPU_GROUP_MAX) {
            struct gpu_group *gr = &gu[ng++];
            const int32_t     left = g->h_start[x + 1] - at;
            gr->expert = (int32_t)x;
            gr->n = left < GPU_GROUP_MAX ? left : GPU_GROUP_MAX;
            for (int32_t t = 0; t < GPU_GROUP_MAX; t++) {
                const int32_t item = g->h_items[at + (t < gr->n ? t : 0)];
                gr->x_row[t] = item / (int32_t)K;
                gr->y_row[t] = item;
            }
        }
    struct gpu_group *gd = gu + ng;
    for (uint32_t i = 0; i < ng; i++) {
        gd[i] = gu[i];
        memcpy(gd[i].x_row, gu[i].y_row, sizeof(gd[i].x_row));
    }
    if (gpu_upload(g->groups, gu, 2 * (size_t)ng * sizeof(struct gpu_group)) < 0)
        return -1;
    const void *xq = gpu_q8_for(g, xg->type, g->xn, ne, n, ne);
    if (!xq ||
        gpu_matvec_groups_q8(xg->type, xg->d, xg->bytes, xg->row_bytes, nf, ne, g->groups, ng, xq,
                             g->ga, nf) < 0 ||
        gpu_matvec_groups_q8(xu->type, xu->d, xu->bytes, xu->row_bytes, nf, ne, g->groups, ng, xq,
                             g->up, nf) < 0 ||
        gpu_moe_act(g, &g->w->layers[il], g->ga, g->up, nk, nf, g->sel) < 0)
        return -1;
    g->q8_src = NULL;
    const void *hq = gpu_q8_for(g, xd->type, g->ga, nf, nk, nf);
    return hq &&
                   gpu_matvec_groups_q8(xd->type, xd->d, xd->bytes, xd->row_bytes, xd->rows, nf,
                                        g->groups + ng, ng, hq, g->moe_y, ne) == 0 &&
                   gpu_moe_down_bias(g, &g->w->layers[il], g->moe_y, nk, g->sel) == 0
               ? 0
               : -1;
}

/* Whether a prefill's routed experts of layer gl go through gpu_gemm_q by tiles (gpu_moe_tiles),
 * and the pool's per-expert products through the same matmul (g->mm_only), whatever their rows. */
static bool gpu_tiles_experts(const struct executor_gpu *g, const struct gpu_layer *gl, int64_t ne)
{
    const struct gpu_experts *xg = &gl->exps[COMMON_EXPERT_GATE], *xu = &gl->exps[COMMON_EXPERT_UP],
                             *xd = &gl->exps[COMMON_EXPERT_DOWN];
    return gpu_gemm_q_path(g, xg->type, ne) && gpu_gemm_q_path(g, xu->type, ne) &&
           gpu_gemm_q_path(g, xd->type, xg->rows);
}

/* The routed experts of a step of many rows (a prefill), every expert resident, on the tensor
 * cores: the router's picks sorted by expert (brought to the host, or with
 * SLUICE_MOE_DEVICE_SORT=1 on the device, gpu_moe_sort, without a round trip), each expert's
 * (token, slot) items cut into tiles of up to GPU_MM_TILE, then one gpu_gemm_q launch per part
 * over every tile (each expert's quantized rows read once per tile), swiglu over all items,
 * outputs into g->moe_y by item. */
static int gpu_moe_tiles(struct executor_gpu *g, uint32_t il, uint32_t n)
{
    const struct gpu_moe_parts p = gpu_moe_parts_of(g, il, n);
    const uint32_t             E = p.E, K = p.K, nk = p.nk;
    const int64_t              ne = p.ne, nf = p.nf;
    const struct gpu_experts  *xg = p.xg, *xu = p.xu, *xd = p.xd;
    /* The tiles go where the groups would (g->groups holds more than the most there can be). */
    struct gpu_mm_tile *dt = (struct gpu_mm_tile *)(void *)g->groups;
    const int64_t       max_tiles = nk / GPU_MM_TILE + E;
    if (g->device_sort) { /* SLUICE_MOE_DEVICE_SORT=1: not yet run on a CUDA device */
        if (gpu_moe_sort(g->sel, nk, E, GPU_MM_TILE, g->items, dt, g->n_tiles_d) < 0)
            return -1;
    } else {
        if (gpu_picks_by_expert(g, n) < 0)
            return -1;
        struct gpu_mm_tile *tl = (struct gpu_mm_tile *)(void *)g->h_groups;
        int32_t             nt = 0;
        for (uint32_t x = 0; x < E; x++)
            for (int32_t at = g->h_start[x]; at < g->h_start[x + 1]; at += GPU_MM_TILE) {
                const int32_t left = g->h_start[x + 1] - at;
                tl[nt++] = (struct gpu_mm_tile){.expert = (int32_t)x,
                                                .first = at,
                                                .count = left < GPU_MM_TILE ? left : GPU_MM_TILE};
            }
        if (gpu_upload(dt, tl, (size_t)nt * sizeof(*tl)) < 0 ||
            gpu_upload(g->items, g->h_items, (size_t)nk * sizeof(int32_t)) < 0 ||
            gpu_upload(g->n_tiles_d, &nt, sizeof(nt)) < 0)
            return -1;
    }
    g->q8_src = NULL;
    const float *xr = gpu_round_for(g, xg->type, g->xn, ne, n, ne);
    if (!xr || gpu_f32_to_f16(xr, ne, n, ne, g->x16) < 0 ||
        gpu_gemm_q_used(xg->type, xg->d, xg->bytes, xg->row_bytes, nf, ne, g->x16, dt, max_tiles,
                        g->n_tiles_d, g->items, (int32_t)K, g->ga, nf) < 0 ||
        gpu_gemm_q_used(xu->type, xu->d, xu->bytes, xu->row_bytes, nf, ne, g->x16, dt, max_tiles,
                        g->n_tiles_d, g->items, (int32_t)K, g->up, nf) < 0 ||
        gpu_moe_act(g, &g->w->layers[il], g->ga, g->up, nk, nf, g->sel) < 0)
        return -1;
    const float *hr = gpu_round_for(g, xd->type, g->ga, nf, nk, nf);
    return hr && gpu_f32_to_f16(hr, nf, nk, nf, g->x16) == 0 &&
                   gpu_gemm_q_used(xd->type, xd->d, xd->bytes, xd->row_bytes, xd->rows, nf, g->x16,
                                   dt, max_tiles, g->n_tiles_d, g->items, 1, g->moe_y, ne) == 0 &&
                   gpu_moe_down_bias(g, &g->w->layers[il], g->moe_y, nk, g->sel) == 0
               ? 0
               : -1;
}

/* The routed experts of a prefill whose experts are in the pool or not all int8: the choices
 * brought to the host and grouped by expert, each expert's rows gathered and computed through the
 * matmul (from its slot when the layer's experts are in the pool, the lock held), its outputs put
 * back by (token, slot) row into g->moe_y. Returns 0 (*cpu_rc < 0 when the weight source failed) or
 * -1 (device). */
static int gpu_moe_grouped(struct executor_gpu *g, uint32_t il, uint32_t n, struct executor_ctx *c,
                           int *cpu_rc)
{
    const struct gpu_layer      *gl = &g->w->layers[il];
    const struct common_hparams *hp = &g->m->desc->hp;
    const uint32_t               E = hp->n_expert, K = hp->n_expert_used, ne = hp->n_embd;
    const uint32_t               nk = n * K;
    if (gpu_picks_by_expert(g, n) < 0)
        return -1;
    if (gpu_upload(g->items, g->h_items, (size_t)nk * sizeof(int32_t)) < 0 ||
        gpu_upload(g->rows, g->h_rows, (size_t)nk * sizeof(int32_t)) < 0)
        return -1;
    for (uint32_t x = 0; x < E; x++) {
        const int32_t cnt = g->h_start[x + 1] - g->h_start[x];
        if (cnt == 0)
            continue;
        struct gpu_xpool *px = gl->pooled ? g->w->pool : NULL;
        for (uint32_t tries = 0;; tries++) {
            int32_t at = (int32_t)x;
            bool    torn = false, again = false, miss = false;
            if (px) {
                px->round++;
                px->n_miss = 0;
                at = gpu_pool_take(px, il, x);
                miss = px->n_miss > 0;
                const int rc = gpu_pool_fill(g->w, il, c, cpu_rc, &torn);
                if (rc < 0)
                    return rc == -1 ? -1 : 0;
            }
            const struct gpu_mat      ge = gpu_expert(&gl->exps[COMMON_EXPERT_GATE], at);
            const struct gpu_mat      ue = gpu_expert(&gl->exps[COMMON_EXPERT_UP], at);
            const struct gpu_mat      de = gpu_expert(&gl->exps[COMMON_EXPERT_DOWN], at);
            const size_t              nfx = (size_t)gl->exps[COMMON_EXPERT_GATE].rows;
            const struct gpu_exp_bias xb = {.g = gl->gate_exps_b ? gl->gate_exps_b + x * nfx : NULL,
                                            .u = gl->up_exps_b ? gl->up_exps_b + x * nfx : NULL,
                                            .d = gl->down_exps_b ? gl->down_exps_b + (size_t)x * ne
                                                                 : NULL};
            /* the resident path's kernels at any count, for its bits: the matmul from the
             * quantized rows (gpu_moe_tiles), or the int8 matvec (gpu_moe_groups) */
            g->mm_only = gpu_tiles_experts(g, gl, ne);
            g->mv_only = !g->mm_only && gpu_q8_experts(gl, ne);
            const bool bad =
                gpu_gather_rows(g->gx, ne, g->xn, ne, g->rows + g->h_start[x], cnt, ne) < 0 ||
                (miss && gpu_pool_wait(px, GPU_EV_GU, false) < 0) ||
                gpu_swiglu_ffn(g, &ge, &ue, &de, g->gx, (uint32_t)cnt, g->tmp, miss ? px : NULL,
                               false, NULL, &xb) < 0 ||
                gpu_scatter_rows(g->moe_y, ne, g->tmp, ne, g->items + g->h_start[x], cnt, ne) < 0;
            g->mv_only = false;
            g->mm_only = false;
            if (bad)
                return -1;
            if (!px)
                break;
            const int rc = gpu_pool_round_end(g->w, tries, torn, &again, c, cpu_rc);
            if (rc < 0)
                return rc == -1 ? -1 : 0;
            if (!again)
                break;
        }
    }
    return 0;
}

/* The routed experts of tokens [t0, t1) of a step of fewer than GPU_GEMM_MIN_N rows: every
 * (token, slot) item in one launch per part, the experts (or their slots in the pool) at ids
 * (device memory, n * K of them), outputs into g->moe_y. 0 or -1. */
/* y row i = expert ids[i]'s matrix of xe . activation row i / x_div of x (n_x rows of xe->cols,
 * contiguous), i < items: int8 activations (gpu_matvec_ids_q8) where the type takes them,
 * rounded floats otherwise. same_x: x has not changed since the product before (its image is
 * reused). */
static int gpu_experts_mv(struct executor_gpu *g, const struct gpu_experts *xe, const int32_t *ids,
                          int64_t items, const float *x, int64_t x_stride, int64_t cols,
                          uint32_t n_x, int64_t x_div, float *y, int64_t y_stride, bool same_x)
{
    if (gpu_q8_path(xe->type, cols)) {
        g->q8_reuse = same_x;
        const void *q8 = gpu_q8_for(g, xe->type, x, x_stride, n_x, cols);
        g->q8_reuse = false;
        return q8 ? gpu_matvec_ids_q8(xe->type, xe->d, xe->bytes, xe->row_bytes, xe->rows, xe->cols,
                                      ids, items, q8, x_div, y, y_stride)
                  : -1;
    }
    g->q8_src = NULL;
    const float *xr = gpu_round_for(g, xe->type, x, x_stride, n_x, cols);
    /* gpu_round_for's rows are packed (cols apart) unless it returned x itself */
    return xr ? gpu_matvec_ids(xe->type, xe->d, xe->bytes, xe->row_bytes, xe->rows, xe->cols, ids,
                               items, xr, xr == x ? x_stride : cols, x_div, y, y_stride)
              : -1;
}

static int gpu_moe_items(struct executor_gpu *g, const struct gpu_layer *gl, const int32_t *ids,
                         uint32_t t0, uint32_t t1, struct gpu_xpool *wait_px, bool combine)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const uint32_t               K = hp->n_expert_used;
    const int64_t                ne = hp->n_embd;
    const struct gpu_experts    *xg = &gl->exps[COMMON_EXPERT_GATE];
    const struct gpu_experts    *xu = &gl->exps[COMMON_EXPERT_UP];
    const struct gpu_experts    *xd = &gl->exps[COMMON_EXPERT_DOWN];
    const int64_t                nf = xg->rows, items = (int64_t)(t1 - t0) * K;
    const size_t                 i0 = (size_t)t0 * K;
    float                       *ga = g->ga + i0 * (size_t)nf, *up = g->up + i0 * (size_t)nf;
    const float                 *xa = g->xn + (size_t)t0 * ne;
    /* gate and up in one int8 matvec, the product in its store, where they are alike (and the
     * activation is silu(g) * u) */
    const bool glu = !gl->gate_exps_b && gpu_q8_path(xg->type, ne) && xg->type == xu->type &&
                     xg->row_bytes == xu->row_bytes && xg->bytes == xu->bytes &&
                     xg->rows == xu->rows && xg->cols == xu->cols;
    const void *q8 = NULL;
    if (executor_vec_dot_type(xu->type) != executor_vec_dot_type(xg->type) ||
        (wait_px && gpu_pool_wait(wait_px, GPU_EV_GU, false) < 0))
        return -1;
    if (glu ? !(q8 = gpu_q8_for(g, xg->type, xa, ne, t1 - t0, ne)) ||
                  gpu_matvec_ids_glu_q8(xg->type, xg->d, xu->d, xg->bytes, xg->row_bytes, xg->rows,
                                        xg->cols, ids + i0, items, q8, K, ga, nf) < 0
            : gpu_experts_mv(g, xg, ids + i0, items, xa, ne, ne, t1 - t0, K, ga, nf, false) < 0 ||
                  gpu_experts_mv(g, xu, ids + i0, items, xa, ne, ne, t1 - t0, K, up, nf, true) <
                      0 ||
                  gpu_moe_act(g, gl, ga, up, items, nf, g->sel + i0) < 0)
        return -1;
    if (combine) { /* down, and the weighted sum of the token's items added to x at once */
        const void *hq = gpu_q8_for(g, xd->type, ga, nf, (uint32_t)items, nf);
        return hq && gpu_matvec_ids_combine_q8(xd->type, xd->d, xd->bytes, xd->row_bytes, xd->rows,
                                               xd->cols, ids + i0, g->sel_w + i0, t1 - t0,
                                               (int32_t)K, hq, g->x + (size_t)t0 * ne, ne) == 0
                   ? 0
                   : -1;
    }
    /* the biases by the items' experts (g->sel), not by ids (slots, in the pool) */
    if ((wait_px && gpu_pool_wait(wait_px, GPU_EV_D, false) < 0) ||
        gpu_experts_mv(g, xd, ids + i0, items, ga, nf, nf, (uint32_t)items, 1,
                       g->moe_y + i0 * (size_t)ne, ne, false) < 0 ||
        gpu_moe_down_bias(g, gl, g->moe_y + i0 * (size_t)ne, items, g->sel + i0) < 0)
        return -1;
    return 0;
}

/* Whether a round's missing expert of `bytes` is computed on the CPU (--expert-miss): always
 * (cpu), never (copy), or (auto) when the CPU would be done with it and the round's other CPU
 * experts sooner than the copy stream with it and the round's other copies (*t_cpu, *t_copy:
 * the round's estimated ns so far, the two working side by side). Both rates leave storage out
 * (an expert still being read waits for it either way): until the CPU's is measured, auto
 * gives it the first miss already in RAM (`in_ram`), and copies the others. */
static bool gpu_miss_on_cpu(const struct gpu_xpool *px, size_t bytes, bool in_ram, double *t_cpu,
                            double *t_copy)
{
    if (px->miss_mode != EXECUTOR_MISS_AUTO)
        return px->miss_mode == EXECUTOR_MISS_CPU;
    if (!(px->cpu_ns_b > 0))
        return in_ram;
    const double cpu = px->cpu_ns_b * (double)bytes, copy = px->copy_ns_b * (double)bytes;
    if (*t_copy + copy <= *t_cpu + cpu) {
        *t_copy += copy;
        return false;
    }
    *t_cpu += cpu;
    return true;
}

/* A pooled round's experts that the CPU computes (px->cpu_mark is this round's): the rows of
 * their tokens (g->xn, brought to the host once a step: *have_xn) through the CPU's expert
 * (executor_moe_expert_rows, from the weight source), each (token, slot) output uploaded to its
 * row of g->moe_y, after the device's kernels (which computed a stand-in there). The CPU's
 * ns per byte (`bytes`: one expert of layer il) is kept as a running mean. Returns 0, -1 (device)
 * or -2 (the weight source failed: *cpu_rc, text in c->err). */
static int gpu_moe_cpu_round(struct executor_gpu *g, uint32_t il, size_t bytes, uint32_t n,
                             uint32_t t0, uint32_t t1, struct executor_ctx *c, bool *have_xn,
                             int *cpu_rc)
{
    struct gpu_xpool *px = g->w->pool;
    const int64_t     ne = g->m->desc->hp.n_embd;
    const uint32_t    K = g->m->desc->hp.n_expert_used;
    const size_t      row = (size_t)ne * sizeof(float);
    if (!*have_xn && gpu_download(c->xn, g->xn, (size_t)n * row) < 0)
        return -1;
    *have_xn = true;
    for (uint32_t i = t0 * K; i < t1 * K; i++) {
        const int32_t x = g->h_sel[i];
        if (px->cpu_mark[x] != px->round || g->h_items[i] == INT32_MIN)
            continue;
        int32_t cnt = 0; /* the round's items of expert x, listed in g->h_rows */
        for (uint32_t k = i; k < t1 * K; k++)
            if (g->h_sel[k] == x) {
                memcpy(c->gx + (size_t)cnt * ne, c->xn + (size_t)(k / K) * ne, row);
                g->h_rows[cnt++] = (int32_t)k;
                g->h_items[k] = INT32_MIN; /* done */
            }
        const uint64_t ts = common_now_ns();
        const int      rc = executor_moe_expert_rows(c, il, (uint32_t)x, cnt);
        if (rc < 0) {
            *cpu_rc = rc;
            return -2;
        }
        const double ns_b = (double)(common_now_ns() - ts) / (double)bytes;
        if (px->cpu_clean[x])
            px->cpu_ns_b = px->cpu_ns_b > 0 ? 0.75 * px->cpu_ns_b + 0.25 * ns_b : ns_b;
        px->cpu_misses += (uint64_t)cnt;
        for (int32_t r = 0; r < cnt; r++)
            if (gpu_upload(g->moe_y + (size_t)g->h_rows[r] * ne, c->tmp + (size_t)r * ne, row) < 0)
                return -1;
    }
    return 0;
}

/* The routed experts of a step of fewer than GPU_GEMM_MIN_N rows from the pool (the lock
 * held): the picks brought to the host (and asked of the weight source at once, so that its
 * reads overlap), the tokens taken in rounds whose experts fit in the pool together (one
 * token's always do), each round's missing experts copied in, then computed over their slots
 * (gpu_moe_items: the same products as with every expert uploaded), or, as --expert-miss
 * chooses, computed on the CPU meanwhile (gpu_moe_cpu_round). Returns 0 (*cpu_rc < 0 when the
 * weight source failed) or -1 (device). */
static int gpu_moe_pooled(struct executor_gpu *g, uint32_t il, uint32_t n, struct executor_ctx *c,
                          int *cpu_rc)
{
    const struct executor_gpu_weights *gw = g->w;
    struct gpu_xpool                  *px = gw->pool;
    const struct executor_weights     *w = gw->m->w;
    const uint32_t                     E = px->n_expert, K = gw->m->desc->hp.n_expert_used;
    size_t                             bytes = 0; /* one expert of the layer */
    bool                               have_xn = false;
    for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
        bytes += (size_t)gw->layers[il].exps[p].rows * gw->layers[il].exps[p].row_bytes;
    gpu_pool_retake(px);
    if (gpu_download(g->h_sel, g->sel, (size_t)n * K * sizeof(int32_t)) < 0)
        return -1;
    for (uint32_t i = 0; i < n * K; i++) {
        if (g->h_sel[i] < 0 || (uint32_t)g->h_sel[i] >= E)
            return -1; /* a routing kernel gone wrong: never index with it */
        if (w->ops->expert_request && px->slot_of[il * E + (uint32_t)g->h_sel[i]] < 0 &&
            !gpu_pool_stages(px)) /* staged: not through the RAM pool */
            (void)w->ops->expert_request(w->impl, il, (uint32_t)g->h_sel[i],
                                         EXECUTOR_HINT_POSTFETCH);
    }
    for (uint32_t t0 = 0, t1 = 0, tries = 0; t0 < n; t0 = t1) {
        uint32_t used = 0, on_cpu = 0;
        bool     torn = false, again = false;
        double   t_cpu = 0, t_copy = 0;
        px->round++;
        px->n_miss = 0;
        for (t1 = t0; t1 < n; t1++) {
            const int32_t *sel = g->h_sel + (size_t)t1 * K;
            uint32_t       add = 0;
            for (uint32_t j = 0; j < K; j++)
                add += px->mark[sel[j]] != px->round;
            if (t1 > t0 && used + add > px->n_slots)
                break;
            used += add;
            for (uint32_t j = 0; j < K; j++) {
                const uint32_t x = (uint32_t)sel[j];
                if (px->mark[x] != px->round) {
                    px->mark[x] = px->round;
                    const bool in_ram =
                        !w->ops->expert_is_ready || w->ops->expert_is_ready(w->impl, il, x);
                    if (px->slot_of[il * E + x] < 0 &&
                        gpu_miss_on_cpu(px, bytes, in_ram, &t_cpu, &t_copy)) {
                        px->cpu_mark[x] = px->round;
                        px->cpu_clean[x] = in_ram;
                    }
                }
                const bool cpu = px->cpu_mark[x] == px->round;
                on_cpu += cpu;
                g->h_items[(size_t)t1 * K + j] = cpu ? -1 : gpu_pool_take(px, il, x);
            }
        }
        /* The device computes a stand-in (a slot of the round) where the CPU computes. */
        const size_t i0 = (size_t)t0 * K, i1 = (size_t)t1 * K;
        int32_t      stand_in = -1;
        for (size_t i = i0; i < i1 && stand_in < 0; i++)
            stand_in = g->h_items[i];
        for (size_t i = i0; i < i1 && on_cpu; i++)
            g->h_items[i] = g->h_items[i] < 0 ? stand_in : g->h_items[i];
        const bool miss = px->n_miss > 0;
        const int  rc = gpu_pool_fill(gw, il, c, cpu_rc, &torn);
        if (rc < 0)
            return rc == -1 ? -1 : 0;
        if (stand_in >= 0 &&
            (gpu_upload(g->items + i0, g->h_items + i0, (i1 - i0) * sizeof(int32_t)) < 0 ||
             gpu_moe_items(g, &gw->layers[il], g->items, t0, t1, miss ? px : NULL, false) < 0))
            return -1;
        const int cpu =
            on_cpu ? gpu_moe_cpu_round(g, il, bytes, n, t0, t1, c, &have_xn, cpu_rc) : 0;
        if (cpu == -1)
            return -1;
        const int end = gpu_pool_round_end(gw, tries, torn, &again, c, cpu_rc);
        if (end < 0 || cpu < 0) /* -2: *cpu_rc says why */
            return end == -1 ? -1 : 0;
        tries = again ? tries + 1 : 0;
        if (again)
            t1 = t0; /* the same tokens again */
    }
    return 0;
}

/* The feed-forward of layer il for the n rows of g->x: adds its output. A layer whose MoE stays
 * on the CPU (--n-cpu-moe) sends x to the host ctx c, where the CPU's FFN (its norm, routing,
 * routed and shared experts, from RAM or streamed) adds to it, and takes x back; a failure
 * there leaves its common_err in *cpu_rc (text in c->err). */
/* The shared expert of layer gl (if any) for the n rows of g->xn, added to x before the routed
 * experts' sum. */
static int gpu_shared_expert(struct executor_gpu *g, const struct gpu_layer *gl, uint32_t n)
{
    const int64_t ne = g->m->desc->hp.n_embd;
    if (gl->sh_gate.d && gl->sh_gate_inp.d) {
        /* A gated shared expert (qwen2moe): its output (in gx, which the routed experts do not
         * hold at this point) times the sigmoid of its gate's one logit a row (in router, whose
         * logits are spent: the routing is done) added first. */
        if (gpu_swiglu_ffn(g, &gl->sh_gate, &gl->sh_up, &gl->sh_down, g->xn, n, g->gx, NULL, false,
                           NULL, NULL) < 0 ||
            gpu_mm_mat(g, &gl->sh_gate_inp, g->xn, ne, n, g->router, 1) < 0 ||
            gpu_gated_add(g->x, g->gx, g->router, n, (uint32_t)ne) < 0)
            return -1;
    } else if (gl->sh_gate.d) {
        /* An ungated shared expert beside the routed ones: its output added first. */
        if (gpu_swiglu_ffn(g, &gl->sh_gate, &gl->sh_up, &gl->sh_down, g->xn, n, g->x, NULL, true,
                           NULL, NULL) < 0)
            return -1;
    }
    return 0;
}

/* Whether a few tokens' routed experts (gpu_moe_items) add their weighted sum to x in the down
 * kernel (gpu_matvec_ids_combine_q8): int8 down products without a bias. */
static bool gpu_down_combines(const struct executor_gpu *g, const struct gpu_layer *gl)
{
    const struct gpu_experts *xd = &gl->exps[COMMON_EXPERT_DOWN];
    return !g->fuse_off && !gl->down_exps_b && gpu_q8_path(xd->type, xd->cols);
}

static int gpu_ffn_block(struct executor_gpu *g, uint32_t il, uint32_t n, struct executor_ctx *c,
                         int *cpu_rc)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const struct gpu_layer      *gl = &g->w->layers[il];
    const int64_t                ne = hp->n_embd;
    if (gl->cpu_moe) {
        const size_t bytes = (size_t)n * (size_t)ne * sizeof(float);
        if (gpu_download(c->x, g->x, bytes) < 0)
            return -1;
        if ((*cpu_rc = executor_fwd_cpu_ffn(c, il, n)) < 0)
            return 0;
        return gpu_upload(g->x, c->x, bytes);
    }
    /* the routed experts' gate, or the dense FFN's, reads the normed rows as int8 */
    if (gpu_norm_xn(g, g->x, gl->ffn_norm, n,
                    gl->gate_inp.d ? gl->exps[COMMON_EXPERT_GATE].type : gl->gate.type) < 0)
        return -1;
    if (!gl->gate_inp.d) {
        return gpu_swiglu_ffn(g, &gl->gate, &gl->up, &gl->down, g->xn, n, g->x, NULL, true,
                              gl->ffn_sub_norm, NULL);
    }
    const uint32_t E = hp->n_expert, K = hp->n_expert_used;
    const int      gating = hp->expert_gating == COMMON_GATING_SIGMOID          ? 1
                            : hp->expert_gating == COMMON_GATING_SOFTMAX_WEIGHT ? 2
                                                                                : 0;
    if (gpu_mm_mat(g, &gl->gate_inp, g->xn, ne, n, g->router, E) < 0 ||
        (gl->gate_inp_b && gpu_add_bias(g->router, E, gl->gate_inp_b, n, E) < 0) ||
        gpu_moe_route(g->router, gl->exp_probs_b, n, E, K, hp->n_expert_groups, hp->n_group_used,
                      gating, hp->norm_topk_prob != 0, hp->expert_weights_scale, g->sel,
                      g->sel_w) < 0)
        return -1;
    if (n < g->gemm_min_n && !gl->pooled && gpu_down_combines(g, gl)) {
        /* A few tokens, the routed experts' sum in their down kernel: the shared expert first
         * (x gets the same sums in the same order: routed + (shared + x)). */
        return gpu_shared_expert(g, gl, n) < 0 || gpu_moe_items(g, gl, g->sel, 0, n, NULL, true) < 0
                   ? -1
                   : 0;
    }
    if (n < g->gemm_min_n && !gl->pooled) {
        /* A few tokens: every (token, slot) item in one launch per part, no host round trip. */
        if (gpu_moe_items(g, gl, g->sel, 0, n, NULL, false) < 0)
            return -1;
    } else if (!gl->pooled && gpu_tiles_experts(g, gl, ne)) {
        if (gpu_moe_tiles(g, il, n) < 0)
            return -1;
    } else if (!gl->pooled && gpu_q8_experts(gl, ne)) {
        if (gpu_moe_groups(g, il, n) < 0)
            return -1;
    } else {
        struct gpu_xpool *px = gl->pooled ? g->w->pool : NULL;
        if (px)
            pthread_mutex_lock(&px->mu);
        const int rc = n < g->gemm_min_n ? gpu_moe_pooled(g, il, n, c, cpu_rc)
                                         : gpu_moe_grouped(g, il, n, c, cpu_rc);
        if (px)
            pthread_mutex_unlock(&px->mu);
        if (rc < 0 || *cpu_rc < 0)
            return rc;
    }
    return gpu_shared_expert(g, gl, n) < 0
               ? -1
               : gpu_moe_combine(g->x, g->moe_y, g->sel_w, n, K, (uint32_t)ne);
}

/* The kernels of a step after its inputs are on the device: every layer from il0, then (with
 * the head) the norm and output matrix of the n_out rows out_rows into g->logits. 0, -1 (device),
 * or 0 with *cpu_rc < 0 (a layer's MoE on the CPU failed). */
static int gpu_step_kernels(struct executor_gpu *g, const struct executor_gpu_member *mb,
                            uint32_t n_mb, struct executor_ctx *c, uint32_t n,
                            const uint32_t *out_rows, uint32_t n_out, int *cpu_rc)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const int64_t                ne = hp->n_embd;
    for (uint32_t il = g->il0; il < g->il1 && *cpu_rc == 0; il++)
        if (gpu_attention_block(g, il, n, mb, n_mb) < 0 || gpu_ffn_block(g, il, n, c, cpu_rc) < 0)
            return -1;
    if (*cpu_rc < 0 || !g->head || !n_out)
        return 0;
    /* The output rows: contiguous ones read in place, others gathered first. */
    bool contiguous = true;
    for (uint32_t i = 1; i < n_out; i++)
        contiguous = contiguous && out_rows[i] == out_rows[0] + i;
    const float *xs = g->x + (size_t)out_rows[0] * ne;
    if (!contiguous) {
        for (uint32_t i = 0; i < n_out; i++)
            g->h_rows[i] = (int32_t)out_rows[i];
        if (gpu_upload(g->rows, g->h_rows, (size_t)n_out * sizeof(int32_t)) < 0 ||
            gpu_gather_rows(g->gx, ne, g->x, ne, g->rows, n_out, ne) < 0)
            return -1;
        xs = g->gx;
    }
    if (gpu_norm_xn(g, xs, g->w->output_norm, n_out, g->w->output.type) < 0 ||
        gpu_mm_mat(g, &g->w->output, g->xn, ne, n_out, g->logits, hp->n_vocab) < 0)
        return -1;
    return 0;
}

/* How a graph slot suits a new set of n_mb members: 2 empty, 1 a graph of as many members (to be
 * updated in place), 0 another's. */
static int gpu_slot_rank(const struct gpu_shape_graph *sg, uint32_t n_mb)
{
    return !sg->graph ? 2 : sg->n_mb == n_mb ? 1 : 0;
}

/* The graph slot a step runs as (NULL: it launches its kernels): every layer's kernels
 * independent of the host while they run (no expert pool, no MoE on the CPU), the head, if here,
 * with logits for every row, a backend with graphs, SLUICE_NO_CUDA_GRAPHS unset, and the step's
 * rows its members' one token each, in order (fewer than GPU_GEMM_MIN_N: no host round trip).
 * The slot is that of the members' set (shapes), or when there is none the best by
 * gpu_slot_rank (the least recently used of equals), marked stale when it holds a graph to update.
 */
static struct gpu_shape_graph *gpu_graph_step(struct executor_gpu              *g,
                                              const struct executor_gpu_member *mb, uint32_t n_mb,
                                              uint32_t n, const uint32_t *out_rows, uint32_t n_out,
                                              const float *logits)
{
    if (g->graph_off || n_mb == 0 || n != n_mb || n >= GPU_GEMM_MIN_N ||
        n_mb > EXECUTOR_GPU_ROW_EXACT || (g->head && (n_out != n || !logits)) || g->w->pool)
        return NULL;
    for (uint32_t i = 0; i < n_mb; i++)
        if (mb[i].n != 1 || mb[i].row != i || (g->head && out_rows[i] != i) ||
            mb[i].g->n_ctx > g->n_ctx)
            return NULL;
    if (!gpu_graphs_supported() || getenv("SLUICE_NO_CUDA_GRAPHS")) {
        g->graph_off = true;
        return NULL;
    }
    for (uint32_t il = g->il0; il < g->il1; il++)
        if (g->w->layers[il].cpu_moe) {
            g->graph_off = true;
            return NULL;
        }
    /* The set's own graph; else an empty slot, else the least recently used one of as many
     * members (its graph updated in place when captured again), else the least recently used */
    struct gpu_shape_graph *pick = NULL;
    for (uint32_t k = 0; k < GPU_GRAPH_SHAPES; k++) {
        struct gpu_shape_graph *sg = &g->shapes[k];
        bool                    same = sg->graph && sg->n_mb == n_mb;
        for (uint32_t i = 0; same && i < n_mb; i++)
            same = sg->serial[i] == mb[i].g->serial;
        if (same) {
            sg->used = ++g->shape_clock;
            return sg;
        }
        const int rank = gpu_slot_rank(sg, n_mb), best = pick ? gpu_slot_rank(pick, n_mb) : -1;
        if (rank > best || (rank == best && rank < 2 && sg->used < pick->used))
            pick = sg;
    }
    pick->stale = pick->graph && pick->n_mb == n_mb;
    if (!pick->stale) {
        gpu_graph_free(pick->graph);
        pick->graph = NULL;
    }
    pick->n_mb = n_mb;
    for (uint32_t i = 0; i < n_mb; i++)
        pick->serial[i] = mb[i].g->serial;
    pick->used = ++g->shape_clock;
    return pick;
}

/* Captures the kernels of a step (gpu_graph_step's) into *graph. A capture that fails leaves no
 * graph and turns graphs off for this part (its steps then launch their kernels); -1 only when
 * the device failed outright. */
static int gpu_graph_capture(struct executor_gpu *g, struct gpu_graph **graph,
                             const struct executor_gpu_member *mb, uint32_t n_mb,
                             struct executor_ctx *c, const uint32_t *out_rows)
{
    int cpu_rc = 0;
    if (gpu_graph_begin() < 0) {
        g->graph_off = true;
        return 0;
    }
    g->capturing = true;
    g->q8_src = NULL;
    const int rc = gpu_step_kernels(g, mb, n_mb, c, n_mb, out_rows, n_mb, &cpu_rc);
    g->capturing = false;
    g->q8_src = NULL;
    if (gpu_graph_end(graph) < 0 || rc < 0 || cpu_rc < 0) {
        gpu_graph_free(*graph);
        *graph = NULL;
        g->graph_off = true;
        return gpu_sync();
    }
    return 0;
}

/* executor_gpu_forward_members on the part of one device (g and the members' g on the same
 * weights): its layers, then the head or x back into c->x. */
static int gpu_forward_part(struct executor_gpu *g, const struct executor_gpu_member *mb,
                            uint32_t n_mb, struct executor_ctx *c, uint32_t n,
                            const uint32_t *out_rows, uint32_t n_out, float *logits,
                            struct common_errmsg *e)
{
    const struct common_hparams *hp = &g->m->desc->hp;
    const int64_t                ne = hp->n_embd;
    int                          rc = 0;
    if (gpu_use(g->dev) < 0)
        return common_errmsg_set(e, COMMON_EDEVICE, "%s: %s", GPU_DEVNAME(g->dev),
                                 gpu_last_error());
    if (n > g->n_batch || n_out > n)
        return common_errmsg_set(e, COMMON_ERANGE, "gpu: %u rows exceed the device's batch %u", n,
                                 g->n_batch);
    for (uint32_t i = 0; i < n_mb; i++) {
        const struct executor_gpu_member *b = &mb[i];
        if (b->g->w != g->w || b->row + b->n > n || b->p0 + b->n > b->g->n_ctx)
            return common_errmsg_set(e, COMMON_ERANGE,
                                     "gpu: member %u (%u tokens at %u, rows from %u) does not fit "
                                     "the batch of %u rows or its context of %u, or has other "
                                     "weights",
                                     i, b->n, b->p0, b->row, n, b->g->n_ctx);
    }
    const uint64_t prof = gpu_prof_begin();
    /* h_in is written again only once the copies from it queued before are done */
    rc = g->in_queued ? gpu_sync() : 0;
    g->in_queued = g->in_queued && rc < 0;
    int                     cpu_rc = 0;
    struct gpu_shape_graph *sg =
        rc == 0 ? gpu_graph_step(g, mb, n_mb, n, out_rows, n_out, logits) : NULL;
    /* One token of each member: the graph of their set, captured at its first step. */
    for (uint32_t i = 0; sg && i < n_mb; i++)
        g->h_pos[i] = mb[i].p0;
    if (rc == 0)
        rc = gpu_step_inputs_put(g, c, n, sg ? n_mb : 0);
    if (rc == 0 && sg && (!sg->graph || sg->stale)) {
        const int cap = g->in_queued && gpu_sync() < 0
                            ? -1
                            : gpu_graph_capture(g, &sg->graph, mb, n_mb, c, out_rows);
        sg->stale = false;
        if (cap < 0)
            return common_errmsg_set(e, COMMON_EDEVICE, "%s: %s", GPU_DEVNAME(g->dev),
                                     gpu_last_error());
        g->in_queued = false; /* captured on an idle stream, as before */
    }
    if (rc == 0 && sg && sg->graph) {
        rc = gpu_graph_launch(sg->graph);
        g->graph_steps += rc == 0;
    } else if (rc == 0) {
        rc = gpu_step_kernels(g, mb, n_mb, c, n, out_rows, logits ? n_out : 0, &cpu_rc);
    }
    if (cpu_rc < 0)
        return c->err.text[0] ? common_errmsg_set(e, cpu_rc, "%s", c->err.text)
                              : common_errmsg_set(e, cpu_rc, "layer's MoE on the CPU: %s",
                                                  common_strerror(cpu_rc));
    if (rc == 0 && !g->head) {
        rc = gpu_download(c->x, g->x, (size_t)n * ne * sizeof(float));
        g->in_queued = g->in_queued && rc < 0;
        if (rc == 0)
            return 0;
    } else if (rc == 0 && n_out && logits) {
        rc = gpu_download(logits, g->logits, (size_t)n_out * hp->n_vocab * sizeof(float));
    } else if (rc == 0) {
        rc = gpu_sync();
    }
    rc = gpu_prof_end(prof, "(device step, whole)", rc);
    if (rc < 0)
        return common_errmsg_set(e, COMMON_EDEVICE, "%s: %s", GPU_DEVNAME(g->dev),
                                 gpu_last_error());
    g->in_queued = false; /* the download or sync above waited for the stream */
    return 1;
}

static int gpu_forward_parts(struct executor_gpu *g, const struct executor_gpu_member *mb,
                             uint32_t n_mb, struct executor_ctx *c, uint32_t n,
                             const uint32_t *out_rows, uint32_t n_out, float *logits,
                             struct common_errmsg *e)
{
    if (!g->next)
        return gpu_forward_part(g, mb, n_mb, c, n, out_rows, n_out, logits, e);
    /* Several devices: each device's layers in turn, x passing through c->x between them. */
    if (n_mb > g->n_batch)
        return common_errmsg_set(e, COMMON_ERANGE, "gpu: %u members exceed the device's batch %u",
                                 n_mb, g->n_batch);
    struct executor_gpu_member *pm = g->h_mb;
    memcpy(pm, mb, (size_t)n_mb * sizeof(*pm));
    for (struct executor_gpu *part = g;; part = part->next) {
        const int rc = gpu_forward_part(part, pm, n_mb, c, n, out_rows, n_out, logits, e);
        if (rc < 0 || !part->next)
            return rc;
        for (uint32_t i = 0; i < n_mb; i++)
            if (!(pm[i].g = pm[i].g->next))
                return common_errmsg_set(e, COMMON_ERANGE, "gpu: member %u has other weights", i);
    }
}

int executor_gpu_forward_members(struct executor_gpu *g, const struct executor_gpu_member *mb,
                                 uint32_t n_mb, struct executor_ctx *c, uint32_t n,
                                 const uint32_t *out_rows, uint32_t n_out, float *logits,
                                 struct common_errmsg *e)
{
    gpu_threads(c->pool); /* c's threads for kernels that run on the CPU (the CPU backend) */
    const int rc = gpu_forward_parts(g, mb, n_mb, c, n, out_rows, n_out, logits, e);
    gpu_threads(NULL);
    return rc;
}

_Static_assert(EXECUTOR_GPU_ROW_EXACT < GPU_GEMM_MIN_N,
               "a shared device step must stay on the row-exact matvec kernels");

bool executor_gpu_same_weights(const struct executor_gpu *a, const struct executor_gpu *b)
{
    return a->w == b->w && a->il0 == b->il0 && a->head == b->head;
}

int executor_gpu_forward(struct executor_gpu *g, struct executor_ctx *c, uint32_t n, uint32_t p0,
                         float *logits, bool all, struct common_errmsg *e)
{
    if (n > g->n_batch || p0 + n > g->n_ctx)
        return common_errmsg_set(e, COMMON_ERANGE,
                                 "gpu: %u tokens at %u exceed the device's "
                                 "batch %u or context %u",
                                 n, p0, g->n_batch, g->n_ctx);
    const struct executor_gpu_member one = {.g = g, .row = 0, .n = n, .p0 = p0};
    const uint32_t                   t0 = all ? 0 : n - 1;
    for (uint32_t i = t0; logits && i < n; i++)
        c->head_rows[i - t0] = i;
    return executor_gpu_forward_members(g, &one, 1, c, n, c->head_rows, logits ? n - t0 : 0, logits,
                                        e);
}

_Static_assert(EXECUTOR_MAX_DEVICES == GPU_MAX_DEVICES, "one limit on the devices");

int executor_devices_resolve(const struct executor_devices *d, int32_t *ids, char *why,
                             size_t why_len)
{
    if (d->none) {
        if (why && why_len)
            snprintf(why, why_len, "--device none");
        return 0;
    }
    if (d->single) {
        ids[0] = d->main_gpu;
        return 1;
    }
    if (d->n) {
        memcpy(ids, d->id, d->n * sizeof(*ids));
        return (int)d->n;
    }
    char      tmp[8];
    const int n = gpu_device_count(why ? why : tmp, why ? why_len : sizeof(tmp));
    if (n <= 0) { /* gpu_select then says why, naming the device */
        ids[0] = d->main_gpu;
        return 1;
    }
    for (int k = 0; k < n && k < GPU_MAX_DEVICES; k++)
        ids[k] = k;
    return n < GPU_MAX_DEVICES ? n : GPU_MAX_DEVICES;
}

int executor_devices_parse_list(void *arg, const char *v, struct common_errmsg *e)
{
    struct executor_devices *d = arg;
    if (strcmp(v, "none") == 0) {
        d->none = true;
        d->n = 0;
        return COMMON_OK;
    }
    struct executor_devices t = *d;
    t.none = false;
    t.n = 0;
    for (const char *p = v;; p++) {
        /* CUDAn, or HOSTn for the host backend (SLUICE_GPU_BACKEND=host) */
        const bool    named = strncmp(p, "CUDA", 4) == 0 || strncmp(p, "HOST", 4) == 0;
        char         *end = NULL;
        unsigned long i = named && p[4] >= '0' && p[4] <= '9' ? strtoul(p + 4, &end, 10) : 0;
        if (!end || (*end && *end != ',') || i >= EXECUTOR_MAX_DEVICES ||
            t.n == EXECUTOR_MAX_DEVICES)
            return common_errmsg_set(e, COMMON_EINVAL,
                                     "expects CUDA0, CUDA1, ... (a comma-separated list of at "
                                     "most %d) or none, got '%s'",
                                     EXECUTOR_MAX_DEVICES, v);
        for (uint32_t k = 0; k < t.n; k++)
            if (t.id[k] == (int32_t)i)
                return common_errmsg_set(e, COMMON_EINVAL, "names a device twice: '%s'", v);
        t.id[t.n++] = (int32_t)i;
        if (!*end)
            break;
        p = end;
    }
    *d = t;
    return COMMON_OK;
}

int executor_devices_parse_mode(void *arg, const char *v, struct common_errmsg *e)
{
    struct executor_devices *d = arg;
    if (strcmp(v, "layer") == 0 || strcmp(v, "none") == 0) {
        d->single = strcmp(v, "none") == 0;
        return COMMON_OK;
    }
    return common_errmsg_set(e, COMMON_EINVAL,
                             "expects layer or none (row, splitting each matrix, is not "
                             "implemented), got '%s'",
                             v);
}

int executor_devices_parse_split(void *arg, const char *v, struct common_errmsg *e)
{
    struct executor_devices *d = arg;
    return common_opts_parse_shares(v, d->split, EXECUTOR_MAX_DEVICES, &d->n_split, e);
}

bool executor_gpu_usable(const struct executor_model *m, const struct executor_devices *d,
                         int32_t n_cpu_moe, char *why, size_t len)
{
    char buf[256];
    if (!why || !len) {
        why = buf;
        len = sizeof(buf);
    }
    int32_t   ids[GPU_MAX_DEVICES];
    const int n = executor_devices_resolve(d, ids, why, len);
    if (n <= 0)
        return false;
    /* The devices first: without a backend no type is supported, which is not the reason. */
    for (int k = 0; k < n; k++)
        if (gpu_select(ids[k], NULL, why, len) < 0)
            return false;
    if (!m)
        return true;
    const char *no = executor_gpu_unsupported(m, n_cpu_moe, why, len);
    if (no && no != why)
        snprintf(why, len, "%s", no);
    return !no;
}
