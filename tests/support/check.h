/* tests/support/check.h - assertions for plain test programs (the TSan suite: Criterion's runner
 * cannot start under ThreadSanitizer), ending with the line "N passed, N failed". */
#ifndef TESTS_SUPPORT_CHECK_H
#define TESTS_SUPPORT_CHECK_H

#include <stdio.h>

/* Process singleton of one test program: counts of checks. */
static int g_check_passed, g_check_failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            g_check_passed++;                                                                      \
        } else {                                                                                   \
            g_check_failed++;                                                                      \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Prints the closing line and returns the exit status. */
static inline int check_report(void)
{
    printf("%d passed, %d failed\n", g_check_passed, g_check_failed);
    return g_check_failed ? 1 : 0;
}

#endif /* TESTS_SUPPORT_CHECK_H */
