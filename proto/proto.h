/* proto/proto.h - face of proto/: protocol version, control messages in C, ring records, wire. */
#ifndef PROTO_PROTO_H
#define PROTO_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* Protocol version spoken by this build; bumped on any incompatible message change. */
#define PROTO_VERSION_MAJOR 0
#define PROTO_VERSION_MINOR 4

/* Limits on decoded messages; larger inbound messages are refused with COMMON_EPROTO. */
#define PROTO_MAX_MESSAGE_BYTES (1u << 20)
#define PROTO_MAX_SHARDS        64u
#define PROTO_MAX_NAME          64u  /* bytes, including the NUL */
#define PROTO_MAX_ERROR_TEXT    256u /* bytes, including the NUL */

/* True when a peer announcing (major, minor) can talk to this build: same major, any minor. */
bool proto_version_is_compatible(uint32_t major, uint32_t minor);

enum proto_role {
    PROTO_ROLE_FETCHER = 0,
    PROTO_ROLE_EXECUTOR = 1,
    PROTO_ROLE_ROUTER = 2,
    PROTO_ROLE_CLIENT = 3,
};

enum proto_kind {
    PROTO_KIND_HELLO = 1,    /* handshake, both ways: who is speaking, version, shard map */
    PROTO_KIND_ERROR = 2,    /* a request failed */
    PROTO_KIND_OK = 3,       /* a request succeeded and has nothing else to say */
    PROTO_KIND_CONFIGURE,    /* set one runtime setting (key = value) */
    PROTO_KIND_LOAD_MODEL,   /* load (or confirm) a model file */
    PROTO_KIND_STATS,        /* ask for counters */
    PROTO_KIND_STATS_REPLY,  /* counters: name = value pairs */
    PROTO_KIND_HEALTH,       /* ask for state */
    PROTO_KIND_HEALTH_REPLY, /* state, role, pid, uptime */
    PROTO_KIND_DRAIN,        /* stop taking new work, finish what is in flight */
    PROTO_KIND_SHUTDOWN,     /* drain, then exit */
    PROTO_KIND_ATTACH,       /* data plane: "map these ring/slab segments and serve them" */
    PROTO_KIND_GENERATE,     /* client -> router: a generation request */
    PROTO_KIND_POLL,         /* client -> router: next token events of a request (long poll) */
    PROTO_KIND_EVENTS,       /* router -> client: token events, and final stats when done */
    PROTO_KIND_CANCEL,       /* client -> router: stop a request */
    PROTO_KIND_EXPERT_ERROR, /* executor -> fetcher: why an expert's acquire failed (0.4) */
};

/* Static name of a kind ("hello", "generate", ...), "?" for an unknown value. */
const char *proto_kind_name(enum proto_kind k);

/* One fetcher's share of the experts: [first_expert, first_expert + n_experts) of the layers
 * [first_layer, first_layer + n_layers), of every layer when n_layers is 0 (fetchers sharded by
 * expert; by file, a fetcher per device, with --shard-by file). */
struct proto_shard {
    uint32_t fetcher;
    uint32_t first_expert;
    uint32_t n_experts;
    uint32_t first_layer;
    uint32_t n_layers;
};

struct proto_hello {
    uint32_t           major;
    uint32_t           minor;
    enum proto_role    role;
    char               name[PROTO_MAX_NAME]; /* NUL-terminated */
    uint32_t           n_shards;
    struct proto_shard shards[PROTO_MAX_SHARDS];
    uint32_t           pid;      /* process id of the speaker (0 = not told) */
    uint64_t           instance; /* changes at every start of the speaker: detects restarts */
};

struct proto_error {
    int32_t code;                          /* a common_err value */
    char    message[PROTO_MAX_ERROR_TEXT]; /* NUL-terminated */
};

#define PROTO_MAX_KEY   64u  /* configure keys and stat names, including the NUL */
#define PROTO_MAX_VALUE 256u /* configure values, including the NUL */
#define PROTO_MAX_PATH  1024u
#define PROTO_MAX_STATS 128u

struct proto_configure {
    char key[PROTO_MAX_KEY];     /* NUL-terminated, e.g. "log.level" */
    char value[PROTO_MAX_VALUE]; /* NUL-terminated, e.g. "debug" */
};

struct proto_load_model {
    char path[PROTO_MAX_PATH]; /* NUL-terminated */
};

struct proto_stat {
    char   name[PROTO_MAX_KEY]; /* NUL-terminated, e.g. "pool.hits" */
    double value;
};

struct proto_stats_reply {
    uint32_t          n_stats;
    struct proto_stat stats[PROTO_MAX_STATS];
};

enum proto_health_state {
    PROTO_HEALTH_STARTING = 0, /* loading; not serving yet */
    PROTO_HEALTH_READY,        /* serving */
    PROTO_HEALTH_DRAINING,     /* finishing in-flight work, taking none */
    PROTO_HEALTH_DEGRADED,     /* up, but a peer is missing or the model file shrank */
};

struct proto_health_reply {
    enum proto_health_state state;
    enum proto_role         role;
    uint32_t                pid;
    uint64_t                instance;
    double                  uptime_s;
    char                    message[PROTO_MAX_ERROR_TEXT]; /* NUL-terminated; may be empty */
};

/* Data-plane setup: the sender created ring and slab segments in the run directory (file names
 * relative to it, proto/records.h gives the record layouts) and asks the receiver to map them
 * and serve them. A new ATTACH from the same role replaces the previous link. */
#define PROTO_MAX_SEGMENTS 4u
struct proto_attach {
    enum proto_role role;     /* who is attaching */
    uint32_t        pid;      /* its process id */
    uint64_t        instance; /* its instance id */
    uint32_t        n_segments;
    char            segments[PROTO_MAX_SEGMENTS][PROTO_MAX_NAME]; /* NUL-terminated names */
    uint32_t        params[8]; /* link-specific numbers (proto/records.h says which) */
};

/* Client API. Strings over PROTO_MAX_VALUE bytes are heap-owned by a decoded message and freed
 * by proto_msg_clear(); on encode they are borrowed from the caller. */
#define PROTO_MAX_PROMPT       (512u * 1024u) /* bytes of a prompt or of all message contents */
#define PROTO_MAX_MESSAGES     64u
#define PROTO_MAX_STOPS        8u
#define PROTO_MAX_STOP_LEN     64u /* bytes, including the NUL */
#define PROTO_MAX_EVENT_TOKENS 256u
#define PROTO_MAX_RESUME                                                                           \
    (1u << 16) /* token ids of a resumed GENERATE (with the longest                                \
                  prompt, the message stays under 1 MiB) */
#define PROTO_MAX_ROLE 16u

struct proto_chat_msg {
    char  role[PROTO_MAX_ROLE]; /* "system", "user", "assistant"; NUL-terminated */
    char *content;              /* NUL-terminated UTF-8 */
};

struct proto_sampling {
    float    temp;           /* 0 = greedy */
    int32_t  top_k;          /* <= 0 = off */
    float    top_p;          /* 1 = off */
    float    min_p;          /* 0 = off */
    float    repeat_penalty; /* 1 = off */
    uint32_t repeat_last_n;
    uint64_t seed;
};

struct proto_generate {
    char                 *prompt;     /* raw prompt (NULL when messages are given) */
    uint32_t              n_messages; /* chat messages, rendered with the model's template */
    struct proto_chat_msg messages[PROTO_MAX_MESSAGES];
    struct proto_sampling sampling;
    uint32_t              max_tokens; /* 0 = until EOS or the context is full */
    uint32_t              n_stops;
    char                  stops[PROTO_MAX_STOPS][PROTO_MAX_STOP_LEN];
    bool                  stream;  /* token events as they come (else one event at the end) */
    bool                  special; /* parse special tokens in the prompt */
    /* 0.3, resuming a request a killed router lost: the token ids the client received (heap
     * after decoding, at most PROTO_MAX_RESUME) and the text bytes it received with them. The
     * router replays them (the sampler's state and the stop strings' included) and goes on. */
    int32_t *resume;
    uint32_t n_resume;
    uint64_t resume_bytes;
};

/* With `ack` (protocol 0.2), the events of a reply stay at the router until a later POLL
 * acknowledges them: ack_tokens and ack_bytes count the tokens and text bytes the client has
 * received for this request. A POLL is then idempotent: a retry after a lost reply (a closed
 * connection, a timeout) gets the same events again, so the client receives each token once.
 * Without `ack` (0.1 clients) a reply consumes its events. */
struct proto_poll {
    uint32_t max_events; /* tokens per reply at most; 0 = PROTO_MAX_EVENT_TOKENS */
    uint32_t timeout_ms; /* reply with no token after this long (0 = router default) */
    bool     ack;        /* ack_tokens and ack_bytes are given */
    uint64_t ack_tokens; /* tokens received so far */
    uint64_t ack_bytes;  /* text bytes received so far */
};

enum proto_stop_reason {
    PROTO_STOP_NONE = 0, /* not finished */
    PROTO_STOP_EOS,      /* end-of-generation token */
    PROTO_STOP_LENGTH,   /* max_tokens reached */
    PROTO_STOP_STRING,   /* a stop string */
    PROTO_STOP_CONTEXT,  /* the context is full */
    PROTO_STOP_CANCEL,   /* cancelled by the client */
    PROTO_STOP_ERROR,    /* failed: see error_code / error_text */
};

struct proto_final_stats {
    uint32_t n_prompt;    /* prompt tokens */
    uint32_t n_generated; /* tokens generated */
    double   queue_ms;    /* waiting before the first step */
    double   prompt_ms;   /* prompt evaluation */
    double   decode_ms;   /* generation after the first token */
};

struct proto_events {
    uint32_t n_tokens;
    int32_t  tokens[PROTO_MAX_EVENT_TOKENS];
    /* The detokenized text of those tokens: text_len bytes, which may hold NUL (a byte token
     * <0x00>), then a NUL terminator. NULL when empty. */
    char                    *text;
    uint32_t                 text_len;
    bool                     done;
    enum proto_stop_reason   reason;
    struct proto_final_stats stats;      /* when done */
    int32_t                  error_code; /* when reason is PROTO_STOP_ERROR */
    char                     error_text[PROTO_MAX_ERROR_TEXT];
};

/* EXPERT_ERROR: the fetcher replies ERROR with the reason the acquire of (layer, expert) failed
 * last (its file, layer, expert and what was wrong), or OK when it knows of none. */
struct proto_expert_error {
    uint32_t layer;
    uint32_t expert;
};

/* A control message. request_id ties a reply to its request; for GENERATE, POLL, EVENTS and
 * CANCEL it is the generation's id (chosen by the client, unique per client connection). */
struct proto_msg {
    enum proto_kind kind;
    uint64_t        request_id;
    union {
        struct proto_hello        hello;
        struct proto_error        error;
        struct proto_configure    configure;
        struct proto_load_model   load_model;
        struct proto_stats_reply  stats;
        struct proto_health_reply health;
        struct proto_attach       attach;
        struct proto_generate     generate;
        struct proto_poll         poll;
        struct proto_events       events;
        struct proto_expert_error expert_error;
    } u; /* OK, STATS, HEALTH, DRAIN, SHUTDOWN and CANCEL have no body */
};

/* Frees what a decoded message owns (prompt, message contents, event text) and zeroes those
 * pointers. Call it on every message proto_decode() filled; never on one whose pointers the
 * caller set itself. Accepts a message of any kind. */
void proto_msg_clear(struct proto_msg *m);

/* For handlers (proto/wire.h): turns *rep into an ERROR reply with `code` and printf-style text,
 * keeping its request_id, and returns `code` (so `return proto_reply_error(rep, ...);`). */
int proto_reply_error(struct proto_msg *rep, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fills *m as an ERROR reply to request `request_id` with `code` and printf-style text
 * (truncated to fit). */
void proto_msg_error(struct proto_msg *m, uint64_t request_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Encodes `m` into a malloc'd buffer (*buf, *len; the caller frees it). Returns 0,
 * COMMON_EINVAL (unknown kind, too many shards, name or message too long) or COMMON_ENOMEM.
 * Thread-safe. */
int proto_encode(const struct proto_msg *m, uint8_t **buf, size_t *len);

/* Verifies `buf` with the generated FlatBuffers verifier, then decodes it into *out. Returns 0,
 * or COMMON_EPROTO for anything malformed, oversized, of another file identifier, with a
 * string that does not fit or an enum value out of range; COMMON_ENOMEM. *out is unchanged on
 * failure; on success, release it with proto_msg_clear(). Never reads outside buf[0, len).
 * Thread-safe. */
int proto_decode(const void *buf, size_t len, struct proto_msg *out);

/* ------------------------------------------------------------------------------------------ */
/* Data-plane ring records: the fixed records of the rings between the daemons                 */
/* ------------------------------------------------------------------------------------------ */

/* Everything read from a ring is untrusted: check op, ids, ranges and sizes before use.
 * Records are plain little-endian structs of fixed size (the ring's slot size is their size). */

/* ---- executor <-> fetcher i ----------------------------------------------------------------- *
 * The executor creates two ring segments in the run directory, "exec-fetch-<i>.req" (executor
 * produces proto_fetch_req) and "exec-fetch-<i>.rep" (fetcher produces proto_fetch_rep), and
 * sends ATTACH to fetcher i's control socket with segments[0] = req, segments[1] = rep,
 * params[0] = ring slots, params[1] = the executor's sequences and params[2] = its positions per
 * sequence (0 = not told); a fetcher whose pool was sized by a --ram-budget plan refuses an
 * executor with more of either than the plan holds. The pool segment (a memfd) is handed over the
 * Unix socket "fetcher-<i>.pool" in the run directory (SCM_RIGHTS, peer of the same uid only) and
 * mapped read-only; reply offsets are relative to its start. A new ATTACH replaces the old link and
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
    PROTO_FETCH_DEVICE_LAYERS = 6, /* the executor keeps the KV of `layer` layers (the last ones,
                                      0..n_layer) on a device: sent after each ATTACH and when it
                                      drops its device. A fetcher whose --ram-budget plan left more
                                      layers' KV out shrinks its pool to the plan with that many;
                                      no reply */
    /* The fetcher's device expert pool (opened over "fetcher-<i>.dev", below); no replies: */
    PROTO_FETCH_DEV_COPY = 7, /* queue a copy of `bytes` from pool-segment offset `src` to device-
                                 pool offset `dst` on the fetcher's copy stream (the executor holds
                                 the loan on the source until a later mark is done) */
    PROTO_FETCH_DEV_MARK = 8, /* record the pool's event `tag` after the copies so far, then publish
                                 `loan` as the marks' sequence in the pool's control page */
    PROTO_FETCH_DEV_WAIT = 9, /* the copies queued next wait for the executor's kernels event (it
                                 recorded it before pushing this) */
    PROTO_FETCH_DEV_READ = 10, /* a pool that stages (PROTO_DEVPOOL_STAGES): read the bundle of
                                  (layer, expert) from storage into the fetcher's pinned staging
                                  (not its RAM pool) and queue the copy of its part `part`,
                                  `bytes` long, to device-pool offset `dst`; the next mark comes
                                  after that copy, or says it failed (the control page) */
};

/* Priority of a HINT (the fetcher's request classes, most urgent first: the same values as its
 * enum fetcher_priority). */
enum proto_fetch_prio {
    PROTO_FETCH_PRIO_DEMAND = 0, /* needed now by the forward pass */
    PROTO_FETCH_PRIO_POSTFETCH,  /* picked by the router for this layer, needed shortly */
    PROTO_FETCH_PRIO_PREFETCH,   /* a guess (next layer, next token); dropped when stale */
    PROTO_FETCH_PRIO_COUNT,
};

struct proto_fetch_req {
    uint32_t op;     /* enum proto_fetch_op */
    uint32_t tag;    /* ACQUIRE: echoed in the reply */
    uint32_t layer;  /* ACQUIRE, HINT, USE, DEV_READ; DEVICE_LAYERS: the count */
    uint32_t expert; /* ACQUIRE, HINT, USE, DEV_READ: the model's expert id (not shard-relative) */
    uint32_t part;   /* ACQUIRE, DEV_READ: enum common_expert_part; USE: a mask of parts */
    uint32_t prio;   /* HINT: enum proto_fetch_prio; DEV_*: the fetcher's pool (its socket's k) */
    uint32_t loan;   /* RELEASE; DEV_MARK: the mark's sequence number */
    uint32_t bytes;  /* DEV_COPY, DEV_READ */
    uint64_t src;    /* DEV_COPY: offset in the pool segment */
    uint64_t dst;    /* DEV_COPY, DEV_READ: offset in the device pool */
};

/* ---- the fetcher's device pool ("fetcher-<i>.dev") ----------------------------------------- *
 * A fetcher started with --vram-budget listens on the Unix socket "fetcher-<i>.dev" in the run
 * directory. One executor at a time connects and keeps the connection for the pool's life; every
 * message either way is a common_devmem_handle (common_devmem_handle_send) whose tag says what it
 * is. The executor sends OPEN (blob: struct proto_devpool_open); the fetcher opens its device,
 * reserves the bytes asked (within its budget) and answers GRANTED (blob: struct
 * proto_devpool_granted) then CTL (fd: the control page, a memfd of PROTO_DEVPOOL_CTL_BYTES: a
 * 32-bit word at offset 0, the last mark's sequence, a futex; a 64-bit word at offset 8, the
 * nanoseconds the fetcher's copy stream spent copying since OPEN, as of the last mark; a 32-bit
 * word at offset 16, the sequence of the last mark after a DEV_COPY, DEV_READ or DEV_WAIT that was
 * refused or failed, 0 = none: the copies that mark covers are not all there) then
 * n_events EVENT handles, or ERROR (blob: the reason, text). The executor then sends KEVENT (its
 * kernels' event, exported). Then, any number of times, PIECE (blob: uint32_t piece index): the
 * fetcher makes piece k of the pool (granularity bytes at offset k * granularity), maps it and
 * answers PIECE with its handle, or ERROR (ADOPT, below, with several fetchers). Records DEV_COPY,
 * DEV_MARK and DEV_WAIT on the link's ring act on the pool. When the connection closes the fetcher
 * drops the pool (the executor's imports keep their memory).
 * A fetcher started with --device-pools N serves the pools of N of the executor's devices at
 * once, pool k on the socket proto_devpool_path names ("fetcher-<i>.dev" for k = 0,
 * "fetcher-<i>.dev<k>" after), each as above with its own memory, events, control page and
 * staging; the records carry k in `prio`. */

enum proto_devpool_tag {
    PROTO_DEVPOOL_OPEN = 1,
    PROTO_DEVPOOL_GRANTED = 2,
    PROTO_DEVPOOL_CTL = 3,
    PROTO_DEVPOOL_EVENT = 4,
    PROTO_DEVPOOL_KEVENT = 5,
    PROTO_DEVPOOL_PIECE = 6,
    PROTO_DEVPOOL_ERROR = 7,
    PROTO_DEVPOOL_ADOPT = 8,   /* (tag | k << 32) another fetcher's piece k, its handle */
    PROTO_DEVPOOL_ADOPTED = 9, /* piece k mapped */
};

#define PROTO_DEVPOOL_MAGIC      0x53445650u /* "SDVP" */
#define PROTO_DEVPOOL_MAX_EVENTS 16u
#define PROTO_DEVPOOL_CTL_BYTES  4096u
#define PROTO_DEVPOOL_MAX_POOLS  8u /* --device-pools */

/* The socket of fetcher i's device pool k in run_dir. 0, or COMMON_EINVAL (too long). */
int proto_devpool_path(char *buf, size_t len, const char *run_dir, uint32_t fetcher, uint32_t k);

struct proto_devpool_open {
    uint32_t magic;    /* PROTO_DEVPOOL_MAGIC */
    int32_t  device;   /* the executor's device index */
    uint64_t bytes;    /* address space wanted (the executor's slots' bytes) */
    uint32_t n_events; /* events the fetcher records (1..PROTO_DEVPOOL_MAX_EVENTS) */
    uint32_t flags;    /* PROTO_DEVPOOL_ADOPTS: the memory is another fetcher's */
};

/* With several fetchers the pool's memory is fetcher 0's; every other fetcher opens with
 * PROTO_DEVPOOL_ADOPTS (its budget is not charged), and instead of PIECE the executor sends it
 * ADOPT (tag PROTO_DEVPOOL_ADOPT | k << 32, the piece's handle as fetcher 0 gave it): it maps the
 * piece at the same offset of its reservation and answers ADOPTED, or ERROR. Each fetcher copies
 * the experts of its shard from its own RAM pool and records its own events. */
#define PROTO_DEVPOOL_ADOPTS 1u

/* GRANTED's flags: the fetcher reads the experts that are not in its RAM pool straight from
 * storage into pinned staging (DEV_READ), its RAM pool left to what it holds (--vram-fill). */
#define PROTO_DEVPOOL_STAGES 1u

struct proto_devpool_granted {
    uint64_t bytes;       /* reserved: `bytes` rounded up to the granularity */
    uint64_t granularity; /* piece size */
    char     backend[8];  /* "HOST" or "CUDA", NUL-terminated */
    uint32_t flags;       /* PROTO_DEVPOOL_STAGES */
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

/* Bits of proto_step_req.flags. */
enum proto_step_flag {
    /* More records of this round follow at once: the executor waits for them and runs the
     * round's EVALs of distinct sequences as one batch (continuous batching), every routed
     * expert read once for all of them. A record without it ends the round. */
    PROTO_STEP_F_MORE = 1u,
};

struct proto_step_req {
    uint32_t op;    /* enum proto_step_op */
    uint32_t seq;   /* sequence slot, < n_seq */
    uint64_t tag;   /* echoed */
    uint32_t pos;   /* EVAL: first position */
    uint32_t n;     /* EVAL: tokens, >= 1, pos + n <= n_ctx */
    uint32_t flags; /* enum proto_step_flag bits; unknown bits are ignored */
    uint32_t pad;
};

/* A failed step's reply (status < 0) with this flag has the reason in row `seq` of the logits
 * slab instead of logits: one line of text, NUL-terminated within PROTO_MAX_ERROR_TEXT bytes and
 * the row (a corrupt expert names its file, layer and expert, as in one process). */
#define PROTO_STEP_REP_TEXT 1u

struct proto_step_rep {
    uint64_t tag;    /* the request's tag */
    uint32_t seq;    /* the request's sequence */
    int32_t  status; /* 0: logits of token pos+n-1 are in row `seq` of the logits slab; or a
                        negative common_err */
    uint32_t n_past; /* the sequence's length after the step */
    uint32_t flags;  /* PROTO_STEP_REP_*; 0 from executors before 0.4 (the field was padding) */
    double   ms;     /* executor time of the step (of its round, when batched) */
};

/* ------------------------------------------------------------------------------------------ */
/* Control messages over nng: request/reply server and client call (proto/wire.c)              */
/* ------------------------------------------------------------------------------------------ */

/* URLs are nng's: "ipc:///run/dir/router.sock" (the socket file is created with mode 0600) or
 * "tcp://host:port". */

/* ---- server: rep0 with several contexts ----------------------------------------------------- */

/* Called once per verified inbound message, from one of the server's worker contexts (several
 * may run at once: the handler must be thread-safe). Fill *rep (its request_id defaults to the
 * request's) and return 0 to send it; a handler may block (a long poll) up to the server's
 * `max_block_ms`. Returning a negative common_err sends an ERROR reply with that code and
 * rep->u.error.message if set. The request is cleared (proto_msg_clear) after the call; the
 * reply too, after it was sent, so a handler may hand over malloc'd text in it. */
typedef int (*proto_handler_fn)(void *arg, const struct proto_msg *req, struct proto_msg *rep);

struct proto_server_opts {
    uint32_t n_workers; /* requests served at once (contexts); 0 = 4 */
    uint32_t recv_max;  /* largest inbound message; 0 = PROTO_MAX_MESSAGE_BYTES */
};

struct proto_server;

/* Listens on `url` (for ipc://, the socket file gets mode 0600 and a stale file left by a dead
 * process is replaced) and serves it with `handler` on nng's threads. Malformed, oversized or
 * unverifiable requests get an ERROR reply (COMMON_EPROTO) without reaching the handler; the
 * server carries on. Returns 0, COMMON_EBUSY (another live server listens there),
 * COMMON_EIO (nng failure, named in e), COMMON_ENOMEM. */
int proto_server_start(const char *url, const struct proto_server_opts *o, proto_handler_fn handler,
                       void *arg, struct proto_server **out, struct common_errmsg *e);
/* Stops listening, waits for handlers in flight, frees; accepts NULL. */
void proto_server_stop(struct proto_server *s);
/* Counters: requests served, malformed requests refused. */
void proto_server_counts(const struct proto_server *s, uint64_t *served, uint64_t *refused);
/* Listeners replaced by the server's watchdog (ipc:// only). nng 1.5.2 stops accepting on a
 * listener whose peer disconnects during the SP handshake (nanomsg/nng#1518); the server checks
 * its listener every 500 ms and replaces a broken one within about a second. Replacing it closes
 * the connections accepted through it: calls in flight on them fail with COMMON_ECLOSED, and nng
 * reconnects the clients. 0 for NULL. */
uint64_t proto_server_listener_restarts(const struct proto_server *s);

/* ---- client: req0 --------------------------------------------------------------------------- */

struct proto_client;

/* Dials `url` (nng reconnects in the background). Returns 0, COMMON_EIO with a message. Does not
 * wait for the peer: the first call does. */
int  proto_client_open(const char *url, struct proto_client **out, struct common_errmsg *e);
void proto_client_close(struct proto_client *c);
/* Replaces the client's socket with a fresh one dialing the same url (calls in flight on the old
 * one fail). For a peer that stopped answering: once, under load, an executor got no reply from
 * a restarted fetcher for 30 s while that fetcher's listener accepted new connections (its
 * watchdog probes passed), i.e. the client's dialer was stuck; so callers waiting for a restarted
 * server start over with a new dialer after a call times out. The old socket is closed on a
 * thread of its own (nng 1.5.2 may never return from closing a socket whose dial failed in the
 * handshake). Returns 0 or COMMON_EIO / COMMON_ENOMEM (the old socket is kept). Not thread-safe
 * against calls on the same client. */
int proto_client_reopen(struct proto_client *c, struct common_errmsg *e);

/* Sends `req` and waits up to `timeout_ms` for the reply, decoded into *rep (release it with
 * proto_msg_clear). An ERROR reply is returned as 0 with rep->kind == PROTO_KIND_ERROR. Returns
 * 0, COMMON_ETIMEDOUT (no reply in time: the peer is gone, busy or not started; e says which
 * url), COMMON_EPROTO (the reply did not verify), COMMON_EIO, COMMON_ENOMEM. Thread-safe: calls
 * from several threads each get their own nng context. */
int proto_client_call(struct proto_client *c, const struct proto_msg *req, struct proto_msg *rep,
                      int timeout_ms, struct common_errmsg *e);

/* One-shot: open, call, close. */
int proto_call(const char *url, const struct proto_msg *req, struct proto_msg *rep, int timeout_ms,
               struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* The daemon skeleton: control socket, common messages, pid file, signals (proto/service.c)   */
/* ------------------------------------------------------------------------------------------ */

/* Every daemon (fetcher, executor, router) is one struct proto_service plus a table of handlers,
 * the shape of nng's protocol ops tables: the skeleton checks (or creates) the run directory,
 * listens on the control socket, answers HELLO (version and role checked, the daemon adds its
 * shard map), HEALTH (role, pid, instance, uptime; the daemon says its state), STATS (the
 * daemon's counters, then ctl.* and uptime_s), DRAIN, SHUTDOWN, CONFIGURE log.level and
 * LOAD_MODEL of the model it serves, hands every other message to the daemon, writes the pid
 * file atomically and removes it and the socket at stop. */

/* What the daemon adds to the skeleton. Every entry may be NULL and is called on the server's
 * threads (several at once): each must be thread-safe. */
struct proto_service_ops {
    /* Adds the daemon's part of a HELLO reply (its shard map); the rest is filled. */
    void (*hello)(void *arg, struct proto_hello *h);
    /* Sets h->state (READY before the call) and h->message; the skeleton reports DRAINING once a
     * DRAIN or SHUTDOWN came, whatever the daemon says. */
    void (*health)(void *arg, struct proto_health_reply *h);
    /* Adds the daemon's counters with proto_stats_add(). */
    void (*stats)(void *arg, struct proto_stats_reply *st);
    /* DRAIN or SHUTDOWN came (or a signal): stop taking new work. May be called more than once. */
    void (*drain)(void *arg);
    /* CONFIGURE keys other than log.level: apply, or refuse with proto_reply_error(). */
    int (*configure)(void *arg, const struct proto_configure *c, struct proto_msg *rep);
    /* Every other message (ATTACH, GENERATE, POLL, CANCEL); as a proto_handler_fn. NULL = such
     * messages are refused (COMMON_EPROTO). */
    proto_handler_fn handle;
};

struct proto_service_opts {
    const char *run_dir;        /* required: created 0700 when absent, else must be ours, 0700 */
    const char *name;           /* required: "fetcher-0", "executor", "router": HELLO's name,
                                   the socket RUN_DIR/NAME.ctl and the pid file RUN_DIR/NAME.pid */
    enum proto_role role;       /* who this daemon is */
    const char     *url;        /* where to listen; NULL = ipc://RUN_DIR/NAME.ctl */
    const char     *model_path; /* the model served: LOAD_MODEL of another one is refused */
    uint64_t        instance;   /* 0 = a random one */
    uint32_t        n_workers;  /* messages served at once; 0 = the server's default */
    bool            no_pidfile; /* tests running several daemons in one process */
};

/* A running control service. Opaque. */
struct proto_service;

/* Why proto_service_run() returned. */
enum proto_service_stop {
    PROTO_SERVICE_STOP_SIGNAL = 0, /* SIGTERM or SIGINT */
    PROTO_SERVICE_STOP_MESSAGE,    /* a SHUTDOWN message */
};

/* Checks the run directory, starts serving `ops` (with `arg`, borrowed: must outlive the
 * service) on the control socket and writes the pid file. Call it once the daemon is ready to
 * answer. Returns 0, COMMON_EINVAL (bad options, run dir unusable: named in e), COMMON_EBUSY
 * (another live daemon listens there), COMMON_EIO, COMMON_ENOMEM. */
int proto_service_start(const struct proto_service_opts *o, const struct proto_service_ops *ops,
                        void *arg, struct proto_service **out, struct common_errmsg *e);
/* Stops listening (waiting for handlers in flight), removes the socket file and the pid file
 * (when it still holds this pid), frees. Accepts NULL. */
void proto_service_stop(struct proto_service *s);

/* Blocks until SHUTDOWN arrives or the process gets SIGTERM/SIGINT (proto_daemon_signals()),
 * then drains (ops->drain) and returns why. */
int proto_service_run(struct proto_service *s);
/* True once DRAIN or SHUTDOWN came (or proto_service_run() returned). Thread-safe. */
bool proto_service_is_draining(struct proto_service *s);
/* True once SHUTDOWN came. Thread-safe. */
bool proto_service_shutdown_requested(struct proto_service *s);
/* As if SHUTDOWN had come (drain, and proto_service_run() returns). Thread-safe. */
void        proto_service_request_shutdown(struct proto_service *s);
uint64_t    proto_service_instance(const struct proto_service *s);
const char *proto_service_url(const struct proto_service *s);
/* The server behind the service (owned by it), for its counters. */
struct proto_server *proto_service_server(struct proto_service *s);

/* Takes SIGTERM and SIGINT for the process: blocks them in the calling thread (threads started
 * later inherit that, so no system call of theirs is interrupted) and starts a thread that
 * waits for them and raises the stop flag; ignores SIGPIPE. Call once at the start of main,
 * before any other thread starts. */
void proto_daemon_signals(void);
/* True once SIGTERM or SIGINT arrived (the process's stop flag). Startup waits (the executor
 * waiting for its fetchers) give up when it is set. Thread-safe. */
bool proto_daemon_stopping(void);

/* The options every daemon takes, besides its own: -m/--model, --run-dir (both required),
 * --log-level and --config. */
struct proto_daemon_args {
    const char           *model;     /* borrowed from argv or the config file's words */
    const char           *run_dir;   /* borrowed likewise */
    enum common_log_level log_level; /* applied by proto_daemon_parse() */
};

/* The command line of a daemon: reads --config FILE (its global keys and `section`: "fetcher",
 * "executor" or "router") before argv, then parses both with the daemon's own rows in `spec`
 * (spec->opts; spec->groups must be NULL: this adds the common options as a group) and the
 * common ones into *a, and sets the log level. *owned receives the config file's words (free()
 * it after the daemon stops; the strings in *a and the daemon's options point into it). Returns
 * 0 (run), COMMON_OPTS_HELP, or a negative common_err already printed; exit with
 * common_opts_exit_status() unless 0. */
int proto_daemon_parse(const struct common_opts_spec *spec, const char *section, int argc,
                       char **argv, struct proto_daemon_args *a, char ***owned);

/* The HELLO of this process: version, role, name, pid and instance, no shards. Both sides of a
 * handshake build theirs with it. */
void proto_hello_init(struct proto_hello *h, enum proto_role role, const char *name,
                      uint64_t instance);
/* Checks a peer's HELLO: a compatible version, the role `want_role` (an enum proto_role, or -1
 * for any) and a sane shard count. Returns 0 or COMMON_EPROTO with a message. */
int proto_hello_check(const struct proto_hello *h, int want_role, struct common_errmsg *e);

/* Appends one counter to a STATS reply (dropped beyond PROTO_MAX_STATS); the name is cut at
 * PROTO_MAX_KEY - 1 bytes. proto_stats_addf() formats the name. */
void proto_stats_add(struct proto_stats_reply *st, const char *name, double value);
void proto_stats_addf(struct proto_stats_reply *st, double value, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* PROTO_PROTO_H */
