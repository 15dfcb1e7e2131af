/* executor/executor.h - public front door of executor/: kernels, model synthesis, forward pass. */
#ifndef EXECUTOR_EXECUTOR_H
#define EXECUTOR_EXECUTOR_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "kernels/kernels.h"

/* ------------------------------------------------------------------------------------------ */
/* Model synthesis: `sluice mkmodel` (executor/synth.c)                                        */
/* ------------------------------------------------------------------------------------------ */

/* Geometry and content of a synthetic model with random weights. Zero fields take defaults. */
struct executor_synth_opts {
    const char *path;          /* output GGUF path (required) */
    const char *name;          /* general.name; NULL = "sluice-synth" */
    uint32_t    n_vocab;       /* 0 = vocabulary size of vocab_from, else 259 (byte-level) */
    uint32_t    n_ctx;         /* context_length; 0 = 2048 */
    uint32_t    n_embd;        /* 0 = 256 */
    uint32_t    n_layer;       /* 0 = 2 (ignored when target_bytes is set) */
    uint32_t    n_head;        /* 0 = 8 */
    uint32_t    n_head_kv;     /* 0 = n_head */
    uint32_t    n_ff;          /* dense or per-expert FFN width; 0 = 4 * n_embd rounded */
    uint32_t    n_expert;      /* 0 = dense; else Mixtral-layout MoE */
    uint32_t    n_expert_used; /* 0 = min(2, n_expert) */
    uint32_t    type;          /* enum common_ggml_type of the 2-D/3-D weights; 0 = F32 */
    uint64_t    target_bytes;  /* 0 = keep n_layer; else choose n_layer to approach this size */
    const char *vocab_from;    /* copy tokenizer.* keys from this GGUF; NULL = byte-level vocab */
    uint64_t    seed;          /* weight RNG seed; 0 = 1 */
    float       rope_freq_base; /* 0 = 10000 */
    bool        progress;      /* print progress to stderr */
};

/* Writes a llama-architecture GGUF (dense, or MoE in the Mixtral layout) with random weights,
 * streaming tensor by tensor with memory bounded by one tensor row block, whatever the size.
 * Returns 0, COMMON_EINVAL (bad geometry, named in e), COMMON_ENOTSUP (type without a quantizer),
 * COMMON_EIO, COMMON_ENOMEM. */
int executor_synth_write(const struct executor_synth_opts *o, struct common_errmsg *e);

#endif /* EXECUTOR_EXECUTOR_H */
