/* router/client/sluice_client.h - C client of the sluice router: generate text over router.sock. */
#ifndef SLUICE_CLIENT_H
#define SLUICE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes: 0 on success, one of these (negative) on failure. */
enum sluice_status {
    SLUICE_OK = 0,
    SLUICE_EINVAL = -1,    /* bad option, or the router refused the request as invalid */
    SLUICE_ENOMEM = -2,    /* out of memory */
    SLUICE_EIO = -3,       /* transport failure */
    SLUICE_ETIMEDOUT = -5, /* the router did not answer in time */
    SLUICE_ECLOSED = -6,   /* the router is not running (or went away) */
    SLUICE_EPROTO = -7,    /* the router answered something unexpected */
    SLUICE_EBUSY = -9,     /* queue full or draining: try later */
    SLUICE_ERANGE = -11,   /* the prompt does not fit the context */
    SLUICE_ENOENT = -12,   /* no such request (finished, dropped, or unknown id) */
};

/* Static name of a status ("closed", ...). */
const char *sluice_strerror(int status);

/* The message of the last failure of a sluice_* call on this thread ("" when none). */
const char *sluice_last_error(void);

struct sluice_client;

/* Connects to the router at `path_or_url`: a plain path means "ipc://PATH" (the router.sock of
 * a run directory); "ipc://" and "tcp://" urls are used as they are. Fails fast with
 * SLUICE_ECLOSED when the ipc socket file does not exist, or when nobody answers a HELLO within
 * 2 s. Returns 0 (*out set) or a status. */
int  sluice_client_connect(const char *path_or_url, struct sluice_client **out);
void sluice_client_close(struct sluice_client *c);

struct sluice_chat_message {
    const char *role;    /* "system", "user", "assistant" */
    const char *content; /* UTF-8 */
};

/* A generation request. sluice_generate_opts_init() fills the defaults of `sluice run`. */
struct sluice_generate_opts {
    const char                       *prompt;         /* raw prompt (BOS added) */
    const struct sluice_chat_message *messages;       /* or: a conversation, rendered with the */
    size_t                            n_messages;     /*     model's chat template */
    uint32_t                          max_tokens;     /* 0 = until EOS or a full context  [128] */
    float                             temp;           /* 0 = greedy                       [0.8] */
    int32_t                           top_k;          /* 0 = off                          [40] */
    float                             top_p;          /* 1 = off                          [0.95] */
    float                             min_p;          /* 0 = off                          [0.05] */
    float                             repeat_penalty; /* 1 = off                      [1] */
    uint32_t                          repeat_last_n;  /* 0 = 64                        [0] */
    uint64_t                          seed;           /* 0 = from the router's clock   [0] */
    const char *const                *stops;          /* stop strings (at most 8, < 64 bytes) */
    size_t                            n_stops;
    bool                              no_stream; /* one callback with everything at the end */
    bool                              special;   /* parse special-token text in the prompt */
    uint64_t                          id;        /* request id; 0 = random */
    uint32_t resume_wait_s; /* a router that died mid-request: how long to wait for a
                               restarted one before failing; 0 = 60 s   [0] */
};

void sluice_generate_opts_init(struct sluice_generate_opts *o);

/* Why a generation ended. */
enum sluice_stop {
    SLUICE_STOP_NONE = 0,
    SLUICE_STOP_EOS,     /* end-of-generation token */
    SLUICE_STOP_LENGTH,  /* max_tokens reached */
    SLUICE_STOP_STRING,  /* a stop string (not included in the text) */
    SLUICE_STOP_CONTEXT, /* the context is full */
    SLUICE_STOP_CANCEL,  /* cancelled */
    SLUICE_STOP_ERROR,   /* failed in the router: error / error_code */
};

struct sluice_generate_result {
    uint64_t         id; /* the request id used */
    enum sluice_stop reason;
    uint32_t         n_prompt;    /* prompt tokens */
    uint32_t         n_generated; /* tokens generated */
    double           queue_ms, prompt_ms, decode_ms;
    int              error_code; /* with SLUICE_STOP_ERROR: a sluice_status */
    char             error[256]; /* with SLUICE_STOP_ERROR: the router's message */
};

/* Called with each piece of text as it comes (valid UTF-8, possibly empty; `len` bytes, which may
 * include NUL when the model generates the byte token <0x00>) and the token ids it came with.
 * Return 0 to go on, anything else to cancel the request. Once this call has sent the cancel (a
 * non-zero return, or sluice_client_request_cancel()), no more pieces are passed on, so the
 * result's n_generated may exceed the tokens the callback saw. */
typedef int (*sluice_piece_fn)(void *arg, const char *text, size_t len, const int32_t *tokens,
                               size_t n_tokens);

/* Sends the request, then polls until it ends, calling `cb` (may be NULL) in order. Returns 0
 * when the request ran to an end (out->reason says which, including CANCEL and ERROR), or a
 * status when it could not be submitted or the router went away (message in
 * sluice_last_error()). One generation at a time per client. A connection that closes or a reply
 * that does not come is retried (each token still arrives once: polls acknowledge what came);
 * 30 s without an answer, or the socket file gone for 2 s, ends it with SLUICE_ECLOSED. */
int sluice_client_generate(struct sluice_client *c, const struct sluice_generate_opts *o,
                           sluice_piece_fn cb, void *arg, struct sluice_generate_result *out);

/* Cancels request `id` (0 = the generation running in sluice_client_generate on this client).
 * Thread-safe: call it from another thread; it sends CANCEL at once. NOT async-signal-safe:
 * from a signal handler use sluice_client_request_cancel(). Returns 0, SLUICE_ENOENT (nothing to
 * cancel) or a transport status. */
int sluice_client_cancel(struct sluice_client *c, uint64_t id);

/* Async-signal-safe: flags the running generation for cancelling; sluice_client_generate sends
 * the CANCEL within one poll interval (250 ms) and ends with SLUICE_STOP_CANCEL. */
void sluice_client_request_cancel(struct sluice_client *c);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_CLIENT_H */
