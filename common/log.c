/* common/log.c - leveled one-line logging to stderr: "LEVEL component message". */
#include "common.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Process singleton: the log level; atomic so any thread may read it while main() sets it. */
static _Atomic int g_log_level = COMMON_LOG_LEVEL_INFO;

void common_log_set_level(enum common_log_level level)
{
    atomic_store_explicit(&g_log_level, (int)level, memory_order_relaxed);
}

enum common_log_level common_log_get_level(void)
{
    return (enum common_log_level)atomic_load_explicit(&g_log_level, memory_order_relaxed);
}

int common_log_parse_level(const char *s, enum common_log_level *out)
{
    static const struct {
        const char           *name;
        enum common_log_level level;
    } names[] = {
        {"err", COMMON_LOG_LEVEL_ERR},   {"error", COMMON_LOG_LEVEL_ERR},
        {"warn", COMMON_LOG_LEVEL_WARN}, {"warning", COMMON_LOG_LEVEL_WARN},
        {"info", COMMON_LOG_LEVEL_INFO}, {"debug", COMMON_LOG_LEVEL_DEBUG},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].level;
            return COMMON_OK;
        }
    }
    return COMMON_EINVAL;
}

static const char *log_level_tag(enum common_log_level level)
{
    switch (level) {
    case COMMON_LOG_LEVEL_ERR:
        return "ERR";
    case COMMON_LOG_LEVEL_WARN:
        return "WARN";
    case COMMON_LOG_LEVEL_INFO:
        return "INFO";
    default:
        return "DEBUG";
    }
}

void common_log_write(enum common_log_level level, const char *component, const char *fmt, ...)
{
    char   line[1024];
    int    n = snprintf(line, sizeof(line), "%s %s ", log_level_tag(level), component);
    size_t used = n > 0 ? (size_t)n : 0;
    if (used < sizeof(line)) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + used, sizeof(line) - used, fmt, ap);
        va_end(ap);
        used += m > 0 ? (size_t)m : 0;
    }
    if (used >= sizeof(line) - 1)
        used = sizeof(line) - 2;
    line[used++] = '\n';
    /* One write() per line so lines of concurrent threads and processes do not interleave. */
    ssize_t w = write(STDERR_FILENO, line, used);
    (void)w;
}
