/* common/util.c - size parsing and formatting, overflow-checked arithmetic, monotonic clock. */
#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int common_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return COMMON_EINVAL;
    errno = 0;
    char  *end = NULL;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || !(v >= 0.0) || isinf(v))
        return COMMON_EINVAL;
    while (*end == ' ')
        end++;
    double mult = 1.0;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'B':
            mult = 1.0;
            break;
        case 'K':
            mult = 1024.0;
            break;
        case 'M':
            mult = 1024.0 * 1024.0;
            break;
        case 'G':
            mult = 1024.0 * 1024.0 * 1024.0;
            break;
        case 'T':
            mult = 1024.0 * 1024.0 * 1024.0 * 1024.0;
            break;
        default:
            return COMMON_EINVAL;
        }
        end++;
        /* Accept the suffix forms K, KB, KiB (all binary). */
        if (mult > 1.0 &&
            (strcasecmp(end, "") == 0 || strcasecmp(end, "b") == 0 || strcasecmp(end, "ib") == 0))
            end += strlen(end);
        if (*end)
            return COMMON_EINVAL;
    }
    double bytes = v * mult;
    if (bytes >= 18446744073709551616.0)
        return COMMON_ERANGE;
    *out = (uint64_t)bytes;
    return COMMON_OK;
}

const char *common_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double             v = (double)bytes;
    size_t             u = 0;
    while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

bool common_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return false;
    *out = r;
    return true;
}

bool common_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return false;
    *out = r;
    return true;
}

uint64_t common_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
