/* common/json.c - writing JSON string literals that stay valid whatever bytes they carry. */
#include "common.h"

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

void common_json_write_str(FILE *f, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    size_t i = 0;
    while (i < len) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
            i++;
        } else if (c == '\n') {
            fputs("\\n", f);
            i++;
        } else if (c == '\t') {
            fputs("\\t", f);
            i++;
        } else if (c == '\r') {
            fputs("\\r", f);
            i++;
        } else if (c < 0x20 || c == 0x7F) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else {
            size_t n = json_utf8_len(p + i, len - i);
            if (n == 0) {
                fprintf(f, "\\u%04x", c); /* a stray byte: keep its value, stay valid JSON */
                i++;
            } else {
                fwrite(p + i, 1, n, f);
                i += n;
            }
        }
    }
    fputc('"', f);
}
