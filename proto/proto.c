/* proto/proto.c - wire protocol version checks, kind names, and the lifetime of decoded messages.
 */
#include "proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool proto_version_is_compatible(uint32_t major, uint32_t minor)
{
    (void)minor; /* minor versions only add optional fields */
    return major == PROTO_VERSION_MAJOR;
}

const char *proto_kind_name(enum proto_kind k)
{
    switch (k) {
    case PROTO_KIND_HELLO:
        return "hello";
    case PROTO_KIND_ERROR:
        return "error";
    case PROTO_KIND_OK:
        return "ok";
    case PROTO_KIND_CONFIGURE:
        return "configure";
    case PROTO_KIND_LOAD_MODEL:
        return "load_model";
    case PROTO_KIND_STATS:
        return "stats";
    case PROTO_KIND_STATS_REPLY:
        return "stats_reply";
    case PROTO_KIND_HEALTH:
        return "health";
    case PROTO_KIND_HEALTH_REPLY:
        return "health_reply";
    case PROTO_KIND_DRAIN:
        return "drain";
    case PROTO_KIND_SHUTDOWN:
        return "shutdown";
    case PROTO_KIND_ATTACH:
        return "attach";
    case PROTO_KIND_GENERATE:
        return "generate";
    case PROTO_KIND_POLL:
        return "poll";
    case PROTO_KIND_EVENTS:
        return "events";
    case PROTO_KIND_CANCEL:
        return "cancel";
    case PROTO_KIND_EXPERT_ERROR:
        return "expert_error";
    }
    return "?";
}

void proto_msg_clear(struct proto_msg *m)
{
    if (!m)
        return;
    switch (m->kind) {
    case PROTO_KIND_GENERATE: {
        struct proto_generate *g = &m->u.generate;
        free(g->prompt);
        g->prompt = NULL;
        uint32_t n = g->n_messages < PROTO_MAX_MESSAGES ? g->n_messages : PROTO_MAX_MESSAGES;
        for (uint32_t i = 0; i < n; i++) {
            free(g->messages[i].content);
            g->messages[i].content = NULL;
        }
        free(g->resume);
        g->resume = NULL;
        g->n_resume = 0;
        break;
    }
    case PROTO_KIND_EVENTS:
        free(m->u.events.text);
        m->u.events.text = NULL;
        break;
    default:
        break; /* no heap-owned fields */
    }
}

void proto_msg_error(struct proto_msg *m, uint64_t request_id, int code, const char *fmt, ...)
{
    memset(m, 0, sizeof(*m));
    m->kind = PROTO_KIND_ERROR;
    m->request_id = request_id;
    m->u.error.code = code;
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(m->u.error.message, sizeof(m->u.error.message), fmt, ap);
    va_end(ap);
}

int proto_reply_error(struct proto_msg *rep, int code, const char *fmt, ...)
{
    rep->kind = PROTO_KIND_ERROR;
    rep->u.error.code = code;
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(rep->u.error.message, sizeof(rep->u.error.message), fmt, ap);
    va_end(ap);
    return code;
}

int proto_devpool_path(char *buf, size_t len, const char *run_dir, uint32_t fetcher, uint32_t k)
{
    const int n = k ? snprintf(buf, len, "%s/fetcher-%u.dev%u", run_dir, fetcher, k)
                    : snprintf(buf, len, "%s/fetcher-%u.dev", run_dir, fetcher);
    return n > 0 && (size_t)n < len ? COMMON_OK : COMMON_EINVAL;
}
