/* proto/codec.cc - the C API over the flatc-generated C++ code: encode, verify, decode. */
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "sluice_generated.h"

extern "C" {
#include "common.h"
#include "proto.h"
}

namespace fb = flatbuffers;
namespace sp = sluice::proto;

/* The Body union lists its tables in proto_kind order, so a kind is its union type. */
static_assert(static_cast<int>(sp::Body_Hello) == PROTO_KIND_HELLO, "Body order");
static_assert(static_cast<int>(sp::Body_Ok) == PROTO_KIND_OK, "Body order");
static_assert(static_cast<int>(sp::Body_Attach) == PROTO_KIND_ATTACH, "Body order");
static_assert(static_cast<int>(sp::Body_Cancel) == PROTO_KIND_CANCEL, "Body order");
static_assert(static_cast<int>(sp::Body_ExpertError) == PROTO_KIND_EXPERT_ERROR, "Body order");

/* Largest heap-owned text of an EVENTS reply (its detokenized tokens). */
#define CODEC_MAX_EVENT_TEXT PROTO_MAX_PROMPT

/* ---- encode --------------------------------------------------------------------------------- */

/* Reads a C enum field as an int: C callers may store any value in it, and loading an
 * out-of-range value through the C++ enum type is undefined behaviour. */
template <typename E> static int codec_enum(const E *field)
{
    static_assert(sizeof(E) == sizeof(int), "C enums are int-sized here");
    int v;
    std::memcpy(&v, field, sizeof(v));
    return v;
}

/* True when the fixed buffer `s` of `cap` bytes holds a NUL (a string that fits). */
static bool codec_str_fits(const char *s, size_t cap)
{
    return std::memchr(s, '\0', cap) != nullptr;
}

/* The byte length of an EVENTS text (NULL counts as empty; it may hold NUL); false when longer
 * than `max`. */
static bool codec_text_len(const char *s, uint32_t len, size_t max, size_t *n)
{
    *n = s ? len : 0;
    return *n <= max;
}

/* Length of a borrowed heap string (NULL counts as empty); false when longer than `max`. */
static bool codec_heap_len(const char *s, size_t max, size_t *n)
{
    *n = s ? strnlen(s, max + 1) : 0;
    return *n <= max;
}

static bool codec_role_ok(int r)
{
    return r >= PROTO_ROLE_FETCHER && r <= PROTO_ROLE_CLIENT;
}

/* Encodes the body of `m` into `b`; returns 0 or COMMON_EINVAL. */
/* The HELLO body of `m` into `b` (fixed fields checked against their limits). */
static int codec_encode_hello(fb::FlatBufferBuilder &b, const struct proto_msg *m,
                              fb::Offset<void> *body)
{
    const struct proto_hello *h = &m->u.hello;
    int                       role = codec_enum(&h->role);
    if (h->n_shards > PROTO_MAX_SHARDS || !codec_str_fits(h->name, sizeof(h->name)) ||
        !codec_role_ok(role))
        return COMMON_EINVAL;
    std::vector<fb::Offset<sp::Shard>> shards;
    for (uint32_t i = 0; i < h->n_shards; i++)
        shards.push_back(sp::CreateShard(b, h->shards[i].fetcher, h->shards[i].first_expert,
                                         h->shards[i].n_experts, h->shards[i].first_layer,
                                         h->shards[i].n_layers));
    auto name = b.CreateString(h->name);
    auto vec = b.CreateVector(shards);
    *body = sp::CreateHello(b, h->major, h->minor, static_cast<sp::Role>(role), name, vec, h->pid,
                            h->instance)
                .Union();
    return COMMON_OK;
}

/* The STATS_REPLY body of `m` into `b` (fixed fields checked against their limits). */
static int codec_encode_stats_reply(fb::FlatBufferBuilder &b, const struct proto_msg *m,
                                    fb::Offset<void> *body)
{
    const struct proto_stats_reply *s = &m->u.stats;
    if (s->n_stats > PROTO_MAX_STATS)
        return COMMON_EINVAL;
    std::vector<fb::Offset<sp::Stat>> stats;
    for (uint32_t i = 0; i < s->n_stats; i++) {
        if (!codec_str_fits(s->stats[i].name, sizeof(s->stats[i].name)))
            return COMMON_EINVAL;
        auto name = b.CreateString(s->stats[i].name);
        stats.push_back(sp::CreateStat(b, name, s->stats[i].value));
    }
    auto vec = b.CreateVector(stats);
    *body = sp::CreateStatsReply(b, vec).Union();
    return COMMON_OK;
}

/* The HEALTH_REPLY body of `m` into `b` (fixed fields checked against their limits). */
static int codec_encode_health_reply(fb::FlatBufferBuilder &b, const struct proto_msg *m,
                                     fb::Offset<void> *body)
{
    const struct proto_health_reply *h = &m->u.health;
    int                              state = codec_enum(&h->state);
    int                              role = codec_enum(&h->role);
    if (state < PROTO_HEALTH_STARTING || state > PROTO_HEALTH_DEGRADED || !codec_role_ok(role) ||
        !codec_str_fits(h->message, sizeof(h->message)))
        return COMMON_EINVAL;
    auto msg = b.CreateString(h->message);
    *body =
        sp::CreateHealthReply(b, static_cast<sp::HealthState>(state), static_cast<sp::Role>(role),
                              h->pid, h->instance, h->uptime_s, msg)
            .Union();
    return COMMON_OK;
}

/* The ATTACH body of `m` into `b` (fixed fields checked against their limits). */
static int codec_encode_attach(fb::FlatBufferBuilder &b, const struct proto_msg *m,
                               fb::Offset<void> *body)
{
    const struct proto_attach *a = &m->u.attach;
    int                        role = codec_enum(&a->role);
    if (!codec_role_ok(role) || a->n_segments > PROTO_MAX_SEGMENTS)
        return COMMON_EINVAL;
    std::vector<fb::Offset<fb::String>> segs;
    for (uint32_t i = 0; i < a->n_segments; i++) {
        if (!codec_str_fits(a->segments[i], sizeof(a->segments[i])))
            return COMMON_EINVAL;
        segs.push_back(b.CreateString(a->segments[i]));
    }
    auto vsegs = b.CreateVector(segs);
    auto vparams = b.CreateVector(a->params, sizeof(a->params) / sizeof(a->params[0]));
    *body = sp::CreateAttach(b, static_cast<sp::Role>(role), a->pid, a->instance, vsegs, vparams)
                .Union();
    return COMMON_OK;
}

/* The GENERATE body of `m` into `b` (fixed fields checked against their limits). */
static int codec_encode_generate(fb::FlatBufferBuilder &b, const struct proto_msg *m,
                                 fb::Offset<void> *body)
{
    const struct proto_generate *g = &m->u.generate;
    if (g->n_messages > PROTO_MAX_MESSAGES || g->n_stops > PROTO_MAX_STOPS ||
        (g->prompt && g->n_messages > 0))
        return COMMON_EINVAL;
    size_t total = 0, n;
    if (!codec_heap_len(g->prompt, PROTO_MAX_PROMPT, &total))
        return COMMON_EINVAL;
    fb::Offset<fb::String> prompt;
    if (g->prompt)
        prompt = b.CreateString(g->prompt, total);
    std::vector<fb::Offset<sp::ChatMessage>> msgs;
    for (uint32_t i = 0; i < g->n_messages; i++) {
        const struct proto_chat_msg *cm = &g->messages[i];
        if (!codec_str_fits(cm->role, sizeof(cm->role)) ||
            !codec_heap_len(cm->content, PROTO_MAX_PROMPT - total, &n))
            return COMMON_EINVAL;
        total += n;
        auto role = b.CreateString(cm->role);
        auto content = b.CreateString(cm->content ? cm->content : "", n);
        msgs.push_back(sp::CreateChatMessage(b, role, content));
    }
    std::vector<fb::Offset<fb::String>> stops;
    for (uint32_t i = 0; i < g->n_stops; i++) {
        if (!codec_str_fits(g->stops[i], sizeof(g->stops[i])))
            return COMMON_EINVAL;
        stops.push_back(b.CreateString(g->stops[i]));
    }
    fb::Offset<fb::Vector<fb::Offset<sp::ChatMessage>>> vmsgs;
    if (!g->prompt)
        vmsgs = b.CreateVector(msgs);
    auto                  vstops = b.CreateVector(stops);
    const proto_sampling *s = &g->sampling;
    auto samp = sp::CreateSampling(b, s->temp, s->top_k, s->top_p, s->min_p, s->repeat_penalty,
                                   s->repeat_last_n, s->seed);
    if (g->n_resume > PROTO_MAX_RESUME || (g->n_resume && !g->resume))
        return COMMON_EINVAL;
    fb::Offset<fb::Vector<int32_t>> vresume;
    if (g->n_resume)
        vresume = b.CreateVector(g->resume, g->n_resume);
    *body = sp::CreateGenerate(b, prompt, vmsgs, samp, g->max_tokens, vstops, g->stream, g->special,
                               vresume, g->resume_bytes)
                .Union();
    return COMMON_OK;
}

/* The EVENTS body of `m` into `b` (fixed fields checked against their limits). */
static int codec_encode_events(fb::FlatBufferBuilder &b, const struct proto_msg *m,
                               fb::Offset<void> *body)
{
    const struct proto_events *ev = &m->u.events;
    int                        reason = codec_enum(&ev->reason);
    size_t                     n = 0;
    if (ev->n_tokens > PROTO_MAX_EVENT_TOKENS || reason < PROTO_STOP_NONE ||
        reason > PROTO_STOP_ERROR ||
        !codec_text_len(ev->text, ev->text_len, CODEC_MAX_EVENT_TEXT, &n) ||
        !codec_str_fits(ev->error_text, sizeof(ev->error_text)))
        return COMMON_EINVAL;
    auto                   tokens = b.CreateVector(ev->tokens, ev->n_tokens);
    fb::Offset<fb::String> text;
    if (ev->text)
        text = b.CreateString(ev->text, n);
    auto stats = sp::CreateFinalStats(b, ev->stats.n_prompt, ev->stats.n_generated,
                                      ev->stats.queue_ms, ev->stats.prompt_ms, ev->stats.decode_ms);
    auto etext = b.CreateString(ev->error_text);
    *body = sp::CreateEvents(b, tokens, text, ev->done, static_cast<sp::StopReason>(reason), stats,
                             ev->error_code, etext)
                .Union();
    return COMMON_OK;
}

static int codec_encode_body(fb::FlatBufferBuilder &b, const struct proto_msg *m,
                             fb::Offset<void> *body)
{
    switch (codec_enum(&m->kind)) {
    case PROTO_KIND_HELLO:
        return codec_encode_hello(b, m, body);
    case PROTO_KIND_ERROR: {
        const struct proto_error *e = &m->u.error;
        if (!codec_str_fits(e->message, sizeof(e->message)))
            return COMMON_EINVAL;
        auto msg = b.CreateString(e->message);
        *body = sp::CreateError(b, e->code, msg).Union();
        return COMMON_OK;
    }
    case PROTO_KIND_OK:
        *body = sp::CreateOk(b).Union();
        return COMMON_OK;
    case PROTO_KIND_CONFIGURE: {
        const struct proto_configure *c = &m->u.configure;
        if (!codec_str_fits(c->key, sizeof(c->key)) || !codec_str_fits(c->value, sizeof(c->value)))
            return COMMON_EINVAL;
        auto key = b.CreateString(c->key);
        auto value = b.CreateString(c->value);
        *body = sp::CreateConfigure(b, key, value).Union();
        return COMMON_OK;
    }
    case PROTO_KIND_LOAD_MODEL: {
        const struct proto_load_model *l = &m->u.load_model;
        if (!codec_str_fits(l->path, sizeof(l->path)))
            return COMMON_EINVAL;
        auto path = b.CreateString(l->path);
        *body = sp::CreateLoadModel(b, path).Union();
        return COMMON_OK;
    }
    case PROTO_KIND_STATS:
        *body = sp::CreateStats(b).Union();
        return COMMON_OK;
    case PROTO_KIND_STATS_REPLY:
        return codec_encode_stats_reply(b, m, body);
    case PROTO_KIND_HEALTH:
        *body = sp::CreateHealth(b).Union();
        return COMMON_OK;
    case PROTO_KIND_HEALTH_REPLY:
        return codec_encode_health_reply(b, m, body);
    case PROTO_KIND_DRAIN:
        *body = sp::CreateDrain(b).Union();
        return COMMON_OK;
    case PROTO_KIND_SHUTDOWN:
        *body = sp::CreateShutdown(b).Union();
        return COMMON_OK;
    case PROTO_KIND_ATTACH:
        return codec_encode_attach(b, m, body);
    case PROTO_KIND_GENERATE:
        return codec_encode_generate(b, m, body);
    case PROTO_KIND_POLL:
        *body = sp::CreatePoll(b, m->u.poll.max_events, m->u.poll.timeout_ms, m->u.poll.ack,
                               m->u.poll.ack_tokens, m->u.poll.ack_bytes)
                    .Union();
        return COMMON_OK;
    case PROTO_KIND_EVENTS:
        return codec_encode_events(b, m, body);
    case PROTO_KIND_CANCEL:
        *body = sp::CreateCancel(b).Union();
        return COMMON_OK;
    case PROTO_KIND_EXPERT_ERROR:
        *body = sp::CreateExpertError(b, m->u.expert_error.layer, m->u.expert_error.expert).Union();
        return COMMON_OK;
    default:
        return COMMON_EINVAL;
    }
}

extern "C" int proto_encode(const struct proto_msg *m, uint8_t **buf, size_t *len)
{
    try {
        fb::FlatBufferBuilder b(256);
        b.ForceDefaults(true); /* every field on the wire: a decode/encode cycle is exact */
        fb::Offset<void> body;
        int              rc = codec_encode_body(b, m, &body);
        if (rc != COMMON_OK)
            return rc;
        auto type = static_cast<sp::Body>(codec_enum(&m->kind));
        b.Finish(sp::CreateEnvelope(b, m->request_id, type, body), sp::EnvelopeIdentifier());
        if (b.GetSize() > PROTO_MAX_MESSAGE_BYTES)
            return COMMON_EINVAL;
        uint8_t *out = static_cast<uint8_t *>(std::malloc(b.GetSize()));
        if (!out)
            return COMMON_ENOMEM;
        std::memcpy(out, b.GetBufferPointer(), b.GetSize());
        *buf = out;
        *len = b.GetSize();
        return COMMON_OK;
    } catch (const std::bad_alloc &) {
        return COMMON_ENOMEM;
    }
}

/* ---- decode --------------------------------------------------------------------------------- */

/* Copies a flatbuffers string into a fixed C buffer; false when it does not fit or holds NUL.
 * An absent string reads as empty. */
static bool codec_copy_str(const fb::String *s, char *dst, size_t cap)
{
    if (!s) {
        dst[0] = '\0';
        return true;
    }
    if (s->size() >= cap || std::memchr(s->data(), '\0', s->size()))
        return false;
    std::memcpy(dst, s->data(), s->size());
    dst[s->size()] = '\0';
    return true;
}

/* Copies a flatbuffers string of at most `max` bytes without NUL into a malloc'd C string.
 * Returns 0, COMMON_EPROTO or COMMON_ENOMEM. */
static int codec_dup_str(const fb::String *s, size_t max, char **out)
{
    size_t n = s ? s->size() : 0;
    if (n > max || (n && std::memchr(s->data(), '\0', n)))
        return COMMON_EPROTO;
    char *p = static_cast<char *>(std::malloc(n + 1));
    if (!p)
        return COMMON_ENOMEM;
    if (n)
        std::memcpy(p, s->data(), n);
    p[n] = '\0';
    *out = p;
    return COMMON_OK;
}

/* Decodes the body of a verified envelope into the zeroed *m (kind already set). On failure *m
 * may own heap strings: the caller clears it. Returns 0, COMMON_EPROTO or COMMON_ENOMEM. */
/* A verified HELLO body into *m; every count and string is checked against its limit. */
static int codec_decode_hello(const sp::Envelope *env, struct proto_msg *m)
{
    const sp::Hello *h = env->body_as_Hello();
    if (!h || static_cast<unsigned>(h->role()) > PROTO_ROLE_CLIENT)
        return COMMON_EPROTO;
    m->u.hello.major = h->major();
    m->u.hello.minor = h->minor();
    m->u.hello.role = static_cast<enum proto_role>(h->role());
    m->u.hello.pid = h->pid();
    m->u.hello.instance = h->instance();
    if (!codec_copy_str(h->name(), m->u.hello.name, sizeof(m->u.hello.name)))
        return COMMON_EPROTO;
    if (h->shards()) {
        if (h->shards()->size() > PROTO_MAX_SHARDS)
            return COMMON_EPROTO;
        for (const sp::Shard *s : *h->shards()) {
            if (!s)
                return COMMON_EPROTO;
            m->u.hello.shards[m->u.hello.n_shards++] = {
                s->fetcher(), s->first_expert(), s->n_experts(), s->first_layer(), s->n_layers()};
        }
    }
    return COMMON_OK;
}

/* A verified STATS_REPLY body into *m; every count and string is checked against its limit. */
static int codec_decode_stats_reply(const sp::Envelope *env, struct proto_msg *m)
{
    const sp::StatsReply *s = env->body_as_StatsReply();
    if (!s)
        return COMMON_EPROTO;
    if (s->stats()) {
        if (s->stats()->size() > PROTO_MAX_STATS)
            return COMMON_EPROTO;
        for (const sp::Stat *st : *s->stats()) {
            struct proto_stat *d = &m->u.stats.stats[m->u.stats.n_stats];
            if (!st || !codec_copy_str(st->name(), d->name, sizeof(d->name)))
                return COMMON_EPROTO;
            d->value = st->value();
            m->u.stats.n_stats++;
        }
    }
    return COMMON_OK;
}

/* A verified HEALTH_REPLY body into *m; every count and string is checked against its limit. */
static int codec_decode_health_reply(const sp::Envelope *env, struct proto_msg *m)
{
    const sp::HealthReply *h = env->body_as_HealthReply();
    if (!h || static_cast<unsigned>(h->state()) > PROTO_HEALTH_DEGRADED ||
        static_cast<unsigned>(h->role()) > PROTO_ROLE_CLIENT)
        return COMMON_EPROTO;
    m->u.health.state = static_cast<enum proto_health_state>(h->state());
    m->u.health.role = static_cast<enum proto_role>(h->role());
    m->u.health.pid = h->pid();
    m->u.health.instance = h->instance();
    m->u.health.uptime_s = h->uptime_s();
    if (!codec_copy_str(h->message(), m->u.health.message, sizeof(m->u.health.message)))
        return COMMON_EPROTO;
    return COMMON_OK;
}

/* A verified ATTACH body into *m; every count and string is checked against its limit. */
static int codec_decode_attach(const sp::Envelope *env, struct proto_msg *m)
{
    const sp::Attach *a = env->body_as_Attach();
    if (!a || static_cast<unsigned>(a->role()) > PROTO_ROLE_CLIENT)
        return COMMON_EPROTO;
    m->u.attach.role = static_cast<enum proto_role>(a->role());
    m->u.attach.pid = a->pid();
    m->u.attach.instance = a->instance();
    if (a->segments()) {
        if (a->segments()->size() > PROTO_MAX_SEGMENTS)
            return COMMON_EPROTO;
        for (const fb::String *s : *a->segments()) {
            char *d = m->u.attach.segments[m->u.attach.n_segments];
            if (!s || !codec_copy_str(s, d, PROTO_MAX_NAME))
                return COMMON_EPROTO;
            m->u.attach.n_segments++;
        }
    }
    if (a->params()) {
        const size_t cap = sizeof(m->u.attach.params) / sizeof(m->u.attach.params[0]);
        if (a->params()->size() > cap)
            return COMMON_EPROTO;
        for (fb::uoffset_t i = 0; i < a->params()->size(); i++)
            m->u.attach.params[i] = a->params()->Get(i);
    }
    return COMMON_OK;
}

/* A verified GENERATE body into *m; every count and string is checked against its limit. */
static int codec_decode_generate(const sp::Envelope *env, struct proto_msg *m)
{
    const sp::Generate *g = env->body_as_Generate();
    if (!g)
        return COMMON_EPROTO;
    struct proto_generate *d = &m->u.generate;
    if (g->prompt() && g->messages() && g->messages()->size() > 0)
        return COMMON_EPROTO; /* a prompt or messages, not both */
    size_t total = 0;
    int    rc;
    if (g->prompt()) {
        if ((rc = codec_dup_str(g->prompt(), PROTO_MAX_PROMPT, &d->prompt)) != COMMON_OK)
            return rc;
        total = g->prompt()->size();
    }
    if (g->messages()) {
        if (g->messages()->size() > PROTO_MAX_MESSAGES)
            return COMMON_EPROTO;
        for (const sp::ChatMessage *cm : *g->messages()) {
            struct proto_chat_msg *dm = &d->messages[d->n_messages];
            if (!cm || !codec_copy_str(cm->role(), dm->role, sizeof(dm->role)))
                return COMMON_EPROTO;
            if ((rc = codec_dup_str(cm->content(), PROTO_MAX_PROMPT - total, &dm->content)) !=
                COMMON_OK)
                return rc;
            d->n_messages++; /* owned from here: cleared on failure */
            total += std::strlen(dm->content);
        }
    }
    const sp::Sampling *s = g->sampling();
    if (s) {
        d->sampling = {s->temp(),           s->top_k(),         s->top_p(), s->min_p(),
                       s->repeat_penalty(), s->repeat_last_n(), s->seed()};
    } else {
        d->sampling = {0.0f, 0, 1.0f, 0.0f, 1.0f, 0, 0};
    }
    d->max_tokens = g->max_tokens();
    if (g->stops()) {
        if (g->stops()->size() > PROTO_MAX_STOPS)
            return COMMON_EPROTO;
        for (const fb::String *st : *g->stops()) {
            if (!st || !codec_copy_str(st, d->stops[d->n_stops], PROTO_MAX_STOP_LEN))
                return COMMON_EPROTO;
            d->n_stops++;
        }
    }
    d->stream = g->stream();
    d->special = g->special();
    if (g->resume() && g->resume()->size() > 0) {
        const fb::uoffset_t n = g->resume()->size();
        if (n > PROTO_MAX_RESUME)
            return COMMON_EPROTO;
        d->resume = static_cast<int32_t *>(std::malloc(n * sizeof(int32_t)));
        if (!d->resume)
            return COMMON_ENOMEM;
        for (fb::uoffset_t i = 0; i < n; i++)
            d->resume[i] = g->resume()->Get(i);
        d->n_resume = n;
    }
    d->resume_bytes = g->resume_bytes();
    return COMMON_OK;
}

/* A verified EVENTS body into *m; every count and string is checked against its limit. */
static int codec_decode_events(const sp::Envelope *env, struct proto_msg *m)
{
    const sp::Events *ev = env->body_as_Events();
    if (!ev || static_cast<unsigned>(ev->reason()) > PROTO_STOP_ERROR)
        return COMMON_EPROTO;
    struct proto_events *d = &m->u.events;
    if (ev->tokens()) {
        if (ev->tokens()->size() > PROTO_MAX_EVENT_TOKENS)
            return COMMON_EPROTO;
        for (fb::uoffset_t i = 0; i < ev->tokens()->size(); i++)
            d->tokens[i] = ev->tokens()->Get(i);
        d->n_tokens = ev->tokens()->size();
    }
    d->done = ev->done();
    d->reason = static_cast<enum proto_stop_reason>(ev->reason());
    if (const sp::FinalStats *fs = ev->stats())
        d->stats = {fs->n_prompt(), fs->n_generated(), fs->queue_ms(), fs->prompt_ms(),
                    fs->decode_ms()};
    d->error_code = ev->error_code();
    if (!codec_copy_str(ev->error_text(), d->error_text, sizeof(d->error_text)))
        return COMMON_EPROTO;
    if (const fb::String *t = ev->text()) {
        /* Generated text is bytes: a byte token may be NUL, so it travels with its length. */
        size_t n = t->size();
        if (n > CODEC_MAX_EVENT_TEXT)
            return COMMON_EPROTO;
        if (!(d->text = static_cast<char *>(std::malloc(n + 1))))
            return COMMON_ENOMEM;
        if (n)
            std::memcpy(d->text, t->data(), n);
        d->text[n] = '\0';
        d->text_len = static_cast<uint32_t>(n);
    }
    return COMMON_OK;
}

static int codec_decode_body(const sp::Envelope *env, struct proto_msg *m)
{
    switch (env->body_type()) {
    case sp::Body_Hello:
        return codec_decode_hello(env, m);
    case sp::Body_Error: {
        const sp::Error *e = env->body_as_Error();
        if (!e)
            return COMMON_EPROTO;
        m->u.error.code = e->code();
        if (!codec_copy_str(e->message(), m->u.error.message, sizeof(m->u.error.message)))
            return COMMON_EPROTO;
        return COMMON_OK;
    }
    case sp::Body_Ok:
    case sp::Body_Stats:
    case sp::Body_Health:
    case sp::Body_Drain:
    case sp::Body_Shutdown:
    case sp::Body_Cancel:
        return env->body() ? COMMON_OK : COMMON_EPROTO;
    case sp::Body_ExpertError: {
        const sp::ExpertError *x = env->body_as_ExpertError();
        if (!x)
            return COMMON_EPROTO;
        m->u.expert_error.layer = x->layer();
        m->u.expert_error.expert = x->expert();
        return COMMON_OK;
    }
    case sp::Body_Configure: {
        const sp::Configure *c = env->body_as_Configure();
        if (!c || !codec_copy_str(c->key(), m->u.configure.key, sizeof(m->u.configure.key)) ||
            !codec_copy_str(c->value(), m->u.configure.value, sizeof(m->u.configure.value)))
            return COMMON_EPROTO;
        return COMMON_OK;
    }
    case sp::Body_LoadModel: {
        const sp::LoadModel *l = env->body_as_LoadModel();
        if (!l || !codec_copy_str(l->path(), m->u.load_model.path, sizeof(m->u.load_model.path)))
            return COMMON_EPROTO;
        return COMMON_OK;
    }
    case sp::Body_StatsReply:
        return codec_decode_stats_reply(env, m);
    case sp::Body_HealthReply:
        return codec_decode_health_reply(env, m);
    case sp::Body_Attach:
        return codec_decode_attach(env, m);
    case sp::Body_Generate:
        return codec_decode_generate(env, m);
    case sp::Body_Poll: {
        const sp::Poll *p = env->body_as_Poll();
        if (!p)
            return COMMON_EPROTO;
        m->u.poll.max_events = p->max_events();
        m->u.poll.timeout_ms = p->timeout_ms();
        m->u.poll.ack = p->ack();
        m->u.poll.ack_tokens = p->ack_tokens();
        m->u.poll.ack_bytes = p->ack_bytes();
        return COMMON_OK;
    }
    case sp::Body_Events:
        return codec_decode_events(env, m);
    default:
        return COMMON_EPROTO;
    }
}

extern "C" int proto_decode(const void *buf, size_t len, struct proto_msg *out)
{
    if (!buf || len < 8 || len > PROTO_MAX_MESSAGE_BYTES)
        return COMMON_EPROTO;
    const uint8_t *p = static_cast<const uint8_t *>(buf);
    /* FlatBuffers reads scalars in place: a misaligned buffer is copied first. */
    void *aligned = nullptr;
    if (reinterpret_cast<uintptr_t>(p) % alignof(std::max_align_t) != 0) {
        aligned = std::malloc(len);
        if (!aligned)
            return COMMON_ENOMEM;
        std::memcpy(aligned, buf, len);
        p = static_cast<const uint8_t *>(aligned);
    }
    /* Depth and table limits keep a hostile message from costing much to verify. */
    fb::Verifier v(p, len, 16, 4096);
    int          rc = COMMON_EPROTO;
    if (sp::EnvelopeBufferHasIdentifier(p) && sp::VerifyEnvelopeBuffer(v)) {
        const sp::Envelope *env = sp::GetEnvelope(p);
        /* On the heap: struct proto_msg is about 10 KiB, and callers may run on small stacks. */
        struct proto_msg *m = static_cast<struct proto_msg *>(std::calloc(1, sizeof(*m)));
        if (!m) {
            rc = COMMON_ENOMEM;
        } else {
            m->request_id = env->request_id();
            m->kind = static_cast<enum proto_kind>(env->body_type());
            rc = codec_decode_body(env, m);
            if (rc == COMMON_OK)
                *out = *m;
            else
                proto_msg_clear(m);
            std::free(m);
        }
    }
    std::free(aligned);
    return rc;
}
