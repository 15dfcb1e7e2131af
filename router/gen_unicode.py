#!/usr/bin/env python3
# router/gen_unicode.py - generates router/unicode_data.c (category ranges, white space) from unicodedata.
"""Writes the Unicode tables the pre-tokenizers need.

Usage: python3 router/gen_unicode.py > router/unicode_data.c

Each code point gets one category class, the way llama.cpp's unicode-data tables group
the general categories: L* letter, N* number, P* punctuation, S* symbol, M* mark,
Z* separator, Cc/Cf/Co/Cs control, Cn undefined. Consecutive code points with the same class
are merged into ranges. White space is the Unicode White_Space property (PropList.txt), which
unicodedata does not expose, so it is listed here.
"""
import sys
import unicodedata

CLASSES = {
    "L": "ROUTER_UCAT_LETTER",
    "N": "ROUTER_UCAT_NUMBER",
    "P": "ROUTER_UCAT_PUNCT",
    "S": "ROUTER_UCAT_SYMBOL",
    "M": "ROUTER_UCAT_MARK",
    "Z": "ROUTER_UCAT_SEPARATOR",
    "C": "ROUTER_UCAT_CONTROL",
}

# Unicode White_Space property (PropList.txt; unchanged since Unicode 6.3).
WHITE_SPACE = [(0x0009, 0x000D), (0x0020, 0x0020), (0x0085, 0x0085), (0x00A0, 0x00A0),
               (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F),
               (0x205F, 0x205F), (0x3000, 0x3000)]

MAX_CPT = 0x110000


def cls(cp):
    cat = unicodedata.category(chr(cp))
    if cat == "Cn":
        return "ROUTER_UCAT_UNDEFINED"
    return CLASSES[cat[0]]


def main():
    ranges = []
    prev = None
    for cp in range(MAX_CPT):
        c = cls(cp)
        if c != prev:
            ranges.append((cp, c))
            prev = c
    out = sys.stdout
    out.write("/* router/unicode_data.c - Unicode %s categories, white space; made by "
              "gen_unicode.py. */\n" % unicodedata.unidata_version)
    out.write("/* Do not edit: regenerate with `python3 router/gen_unicode.py > router/unicode_data.c`. */\n")
    out.write('#include "unicode.h"\n\n/* clang-format off */\n')
    out.write("/* Category of code points [start, next start): sorted by start, first start 0. */\n")
    out.write("const struct router_ucat_range router_ucat_ranges[] = {\n")
    for start, c in ranges:
        out.write("    {0x%06X, %s},\n" % (start, c))
    out.write("};\n")
    out.write("const size_t router_ucat_n_ranges = sizeof(router_ucat_ranges) / "
              "sizeof(router_ucat_ranges[0]);\n\n")
    out.write("/* Unicode White_Space property, inclusive ranges sorted by start. */\n")
    out.write("const struct router_urange router_white_space[] = {\n")
    for a, b in WHITE_SPACE:
        out.write("    {0x%06X, 0x%06X},\n" % (a, b))
    out.write("};\n")
    out.write("const size_t router_n_white_space = sizeof(router_white_space) / "
              "sizeof(router_white_space[0]);\n/* clang-format on */\n")


if __name__ == "__main__":
    main()
