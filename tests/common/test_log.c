/* tests/common/test_log.c - log lines: UTC time, level, component, message; level filtering. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

/* Fixture state (Criterion fixtures take no arguments): stderr is pointed at a temporary file
 * while a test runs, so the lines the logger writes can be read back. */
static FILE *t_capture;
static int   t_saved_stderr = -1;
static char  t_text[1 << 17];

static void log_setup(void)
{
    t_capture = tmpfile();
    cr_assert_not_null(t_capture);
    fflush(stderr);
    t_saved_stderr = dup(STDERR_FILENO);
    cr_assert_geq(t_saved_stderr, 0);
    cr_assert_geq(dup2(fileno(t_capture), STDERR_FILENO), 0);
    common_log_set_level(COMMON_LOG_LEVEL_INFO);
}

static void log_teardown(void)
{
    dup2(t_saved_stderr, STDERR_FILENO);
    close(t_saved_stderr);
    fclose(t_capture);
}

TestSuite(common_log, .init = log_setup, .fini = log_teardown);

/* Returns everything logged so far. */
static const char *captured(void)
{
    ssize_t n = pread(fileno(t_capture), t_text, sizeof(t_text) - 1, 0);
    cr_assert_geq(n, 0);
    t_text[n] = '\0';
    return t_text;
}

static bool matches(const char *pattern, const char *text)
{
    regex_t re;
    cr_assert_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0, "bad pattern %s", pattern);
    bool ok = regexec(&re, text, 0, NULL, 0) == 0;
    regfree(&re);
    return ok;
}

#define TIME_RE "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"

Test(common_log, write_prefixes_iso_utc_time_and_level)
{
    COMMON_LOG_WARN("fetcher.uring", "short read expert=%u want=%zu got=%d", 3u, (size_t)4096, 100);
    const char *t = captured();
    cr_assert(
        matches("^" TIME_RE " WARN fetcher\\.uring short read expert=3 want=4096 got=100\n$", t),
        "%s", t);
}

/* The wall clock in seconds as the log reads it (time() may lag CLOCK_REALTIME by a tick). */
static time_t wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec;
}

Test(common_log, time_is_the_utc_wall_clock_now)
{
    time_t before = wall_seconds();
    COMMON_LOG_INFO("test", "now");
    time_t      after = wall_seconds();
    struct tm   tm = {0};
    const char *t = captured();
    cr_assert_not_null(strptime(t, "%Y-%m-%dT%H:%M:%S", &tm), "%s", t);
    time_t logged = timegm(&tm);
    cr_assert(logged >= before - 1 && logged <= after, "logged %lld, now %lld: %s",
              (long long)logged, (long long)before, t);
}

Test(common_log, levels_have_their_tags)
{
    common_log_set_level(COMMON_LOG_LEVEL_DEBUG);
    COMMON_LOG_ERR("c", "e");
    COMMON_LOG_WARN("c", "w");
    COMMON_LOG_INFO("c", "i");
    COMMON_LOG_DEBUG("c", "d");
    const char *t = captured();
    cr_assert(matches("^" TIME_RE " ERR c e\n" TIME_RE " WARN c w\n" TIME_RE " INFO c i\n" TIME_RE
                      " DEBUG c d\n$",
                      t),
              "%s", t);
}

static int t_evaluated;

static int count_evaluation(void)
{
    return ++t_evaluated;
}

Test(common_log, level_filters_lines_and_skips_their_arguments)
{
    common_log_set_level(COMMON_LOG_LEVEL_WARN);
    cr_assert_eq(common_log_get_level(), COMMON_LOG_LEVEL_WARN);
    COMMON_LOG_INFO("c", "hidden %d", count_evaluation());
    COMMON_LOG_DEBUG("c", "hidden %d", count_evaluation());
    cr_assert_eq(t_evaluated, 0, "arguments of a filtered line are not evaluated");
    cr_assert_str_empty(captured());
    COMMON_LOG_WARN("c", "shown %d", count_evaluation());
    cr_assert(matches("^" TIME_RE " WARN c shown 1\n$", captured()), "%s", captured());
}

Test(common_log, newlines_in_a_message_stay_on_one_line)
{
    COMMON_LOG_INFO("c", "a\nb\r\nc");
    cr_assert(matches("^" TIME_RE " INFO c a b  c\n$", captured()), "%s", captured());
}

Test(common_log, long_message_is_cut_to_one_line)
{
    char big[5000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    COMMON_LOG_INFO("c", "%s", big);
    COMMON_LOG_INFO("c", "next");
    const char *t = captured();
    const char *nl = strchr(t, '\n');
    cr_assert_not_null(nl);
    cr_assert_eq(nl - t, 1022, "the line is cut at 1023 bytes with its newline");
    cr_assert(matches("^" TIME_RE " INFO c next\n$", nl + 1), "%s", nl + 1);
}

Test(common_log, parse_level_reads_names)
{
    enum common_log_level l = COMMON_LOG_LEVEL_INFO;
    cr_assert_eq(common_log_parse_level("debug", &l), COMMON_OK);
    cr_assert_eq(l, COMMON_LOG_LEVEL_DEBUG);
    cr_assert_eq(common_log_parse_level("error", &l), COMMON_OK);
    cr_assert_eq(l, COMMON_LOG_LEVEL_ERR);
    cr_assert_eq(common_log_parse_level("loud", &l), COMMON_EINVAL);
    cr_assert_eq(l, COMMON_LOG_LEVEL_ERR, "unchanged on failure");
}

/* Each thread logs its own lines; none may be split by another thread's. */
static void *log_thread(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < 200; i++)
        COMMON_LOG_INFO("thread", "id=%d i=%d payload=%s", id, i,
                        "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz");
    return NULL;
}

Test(common_log, concurrent_lines_do_not_interleave)
{
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, log_thread, (void *)(intptr_t)i), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    const char *t = captured();
    int         lines = 0;
    for (const char *l = t; *l; lines++) {
        size_t n = strcspn(l, "\n");
        char   line[256];
        cr_assert_lt(n, sizeof(line));
        memcpy(line, l, n);
        line[n] = '\0';
        cr_assert(matches("^" TIME_RE " INFO thread id=[0-3] i=[0-9]+ payload=[a-z]{52}$", line),
                  "%s", line);
        l += n + 1;
    }
    cr_assert_eq(lines, 800);
}
