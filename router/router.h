/* router/router.h - public front door of router/: tokenizers, detokenizer, sampling, chat
 * templates. */
#ifndef ROUTER_ROUTER_H
#define ROUTER_ROUTER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* ------------------------------------------------------------------------------------------ */
/* Growable buffers (router/text.c, router/tokens.c)                                           */
/* ------------------------------------------------------------------------------------------ */

/* A growable byte string. A zeroed struct is an empty string. Not thread-safe. */
struct router_text {
    char  *ptr; /* owned: NUL-terminated once anything was appended; NULL while empty */
    size_t len; /* bytes, without the NUL */
    size_t cap; /* bytes allocated */
};

/* Frees the bytes and zeroes the struct; accepts a zeroed struct. */
void router_text_fini(struct router_text *t);
/* Appends n bytes. Returns 0 or COMMON_ENOMEM (t unchanged). */
int router_text_append(struct router_text *t, const char *s, size_t n);
/* Empties the string, keeping the allocation. */
void router_text_clear(struct router_text *t);

/* A growable list of token ids. A zeroed struct is an empty list. Not thread-safe. */
struct router_tokens {
    int32_t *ids; /* owned: n valid ids */
    size_t   n;   /* ids held */
    size_t   cap; /* ids allocated */
};

void router_tokens_fini(struct router_tokens *t);
/* Appends one id. Returns 0 or COMMON_ENOMEM (t unchanged). */
int  router_tokens_push(struct router_tokens *t, int32_t id);
void router_tokens_clear(struct router_tokens *t);

/* ------------------------------------------------------------------------------------------ */
/* Vocabulary (router/vocab.c)                                                                 */
/* ------------------------------------------------------------------------------------------ */

#define ROUTER_TOKEN_NULL (-1) /* "no such token" */

enum router_vocab_type {
    ROUTER_VOCAB_SPM = 1, /* tokenizer.ggml.model = "llama": SentencePiece, scores-driven */
    ROUTER_VOCAB_BPE = 2, /* tokenizer.ggml.model = "gpt2": byte-level BPE, merges by rank */
};

/* Token attributes (a bit set, like llama.cpp's llama_token_attr), from tokenizer.ggml.token_type:
 * 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte, 0 or other undefined. */
enum router_token_attr {
    ROUTER_ATTR_UNDEFINED = 0,
    ROUTER_ATTR_UNKNOWN = 1 << 0,
    ROUTER_ATTR_UNUSED = 1 << 1,
    ROUTER_ATTR_NORMAL = 1 << 2,
    ROUTER_ATTR_CONTROL = 1 << 3,
    ROUTER_ATTR_USER_DEFINED = 1 << 4,
    ROUTER_ATTR_BYTE = 1 << 5,
    ROUTER_ATTR_LSTRIP = 1 << 7, /* eat white space left of this token when matched in text */
    ROUTER_ATTR_RSTRIP = 1 << 8, /* eat white space right of it */
};

/* A tokenizer built from a GGUF file's tokenizer.ggml.* metadata alone. Opaque; immutable after
 * load, so one vocabulary may be used by any number of threads at once. */
struct router_vocab;

/* Special token ids (ROUTER_TOKEN_NULL when the model has none) and the flags that drive them. */
struct router_vocab_special {
    int32_t bos, eos, eot, pad, unk;
    bool    add_bos;          /* tokenizer.ggml.add_bos_token (SPM default true) */
    bool    add_eos;          /* tokenizer.ggml.add_eos_token (default false) */
    bool    add_space_prefix; /* tokenizer.ggml.add_space_prefix (SPM default true) */
};

/* Builds the tokenizer of the model in `g` (which may be closed afterwards: everything needed is
 * copied). Reads tokenizer.ggml.model ("llama" or "gpt2"), .tokens, .scores, .token_type,
 * .merges, .pre, the special ids and flags. Returns 0, or with a message in `e`:
 * COMMON_ENOENT (no tokenizer.ggml.model / .tokens / .merges for gpt2), COMMON_ENOTSUP (unknown
 * model or pre-tokenizer, named), COMMON_ECORRUPT (wrong key types, scores / token_type counts
 * that differ from the token count, special ids out of range, duplicate tokens, add_bos without
 * a BOS id), COMMON_ENOMEM. Free with router_vocab_destroy(). */
int router_vocab_load(const struct common_gguf *g, struct router_vocab **out,
                      struct common_errmsg *e);

/* Frees everything; accepts NULL. */
void router_vocab_destroy(struct router_vocab *v);

enum router_vocab_type router_vocab_type(const struct router_vocab *v);
/* The pre-tokenizer name in use ("default", "llama-bpe", ...); "spm" for SentencePiece. Static. */
const char *router_vocab_pre_name(const struct router_vocab *v);
uint32_t    router_vocab_n_tokens(const struct router_vocab *v);
void        router_vocab_special(const struct router_vocab *v, struct router_vocab_special *out);
/* Attribute bits of `id` (0 when out of range). */
uint32_t router_vocab_attr(const struct router_vocab *v, int32_t id);
/* True when `id` ends generation: EOS, EOT and the end-of-turn tokens llama.cpp recognises by
 * text (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, ...). */
bool router_vocab_is_eog(const struct router_vocab *v, int32_t id);
/* The raw vocabulary string of `id` (as stored, e.g. "▁the" or "Ġthe"), not NUL-terminated.
 * Returns 0 or COMMON_EINVAL for an id out of range. Borrowed: valid while v lives. */
int router_vocab_text(const struct router_vocab *v, int32_t id, const char **s, size_t *len);
/* The id whose vocabulary string is exactly s[0..len), or ROUTER_TOKEN_NULL. */
int32_t router_vocab_find(const struct router_vocab *v, const char *s, size_t len);

/* ------------------------------------------------------------------------------------------ */
/* Tokenizing (router/tokenize.c)                                                              */
/* ------------------------------------------------------------------------------------------ */

struct router_tokenize_opts {
    bool add_special;   /* add BOS / EOS as the model asks (add_bos_token, add_eos_token) */
    bool parse_special; /* recognise control-token text such as "<|im_start|>" in the input;
                           user-defined tokens are always recognised, as in llama.cpp */
};

/* Appends the tokens of text[0..len) to `out`, exactly as llama.cpp's llama_tokenize() would.
 * Any bytes are accepted: invalid UTF-8 never reads out of bounds (SPM falls back to byte
 * tokens, BPE encodes each invalid byte as U+FFFD, like llama.cpp). `o` may be NULL (all false).
 * Returns 0 or COMMON_ENOMEM (out then holds a prefix). Thread-safe for a shared vocabulary. */
int router_tokenize(const struct router_vocab *v, const char *text, size_t len,
                    const struct router_tokenize_opts *o, struct router_tokens *out);

/* ------------------------------------------------------------------------------------------ */
/* Detokenizing (router/detok.c)                                                               */
/* ------------------------------------------------------------------------------------------ */

struct router_detok_opts {
    bool render_special;     /* write control / unknown tokens as their text (else nothing) */
    bool remove_special;     /* drop a leading BOS / trailing EOS the model adds itself */
    bool keep_leading_space; /* keep the space SentencePiece puts before the first word */
    bool no_clean_spaces;    /* skip llama.cpp's clean-up of " ," " 's" etc. for BPE families
                                that ask for it (gpt-2, mpt, starcoder, ...) */
};

/* The text of one token: `*p` points at `*len` bytes owned by v (no NUL). Unknown and control
 * tokens give "" unless o->render_special. Returns 0 or COMMON_EINVAL (id out of range).
 * `o` may be NULL. */
int router_token_piece(const struct router_vocab *v, int32_t id, const struct router_detok_opts *o,
                       const char **p, size_t *len);

/* Appends the text of ids[0..n) to `out` as llama.cpp's llama_detokenize() does: pieces
 * concatenated, the SentencePiece leading space of the first piece removed (unless
 * keep_leading_space), then space clean-up where the model family wants it. Returns 0,
 * COMMON_EINVAL (an id out of range; out unchanged) or COMMON_ENOMEM. */
int router_detokenize(const struct router_vocab *v, const int32_t *ids, size_t n,
                      const struct router_detok_opts *o, struct router_text *out);

/* Streaming detokenizer: turns tokens into text as they are generated and never emits part of
 * a multi-byte UTF-8 character: bytes of an incomplete character are held until it completes.
 * Bytes that cannot start or continue a character are emitted as U+FFFD, so the output is
 * always valid UTF-8. Caller-owned storage; init/push/flush, no fini needed. */
struct router_detok_stream {
    const struct router_vocab *vocab;   /* borrowed: must outlive the stream */
    struct router_detok_opts   opts;    /* copied at init */
    bool                       started; /* a piece was seen (leading-space rule applies once) */
    uint8_t                    held[4]; /* bytes of an incomplete UTF-8 character */
    uint8_t                    n_held;  /* 0..3 */
};

/* `o` may be NULL. */
void router_detok_stream_init(struct router_detok_stream *s, const struct router_vocab *v,
                              const struct router_detok_opts *o);
/* Appends the complete characters that token `id` finishes to `out`. Returns the bytes appended
 * (>= 0), COMMON_EINVAL (id out of range; stream unchanged) or COMMON_ENOMEM. */
int router_detok_stream_push(struct router_detok_stream *s, int32_t id, struct router_text *out);
/* Ends the stream: held bytes of an unfinished character are written as U+FFFD. Returns bytes
 * appended or COMMON_ENOMEM. */
int router_detok_stream_flush(struct router_detok_stream *s, struct router_text *out);

/* ------------------------------------------------------------------------------------------ */
/* Sampling (router/sampler.c)                                                                 */
/* ------------------------------------------------------------------------------------------ */

struct router_logit_bias {
    int32_t id;   /* token */
    float   bias; /* added to its logit; -INFINITY bans it */
};

/* Sampling options; zero means default / off for every field. The chain runs in this fixed
 * order: logit bias, repetition / frequency / presence penalties over the last penalty_last_n
 * accepted tokens, top-k, top-p, min-p, temperature, then a draw with the seeded PRNG.
 * temperature <= 0 picks the argmax after bias and penalties (ties -> lowest id). */
struct router_sampler_opts {
    float    temperature;       /* 0 = greedy */
    int32_t  top_k;             /* <= 0 = off */
    float    top_p;             /* 0 or >= 1 = off */
    float    min_p;             /* 0 = off */
    float    repeat_penalty;    /* 0 or 1 = off; > 1 discourages repeats (llama.cpp rule) */
    float    frequency_penalty; /* 0 = off; subtracted once per occurrence */
    float    presence_penalty;  /* 0 = off; subtracted once if present */
    int32_t  penalty_last_n;    /* window of accepted tokens; 0 = 64, -1 = all kept (<= 4096) */
    uint64_t seed;              /* 0 = derive from the clock */
    const struct router_logit_bias *bias; /* borrowed during init only (copied) */
    size_t                          n_bias;
};

/* One candidate of the chain (private to router/sampler.c). */
struct router_sampler_cand;

/* Caller-owned sampler; fields are private to router/sampler.c. */
struct router_sampler {
    struct router_sampler_opts  opts;      /* copied; opts.bias points at `bias` below */
    uint32_t                    n_vocab;   /* logits per call */
    struct router_logit_bias   *bias;      /* owned: opts.n_bias entries */
    struct router_sampler_cand *cand;      /* owned: n_vocab candidates (scratch) */
    int32_t                    *hist;      /* owned: ring of the last hist_cap accepted tokens */
    uint32_t                    hist_cap;  /* ring size */
    uint32_t                    hist_n;    /* tokens in the ring */
    uint32_t                    hist_head; /* next write index */
    uint32_t                   *counts;    /* owned: n_vocab occurrence counts (scratch) */
    uint64_t                    rng[4];    /* xoshiro256** state, seeded via splitmix64 */
};

/* Sets up a sampler for `n_vocab` logits. Returns 0, COMMON_EINVAL (n_vocab 0, a bias id out
 * of range, negative top_k / min_p outside [0,1] / NaN options) or COMMON_ENOMEM. */
int router_sampler_init(struct router_sampler *s, const struct router_sampler_opts *o,
                        uint32_t n_vocab);
/* Frees the arrays; accepts a zeroed or failed-init struct; idempotent. */
void router_sampler_fini(struct router_sampler *s);
/* Picks the next token from logits[0..n_vocab) (not modified). Same seed, same history and same
 * logits give the same token on every machine (own PRNG and exp). Returns 0 and *id, or
 * COMMON_EINVAL when every logit is -inf/NaN after biasing. Does not record the token. */
int router_sampler_pick(struct router_sampler *s, const float *logits, int32_t *id);
/* Records a token of the sequence (prompt or generated) for the penalties. */
void router_sampler_accept(struct router_sampler *s, int32_t id);
/* Records `id` as if this sampler had picked it: the PRNG advances as a pick does (one draw
 * above temperature 0, none at 0), then the token is accepted. A request resumed from the
 * tokens a client already has (a restarted router) goes on as the uninterrupted one would. */
void router_sampler_replay(struct router_sampler *s, int32_t id);
/* Forgets the history (a new sequence); the PRNG keeps going. */
void router_sampler_reset(struct router_sampler *s);

/* ------------------------------------------------------------------------------------------ */
/* End of a sequence: EOS, stop strings, token cap (router/stop.c)                             */
/* ------------------------------------------------------------------------------------------ */

enum router_stop_reason {
    ROUTER_STOP_NONE = 0,   /* keep generating */
    ROUTER_STOP_EOS,        /* an end-of-generation token (router_vocab_is_eog) */
    ROUTER_STOP_STRING,     /* a stop string appeared in the text */
    ROUTER_STOP_MAX_TOKENS, /* max_tokens tokens were generated */
};

struct router_stop_opts {
    const char *const *stop; /* borrowed during init only (copied): NUL-terminated strings */
    size_t             n_stop;
    uint32_t           max_tokens; /* 0 = no cap */
    bool               ignore_eos; /* keep going through EOS / EOT */
};

/* Tracks the generated text of one sequence, holds back text that might be the start of a stop
 * string, and says when to stop. Caller-owned; fields private to router/stop.c. */
struct router_stop {
    struct router_detok_stream detok; /* text of the generated tokens */
    char                     **stop;  /* owned: n_stop copies */
    size_t                     n_stop;
    size_t                     max_stop_len; /* longest stop string, bytes */
    uint32_t                   max_tokens;
    bool                       ignore_eos;
    uint32_t                   n_tokens; /* tokens pushed */
    struct router_text         pending;  /* owned: text not yet released to the caller */
    enum router_stop_reason    reason;   /* sticky once set */
};

/* Returns 0, COMMON_EINVAL (an empty stop string) or COMMON_ENOMEM. */
int  router_stop_init(struct router_stop *st, const struct router_vocab *v,
                      const struct router_stop_opts *o);
void router_stop_fini(struct router_stop *st);
/* Feeds one generated token. Appends to `out` the text that can no longer be part of a stop
 * string (never the stop string itself, never half a UTF-8 character; EOS adds no text).
 * Returns the enum router_stop_reason (>= 0) or COMMON_EINVAL / COMMON_ENOMEM. */
int router_stop_push(struct router_stop *st, int32_t id, struct router_text *out);
/* At the end of a sequence that did not stop on a string: appends the held-back text. Returns
 * 0 or COMMON_ENOMEM. */
int router_stop_finish(struct router_stop *st, struct router_text *out);

/* ------------------------------------------------------------------------------------------ */
/* Chat templates (router/chat.c)                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Built-in templates, rendered as llama.cpp's llama_chat_apply_template() renders them. */
enum router_chat_tmpl {
    ROUTER_CHAT_CHATML = 0,       /* <|im_start|>role\n...<|im_end|> (Qwen, many others) */
    ROUTER_CHAT_LLAMA2,           /* [INST] ... [/INST] */
    ROUTER_CHAT_LLAMA2_SYS,       /* with <<SYS>> */
    ROUTER_CHAT_LLAMA2_SYS_BOS,   /* with <<SYS>>, <s> inside the history */
    ROUTER_CHAT_LLAMA2_SYS_STRIP, /* with <<SYS>>, contents stripped */
    ROUTER_CHAT_LLAMA3,           /* <|start_header_id|>role<|end_header_id|> */
    ROUTER_CHAT_MISTRAL_V1,
    ROUTER_CHAT_MISTRAL_V3,
    ROUTER_CHAT_MISTRAL_V3_TEKKEN,
    ROUTER_CHAT_MISTRAL_V7,
    ROUTER_CHAT_MISTRAL_V7_TEKKEN,
    ROUTER_CHAT_GEMMA,     /* <start_of_turn>user / model */
    ROUTER_CHAT_PHI3,      /* <|user|>\n...<|end|> */
    ROUTER_CHAT_PHI4,      /* <|im_start|>role<|im_sep|> */
    ROUTER_CHAT_DEEPSEEK,  /* deepseek-coder: ### Instruction: / ### Response: */
    ROUTER_CHAT_DEEPSEEK2, /* User: / Assistant: */
    ROUTER_CHAT_DEEPSEEK3, /* <｜User｜> / <｜Assistant｜> */
    ROUTER_CHAT_CHATGLM4,  /* [gMASK]<sop><|role|>\n... (GLM-4, GLM-4.5) */
    ROUTER_CHAT_GPT_OSS,   /* <|start|>role<|message|>...<|end|> (gpt-oss, Harmony) */
    ROUTER_CHAT_KIMI_K2,   /* <|im_user|>user<|im_middle|>...<|im_end|> (Kimi K2) */
    ROUTER_CHAT_COUNT,
};

struct router_chat_msg {
    const char *role;    /* borrowed: "system", "user", "assistant" */
    const char *content; /* borrowed: UTF-8 text */
};

struct router_chat_opts {
    bool add_generation_prompt; /* end with the opening of an assistant turn */
};

/* Recognises a template from a tokenizer.chat_template text (Jinja source, not run) or from a
 * template name ("chatml", "llama3", "mistral-v7", ...) by the distinctive substrings llama.cpp
 * uses. Returns 0 and *out, or COMMON_ENOENT when nothing matches. */
int router_chat_detect(const char *tmpl, size_t len, enum router_chat_tmpl *out);
/* Picks the template of a model: tokenizer.chat_template when present and recognised; ChatML
 * (with a warning log) when absent or unrecognised. Always succeeds; returns 0. */
int router_chat_for_model(const struct common_gguf *g, enum router_chat_tmpl *out);
/* Static name of a template ("chatml", "llama3", ...). */
const char *router_chat_name(enum router_chat_tmpl t);
/* Appends the rendered conversation to `out`. Returns 0, COMMON_EINVAL (unknown template, NULL
 * role or content) or COMMON_ENOMEM. `o` may be NULL. */
int router_chat_render(enum router_chat_tmpl t, const struct router_chat_msg *msgs, size_t n,
                       const struct router_chat_opts *o, struct router_text *out);

/* ------------------------------------------------------------------------------------------ */
/* The router service: client API on router.sock and HTTP, step scheduler (router/serve.c)     */
/* ------------------------------------------------------------------------------------------ */

struct router_serve_opts {
    const char *model_path;        /* -m: GGUF holding the tokenizer and chat template */
    const char *run_dir;           /* --run-dir: executor.ctl, router.sock, segments */
    uint32_t    n_ctx;             /* -c: positions per sequence; 0 = min(4096, model's) */
    uint32_t    n_seq;             /* --parallel: sequences at once; 0 = 4 */
    uint32_t    queue_max;         /* --queue: requests waiting for a sequence; 0 = 64 */
    uint32_t    client_timeout_s;  /* --client-timeout: drop a request nobody polls; 0 = 60 */
    uint32_t    connect_timeout_s; /* --connect-timeout: wait for the executor; 0 = 30 */
    uint32_t    poll_default_ms;   /* long poll when the client says 0; 0 = 2000 */
    uint32_t    stream_ms;         /* --stream-interval: a streaming poll answered less than this
                                      long ago waits out the rest of the interval to gather tokens
                                      (one round trip per interval, not per token); 0 = none */
    uint32_t watchdog_s;           /* --watchdog: a wait for the executor without progress this
                                      long ends the process (serve.c); 0 = SERVE_WEDGE_S (20) */
    uint32_t exec_wait_ms;         /* ring wait before checking the executor; 0 = 200 */
    uint32_t prefill_chunk;        /* --prefill-chunk: prompt tokens of a sequence per round, so
                                      that a long prompt shares rounds with the others' decoding
                                      (continuous batching); 0 = 512 */
    const char *listen_url;        /* NULL = "ipc://RUN_DIR/router.sock" */
    const char *executor_url;      /* NULL = "ipc://RUN_DIR/executor.ctl" */
    bool        no_pidfile;        /* do not write RUN_DIR/router.pid (tests) */
    const char *http_addr;         /* --http HOST:PORT: also serve OpenAI-compatible HTTP; NULL or
                                      "" = off; ":PORT" = 127.0.0.1:PORT; port 0 = a free one */
    const char *api_key;           /* --api-key: HTTP requests (but /health) must carry
                                      "Authorization: Bearer KEY"; NULL or "" = none */
    uint64_t http_max_body;        /* --http-max-body: request body bytes at most; 0 = 1 MiB */
};

struct router_serve;

/* Loads the tokenizer, waits for the executor (HELLO) up to connect_timeout_s, creates and
 * ATTACHes the four router-exec segments, starts the scheduler and listens. Returns 0, or a
 * negative common_err with a message in e (bad model, executor missing, socket busy). */
int router_serve_create(const struct router_serve_opts *o, struct router_serve **out,
                        struct common_errmsg *e);

/* Stops taking new requests (GENERATE -> COMMON_EBUSY); queued and active ones finish. */
void router_serve_drain(struct router_serve *s);

/* The service behind router.sock (owned by s): proto_service_run() waits for SHUTDOWN or a
 * signal. */
struct proto_service *router_serve_service(struct router_serve *s);

/* Waits up to timeout_ms (< 0 = forever) until no request is queued or active, or a SHUTDOWN
 * was asked for and the work drained. Returns true when idle. */
bool router_serve_wait_idle(struct router_serve *s, int timeout_ms);

/* The url it listens on (static while s lives). */
const char *router_serve_url(const struct router_serve *s);
/* The url of its HTTP server ("http://127.0.0.1:8080", the bound port when 0 was asked for;
 * also written to RUN_DIR/router.http), or NULL without --http. Static while s lives. */
const char *router_serve_http_url(const struct router_serve *s);

/* Stops listening and the scheduler, removes router.sock's file and the segments, frees;
 * accepts NULL. Call router_serve_drain() + router_serve_wait_idle() first for a clean exit. */
void router_serve_destroy(struct router_serve *s);

#endif /* ROUTER_ROUTER_H */
