/* common/log.c - leveled one-line logging to stderr: "TIME LEVEL component message". */
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

/* Writes the UTC wall clock as "2026-11-24T01:28:34.123Z " into `buf`; returns its length. */
static size_t log_format_time(char *buf, size_t len)
{
    struct timespec ts = {0, 0};
    struct tm       tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (!gmtime_r(&ts.tv_sec, &tm))
        memset(&tm, 0, sizeof(tm));
    int n =
        snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    return n > 0 && (size_t)n < len ? (size_t)n : 0;
}

void common_log_write(enum common_log_level level, const char *component, const char *fmt, ...)
{
    char   line[1024];
    size_t used = log_format_time(line, sizeof(line));
    int n = snprintf(line + used, sizeof(line) - used, "%s %s ", log_level_tag(level), component);
    used += n > 0 ? (size_t)n : 0;
    if (used < sizeof(line)) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + used, sizeof(line) - used, fmt, ap);
        va_end(ap);
        used += m > 0 ? (size_t)m : 0;
    }
    if (used >= sizeof(line) - 1)
        used = sizeof(line) - 2;
    /* One line per call whatever the message holds, so readers can split on newlines. */
    for (size_t i = 0; i < used; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[used++] = '\n';
    /* One write() per line so lines of concurrent threads and processes do not interleave. */
    ssize_t w = write(STDERR_FILENO, line, used);
    (void)w;
}

int common_log_level_opt(void *arg, const char *value, struct common_errmsg *e)
{
    if (common_log_parse_level(value, arg) != COMMON_OK)
        return common_errmsg_set(e, COMMON_EINVAL, "expects err, warn, info or debug, got '%s'",
                                 value);
    return COMMON_OK;
}
