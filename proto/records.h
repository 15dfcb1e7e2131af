/* proto/records.h - fixed records of the data-plane rings (common_ring) between the daemons. */
#ifndef PROTO_RECORDS_H
#define PROTO_RECORDS_H

#include <stdint.h>

/* Everything read from a ring is untrusted: check op, ids, ranges and sizes before use.
 * Records are plain little-endian structs of fixed size (the ring's slot size is their size). */

/* ---- executor <-> fetcher i ----------------------------------------------------------------- *
 * The executor creates two ring segments in the run directory, "exec-fetch-<i>.req" (executor
 * produces proto_fetch_req) and "exec-fetch-<i>.rep" (fetcher produces proto_fetch_rep), and
 * sends ATTACH to fetcher i's control socket with segments[0] = req, segments[1] = rep,
 * params[0] = ring slots. The pool segment (a memfd) is handed over the Unix socket
 * "fetcher-<i>.pool" in the run directory (SCM_RIGHTS, peer of the same uid only) and mapped
 * read-only; reply offsets are relative to its start. A new ATTACH replaces the old link and
 * the fetcher releases every loan the old link still held. */

#define PROTO_FETCH_RING_SLOTS 1024u

enum proto_fetch_op {
    PROTO_FETCH_ACQUIRE = 1, /* pin part `part` of (layer, expert); reply when readable */
    PROTO_FETCH_RELEASE = 2, /* end loan `loan`; no reply */
    PROTO_FETCH_HINT = 3,    /* fetcher_request(layer, expert, prio); no reply */
    PROTO_FETCH_TOKEN = 4,   /* a new token starts (fetcher_token_begin); no reply */
    PROTO_FETCH_USE = 5,     /* the parts in mask `part` (bit p: part p; 1..7) of (layer, expert)
                                were read straight from the mapped pool without a loan
                                (fetcher_note_use); no reply */
};

struct proto_fetch_req {
    uint32_t op;     /* enum proto_fetch_op */
    uint32_t tag;    /* ACQUIRE: echoed in the reply */
    uint32_t layer;  /* ACQUIRE, HINT, USE */
    uint32_t expert; /* ACQUIRE, HINT, USE: the model's expert id (not shard-relative) */
    uint32_t part;   /* ACQUIRE: enum common_expert_part; USE: a mask of parts */
    uint32_t prio;   /* HINT: enum fetcher_priority */
    uint32_t loan;   /* RELEASE */
    uint32_t pad;
};

struct proto_fetch_rep {
    uint32_t tag;    /* the ACQUIRE's tag */
    int32_t  status; /* 0, or a negative common_err (the acquire failed; nothing is pinned) */
    uint32_t loan;   /* for RELEASE */
    uint32_t pad;
    uint64_t offset; /* the part's bytes: [offset, offset + size) of the pool segment */
    uint64_t size;
};

/* ---- router <-> executor -------------------------------------------------------------------- *
 * The router creates four segments: "router-exec.req" (ring of proto_step_req, router
 * produces), "router-exec.rep" (ring of proto_step_rep, executor produces), "router-exec.tokens"
 * (slab: n_seq rows of n_ctx int32 token ids, router writes) and "router-exec.logits" (slab:
 * n_seq rows of n_vocab floats, executor writes), and sends ATTACH to the executor with those
 * four names and params[0] = ring slots, params[1] = n_seq, params[2] = n_ctx,
 * params[3] = n_vocab. The executor refuses numbers that do not match its model and
 * configuration (n_seq and n_ctx at most its own). */

#define PROTO_STEP_RING_SLOTS 256u

enum proto_step_op {
    PROTO_STEP_EVAL = 1, /* evaluate tokens[seq][pos, pos + n) at positions pos..; pos 0 resets
                            the sequence first; pos must be 0 or the sequence's length */
    PROTO_STEP_FREE = 2, /* forget sequence `seq`; replied to */
};

struct proto_step_req {
    uint32_t op;  /* enum proto_step_op */
    uint32_t seq; /* sequence slot, < n_seq */
    uint64_t tag; /* echoed */
    uint32_t pos; /* EVAL: first position */
    uint32_t n;   /* EVAL: tokens, >= 1, pos + n <= n_ctx */
    uint32_t pad[2];
};

struct proto_step_rep {
    uint64_t tag;    /* the request's tag */
    uint32_t seq;    /* the request's sequence */
    int32_t  status; /* 0: logits of token pos+n-1 are in row `seq` of the logits slab; or a
                        negative common_err */
    uint32_t n_past; /* the sequence's length after the step */
    uint32_t pad;
    double   ms; /* executor time of the step */
};

#endif /* PROTO_RECORDS_H */
