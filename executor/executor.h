/* executor/executor.h - public front door of executor/: kernels, model synthesis, forward pass. */
#ifndef EXECUTOR_EXECUTOR_H
#define EXECUTOR_EXECUTOR_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "proto.h"

/* ------------------------------------------------------------------------------------------ */
/* CPU features and kernel selection (executor/kernels/cpu.c, dispatch.c)                      */
/* ------------------------------------------------------------------------------------------ */

/* CPU features that pick the kernel set. */
struct executor_cpu_features {
    bool avx2;
    bool fma;
    bool f16c;
    bool avx512f;
    bool avx512dq;
    bool avx512bw;
    bool avx512vl;
    bool avx512vnni;
    bool avx512bf16;
};

/* Kernel sets, from slowest to fastest. */
enum executor_isa {
    EXECUTOR_ISA_REF = 0, /* portable scalar reference (kernels/ref.c) */
    EXECUTOR_ISA_AVX2,    /* AVX2 + FMA + F16C (kernels/avx2.c) */
    EXECUTOR_ISA_AVX512,  /* AVX-512 F/DQ/BW/VL + VNNI (kernels/avx512.c); CPUs with AVX-512 but
                             no VNNI (Skylake-X) use the AVX2 set */
};

/* Detects the CPU once and selects the fastest supported kernel set (process singleton; call
 * before threads start; later calls are no-ops). */
void executor_kernels_init(void);
/* Features found by executor_kernels_init(). */
const struct executor_cpu_features *executor_cpu_features(void);
/* Forces a kernel set (tests, benchmarks, --isa flag). Returns 0, or COMMON_ENOTSUP when the CPU
 * lacks it. Not thread-safe: call while no kernel runs. */
int               executor_kernels_select(enum executor_isa isa);
enum executor_isa executor_kernels_active(void);
const char       *executor_isa_name(enum executor_isa isa);

/* ------------------------------------------------------------------------------------------ */
/* Model synthesis: `sluice mkmodel` (executor/synth.c)                                        */
/* ------------------------------------------------------------------------------------------ */

/* Geometry and content of a synthetic model with random weights. Zero fields take defaults. */
/* How the experts of a synthetic MoE are picked. */
enum executor_synth_routing {
    EXECUTOR_SYNTH_ROUTING_NATURAL = 0, /* whatever the random network does: a component common
                                           to all tokens dominates its residual stream, so a few
                                           experts take most tokens (a skew that flatters caches) */
    EXECUTOR_SYNTH_ROUTING_BALANCED,    /* token embeddings 32x larger dominate the residual
                                           stream, so every layer routes by the current token:
                                           close to uniform and memoryless, as trained MoEs with a
                                           load-balancing loss */
};

/* The three layouts of an I2_S tensor (seed 003; docs/kernels.md "I2_S"). I2_S weights are
 * random ternary values times one power-of-two scale per tensor, so the three layouts of a seed
 * hold the same weights and give the same logits. */
enum executor_synth_i2s {
    EXECUTOR_SYNTH_I2S_QK256 = 0, /* Microsoft's: codes in 128-element groups, f32 scale after */
    EXECUTOR_SYNTH_I2S_BITNET32,  /* 32-element blocks of codes with an inline f16 scale */
    EXECUTOR_SYNTH_I2S_SPLIT32,   /* 32-element blocks of codes, scales in "<name>.scales" */
};

struct executor_synth_opts {
    const char      *path;  /* output GGUF path (required) */
    const char      *name;  /* general.name; NULL = "sluice-synth" */
    enum common_arch arch;  /* tensor names, shapes and keys as llama.cpp's converter
                               writes them for this architecture; 0 = llama */
    uint32_t n_vocab;       /* 0 = vocabulary size of vocab_from, else 259 (byte-level) */
    uint32_t n_ctx;         /* context_length; 0 = 2048 */
    uint32_t n_embd;        /* 0 = 256 */
    uint32_t n_layer;       /* 0 = 2 (ignored when target_bytes is set) */
    uint32_t n_head;        /* 0 = 8 */
    uint32_t n_head_kv;     /* 0 = n_head */
    uint32_t n_ff;          /* dense or per-expert FFN width; 0 = 4 * n_embd rounded */
    uint32_t n_expert;      /* 0 = dense (8 for the MoE architectures); else routed experts
                               (llama: the Mixtral layout) */
    uint32_t n_expert_used; /* 0 = min(2, n_expert) */
    uint32_t n_ff_shexp;    /* shared expert width (qwen2moe only); 0 = 2 * n_ff */
    bool     lite;          /* deepseek2: the V2-Lite shape (no q LoRA, softmax routing)
                               instead of V3's */
    enum executor_synth_routing routing; /* MoE routing statistics; 0 = natural */
    float routing_skew;  /* balanced routing only: every token embedding gets a component common
                            to all tokens, routing_skew times as large per element as the token's
                            own spread, so each expert of a layer gets a fixed offset of that many
                            times the token-dependent part of its gate logit: 0 = uniform; about 1
                            = a skewed load; 4 and more = a few experts take most tokens. >= 0 */
    float routing_reuse; /* balanced routing, architectures with q/k biases (qwen2moe, gpt-oss)
                            only: every head attends to the recent tokens (constant q and k
                            rotated by RoPE score by distance alone: weights falling about as
                            distance^-1.5), and the attention output, routing_reuse times the
                            embeddings' spread, carries them into the routing: experts repeat
                            over neighbouring tokens (temporal reuse) while the load stays
                            spread. 0 = memoryless. >= 0 */
    uint32_t                type;       /* enum common_ggml_type of the 2-D/3-D weights; 0 = F32 */
    enum executor_synth_i2s i2s_layout; /* type I2_S: which of seed 003's layouts; 0 = qk256 */
    uint64_t    target_bytes;   /* 0 = keep n_layer; else choose n_layer to approach this size */
    const char *vocab_from;     /* copy tokenizer.* keys from this GGUF; NULL = byte-level vocab */
    uint64_t    seed;           /* weight RNG seed; 0 = 1 */
    float       rope_freq_base; /* 0 = 10000 */
    bool        progress;       /* print progress to stderr */
    bool        quick_quant;    /* Q4_K/Q5_K: executor_quantize_row_quick (no scale search) */
    uint32_t    n_threads;      /* threads generating and quantizing the weights (the caller
                                   writes); 0 = executor_physical_cores(); at most 256. The
                                   bytes written do not depend on it. */
};

/* Writes a GGUF of architecture o->arch (llama: dense, or MoE in the Mixtral layout) with random
 * weights, streaming: o->n_threads threads generate and quantize chunks of rows (512 KiB written
 * each, or one longer row), at most two chunks per thread in flight, and the calling thread
 * writes them in order, so memory stays bounded whatever the size. Each row of a tensor has its
 * own RNG stream, so a seed gives the same file whatever the thread count.
 * Returns 0, COMMON_EINVAL (bad geometry or n_threads, named in e), COMMON_ENOTSUP (type without
 * a quantizer), COMMON_EIO, COMMON_ENOMEM. Reentrant: no global state. */
int executor_synth_write(const struct executor_synth_opts *o, struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* Thread pool (executor/threadpool.c)                                                         */
/* ------------------------------------------------------------------------------------------ */

/* A fixed set of worker threads created once and reused for every operation: the caller's
 * thread plus n_threads - 1 workers. Idle workers spin for a few microseconds after a job, then
 * sleep on a condition variable, so an idle pool costs no CPU. Opaque. */
struct executor_threadpool;

/* One piece of a parallel loop: handles items [i0, i1) on thread `ith` (0 = the caller's
 * thread, 1..n_threads-1 the workers), so `ith` can index per-thread scratch. */
typedef void (*executor_threadpool_fn)(void *arg, int64_t i0, int64_t i1, uint32_t ith);

/* Number of physical cores available to this process (SMT siblings counted once, limited by
 * the affinity mask); at least 1. */
uint32_t executor_physical_cores(void);

/* Starts n_threads - 1 workers (n_threads 0 = executor_physical_cores(); at most 256).
 * Returns 0, COMMON_EINVAL (n_threads > 256), COMMON_ENOMEM, or COMMON_EAGAIN (thread creation
 * failed). Free with executor_threadpool_destroy(). */
int executor_threadpool_create(uint32_t n_threads, struct executor_threadpool **out);
/* Stops and joins the workers; accepts NULL. */
void executor_threadpool_destroy(struct executor_threadpool *p);
/* Threads taking part in each loop, the caller included (1 for a NULL pool). */
uint32_t executor_threadpool_n_threads(const struct executor_threadpool *p);
/* Runs fn over [0, n) in pieces of at most `chunk` items (0 = split n evenly into a few pieces
 * per thread), on every thread of the pool, and returns when all pieces are done; writes made
 * by fn are visible to the caller on return. A NULL or 1-thread pool runs the pieces on the
 * caller.
 * One caller at a time per pool (not reentrant; fn must not call executor_threadpool_for). */
void executor_threadpool_for(struct executor_threadpool *p, int64_t n, int64_t chunk,
                             executor_threadpool_fn fn, void *arg);

/* ------------------------------------------------------------------------------------------ */
/* Weight access (executor/weights.c)                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Why an expert is asked for before its acquire (DESIGN.md section 2). */
enum executor_expert_hint {
    EXECUTOR_HINT_POSTFETCH = 0, /* picked by the router for this layer: needed shortly */
    EXECUTOR_HINT_PREFETCH,      /* a guess for the next layer or the next token */
};

/* The forward pass reads weights only through this narrow interface, so where the bytes come
 * from (an mmap of the model files, buffers filled with pread, later the fetcher's budgeted
 * expert pool in shared memory) never touches the kernels:
 * - resident tensors (attention, norms, embeddings, router gates, dense FFN): `tensor` gives
 *   the bytes of a GGUF tensor, valid until the source is destroyed;
 * - routed experts: `expert_acquire` pins one part (gate, up or down) of expert e of layer L
 *   and gives its bytes (rows x cols of the part's type, rows contiguous), valid until the
 *   matching `expert_release`; every successful acquire is released exactly once. A source
 *   may lend a part without pinning it (a seqlock read of a shared pool): its release then
 *   says whether the bytes stayed the same during the loan, and when they did not, what was
 *   computed from them is thrown away and the part acquired again.
 * Implementations are thread-safe: any thread may call any entry at any time. */
/* A device's registration of the memory expert loans point into (expert_regions below). */
struct executor_region_hooks {
    /* [base, base + bytes) holds loans now; read_only: mapped without write access here.
     * Returns 0, or < 0: it stays unregistered (copies from it still work, staged). */
    int (*add)(void *arg, const void *base, size_t bytes, bool read_only);
    /* [base, ...) as added is about to be unmapped: no loan is out on it. */
    void (*remove)(void *arg, const void *base);
    void *arg; /* borrowed */
};

struct executor_dev_ops; /* below */
struct executor_weight_ops {
    /* Bytes of GGUF tensor `index` (file order). Returns 0, COMMON_EINVAL (bad index),
     * COMMON_EIO. */
    int (*tensor)(void *impl, uint64_t index, const void **data);
    /* Pins a part of a routed expert. *slot identifies the loan for expert_release. Returns 0,
     * COMMON_EINVAL (dense model, index out of range), COMMON_EAGAIN (every slot is pinned),
     * COMMON_EIO. */
    int (*expert_acquire)(void *impl, uint32_t layer, uint32_t expert, enum common_expert_part part,
                          const void **data, uint32_t *slot);
    /* Ends the loan made by expert_acquire (the bytes may then be reused). Returns 0, or
     * COMMON_EAGAIN when the loan was not pinned and its bytes were reused during it: results
     * computed from them are wrong; compute again with a new acquire. */
    int (*expert_release)(void *impl, uint32_t slot);
    /* Frees the implementation state. */
    void (*destroy)(void *impl);
    /* Optional (NULL = a source without a pool: every expert is always at hand). */
    /* Asks for expert e of layer L ahead of its acquire, without waiting (post-fetch or a
     * prefetch hint). Returns 0 or a negative common_err; failures are not fatal. */
    int (*expert_request)(void *impl, uint32_t layer, uint32_t expert,
                          enum executor_expert_hint hint);
    /* True when every part of expert e of layer L is in memory now (no wait on acquire). */
    bool (*expert_is_ready)(void *impl, uint32_t layer, uint32_t expert);
    /* A forward pass of one batch (a decode step, or one wave of a prefill) starts. */
    void (*token_begin)(void *impl);
    /* Why an expert_acquire of expert e of layer L failed, in one line naming what was read
     * (file, offset, checksum); out is left empty when the source does not know. */
    void (*expert_error)(void *impl, uint32_t layer, uint32_t expert, struct common_errmsg *out);
    /* The memory expert loans point into (pool segments), for a device to register as pinned
     * memory: with h, h->add is called now for every region mapped and later for every region
     * mapped anew (a restarted fetcher's pool), h->remove before one is unmapped (no loan is out
     * on it then); *h is copied. With NULL the calls stop (none is in progress when it returns),
     * and the device unregisters what it still holds itself. The calls come
     * from any thread, possibly under the source's own locks: the hooks must not call into the
     * source. NULL op = the source has no such memory. */
    void (*expert_regions)(void *impl, const struct executor_region_hooks *h);
    /* The device expert pool a fetcher behind the source makes (struct executor_dev_ops, called
     * with *arg); NULL op or result = none. */
    const struct executor_dev_ops *(*expert_device)(void *impl, void **arg);
};

/* A weight source: an implementation table and its state. */
struct executor_weights {
    const struct executor_weight_ops *ops;   /* borrowed: static table of the implementation */
    void                             *impl;  /* owned: freed by ops->destroy */
    const struct common_model        *model; /* borrowed: must outlive the source */
};

/* Reads span bytes into dst; common_gguf_read_span() has this signature. */
typedef int (*executor_read_span_fn)(const struct common_gguf *g, const struct common_span *span,
                                     void *dst, struct common_errmsg *e);

struct executor_weights_opts {
    bool     populate;               /* mmap: fault every page in at creation (MAP_POPULATE) */
    uint32_t n_expert_slots;         /* pread: expert part buffers; 0 = 6 * expert_used_count */
    executor_read_span_fn read_span; /* pread: how to read spans (required); stream: resident
                                        tensors are read with it (NULL = mapped instead) */
    bool  no_expert_slots;           /* pread: resident tensors only, expert acquires fail */
    FILE *progress;                  /* pread/stream: progress of the resident read (NULL =
                                        none); printed only above 256 MiB */
    FILE *trace_names;               /* stream: one line per expert acquire, as
                                        "blk.N.ffn_down_exps.weight expert E" (NULL = off) */
};

/* A device expert pool that the fetchers make and fill (DESIGN section 8; proto.h: the fetcher's
 * device pool), for a device's pool of experts (executor/gpu.c): one per device, each filled by
 * the fetchers whose shards hold experts of that device's layers (a fetcher serves as many pools
 * as its --device-pools, each on its own socket; one fetcher per GPU where the fetchers shard by
 * layer as the devices do). Its memory is the first
 * of those fetchers', mapped here and in the others; each fetcher copies the experts of its shard
 * into it from its RAM pool on its own copy stream; the fetchers' events (recorded by mark) say
 * when copies are done, and this process's kernels event (kev, recorded after the kernels) lets
 * them copy over slots only after them. */
struct common_devmem_event;
#define EXECUTOR_DEV_MAX_EVENTS   16u
#define EXECUTOR_DEV_MAX_FETCHERS 16u
struct executor_dev_pool {
    uint8_t                    *base; /* reserved here: bytes, mapped piece by piece by back */
    size_t                      bytes, gran;
    struct common_devmem_event *kev;        /* this process's, recorded after the kernels */
    uint32_t                    n_fetchers; /* that copy into it (the memory is the lead's) */
    uint32_t                    lead;       /* the fetcher whose memory it is */
    char                        backend[8]; /* "HOST" or "CUDA" */
    bool stages; /* every fetcher reads what is not in its RAM pool from storage (read) */
    bool local;  /* the fetcher is this process's (one process), its copies on a thread here */
};
struct executor_dev_ops {
    /* Asks the fetchers of the experts of layers first_layer .. first_layer + n_layers - 1 for a
     * pool of `bytes` with n_events events on device dev; *pool: the argument of the calls below.
     * 0, or a negative common_err with the reason (COMMON_ENOTSUP: none to be had, as when one
     * of those fetchers serves as many other pools as it can; the caller makes its own pool). */
    int (*open)(void *arg, int dev, uint32_t first_layer, uint32_t n_layers, size_t bytes,
                uint32_t n_events, struct executor_dev_pool *out, void **pool,
                struct common_errmsg *e);
    /* Maps piece k (gran bytes at base + k * gran): the fetcher's, or, once it is gone, one made
     * here. 0 or a negative common_err. */
    int (*back)(void *arg, uint32_t piece, struct common_errmsg *e);
    /* Asks the fetcher to copy `bytes` from src (in a loan of this source, held until a later
     * mark is ready and its event done) to base + dst. 0, or COMMON_ECLOSED: the fetcher is gone
     * (and every later call fails so too; the pool's memory stays mapped). */
    int (*copy)(void *arg, size_t dst, const void *src, size_t bytes);
    /* A pool that stages: asks the fetcher of (layer, expert) to read its bundle from storage
     * into its staging and copy part `part` (`bytes`) to base + dst. 0, or COMMON_ECLOSED (as
     * copy). A read that fails makes the ready of the next mark COMMON_EIO. */
    int (*read)(void *arg, uint32_t layer, uint32_t expert, enum common_expert_part part,
                size_t dst, size_t bytes);
    /* Asks each fetcher that copied since its last mark of event k to record its event k after
     * its copies so far. 0 or COMMON_ECLOSED. */
    int (*mark)(void *arg, uint32_t k);
    /* Waits until those fetchers recorded the last marks of event k, and gives their events
     * (*n of them, at most EXECUTOR_DEV_MAX_FETCHERS) for the caller to wait for. 0,
     * COMMON_EIO (the same, but a read asked since the last ready failed: its part is not
     * there), or COMMON_ECLOSED. */
    int (*ready)(void *arg, uint32_t k, struct common_devmem_event **evs, uint32_t *n);
    /* The copies asked next wait for kev (recorded by the caller just before). */
    int (*after)(void *arg);
    /* Once the caller lost the pool (a call above failed with COMMON_ECLOSED, or a fetcher's
     * event was never done): when every fetcher runs again, they open their side anew over the
     * same memory (now this process's) and copy again. 0 (*out updated: stages may differ),
     * COMMON_EAGAIN (not yet), or another negative common_err with the reason; the pool stays
     * lost (every call above failing) until a later call succeeds. */
    int (*retake)(void *arg, struct executor_dev_pool *out, struct common_errmsg *e);
    /* Nanoseconds the fetcher's copy stream spent copying into the pool, as of its last mark
     * (once it is gone, the last value seen). */
    void (*copy_time)(void *arg, uint64_t *ns);
    /* Ends the pool: pieces unmapped, events freed, the fetcher told. */
    void (*close)(void *arg);
};

/* Routed experts served by someone else (the fetcher's budgeted pool, in one process): the same
 * shapes as the expert entries of struct executor_weight_ops, with the caller's state. */
struct executor_expert_source {
    int (*acquire)(void *arg, uint32_t layer, uint32_t expert, enum common_expert_part part,
                   const void **data, uint32_t *loan); /* required */
    int (*release)(void *arg, uint32_t loan);          /* required; returns as
                                                          expert_release */
    int (*request)(void *arg, uint32_t layer, uint32_t expert,
                   enum executor_expert_hint hint);               /* NULL = no hints */
    bool (*is_ready)(void *arg, uint32_t layer, uint32_t expert); /* NULL = unknown */
    void (*token_begin)(void *arg);                               /* NULL = not needed */
    void (*error)(void *arg, uint32_t layer, uint32_t expert,
                  struct common_errmsg *out); /* why acquire failed; NULL = not known */
    void (*regions)(void *arg, const struct executor_region_hooks *h); /* as expert_regions;
                                                                         NULL = none */
    const struct executor_dev_ops *dev; /* the fetcher's device pool; NULL = none */
    void *arg; /* borrowed: must outlive the weight source */
};

/* Maps every split of the model read-only; tensors and experts point into the mapping (an
 * expert acquire pins nothing and never fails). Returns 0, COMMON_EINVAL (a model parsed from
 * memory has no file), COMMON_EIO (mmap failed), COMMON_ENOMEM, with a message. `o` may be NULL.
 */
int executor_weights_mmap_create(const struct common_model          *m,
                                 const struct executor_weights_opts *o,
                                 struct executor_weights **out, struct common_errmsg *e);
/* Reads every resident tensor into malloc'd buffers at creation, and serves experts from
 * o->n_expert_slots buffers of bytes_expert_bundle-part size filled on acquire with
 * o->read_span (a cache: a part still held in an idle slot is not read again). Returns 0,
 * COMMON_EINVAL (no read_span), COMMON_EIO, COMMON_ENOMEM, with a message. */
int executor_weights_pread_create(const struct common_model          *m,
                                  const struct executor_weights_opts *o,
                                  struct executor_weights **out, struct common_errmsg *e);
/* The streaming source: resident tensors (attention, norms, embeddings, router gates) read into
 * owned buffers once with o->read_span (or mapped when it is NULL), routed experts from `src`
 * (acquire, release and the optional hints forwarded as they are). Returns 0, COMMON_EINVAL
 * (dense model, src without acquire/release), COMMON_EIO, COMMON_ENOMEM, with a message. */
int executor_weights_stream_create(const struct common_model           *m,
                                   const struct executor_weights_opts  *o,
                                   const struct executor_expert_source *src,
                                   struct executor_weights **out, struct common_errmsg *e);
/* Destroys a source made by any function above; accepts NULL. */
void executor_weights_destroy(struct executor_weights *w);

/* ------------------------------------------------------------------------------------------ */
/* Model and inference context (executor/model.c, executor/forward.c)                          */
/* ------------------------------------------------------------------------------------------ */

/* A model ready to run: hyper-parameters, validated tensor views over a weight source, small
 * tensors (norms, biases) expanded to f32. Immutable after creation: several contexts may share
 * one. Opaque. */
struct executor_model;

enum executor_weights_kind {
    EXECUTOR_WEIGHTS_MMAP = 0, /* executor_weights_mmap_create */
    EXECUTOR_WEIGHTS_PREAD,    /* executor_weights_pread_create (needs read_span) */
};

struct executor_model_opts {
    enum executor_weights_kind weights;   /* source executor_model_open() creates */
    executor_read_span_fn      read_span; /* for EXECUTOR_WEIGHTS_PREAD */
    bool                       populate;  /* mmap: prefault the mapping */
};

/* Checks that the forward pass supports `desc` (architecture llama, qwen2, qwen3 or qwen3moe;
 * every matrix type known to the kernels with rows of whole blocks; norms and biases of a float
 * type) and builds the views. Returns 0, COMMON_ENOTSUP (architecture, tensor type or feature
 * not supported: named in e), COMMON_ECORRUPT, COMMON_EIO, COMMON_ENOMEM. desc and w are
 * borrowed and must outlive the model. */
int executor_model_create(const struct common_model *desc, struct executor_weights *w,
                          struct executor_model **out, struct common_errmsg *e);
/* Opens `path` (GGUF, following splits), describes it, creates the weight source and the model,
 * all owned by the model. Same returns as common_gguf_open(), common_model_init() and
 * executor_model_create(). `o` may be NULL. */
int executor_model_open(const char *path, const struct executor_model_opts *o,
                        struct executor_model **out, struct common_errmsg *e);
/* Frees the model (and what executor_model_open() made); accepts NULL. */
void                         executor_model_destroy(struct executor_model *m);
const struct common_model   *executor_model_desc(const struct executor_model *m);
const struct common_hparams *executor_model_hparams(const struct executor_model *m);
struct executor_weights     *executor_model_weights(const struct executor_model *m);

/* One sequence being evaluated: KV cache, position, scratch buffers. Opaque. */
struct executor_ctx;
struct executor_gpu_weights;

/* What a device step does with a routed expert missing from the --vram-budget pool. */
enum executor_expert_miss {
    EXECUTOR_MISS_COPY = 0, /* copy it into the pool, compute it there (the default) */
    EXECUTOR_MISS_CPU,      /* compute it on the CPU from the weight source (RAM) */
    EXECUTOR_MISS_AUTO,     /* either, per miss, by the measured copy and CPU rates */
};
/* "copy", "cpu", "auto"; the names in enum order, NULL-terminated (an option's choices). */
const char              *executor_expert_miss_name(enum executor_expert_miss m);
extern const char *const executor_expert_miss_names[];

/* Which expert the --vram-budget pool gives up for a missing one: the fetchers' RAM pool
 * policies (--policy), so that one policy rules both tiers. */
enum executor_pool_policy {
    EXECUTOR_POOL_LRU = 0, /* the least recently used (the default) */
    EXECUTOR_POOL_LFU,     /* the least frequently used, counts halved every 4 x slots uses */
};

/* The devices the -ngl layers go to, as llama.cpp's options say: every device (or the --device
 * list), the layers split in proportion to --tensor-split (default: the devices' free memory),
 * the head on the last; --split-mode none: --main-gpu alone. Zeroed: every device. */
#define EXECUTOR_MAX_DEVICES 16
struct executor_devices {
    int32_t  main_gpu; /* --main-gpu: the device of --split-mode none */
    bool     none;     /* --device none: no device */
    bool     single;   /* --split-mode none */
    uint32_t n;        /* --device LIST: these, in this order; 0 = every device */
    int32_t  id[EXECUTOR_MAX_DEVICES];
    uint32_t n_split; /* --tensor-split: each device's share (of the list); 0 = free memory */
    float    split[EXECUTOR_MAX_DEVICES];
    /* Each device's first layer instead, when n_at is the number of devices (the executor
     * daemon: the fetchers' layer shards, one fetcher per device, so that each device's expert
     * pool is one fetcher's); the -ngl layers from at[k] to at[k + 1] go to device k. */
    uint32_t n_at;
    uint32_t at[EXECUTOR_MAX_DEVICES];
};
/* The devices d names: their ids into ids (EXECUTOR_MAX_DEVICES of room); returns how many, 0
 * (why says why: --device none, or no device), never more than the process has when it has
 * some. */
int executor_devices_resolve(const struct executor_devices *d, int32_t *ids, char *why,
                             size_t why_len);
/* Option parsers (COMMON_OPT_CALLBACK, target a struct executor_devices): --device
 * CUDA0,CUDA1|none, --split-mode layer|none, --tensor-split 3,1. */
int executor_devices_parse_list(void *arg, const char *v, struct common_errmsg *e);
int executor_devices_parse_mode(void *arg, const char *v, struct common_errmsg *e);
int executor_devices_parse_split(void *arg, const char *v, struct common_errmsg *e);

struct executor_ctx_opts {
    uint32_t                    n_ctx;      /* KV positions; 0 = min(context_length, 4096) */
    uint32_t                    n_batch;    /* tokens per forward batch; 0 = 512 */
    enum common_cache_type      cache_type; /* 0 = f16 */
    struct executor_threadpool *pool;       /* borrowed: must outlive the ctx; NULL = caller only */
    bool                        no_postfetch; /* do not request a layer's experts before use */
    bool                        no_prefetch;  /* no hints for the next layer or the next token */
    bool prefetch_history; /* also hint the previous token's choices for the next layer and this
                              token's for the next token's first layers (more reads: worth it
                              only when routing repeats across tokens); the default hints only
                              the gate predictor's guesses. Both predictors are scored anyway. */
    uint32_t prefetch_top; /* gate predictor: hint its best N guesses per token (at most
                              n_expert_used); 0 = the best guess, and each next rank while at
                              least 85% of that rank's guesses were picked (scored on decode
                              steps). Each wrong guess is a wasted read and may evict a bundle
                              still in use; each right one a read that overlaps compute
                              (docs/fetcher.md) */
    uint32_t fetch_window; /* experts asked for ahead of use at once; 0 = all
                              (set about half the pool when the pool is small) */
    int32_t n_gpu_layers;  /* -ngl: the last N layers on the CUDA device, and the output head
                              too when N > n_layer (llama.cpp's meaning; 999 = all); 0 = none.
                              Creation fails with COMMON_ENOTSUP when no device can take them
                              (see executor_gpu_usable) and COMMON_ENOMEM when they do not fit */
    struct executor_devices devices; /* the devices of those layers (--device, --split-mode,
                                        --tensor-split, --main-gpu) */
    int32_t n_cpu_moe;     /* --n-cpu-moe N (EXECUTOR_N_CPU_MOE_HELP): the MoE of the first N
                              layers (router, routed and shared experts) stays on the CPU even
                              when the layer is on the device (llama.cpp's meaning): its experts
                              never take device memory and stream under a RAM budget as on the
                              CPU; 0 = none */
    uint64_t vram_budget;  /* --vram-budget SIZE (EXECUTOR_VRAM_BUDGET_HELP): the device
                              memory the routed experts of its layers may take; 0 = all of them
                              uploaded */
    enum executor_expert_miss expert_miss; /* --expert-miss: a decode step's pick that is not
                                              in that pool (EXECUTOR_EXPERT_MISS_HELP) */
    enum executor_pool_policy pool_policy; /* --policy: which expert that pool gives up */
    /* Device weights shared by several ctxs (executor_gpu_weights_create; borrowed, must
     * outlive the ctx); NULL = the ctx uploads its own when n_gpu_layers > 0. */
    const struct executor_gpu_weights *gpu_weights;
    /* The layers not on a device (all of them with n_gpu_layers 0) on the CPU device, through
     * executor/gpu.c's forward pass, where the model allows; SLUICE_ONE_PASS=1 sets it for
     * every ctx (executor_gpu_one_pass). With gpu_weights, those weights' placement decides. */
    bool one_pass;
};

/* Where the layers go on the device: executor_ctx_opts' fields of the same names. */
struct executor_gpu_place {
    int32_t                   n_gpu_layers, n_cpu_moe;
    struct executor_devices   devices;
    uint64_t                  vram_budget;
    enum executor_expert_miss expert_miss;
    enum executor_pool_policy pool_policy;
    enum common_cache_type    cache_type; /* the device's KV cache (executor_gpu_create) */
    bool one_pass; /* the layers before the devices' on the CPU device (executor_gpu_one_pass) */
};

/* The --expert-miss option's help line, shared by the commands and the executor daemon. */
#define EXECUTOR_EXPERT_MISS_HELP                                                                  \
    "with --vram-budget, a decode step's expert that is not in the device pool: copy it in "       \
    "(copy), compute it on the CPU from RAM while the device computes the others (cpu), or "       \
    "choose per miss from the measured copy and CPU rates (auto; the CPU's products differ "       \
    "from the device's in the last bits, so runs are not bit-reproducible)"
/* The --expert-miss row of an option table (struct common_opt), its target an enum
 * executor_expert_miss. */
#define EXECUTOR_EXPERT_MISS_OPT(tgt)                                                              \
    {                                                                                              \
        .name = "expert-miss", .type = COMMON_OPT_CHOICE, .target = (tgt),                         \
        .choices = executor_expert_miss_names, .help = EXECUTOR_EXPERT_MISS_HELP, .def = "copy"    \
    }

/* The --vram-budget option's help line, shared by the commands and the executor daemon. */
#define EXECUTOR_VRAM_BUDGET_HELP                                                                  \
    "bound the device memory of the routed experts to SIZE (e.g. 4G): the experts of the "         \
    "device's layers live in a pool of that size, copied in from RAM (or storage under "           \
    "--ram-budget) when the router picks one that is not there, the least recently used (or, "     \
    "with --policy lfu, frequently used) given up"

/* The --n-cpu-moe option's help line, shared by the commands and the executor daemon. */
#define EXECUTOR_N_CPU_MOE_HELP                                                                    \
    "keep the MoE (router, routed and shared experts) of the first N layers on the CPU, even on "  \
    "the device's layers: their experts take no device memory and stream under --ram-budget "      \
    "(llama.cpp's --n-cpu-moe)"

/* The option rows of --device, --split-mode, --tensor-split, --main-gpu, --n-cpu-moe and
 * --vram-budget (struct executor_devices, int32_t and uint64_t targets), shared by the commands
 * and the executor daemon beside their own -ngl (EXECUTOR_DEVICE_N_ROWS rows). */
#define EXECUTOR_DEVICE_N_ROWS 6
/* clang-format off */
#define EXECUTOR_DEVICE_OPTS(devs, n_cpu_moe, vram_budget)                                         \
    {.name = "device", .short_name = "dev", .type = COMMON_OPT_CALLBACK, .target = (devs),        \
     .parse = executor_devices_parse_list, .metavar = "LIST",                                      \
     .help = "the devices for -ngl, comma-separated (CUDA0,CUDA1), or none for the CPU only",     \
     .def = "every device"},                                                                       \
    {.name = "split-mode", .short_name = "sm", .type = COMMON_OPT_CALLBACK, .target = (devs),     \
     .parse = executor_devices_parse_mode, .metavar = "layer|none",                                \
     .help = "layer: split the -ngl layers over the devices; none: --main-gpu alone",              \
     .def = "layer"},                                                                              \
    {.name = "tensor-split", .short_name = "ts", .type = COMMON_OPT_CALLBACK, .target = (devs),   \
     .parse = executor_devices_parse_split, .metavar = "N0,N1,...",                                \
     .help = "each device's share of the -ngl layers, e.g. 3,1", .def = "by free memory"},        \
    {.name = "main-gpu", .short_name = "mg", .type = COMMON_OPT_I32,                              \
     .target = &(devs)->main_gpu, .max = EXECUTOR_MAX_DEVICES - 1, .metavar = "I",                 \
     .help = "the device for -ngl with --split-mode none", .def = "0"},                            \
    {.name = "n-cpu-moe", .short_name = "ncmoe", .type = COMMON_OPT_I32, .target = (n_cpu_moe),   \
     .max = 1u << 20, .metavar = "N", .help = EXECUTOR_N_CPU_MOE_HELP, .def = "0"},                \
    {.name = "vram-budget", .type = COMMON_OPT_SIZE, .target = (vram_budget), .min = 1,           \
     .metavar = "SIZE", .help = EXECUTOR_VRAM_BUDGET_HELP}
/* clang-format on */

/* Expert predictors of the forward pass (DESIGN.md section 2): counts over (token, layer)
 * pairs of predicted experts, predicted experts the router then picked, and picked experts. */
enum executor_predictor {
    EXECUTOR_PRED_GATE = 0,   /* layer L+1's router applied to the hidden state at layer L */
    EXECUTOR_PRED_PREV_TOKEN, /* the previous token's choices at layer L+1 (L+1 >= 1) */
    EXECUTOR_PRED_NEXT_TOKEN, /* at the end of a token: its layer-0 choices for the next token */
    EXECUTOR_PRED_COUNT,
};

struct executor_predictor_stats {
    uint64_t predicted, correct, actual; /* precision = correct / predicted, recall = / actual */
};

/* Static name of a predictor ("gate", "prev_token", "next_token"). */
const char *executor_predictor_name(enum executor_predictor p);
/* Copies the counters accumulated since the ctx was created (zero for a dense model). */
void executor_ctx_predictor_stats(const struct executor_ctx      *c,
                                  struct executor_predictor_stats out[EXECUTOR_PRED_COUNT]);

/* Allocates the KV cache and every scratch buffer once (decoding never allocates). Returns 0,
 * COMMON_EINVAL (n_ctx or cache type unusable for the model, named in e), COMMON_ENOMEM. */
int executor_ctx_create(const struct executor_model *m, const struct executor_ctx_opts *o,
                        struct executor_ctx **out, struct common_errmsg *e);
/* Frees the ctx; accepts NULL. */
void     executor_ctx_destroy(struct executor_ctx *c);
uint32_t executor_ctx_n_ctx(const struct executor_ctx *c);
/* The weights of the last pl->n_gpu_layers layers of a model on the devices pl->devices names (the
 * head too when it exceeds n_layer), but for the MoE of the first pl->n_cpu_moe layers, the routed
 * experts in a pool of pl->vram_budget bytes when not 0 (executor_ctx_opts), for
 * several ctxs of it (executor_ctx_opts.gpu_weights): uploaded once, checked to fit with n_seq
 * sequences of n_ctx positions and n_batch tokens. Returns 0, COMMON_ENOTSUP (no usable device,
 * or a model the CUDA path lacks) or COMMON_ENOMEM, with the message in e. */
int executor_gpu_weights_create(const struct executor_model *m, const struct executor_gpu_place *pl,
                                uint32_t n_ctx, uint32_t n_batch, uint32_t n_seq,
                                struct executor_gpu_weights **out, struct common_errmsg *e);
void executor_gpu_weights_destroy(struct executor_gpu_weights *gw);

/* The device's expert pool (--vram-budget): its slots (one expert each) and what the router's
 * picks found there since the weights were made. */
struct executor_gpu_pool_stats {
    uint32_t n_slots;        /* 0: no pool (every expert uploaded, or none on the device) */
    uint64_t slot_bytes;     /* one expert's parts */
    uint64_t expert_bytes;   /* every routed expert of the device's layers */
    uint64_t hits, misses;   /* expert picks found in the pool, and copied in */
    uint64_t copied_bytes;   /* copied to the device for the misses */
    uint64_t cpu_misses;     /* expert picks not in the pool computed on the CPU (--expert-miss),
                                counted apart from hits and misses */
    double copy_gbps;        /* the copy rate measured when the pool was made (from where its
                                copies come: the pinned region, else pageable memory), GB/s */
    double   cpu_gbps;       /* the CPU's rate over an expert's bytes, GB/s; 0 = not measured yet */
    uint64_t pinned_bytes;   /* the weight source's RAM pools registered as pinned memory now;
                                0 = the copies read pageable memory */
    uint32_t pinned_regions; /* how many (one per fetcher through the daemons) */
    bool     on_demand;      /* the slots' address space reserved, backed as slots are first
                                used (virtual memory management); else one allocation */
    uint64_t mapped_bytes;   /* device memory behind the slots now */
    uint64_t pin_adds, pin_removes; /* registrations and unregistrations so far (a restarted
                                       fetcher's pool: one of each) */
    bool     copy_timed;            /* the backend timed the copies: */
    uint64_t copy_busy_ns;          /* the copy stream's time copying, */
    uint64_t copy_stall_ns;         /* and the kernels' time waiting for copies */
    bool     fetcher_memory;        /* the slots are a fetcher's device memory (DESIGN section 8) */
    bool     in_fetcher;            /* and that fetcher copies the experts in now */
    uint64_t fetcher_losses;        /* times it went away (the executor copies since) */
    uint64_t fetcher_wait_ns;       /* the executor's waits for the fetcher's marks (and, where
                                       the kernels run on the host, for its copies) */
    uint64_t fetcher_copy_ns;       /* the fetcher's copy time, part of copy_busy_ns (the
                                       kernels' waits for its copies are in copy_stall_ns) */
    uint64_t staged;                /* parts the fetchers read from storage for the pool */
    uint64_t stage_failures;        /* rounds one of those reads failed in (done again) */
    uint64_t fetcher_retakes;       /* times the fetchers took the pool back after a loss */
};
/* The pool of the ctx's device weights; false (out zeroed) when the ctx has no device. */
bool executor_ctx_gpu_pool_stats(const struct executor_ctx *c, struct executor_gpu_pool_stats *out);
/* Decode steps of the ctx run as its captured CUDA graph (one token of the sequence alone, its
 * logits; docs/gpu.md); 0 without a device or graphs. */
uint64_t executor_ctx_gpu_graph_steps(const struct executor_ctx *c);
/* Whether the ctx's layers run through executor/gpu.c's forward pass (on a device, or on the CPU
 * device with one_pass), not only through the CPU's own (executor/forward.c). */
bool executor_ctx_gpu_pass(const struct executor_ctx *c);
/* Bytes of the KV caches of gpu.c's parts (a device's and the CPU device's); 0 without. */
uint64_t executor_ctx_gpu_kv_bytes(const struct executor_ctx *c);
/* Layers the ctx placed on a CUDA device, plus one when the output head is there too (so
 * n_layer + 1 = everything, as llama.cpp counts -ngl); the device's name in `name`. 0 = none. */
int32_t executor_ctx_gpu_layers(const struct executor_ctx *c, char *name, size_t len);
/* Layers whose KV cache the ctx keeps on the device (the last ones); 0 = none. */
uint32_t executor_ctx_gpu_kv_layers(const struct executor_ctx *c);
/* The memory bandwidth of the ctx's device in bytes/s (executor/cuda: the best of a few
 * device-to-device copies of `bytes`, bytes read and written counted); 0 without a device. */
double executor_ctx_gpu_membw(const struct executor_ctx *c, size_t bytes);
/* One line on the layers the ctx placed on a CUDA device; false (buf untouched) when none. */
bool executor_ctx_gpu_describe(const struct executor_ctx *c, char *buf, size_t len);
/* Whether the device backend keeps its memory in this process's RAM and runs on the CPU (the CPU
 * backend, SLUICE_GPU_BACKEND=cpu): a plan under --ram-budget then counts the device layers' KV
 * as its own. */
bool executor_gpu_in_ram(void);
/* SLUICE_ONE_PASS=1 in the environment: every context runs executor/gpu.c's forward pass, the
 * layers not on a device (all of them without -ngl) on the CPU device (the CPU's kernels,
 * executor/gpu_cpu.c), instead of the CPU's own pass (executor/forward.c): one_pass of
 * executor_ctx_opts and executor_gpu_place for all. */
bool executor_gpu_one_pass(void);
/* Bytes of one sequence's scratch on the CPU's backend or the CPU device (its KV cache aside,
 * the output head's rows included), for a context of n_ctx positions and batches of n_batch:
 * what it adds to a --ram-budget plan. */
uint64_t executor_gpu_scratch_bytes(const struct common_hparams *hp, uint32_t n_ctx,
                                    uint32_t n_batch);
/* Whether `m` can put layers on the devices d names with the MoE of its first n_cpu_moe layers on
 * the CPU (--n-cpu-moe): true, or false with the reason in `why` (built without CUDA, no driver
 * or device, an architecture or type the CUDA path lacks). m NULL: whether the devices are there,
 * whatever the model. */
bool executor_gpu_usable(const struct executor_model *m, const struct executor_devices *d,
                         int32_t n_cpu_moe, char *why, size_t len);
/* Positions filled so far (tokens decoded since the last reset). */
uint32_t executor_ctx_n_past(const struct executor_ctx *c);
/* Logits per token (the model's vocabulary size). */
uint32_t executor_ctx_n_vocab(const struct executor_ctx *c);
/* Forgets the sequence (n_past = 0); the cache memory is kept. */
void executor_ctx_reset(struct executor_ctx *c);

struct executor_decode_opts {
    bool all_logits; /* logits for every token (else only for the last one) */
};

/* Evaluates tokens[0..n) at positions n_past .. n_past+n-1 (in batches of n_batch through the
 * matrix-matrix kernels), appends them to the KV cache and writes n_vocab logits per requested
 * token to `logits` (n * n_vocab floats with all_logits, else n_vocab). `o` may be NULL.
 * Returns 0, COMMON_ERANGE (n_past + n > n_ctx: nothing is evaluated; message in e),
 * COMMON_EINVAL (n == 0, a token id out of range), COMMON_EDEVICE (the device of -ngl failed:
 * the ctx cannot run again), or an error of the weight source (the ctx must then be reset). Not
 * thread-safe for one ctx (it uses the pool given at creation). */
int executor_ctx_decode(struct executor_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
                        const struct executor_decode_opts *o, struct common_errmsg *e);

/* One sequence's part of a multi-sequence step (executor_ctx_decode_batch). */
struct executor_batch_seq {
    struct executor_ctx *ctx;    /* the sequence: its cache and position */
    const int32_t       *tokens; /* n tokens appended at positions n_past.. */
    uint32_t             n;      /* >= 1 */
    float               *logits; /* n_vocab logits of its last token; NULL = none wanted */
    int                  status; /* out: 0, or the negative common_err that failed it */
};

/* Continuous batching: evaluates the tokens of several sequences in shared batches of at most
 * lead's n_batch rows (a sequence's tokens may straddle two batches). The rows of every sequence
 * pass each weight, and each routed expert, together, so a weight is read once per batch for
 * all the sequences that need it; each row attends over its own sequence's cache. What a
 * sequence gets (its cache and its logits) is bit for bit what executor_ctx_decode of that
 * sequence alone gives: every kernel computes a row independently of the others in its batch.
 * `lead` lends its scratch and threads (it may be one of the sequences' contexts, or none);
 * every context must have lead's model and cache type and at most lead's n_ctx, and appear
 * once. With layers on a device (-ngl) the sequences run one after another instead (the
 * device's batched kernels round differently from its one-token ones).
 * Returns 0 when every sequence succeeded, else the first failure (text in e); each status
 * says which failed: a sequence with bad tokens (COMMON_EINVAL, COMMON_ERANGE) fails alone and
 * untouched; a failed batch (COMMON_EIO, COMMON_ENOMEM...) fails the sequences in it and resets
 * their contexts (their caches may be half-written). COMMON_EDEVICE (the device failed) wins
 * over any other failure: it fails the sequences not yet run too, and the contexts with layers
 * on the device can no longer run (executor_serve falls back to contexts on the CPU). */
int executor_ctx_decode_batch(struct executor_ctx *lead, struct executor_batch_seq *seqs,
                              uint32_t n_seqs, struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* Perplexity, llama-perplexity's protocol (executor/perplexity.c)                             */
/* ------------------------------------------------------------------------------------------ */

struct executor_ppl_opts {
    uint32_t n_ctx;      /* chunk length; 0 = the ctx's n_ctx */
    int32_t  bos;        /* replaces the first token of every chunk; < 0 = leave it */
    uint32_t max_chunks; /* score at most this many chunks (llama.cpp --chunks); 0 = all */
    /* Called after each chunk with its 0-based index and the running perplexity; may be NULL. */
    void (*on_chunk)(void *arg, uint32_t chunk, double ppl);
    /* Called after each chunk's forward pass, before on_chunk, with the logits of its n scored
     * positions (n rows of n_vocab) and the tokens that follow them; a negative return stops the
     * run with that error. May be NULL. */
    int (*on_logits)(void *arg, uint32_t chunk, const float *logits, const int32_t *next,
                     uint32_t n, uint32_t n_vocab);
    void *arg;
};

struct executor_ppl_result {
    double   ppl;      /* exp(mean negative log-likelihood) */
    double   ppl_err;  /* llama.cpp's +/-: ppl * sqrt((E[nll^2] - E[nll]^2) / (count - 1)) */
    double   nll;      /* mean negative log-likelihood */
    uint32_t n_chunks; /* chunks scored */
    uint64_t n_scored; /* predictions scored: n_chunks * (n_ctx - 1 - n_ctx / 2) */
};

/* Scores tokens (already tokenized with BOS, as llama-perplexity does) in n_tokens / n_ctx
 * chunks: each chunk starts a fresh sequence, its first token replaced by `bos`, and the
 * predictions of positions n_ctx/2 .. n_ctx-2 (for the next token) are scored with a log-softmax
 * in double. Returns 0, COMMON_ERANGE (fewer than 2 * n_ctx tokens, or n_ctx above the ctx's),
 * COMMON_EINVAL, COMMON_ENOMEM, or a decode error. */
int executor_perplexity(struct executor_ctx *c, const int32_t *tokens, size_t n_tokens,
                        const struct executor_ppl_opts *o, struct executor_ppl_result *out,
                        struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* KL divergence against llama-perplexity's base files (executor/kld.c)                       */
/* ------------------------------------------------------------------------------------------ */

/* The file `llama-perplexity --kl-divergence-base FILE` writes and `--kl-divergence` reads:
 * "_logits_", int32 n_ctx, n_vocab, n_chunk, the n_chunk * n_ctx evaluation tokens (int32), then
 * for each chunk one row per scored position (n_ctx/2 .. n_ctx-2): two floats (scale, minimum
 * log-probability) and n_vocab uint16 log-probabilities (log p = scale * q + minimum; those below
 * max - 16 stored as 0), padded to an even count. Native byte order, as llama.cpp writes it. */

/* uint16 entries of one row: 4 for the two floats, n_vocab rounded up to even. */
size_t executor_kld_row_len(uint32_t n_vocab);
/* Rows of one chunk: the positions n_ctx/2 .. n_ctx-2. */
uint32_t executor_kld_rows_per_chunk(uint32_t n_ctx);
/* Encodes the log-softmax of `logits` into a row of executor_kld_row_len(n_vocab) entries as
 * llama-perplexity does; returns the negative log-likelihood of `tok`. */
double executor_kld_encode_row(const float *logits, uint32_t n_vocab, int32_t tok, uint16_t *row);
/* Writes the header and the evaluation tokens; the rows follow, chunk by chunk. */
int executor_kld_write_header(FILE *f, uint32_t n_ctx, uint32_t n_vocab, uint32_t n_chunk,
                              const int32_t *tokens);

/* An open base file, read chunk by chunk. */
struct executor_kld_base;

/* Opens and checks a base file: the header, a size that matches it exactly, every token inside
 * the vocabulary. Returns 0, COMMON_EIO, COMMON_EINVAL (not a regular file), COMMON_ECORRUPT,
 * COMMON_ENOMEM; the reason is in e. */
int executor_kld_base_open(const char *path, struct executor_kld_base **out,
                           struct common_errmsg *e);
/* The same on a stream of `size` bytes positioned at its start (borrowed: not closed). */
int  executor_kld_base_read(FILE *f, uint64_t size, struct executor_kld_base **out,
                            struct common_errmsg *e);
void executor_kld_base_close(struct executor_kld_base *b);
/* The file's geometry and its tokens (borrowed: valid while b is open). */
void executor_kld_base_info(const struct executor_kld_base *b, uint32_t *n_ctx, uint32_t *n_vocab,
                            uint32_t *n_chunk, const int32_t **tokens);
/* Reads the next chunk's rows into `rows` (rows_per_chunk * row_len entries); checks each row's
 * scale and minimum are finite. */
int executor_kld_base_next(struct executor_kld_base *b, uint16_t *rows, struct common_errmsg *e);

/* Running sums of a comparison, llama-perplexity's kl_divergence_result. */
struct executor_kld_stats {
    double   sum_nll, sum_nll2, sum_nll_base, sum_nll_base2, sum_nll_nll_base;
    double   sum_kld, sum_kld2, sum_p_diff, sum_p_diff2, sum_p_diff4;
    float    max_p_diff;
    uint64_t n_same_top; /* positions where both argmaxes agree */
    uint64_t count;      /* positions compared */
    float   *kld_values; /* owned: per position (capacity), for the percentiles */
    float   *p_diff_values;
    uint64_t capacity;
};

int  executor_kld_stats_init(struct executor_kld_stats *s, uint64_t capacity);
void executor_kld_stats_fini(struct executor_kld_stats *s);
/* Compares one position's logits with its base row; `tok` is the token that followed. */
void executor_kld_accumulate(struct executor_kld_stats *s, const float *logits, uint32_t n_vocab,
                             const uint16_t *base_row, int32_t tok);

/* ------------------------------------------------------------------------------------------ */
/* Memory bandwidth (executor/membw.c)                                                         */
/* ------------------------------------------------------------------------------------------ */

struct executor_membw_opts {
    uint64_t                    bytes; /* buffer size; 0 = 1 GiB (far above any cache) */
    uint32_t                    reps;  /* timed passes, the best is kept; 0 = 5 */
    struct executor_threadpool *pool;  /* threads reading in parallel; NULL = caller only */
};

/* Measures the streaming read bandwidth of main memory with every pool thread reading its part
 * of a large buffer. Returns 0 and *bytes_per_s, COMMON_ENOMEM. */
int executor_membw_measure(const struct executor_membw_opts *o, double *bytes_per_s);

/* ------------------------------------------------------------------------------------------ */
/* The executor as a daemon: experts from fetcher daemons, steps for the router (remote.c,
 * serve.c)*/
/* ------------------------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------------------------ */
/* Expert source backed by fetcher daemons (executor/remote.c)                                 */
/* ------------------------------------------------------------------------------------------ */

/* Links to N fetcher daemons of one run directory (pipeline-brief.md): for each, HELLO on
 * ipc://RUNDIR/fetcher-<i>.ctl (version, pid, instance, shard map), the pool memfd received over
 * RUNDIR/fetcher-<i>.pool and mapped read-only, a ring pair exec-fetch-<i>.req/.rep created in
 * RUNDIR and announced with ATTACH. One reader thread per fetcher pops replies, watches the
 * fetcher (kill(pid, 0) every 200 ms of silence, HELLO now and then) and relinks after a restart:
 * new pool mapped (old mappings kept while loans on them are out), fresh rings, ACQUIREs in
 * flight sent again. Opaque; every function is thread-safe. */
struct executor_remote;

struct executor_remote_opts {
    const char                *run_dir;            /* required; borrowed during create */
    uint32_t                   n_fetchers;         /* 1..PROTO_MAX_SHARDS; 0 = 1 */
    const struct common_model *model;              /* required; borrowed: must outlive it */
    uint32_t                   connect_timeout_ms; /* startup and relink deadline; 0 = 30 s */
    uint32_t                   acquire_timeout_ms; /* an ACQUIRE unanswered by a live fetcher;
                                                      0 = 120 s */
    uint64_t instance;                             /* this executor's instance id, for ATTACH */
    uint32_t n_seq, n_ctx;   /* for ATTACH: the sequences and positions (resolved) this executor's
                                contexts hold; a fetcher checks them against its memory plan */
    bool (*cancelled)(void); /* the startup wait gives up (COMMON_ECLOSED) once it returns true
                                (proto_daemon_stopping: a signal); NULL = never */
    bool direct_reads;       /* read READY parts of a settled pool in place instead of pinning them
                                through an ACQUIRE (never under ThreadSanitizer); experimental */
};

/* Connects to every fetcher (retrying until the deadline), checks that their shards cover each
 * expert of the model exactly once and starts the reader threads. Returns 0, COMMON_ETIMEDOUT
 * (a fetcher did not answer in time: named in e), COMMON_EPROTO (bad HELLO, version, shard map,
 * pool or ATTACH refused: named), COMMON_EINVAL, COMMON_ENOMEM, COMMON_EIO. */
int executor_remote_create(const struct executor_remote_opts *o, struct executor_remote **out,
                           struct common_errmsg *e);
/* Stops the readers, closes the links, removes the ring files it created, unmaps the pools.
 * Every loan must have been released. Accepts NULL. */
void executor_remote_destroy(struct executor_remote *r);

/* Tells every fetcher, now and after each (re)attach, that the executor keeps the KV of its last
 * n layers on a device (DEVICE_LAYERS): a fetcher whose --ram-budget plan left more layers' KV
 * out of RAM shrinks its pool (after the device was dropped, or could not be used). */
void executor_remote_device_layers(struct executor_remote *r, uint32_t n);

/* The expert source to give executor_weights_stream_create() (arg = r: r must outlive it). */
void executor_remote_source(struct executor_remote *r, struct executor_expert_source *out);

/* The shard map in use (one entry per fetcher, by fetcher index); returns the count. */
uint32_t executor_remote_shards(struct executor_remote *r, struct proto_shard *out, uint32_t cap);

/* Number of fetchers not linked right now (0 = all serving). */
uint32_t executor_remote_n_down(struct executor_remote *r);

/* Counters of one fetcher link. */
struct executor_remote_stats {
    uint64_t acquires;    /* ACQUIREs answered with a loan */
    uint64_t errors;      /* ACQUIREs failed (fetcher error, bad reply, timeout, link down) */
    uint64_t wait_ns;     /* time spent waiting for ACQUIRE replies */
    uint64_t hints;       /* HINTs sent */
    uint64_t direct;      /* parts read in place from the pool (no ACQUIRE, no pin) */
    uint64_t torn;        /* direct reads whose slot was reused meanwhile (computed again) */
    uint64_t relinks;     /* restarts of the fetcher followed */
    uint64_t bad_replies; /* replies refused (unknown tag, out-of-bounds offsets) */
    bool     up;          /* linked now */
};
/* Copies the counters of fetcher `i`; returns 0 or COMMON_EINVAL. */
int executor_remote_stats(struct executor_remote *r, uint32_t i, struct executor_remote_stats *out);

/* ------------------------------------------------------------------------------------------ */
/* Step service for the router (executor/serve.c)                                              */
/* ------------------------------------------------------------------------------------------ */

/* The control socket ipc://RUNDIR/executor.ctl (HELLO, STATS, HEALTH, DRAIN, SHUTDOWN,
 * CONFIGURE, LOAD_MODEL, ATTACH) and one step thread serving the router's step rings (EVAL,
 * FREE) with one executor_ctx per sequence. Opaque. */
struct executor_serve;

struct executor_serve_opts {
    const char                  *run_dir;    /* required; borrowed during start */
    const char                  *model_path; /* what LOAD_MODEL compares; borrowed during start */
    const struct executor_model *model;      /* borrowed: must outlive the service */
    struct executor_remote      *remote;     /* borrowed, NULL for a dense model */
    struct executor_threadpool  *pool;       /* borrowed: threads of the forward pass */
    uint32_t                     n_seq;      /* sequences (contexts); 0 = 4 */
    uint32_t                     n_ctx;      /* positions per sequence; 0 = min(train, 4096) */
    uint32_t                     n_batch;    /* 0 = 512 */
    enum common_cache_type       cache_type;
    uint64_t                     instance;   /* 0 = a random one */
    bool                         no_pidfile; /* do not write RUNDIR/executor.pid (tests) */
    int32_t n_gpu_layers; /* -ngl: as executor_ctx_opts (the weights uploaded once for all
                             sequences); 0 = none. Without a usable device: a warning, the CPU.
                             A device failing later (COMMON_EDEVICE): the contexts are made again
                             on the CPU and the instance id changes, so the router replays its
                             sequences. SLUICE_TEST_DEVICE_FAULT=N in the environment (tests)
                             makes the Nth batched step fail that way, with or without a device */
    struct executor_devices   devices;     /* the devices: as executor_ctx_opts */
    int32_t                   n_cpu_moe;   /* --n-cpu-moe: as executor_ctx_opts */
    uint64_t                  vram_budget; /* --vram-budget: as executor_ctx_opts */
    enum executor_expert_miss expert_miss; /* --expert-miss: as executor_ctx_opts */
    enum executor_pool_policy pool_policy; /* --policy: as executor_ctx_opts */
};

/* Creates the contexts, writes the pid file, starts the step thread and listens on
 * ipc://RUNDIR/executor.ctl. Returns 0, COMMON_EBUSY (another executor listens there),
 * COMMON_EINVAL (options unusable for the model: named in e), COMMON_ENOMEM, COMMON_EIO. */
int executor_serve_start(const struct executor_serve_opts *o, struct executor_serve **out,
                         struct common_errmsg *e);
/* The control service of the executor (owned by s): proto_service_run() waits for SHUTDOWN or a
 * signal. */
struct proto_service *executor_serve_service(struct executor_serve *s);
/* Stops taking new links and steps (what DRAIN does). Thread-safe. */
void executor_serve_drain(struct executor_serve *s);
/* Stops listening and the step thread (finishing the step in progress), closes the router link,
 * removes the socket and pid file. Accepts NULL. */
void executor_serve_stop(struct executor_serve *s);
/* The n_ctx and n_seq in use (after defaults). */
uint32_t executor_serve_n_ctx(const struct executor_serve *s);
uint32_t executor_serve_n_seq(const struct executor_serve *s);
/* The service's instance id: a new one after a device failure, as after a restart. */
uint64_t executor_serve_instance(struct executor_serve *s);

#endif /* EXECUTOR_EXECUTOR_H */
