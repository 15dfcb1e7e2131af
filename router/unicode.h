/* router/unicode.h - UTF-8 decoding as llama.cpp does it, code point classes, GPT-2 byte map. */
#ifndef ROUTER_UNICODE_H
#define ROUTER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Code point classes, grouping the Unicode general categories the way llama.cpp's
 * unicode-data tables do (so \p{L}, \p{N}, \p{P}, \p{S}, \p{M} can be tested). */
enum router_ucat {
    ROUTER_UCAT_UNDEFINED = 0, /* Cn: unassigned */
    ROUTER_UCAT_LETTER,        /* L*  : \p{L} */
    ROUTER_UCAT_NUMBER,        /* N*  : \p{N} */
    ROUTER_UCAT_PUNCT,         /* P*  : \p{P} */
    ROUTER_UCAT_SYMBOL,        /* S*  : \p{S} */
    ROUTER_UCAT_MARK,          /* M*  : \p{M} */
    ROUTER_UCAT_SEPARATOR,     /* Z*  : \p{Z} */
    ROUTER_UCAT_CONTROL,       /* Cc, Cf, Co, Cs */
};

/* One entry of the generated category table: `cat` holds from `start` up to the next start. */
struct router_ucat_range {
    uint32_t start;
    uint8_t  cat; /* enum router_ucat */
};

/* An inclusive code point range. */
struct router_urange {
    uint32_t first;
    uint32_t last;
};

/* Generated tables (router/unicode_data.c, made by router/gen_unicode.py). */
extern const struct router_ucat_range router_ucat_ranges[];
extern const size_t                   router_ucat_n_ranges;
extern const struct router_urange     router_white_space[];
extern const size_t                   router_n_white_space;

#define ROUTER_UTF8_REPLACEMENT 0xFFFDu /* what an invalid byte decodes to */

/* Byte length of a UTF-8 sequence from its lead byte, as llama.cpp's unicode_len_utf8() reads the
 * high nibble: 0x0-0xB -> 1 (stray continuation bytes count as 1), 0xC-0xD -> 2, 0xE -> 3,
 * 0xF -> 4. Callers clip it to the bytes left. */
size_t router_utf8_len(uint8_t lead);

/* Decodes one code point of s[*pos .. len) and advances *pos; requires *pos < len. Invalid input
 * never reads past `len`: a stray continuation byte, a lead byte whose continuation bytes are
 * missing or wrong, a byte 0xF8-0xFF, or a sequence above U+10FFFF decodes to U+FFFD and
 * advances by one byte (llama.cpp's unicode_cpts_from_utf8() does the same, except that it
 * throws later on sequences above U+10FFFF). Overlong forms and surrogates are accepted. */
uint32_t router_utf8_decode(const char *s, size_t len, size_t *pos);

/* Writes the UTF-8 form of cp (<= 0x10FFFF) into out; returns its length 1..4 (0 if cp is too
 * large). */
size_t router_utf8_encode(uint32_t cp, char out[4]);

/* True when s[0..len) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
bool router_utf8_is_valid(const char *s, size_t len);

/* Class of a code point (values above U+10FFFF are UNDEFINED). */
enum router_ucat router_ucat_get(uint32_t cp);

/* True for the Unicode White_Space property. */
bool router_is_space(uint32_t cp);

/* GPT-2 byte-level map: every byte 0..255 to a printable code point (bytes that are printable
 * Latin-1 map to themselves, the others to U+0100 + n in byte order). */
uint32_t router_byte_to_cpt(uint8_t b);

/* Reverse of router_byte_to_cpt(): the byte, or -1 when cp is not in the map. */
int router_cpt_to_byte(uint32_t cp);

#endif /* ROUTER_UNICODE_H */
