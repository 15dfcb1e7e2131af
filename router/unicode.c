/* router/unicode.c - UTF-8 decoding as llama.cpp does it, code point classes, GPT-2 byte map. */
#include "unicode.h"

size_t router_utf8_len(uint8_t lead)
{
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}

static bool utf8_is_cont(const char *s, size_t len, size_t i)
{
    return i < len && ((uint8_t)s[i] & 0xC0u) == 0x80u;
}

uint32_t router_utf8_decode(const char *s, size_t len, size_t *pos)
{
    size_t        i = *pos;
    const uint8_t b = (uint8_t)s[i];
    uint32_t      cp;

    if (b < 0x80u) {
        *pos = i + 1;
        return b;
    }
    if ((b & 0xE0u) == 0xC0u) {
        if (!utf8_is_cont(s, len, i + 1))
            goto invalid;
        cp = ((uint32_t)(b & 0x1Fu) << 6) | ((uint8_t)s[i + 1] & 0x3Fu);
        *pos = i + 2;
        return cp;
    }
    if ((b & 0xF0u) == 0xE0u) {
        if (!utf8_is_cont(s, len, i + 1) || !utf8_is_cont(s, len, i + 2))
            goto invalid;
        cp = ((uint32_t)(b & 0x0Fu) << 12) | ((uint32_t)((uint8_t)s[i + 1] & 0x3Fu) << 6) |
             ((uint8_t)s[i + 2] & 0x3Fu);
        *pos = i + 3;
        return cp;
    }
    if ((b & 0xF8u) == 0xF0u) {
        if (!utf8_is_cont(s, len, i + 1) || !utf8_is_cont(s, len, i + 2) ||
            !utf8_is_cont(s, len, i + 3))
            goto invalid;
        cp = ((uint32_t)(b & 0x07u) << 18) | ((uint32_t)((uint8_t)s[i + 1] & 0x3Fu) << 12) |
             ((uint32_t)((uint8_t)s[i + 2] & 0x3Fu) << 6) | ((uint8_t)s[i + 3] & 0x3Fu);
        if (cp > 0x10FFFFu)
            goto invalid;
        *pos = i + 4;
        return cp;
    }
invalid:
    *pos = i + 1;
    return ROUTER_UTF8_REPLACEMENT;
}

size_t router_utf8_encode(uint32_t cp, char out[4])
{
    if (cp <= 0x7Fu) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp <= 0x7FFu) {
        out[0] = (char)(0xC0u | (cp >> 6));
        out[1] = (char)(0x80u | (cp & 0x3Fu));
        return 2;
    }
    if (cp <= 0xFFFFu) {
        out[0] = (char)(0xE0u | (cp >> 12));
        out[1] = (char)(0x80u | ((cp >> 6) & 0x3Fu));
        out[2] = (char)(0x80u | (cp & 0x3Fu));
        return 3;
    }
    if (cp <= 0x10FFFFu) {
        out[0] = (char)(0xF0u | (cp >> 18));
        out[1] = (char)(0x80u | ((cp >> 12) & 0x3Fu));
        out[2] = (char)(0x80u | ((cp >> 6) & 0x3Fu));
        out[3] = (char)(0x80u | (cp & 0x3Fu));
        return 4;
    }
    return 0;
}

bool router_utf8_is_valid(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        const uint8_t b = (uint8_t)s[i];
        size_t        n;
        uint32_t      cp, min;
        if (b < 0x80u) {
            i++;
            continue;
        }
        if ((b & 0xE0u) == 0xC0u) {
            n = 2;
            cp = b & 0x1Fu;
            min = 0x80u;
        } else if ((b & 0xF0u) == 0xE0u) {
            n = 3;
            cp = b & 0x0Fu;
            min = 0x800u;
        } else if ((b & 0xF8u) == 0xF0u) {
            n = 4;
            cp = b & 0x07u;
            min = 0x10000u;
        } else {
            return false;
        }
        if (len - i < n)
            return false;
        for (size_t k = 1; k < n; k++) {
            if (((uint8_t)s[i + k] & 0xC0u) != 0x80u)
                return false;
            cp = (cp << 6) | ((uint8_t)s[i + k] & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFFu || (cp >= 0xD800u && cp <= 0xDFFFu))
            return false;
        i += n;
    }
    return true;
}

enum router_ucat router_ucat_get(uint32_t cp)
{
    if (cp > 0x10FFFFu)
        return ROUTER_UCAT_UNDEFINED;
    /* Largest range start <= cp; the table starts at 0. */
    size_t lo = 0, hi = router_ucat_n_ranges;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (router_ucat_ranges[mid].start <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return (enum router_ucat)router_ucat_ranges[lo].cat;
}

bool router_is_space(uint32_t cp)
{
    if (cp < 0x80u)
        return cp == 0x20u || (cp >= 0x09u && cp <= 0x0Du);
    for (size_t i = 0; i < router_n_white_space; i++) {
        if (cp < router_white_space[i].first)
            return false;
        if (cp <= router_white_space[i].last)
            return true;
    }
    return false;
}

static bool byte_is_printable(unsigned b)
{
    return (b >= 0x21u && b <= 0x7Eu) || (b >= 0xA1u && b <= 0xACu) || (b >= 0xAEu && b <= 0xFFu);
}

uint32_t router_byte_to_cpt(uint8_t b)
{
    if (byte_is_printable(b))
        return b;
    /* The n-th non-printable byte (in byte order) maps to U+0100 + n. */
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        n += !byte_is_printable(c);
    return 0x100u + n;
}

int router_cpt_to_byte(uint32_t cp)
{
    if (cp < 0x100u)
        return byte_is_printable(cp) ? (int)cp : -1;
    if (cp >= 0x100u + 68u)
        return -1; /* 68 bytes are not printable: 0x00-0x20, 0x7F-0xA0, 0xAD */
    uint32_t n = cp - 0x100u;
    for (unsigned c = 0; c < 256u; c++) {
        if (!byte_is_printable(c) && n-- == 0)
            return (int)c;
    }
    return -1;
}
