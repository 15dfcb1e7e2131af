/* common/json.c - text made valid UTF-8 whatever bytes it carries, for JSON writers. */
#include "common.h"

#include <stdlib.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s[0..len), or 0 when it is not one. */
static size_t json_utf8_len(const unsigned char *s, size_t len)
{
    unsigned char c = s[0];
    size_t        n;
    uint32_t      cp;
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0) {
        n = 2;
        cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3;
        cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4;
        cp = c & 0x07u;
    } else {
        return 0;
    }
    if (n > len)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

char *common_utf8_repair(const char *s, size_t len, size_t *out_len)
{
    const unsigned char *p = (const unsigned char *)s;
    char                *out = malloc(2 * len + 1); /* a stray byte takes two */
    size_t               o = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len;) {
        size_t n = json_utf8_len(p + i, len - i);
        if (n == 0) {
            /* A stray byte stands for the code point of its value (U+0080..U+00FF). */
            out[o++] = (char)(0xC0 | (p[i] >> 6));
            out[o++] = (char)(0x80 | (p[i] & 0x3F));
            i++;
        } else {
            memcpy(out + o, p + i, n);
            o += n;
            i += n;
        }
    }
    out[o] = '\0';
    if (out_len)
        *out_len = o;
    return out;
}
