/* router/openai.c - the OpenAI API's JSON: completion requests parsed and checked, responses,
 * stream chunks and error objects written, all with jansson. */
#include "openai.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

int openai_err_set(struct openai_err *err, uint16_t status, const char *type, const char *code,
                   const char *param, const char *fmt, ...)
{
    err->status = status;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return COMMON_EINVAL;
}

void openai_req_fini(struct openai_req *r)
{
    free(r->gen.prompt);
    r->gen.prompt = NULL;
    for (uint32_t i = 0; i < r->gen.n_messages && i < PROTO_MAX_MESSAGES; i++) {
        free(r->gen.messages[i].content);
        r->gen.messages[i].content = NULL;
    }
    r->gen.n_messages = 0;
}

/* ---- request fields ----------------------------------------------------------------------- */

/* The member `key` of `root`, NULL when absent or null (OpenAI's clients send null for "not
 * given"). */
static json_t *field(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* A number field in [lo, hi] into *out (left as is when absent). */
static int get_real(json_t *root, const char *key, double lo, double hi, float *out,
                    struct openai_err *err)
{
    json_t *v = field(root, key);
    if (!v)
        return 0;
    double d = json_number_value(v);
    if (!json_is_number(v) || !isfinite(d) || d < lo || d > hi)
        return openai_err_set(err, 400, INVALID, NULL, key, "'%s' must be a number in [%g, %g]",
                              key, lo, hi);
    *out = (float)d;
    return 0;
}

/* An integer field in [lo, hi] into *out (left as is when absent). */
static int get_int(json_t *root, const char *key, json_int_t lo, json_int_t hi, json_int_t *out,
                   struct openai_err *err)
{
    json_t *v = field(root, key);
    if (!v)
        return 0;
    json_int_t i = json_integer_value(v);
    if (!json_is_integer(v) || i < lo || i > hi)
        return openai_err_set(err, 400, INVALID, NULL, key,
                              "'%s' must be an integer in [%lld, %lld]", key, (long long)lo,
                              (long long)hi);
    *out = i;
    return 0;
}

/* One stop string into slot i. */
static int put_stop(struct proto_generate *g, json_t *v, struct openai_err *err)
{
    const char *s = json_string_value(v);
    size_t      n = json_string_length(v);
    if (!json_is_string(v) || n == 0 || n >= PROTO_MAX_STOP_LEN || memchr(s, 0, n))
        return openai_err_set(err, 400, INVALID, NULL, "stop",
                              "'stop' strings must be non-empty and shorter than %u bytes",
                              PROTO_MAX_STOP_LEN);
    if (g->n_stops >= PROTO_MAX_STOPS)
        return openai_err_set(err, 400, INVALID, NULL, "stop", "at most %u stop strings",
                              PROTO_MAX_STOPS);
    memcpy(g->stops[g->n_stops], s, n + 1);
    g->n_stops++;
    return 0;
}

static int get_stops(json_t *root, struct proto_generate *g, struct openai_err *err)
{
    json_t *v = field(root, "stop");
    if (!v)
        return 0;
    if (json_is_string(v))
        return put_stop(g, v, err);
    if (!json_is_array(v))
        return openai_err_set(err, 400, INVALID, NULL, "stop",
                              "'stop' must be a string or an array of strings");
    size_t  i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        int rc = put_stop(g, e, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* A string without NUL bytes, copied. */
static char *dup_text(json_t *v)
{
    size_t      n = json_string_length(v);
    const char *s = json_string_value(v);
    if (memchr(s, 0, n))
        return NULL;
    char *p = malloc(n + 1);
    if (p)
        memcpy(p, s, n + 1);
    return p;
}

static int get_prompt(json_t *root, struct proto_generate *g, struct openai_err *err)
{
    json_t *v = field(root, "prompt");
    if (v && json_is_array(v) && json_array_size(v) == 1)
        v = json_array_get(v, 0); /* ["text"]: one prompt */
    if (!v)
        return openai_err_set(err, 400, INVALID, NULL, "prompt", "'prompt' is required");
    if (!json_is_string(v))
        return openai_err_set(err, 400, INVALID, NULL, "prompt",
                              "'prompt' must be a string (token arrays and batches of prompts "
                              "are not supported)");
    if (json_string_length(v) == 0)
        return openai_err_set(err, 400, INVALID, NULL, "prompt", "'prompt' is empty");
    if (!(g->prompt = dup_text(v)))
        return openai_err_set(err, 400, INVALID, NULL, "prompt",
                              "'prompt' holds a NUL character or memory ran out");
    return 0;
}

/* A message's content: a string, null, or an array of {"type":"text","text":...} parts. */
static char *message_content(json_t *c)
{
    if (!c || json_is_null(c))
        return strdup("");
    if (json_is_string(c))
        return dup_text(c);
    if (!json_is_array(c))
        return NULL;
    size_t  n = 0, i;
    json_t *part;
    json_array_foreach(c, i, part)
    {
        json_t *t = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(json_object_get(part, "type")) ||
            strcmp(json_string_value(json_object_get(part, "type")), "text") != 0 ||
            !json_is_string(t))
            return NULL;
        n += json_string_length(t);
    }
    char *p = malloc(n + 1), *w = p;
    if (!p)
        return NULL;
    json_array_foreach(c, i, part)
    {
        json_t *t = json_object_get(part, "text");
        memcpy(w, json_string_value(t), json_string_length(t));
        w += json_string_length(t);
    }
    *w = '\0';
    if (strlen(p) != n) {
        free(p);
        return NULL;
    }
    return p;
}

static int get_messages(json_t *root, struct proto_generate *g, struct openai_err *err)
{
    json_t *v = field(root, "messages");
    if (!v)
        return openai_err_set(err, 400, INVALID, NULL, "messages", "'messages' is required");
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > PROTO_MAX_MESSAGES)
        return openai_err_set(err, 400, INVALID, NULL, "messages",
                              "'messages' must be an array of 1 to %u messages",
                              PROTO_MAX_MESSAGES);
    size_t  i;
    json_t *m;
    json_array_foreach(v, i, m)
    {
        char    param[32];
        json_t *role = json_object_get(m, "role");
        snprintf(param, sizeof(param), "messages[%zu]", i);
        if (!json_is_object(m) || !json_is_string(role) || json_string_length(role) == 0 ||
            json_string_length(role) >= PROTO_MAX_ROLE ||
            strlen(json_string_value(role)) != json_string_length(role))
            return openai_err_set(err, 400, INVALID, NULL, param,
                                  "%s must be an object with a 'role' string of 1 to %u bytes",
                                  param, PROTO_MAX_ROLE - 1);
        char *content = message_content(json_object_get(m, "content"));
        if (!content)
            return openai_err_set(err, 400, INVALID, NULL, param,
                                  "%s 'content' must be a string or an array of text parts "
                                  "(without NUL characters)",
                                  param);
        struct proto_chat_msg *cm = &g->messages[g->n_messages++];
        snprintf(cm->role, sizeof(cm->role), "%s", json_string_value(role));
        cm->content = content;
    }
    return 0;
}

/* The fields of a completion request, on a parsed object. */
static int parse_fields(json_t *root, const char *const *models, struct openai_req *r,
                        struct openai_err *err)
{
    struct proto_generate *g = &r->gen;
    json_t                *v;
    int                    rc;
    if ((v = field(root, "model"))) {
        if (!json_is_string(v))
            return openai_err_set(err, 400, INVALID, NULL, "model", "'model' must be a string");
        bool known = !models || !models[0];
        for (size_t i = 0; models && models[i] && !known; i++)
            known = strcmp(models[i], json_string_value(v)) == 0;
        if (!known)
            return openai_err_set(err, 404, INVALID, "model_not_found", "model",
                                  "The model '%s' does not exist: this server has '%s'",
                                  json_string_value(v), models[0]);
    }
    g->sampling = (struct proto_sampling){.temp = 0.8f,
                                          .top_k = 40,
                                          .top_p = 0.95f,
                                          .min_p = 0.05f,
                                          .repeat_penalty = 1.0f,
                                          .repeat_last_n = 64};
    json_int_t max_tokens = r->kind == OPENAI_COMPLETION ? 16 : 0, top_k = 40, seed = 0, n = 1;
    if ((rc = get_int(root, "max_tokens", 0, 1 << 20, &max_tokens, err)) < 0 ||
        (r->kind == OPENAI_CHAT &&
         (rc = get_int(root, "max_completion_tokens", 0, 1 << 20, &max_tokens, err)) < 0) ||
        (rc = get_int(root, "top_k", 0, INT32_MAX, &top_k, err)) < 0 ||
        (rc = get_int(root, "seed", INT64_MIN, INT64_MAX, &seed, err)) < 0 ||
        (rc = get_int(root, "n", 1, 1, &n, err)) < 0 ||
        (rc = get_real(root, "temperature", 0, 100, &g->sampling.temp, err)) < 0 ||
        (rc = get_real(root, "top_p", 0, 1, &g->sampling.top_p, err)) < 0 ||
        (rc = get_real(root, "min_p", 0, 1, &g->sampling.min_p, err)) < 0 ||
        (rc = get_real(root, "repeat_penalty", 0, 100, &g->sampling.repeat_penalty, err)) < 0 ||
        (rc = get_real(root, "presence_penalty", -2, 2, &r->extra.presence_penalty, err)) < 0 ||
        (rc = get_real(root, "frequency_penalty", -2, 2, &r->extra.frequency_penalty, err)) < 0 ||
        (rc = get_stops(root, g, err)) < 0)
        return rc;
    g->max_tokens = (uint32_t)max_tokens;
    g->sampling.top_k = (int32_t)top_k;
    g->sampling.seed = (uint64_t)seed;
    if ((v = field(root, "stream"))) {
        if (!json_is_boolean(v))
            return openai_err_set(err, 400, INVALID, NULL, "stream", "'stream' must be a boolean");
        r->stream = json_is_true(v);
    }
    g->stream = r->stream;
    return r->kind == OPENAI_COMPLETION ? get_prompt(root, g, err) : get_messages(root, g, err);
}

int openai_parse(enum openai_kind kind, const char *body, size_t len, const char *const *models,
                 struct openai_req *out, struct openai_err *err)
{
    json_error_t jerr;
    json_t      *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return openai_err_set(err, 400, INVALID, NULL, NULL,
                              "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                              jerr.line, jerr.column);
    int rc = 0;
    out->kind = kind;
    if (!json_is_object(root))
        rc = openai_err_set(err, 400, INVALID, NULL, NULL, "the body must be a JSON object");
    else
        rc = parse_fields(root, models, out, err);
    json_decref(root);
    if (rc < 0)
        openai_req_fini(out);
    return rc;
}

/* ---- responses ---------------------------------------------------------------------------- */

/* Dumps and drops `v` (NULL stays NULL). */
static char *dump(json_t *v)
{
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    return s;
}

char *openai_error_json(const struct openai_err *err)
{
    return dump(json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", err->message, "type",
                          err->type, "param", err->param[0] ? json_string(err->param) : json_null(),
                          "code", err->code ? json_string(err->code) : json_null()));
}

char *openai_models_json(const char *id, int64_t created)
{
    return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", id,
                          "object", "model", "created", (json_int_t)created, "owned_by", "sluice"));
}

char *openai_health_json(const char *why)
{
    if (!why)
        return dump(json_pack("{s:s}", "status", "ok"));
    return dump(json_pack("{s:s, s:s}", "status", "unavailable", "message", why));
}

/* The usage object of `o`. */
static json_t *usage(const struct openai_out *o)
{
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)o->n_prompt,
                     "completion_tokens", (json_int_t)o->n_generated, "total_tokens",
                     (json_int_t)o->n_prompt + (json_int_t)o->n_generated);
}

/* A response object around one choice; takes `choice`. */
static char *envelope(const struct openai_out *o, const char *object, json_t *choice)
{
    json_t *root =
        json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", o->id, "object", object, "created",
                  (json_int_t)o->created, "model", o->model, "choices", choice);
    if (root && o->usage && json_object_set_new(root, "usage", usage(o)) < 0) {
        json_decref(root);
        root = NULL;
    }
    return dump(root);
}

static json_t *finish_value(const struct openai_out *o)
{
    return o->finish ? json_string(o->finish) : json_null();
}

char *openai_result_json(const struct openai_out *o)
{
    json_t *text = json_stringn(o->text ? o->text : "", o->text_len);
    if (!text)
        return NULL;
    json_t *choice;
    if (o->kind == OPENAI_CHAT)
        choice =
            json_pack("{s:i, s:{s:s, s:o}, s:n, s:o}", "index", 0, "message", "role", "assistant",
                      "content", text, "logprobs", "finish_reason", finish_value(o));
    else
        choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "text", text, "logprobs",
                           "finish_reason", finish_value(o));
    return choice
               ? envelope(o, o->kind == OPENAI_CHAT ? "chat.completion" : "text_completion", choice)
               : NULL;
}

char *openai_chunk_json(const struct openai_out *o)
{
    json_t *text = json_stringn(o->text ? o->text : "", o->text_len);
    if (!text)
        return NULL;
    json_t *choice;
    if (o->kind == OPENAI_CHAT) {
        /* The delta: the role on the first chunk, the text, nothing on the final one. */
        json_t *delta = json_object();
        int     rc = delta ? 0 : -1;
        if (rc == 0 && o->role)
            rc = json_object_set_new(delta, "role", json_string("assistant"));
        if (rc == 0 && (o->text_len || !o->finish))
            rc = json_object_set_new(delta, "content", json_incref(text));
        json_decref(text);
        if (rc < 0) {
            json_decref(delta);
            delta = NULL;
        }
        choice = delta ? json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "delta", delta, "logprobs",
                                   "finish_reason", finish_value(o))
                       : NULL;
    } else {
        choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "text", text, "logprobs",
                           "finish_reason", finish_value(o));
    }
    return choice
               ? envelope(o, o->kind == OPENAI_CHAT ? "chat.completion.chunk" : "text_completion",
                          choice)
               : NULL;
}
