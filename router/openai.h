/* router/openai.h - private to router/: the OpenAI API's JSON, requests in and responses out. */
#ifndef ROUTER_OPENAI_H
#define ROUTER_OPENAI_H

/* Not for use outside router/. Every JSON text goes through jansson; this module knows the
 * shapes of OpenAI's /v1/completions and /v1/chat/completions (and the llama.cpp extensions
 * top_k, min_p, repeat_penalty), nothing of HTTP or of the scheduler. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve_impl.h"

enum openai_kind {
    OPENAI_COMPLETION, /* /v1/completions: a prompt, "text_completion" objects */
    OPENAI_CHAT,       /* /v1/chat/completions: messages, "chat.completion[.chunk]" objects */
};

/* An error to answer with: the HTTP status and the fields of OpenAI's error object. */
struct openai_err {
    uint16_t    status;    /* 400, 401, 404, 405, 413, 500, 503 */
    const char *type;      /* static: "invalid_request_error", "server_error" */
    const char *code;      /* static, or NULL (null in the object): "model_not_found", ... */
    char        param[64]; /* the offending field; "" = null */
    char        message[PROTO_MAX_ERROR_TEXT + 64];
};

/* Fills *err (`param` and `code` may be NULL) and returns COMMON_EINVAL, so a parser can
 * `return openai_err_set(...);`. */
int openai_err_set(struct openai_err *err, uint16_t status, const char *type, const char *code,
                   const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* A parsed completion request. Zeroed before openai_parse(); released by openai_req_fini(). */
struct openai_req {
    enum openai_kind       kind;
    struct proto_generate  gen;    /* prompt and message contents owned (malloc'd) */
    struct serve_gen_extra extra;  /* presence and frequency penalties */
    bool                   stream; /* answer with server-sent events */
};

/* Parses and checks the body of a completion request of `kind`: types and ranges of every
 * known field (unknown fields are ignored, as OpenAI's clients send many), the model name
 * against `models` (NULL-terminated; absent = any), and fills *out with the sampling the
 * router's scheduler takes (defaults those of `sluice run`: temperature 0.8, top_k 40, top_p
 * 0.95, min_p 0.05; max_tokens 16 for completions as OpenAI's, none for chat). Returns 0, or
 * COMMON_EINVAL with *err filled (400, or 404 model_not_found); out holds nothing then. */
int openai_parse(enum openai_kind kind, const char *body, size_t len, const char *const *models,
                 struct openai_req *out, struct openai_err *err);
/* Frees what openai_parse() allocated; accepts a zeroed struct; idempotent. */
void openai_req_fini(struct openai_req *r);

/* What one response or stream chunk says. */
struct openai_out {
    enum openai_kind kind;
    const char      *id;      /* "cmpl-..." or "chatcmpl-..." */
    int64_t          created; /* unix seconds */
    const char      *model;
    const char      *text; /* text_len bytes of valid UTF-8 (may hold NUL) */
    size_t           text_len;
    const char      *finish;      /* "stop", "length", or NULL (a chunk before the end) */
    bool             role;        /* chat chunk: the delta names the assistant role */
    bool             usage;       /* add the usage object */
    uint32_t         n_prompt;    /* usage: prompt tokens */
    uint32_t         n_generated; /* usage: completion tokens */
};

/* The serialisers return a malloc'd compact JSON text (one line, no newline; free() it), or
 * NULL when memory ran out or the text is not valid UTF-8. */
char *openai_error_json(const struct openai_err *err);
/* GET /v1/models: a list object with the one model. */
char *openai_models_json(const char *id, int64_t created);
/* GET /health: {"status":"ok"}, or {"status":"unavailable","message":why}. */
char *openai_health_json(const char *why);
/* The whole answer of a non-streamed request. */
char *openai_result_json(const struct openai_out *o);
/* One server-sent event's data of a streamed request. */
char *openai_chunk_json(const struct openai_out *o);

#endif /* ROUTER_OPENAI_H */
