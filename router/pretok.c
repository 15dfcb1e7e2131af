/* router/pretok.c - BPE pre-tokenizers: hand-written splitters equal to llama.cpp's regexes. */
#include "pretok.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "unicode.h"

/*
 * llama.cpp splits BPE input with a list of regexes per pre-tokenizer type, applied one after
 * the other: each regex cuts every piece left by the previous one into its matches and the
 * unmatched gaps between them (std::regex_iterator semantics: leftmost match, ECMAScript
 * alternation order, greedy with backtracking). Two regexes (GPT-2's and Llama 3's) have
 * hand-written equivalents in llama.cpp's unicode.cpp; the others run through std::regex over a
 * "collapsed" text where each non-ASCII code point stands for its class, so \p{L}, \p{N}, \p{P}
 * test the class and \s the White_Space property. Each matcher below returns the length of the
 * match at a position (0 = none), which reproduces that behaviour without a regex engine.
 */

/* Per-code-point flag bits: low 3 bits enum router_ucat, plus: */
#define F_SPACE 0x10u /* White_Space */
#define F_VALID 0x80u /* inside the piece (out-of-range reads give 0) */

static const struct router_pre_info k_pre_infos[] = {
    {"default", ROUTER_PRE_DEFAULT, true, false, false},
    {"gpt-2", ROUTER_PRE_GPT2, true, false, false},
    {"phi-2", ROUTER_PRE_GPT2, true, false, false},
    {"mpt", ROUTER_PRE_GPT2, true, false, false},
    {"olmo", ROUTER_PRE_GPT2, true, false, false},
    /* Not a llama.cpp name: GPT-NeoX's tokenizer.json uses GPT-2's ByteLevel split. */
    {"gpt-neox", ROUTER_PRE_GPT2, true, false, false},
    {"llama3", ROUTER_PRE_LLAMA3, true, true, true},
    {"llama-v3", ROUTER_PRE_LLAMA3, true, true, true},
    {"llama-bpe", ROUTER_PRE_LLAMA3, true, true, true},
    {"qwen2", ROUTER_PRE_QWEN2, false, false, false},
    {"deepseek-r1-qwen", ROUTER_PRE_QWEN2, false, false, false},
    {"megrez", ROUTER_PRE_QWEN2, true, false, false},
    {"starcoder", ROUTER_PRE_STARCODER, true, false, false},
    {"refact", ROUTER_PRE_STARCODER, true, false, false},
    {"deepseek-coder", ROUTER_PRE_DEEPSEEK_CODER, false, false, false},
    {"deepseek-llm", ROUTER_PRE_DEEPSEEK_LLM, false, false, false},
    {"falcon", ROUTER_PRE_FALCON, true, false, false},
    {"deepseek-v3", ROUTER_PRE_DEEPSEEK3, false, false, false},
    {"gpt-4o", ROUTER_PRE_GPT4O, false, false, false},
    {"llama4", ROUTER_PRE_GPT4O, false, false, false},
    /* GLM-4's regex is Llama 3's; llama.cpp keeps clean_spaces and drops BOS for it. */
    {"glm4", ROUTER_PRE_LLAMA3, true, false, false},
    {"chatglm-bpe", ROUTER_PRE_LLAMA3, true, false, false},
    {"kimi-k2", ROUTER_PRE_KIMI_K2, false, false, false},
};

const struct router_pre_info *router_pre_find(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof(k_pre_infos) / sizeof(k_pre_infos[0]); i++) {
        if (strlen(k_pre_infos[i].name) == len && memcmp(k_pre_infos[i].name, name, len) == 0)
            return &k_pre_infos[i];
    }
    return NULL;
}

/* The letter class of deepseek-llm's second regex, \s?[A-Za-zµÀ-ÖØ-ö...]+ (cased letters). */
static const struct router_urange k_dsllm_letters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

/* deepseek-llm's third regex, \s?[!-/:-~！-／：-～‘-‟　-。]+ */
static const struct router_urange k_dsllm_punct[] = {
    {0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
    {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002},
};

/* [一-龥぀-ゟ゠-ヿ]+ of deepseek-v3: CJK ideographs, hiragana, katakana */
static const struct router_urange k_cjk_kana[] = {
    {0x4E00, 0x9FA5},
    {0x3040, 0x309F},
    {0x30A0, 0x30FF},
};

/* [一-龥ࠀ-一가-퟿]+ of deepseek-coder and deepseek-llm */
static const struct router_urange k_cjk[] = {
    {0x4E00, 0x9FA5},
    {0x0800, 0x4E00},
    {0xAC00, 0xD7FF},
};

/* \p{Han} as llama.cpp's unicode_cpt_is_han() has it: the CJK Unified Ideographs, their
 * extensions A to F and the compatibility ideographs. */
static const struct router_urange k_han[] = {
    {0x4E00, 0x9FFF},   {0x3400, 0x4DBF},   {0x20000, 0x2A6DF},
    {0x2A700, 0x2B73F}, {0x2B740, 0x2B81F}, {0x2B820, 0x2CEAF},
    {0x2CEB0, 0x2EBEF}, {0xF900, 0xFAFF},   {0x2F800, 0x2FA1F},
};

static bool in_ranges(const struct router_urange *r, size_t n, uint32_t cp)
{
    for (size_t i = 0; i < n; i++) {
        if (cp >= r[i].first && cp <= r[i].last)
            return true;
    }
    return false;
}

#define N_RANGES(a) (sizeof(a) / sizeof((a)[0]))

/* The piece [a, b) being split, with bounds-checked accessors. */
struct piece {
    const uint32_t *cpts;
    const uint8_t  *flags;
    size_t          a, b;
};

static inline uint32_t pc_cpt(const struct piece *p, size_t i)
{
    return i >= p->a && i < p->b ? p->cpts[i] : 0xFFFFFFFFu;
}

static inline uint8_t pc_flags(const struct piece *p, size_t i)
{
    return i >= p->a && i < p->b ? p->flags[i] : 0;
}

static inline bool f_letter(uint8_t f)
{
    return (f & F_VALID) && (f & 7u) == ROUTER_UCAT_LETTER;
}

static inline bool f_number(uint8_t f)
{
    return (f & F_VALID) && (f & 7u) == ROUTER_UCAT_NUMBER;
}

static inline bool f_punct(uint8_t f)
{
    return (f & F_VALID) && (f & 7u) == ROUTER_UCAT_PUNCT;
}

static inline bool f_space(uint8_t f)
{
    return (f & F_SPACE) != 0;
}

/* [^\s\p{L}\p{N}]: any code point of the piece that is none of those */
static inline bool f_other(uint8_t f)
{
    return (f & F_VALID) && !f_space(f) && !f_letter(f) && !f_number(f);
}

/* A code point as std::wregex sees it in llama.cpp: non-ASCII white space becomes U+000B. */
static inline uint32_t pc_wcpt(const struct piece *p, size_t i)
{
    uint32_t cp = pc_cpt(p, i);
    return cp >= 0x80u && f_space(pc_flags(p, i)) ? 0x0Bu : cp;
}

/* Output of one pass: lengths of consecutive words. */
struct emit {
    uint32_t *out;
    size_t    n;
    size_t    prev_end; /* end of the last word emitted */
};

static inline void emit_to(struct emit *e, size_t end)
{
    if (end > e->prev_end)
        e->out[e->n++] = (uint32_t)(end - e->prev_end);
    e->prev_end = end;
}

static bool is_contraction_letter(uint32_t c)
{
    return c == 's' || c == 't' || c == 'm' || c == 'd';
}

static bool is_contraction_pair(uint32_t c1, uint32_t c2)
{
    return (c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l');
}

static uint32_t ascii_lower(uint32_t c)
{
    return c >= 'A' && c <= 'Z' ? c + 32u : c;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
 * (same steps as llama.cpp's unicode_regex_split_custom_gpt2). */
static void split_gpt2(const struct piece *p, struct emit *e)
{
    size_t pos = p->a;
    while (pos < p->b) {
        const uint32_t cpt = pc_cpt(p, pos);
        const uint8_t  f = pc_flags(p, pos);

        if (cpt == '\'' && pos + 1 < p->b) {
            const uint32_t n1 = pc_cpt(p, pos + 1);
            if (is_contraction_letter(n1)) {
                pos += 2;
                emit_to(e, pos);
                continue;
            }
            if (pos + 2 < p->b && is_contraction_pair(n1, pc_cpt(p, pos + 2))) {
                pos += 3;
                emit_to(e, pos);
                continue;
            }
        }
        uint8_t f2 = cpt == ' ' ? pc_flags(p, pos + 1) : f;
        if (f_letter(f2) || f_number(f2) || f_other(f2)) {
            bool (*same)(uint8_t) = f_letter(f2) ? f_letter : f_number(f2) ? f_number : f_other;
            pos += cpt == ' ';
            while (same(pc_flags(p, pos)))
                pos++;
            emit_to(e, pos);
            continue;
        }
        size_t n_ws = 0;
        while (f_space(pc_flags(p, pos + n_ws)))
            n_ws++;
        if (n_ws > 1 && pos + n_ws < p->b) { /* \s+(?!\S): leave the last space to the word */
            pos += n_ws - 1;
        } else if (n_ws > 0) {
            pos += n_ws;
        } else {
            pos++;
        }
        emit_to(e, pos);
    }
}

/* \s*[\r\n]+ | \s+(?!\S) | \s+ at pos, the white-space tail of the Llama 3 family of regexes:
 * the match length, 0 when no white space starts here. */
static size_t ws_match(const struct piece *p, size_t pos)
{
    size_t n_ws = 0, last_crlf_end = 0;
    while (f_space(pc_flags(p, pos + n_ws))) {
        const uint32_t c = pc_cpt(p, pos + n_ws);
        if (c == '\r' || c == '\n')
            last_crlf_end = pos + n_ws + 1;
        n_ws++;
    }
    if (last_crlf_end) /* \s*[\r\n]+ */
        return last_crlf_end - pos;
    if (n_ws > 1 && pos + n_ws < p->b) /* \s+(?!\S) */
        return n_ws - 1;
    return n_ws; /* \s+, or 0 */
}

/* Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * and Qwen2, the same with \p{N} instead of \p{N}{1,3} (max_digits 1). Same steps as llama.cpp's
 * unicode_regex_split_custom_llama3(); for Qwen2 llama.cpp runs std::regex, which this equals. */
static void split_llama3(const struct piece *p, struct emit *e, size_t max_digits)
{
    size_t pos = p->a;
    while (pos < p->b) {
        const uint32_t cpt = pc_cpt(p, pos);
        const uint8_t  f = pc_flags(p, pos);

        if (cpt == '\'' && pos + 1 < p->b) {
            const uint32_t n1 = ascii_lower(pc_cpt(p, pos + 1));
            if (is_contraction_letter(n1)) {
                pos += 2;
                emit_to(e, pos);
                continue;
            }
            if (pos + 2 < p->b && is_contraction_pair(n1, ascii_lower(pc_cpt(p, pos + 2)))) {
                pos += 3;
                emit_to(e, pos);
                continue;
            }
        }
        if (!(cpt == '\r' || cpt == '\n' || f_number(f))) {
            if (f_letter(f) || f_letter(pc_flags(p, pos + 1))) {
                pos++;
                while (f_letter(pc_flags(p, pos)))
                    pos++;
                emit_to(e, pos);
                continue;
            }
        }
        if (f_number(f)) {
            size_t ini = pos;
            while (f_number(pc_flags(p, pos))) {
                if (++pos - ini >= max_digits) {
                    emit_to(e, pos);
                    ini = pos;
                }
            }
            emit_to(e, pos);
            continue;
        }
        uint8_t f2 = cpt == ' ' ? pc_flags(p, pos + 1) : f;
        /* llama.cpp tests `f` (not f2) for validity here: a lone trailing space comes out alone,
         * as the regex's \s+(?!\S) would give it. */
        if (!(f_space(f2) || f_letter(f2) || f_number(f2)) && (f & F_VALID)) {
            pos += cpt == ' ';
            while (f_other(pc_flags(p, pos)))
                pos++;
            while (pc_cpt(p, pos) == '\r' || pc_cpt(p, pos) == '\n')
                pos++;
            emit_to(e, pos);
            continue;
        }
        const size_t n_ws = ws_match(p, pos);
        pos += n_ws ? n_ws : 1; /* no match: one code point alone */
        emit_to(e, pos);
    }
}

/* A letter of the piece that is not Han (Kimi K2's letter classes). */
static bool kimi_letter(const struct piece *p, size_t i)
{
    return f_letter(pc_flags(p, i)) && !in_ranges(k_han, N_RANGES(k_han), pc_cpt(p, i));
}

/* Kimi K2 (tiktoken's pattern):
 *   [\p{Han}]+ | [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*
 *   [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)? | (the same with + and *) |
 *   \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 * Same steps as llama.cpp's unicode_regex_split_custom_kimi_k2(), which takes both letter
 * alternatives as one run of non-Han letters (marks are not letters there) with the contraction
 * after it. */
static void split_kimi(const struct piece *p, struct emit *e)
{
    size_t pos = p->a;
    while (pos < p->b) {
        const uint32_t cpt = pc_cpt(p, pos);
        const uint8_t  f = pc_flags(p, pos);
        if (in_ranges(k_han, N_RANGES(k_han), cpt)) {
            while (in_ranges(k_han, N_RANGES(k_han), pc_cpt(p, pos)))
                pos++;
            emit_to(e, pos);
            continue;
        }
        const bool lead = !(cpt == '\r' || cpt == '\n' || f_letter(f) || f_number(f));
        if (kimi_letter(p, pos) || (lead && kimi_letter(p, pos + 1))) {
            pos += lead;
            while (kimi_letter(p, pos))
                pos++;
            if (pc_cpt(p, pos) == '\'' && pos + 1 < p->b) {
                const uint32_t n1 = ascii_lower(pc_cpt(p, pos + 1));
                if (is_contraction_letter(n1))
                    pos += 2;
                else if (pos + 2 < p->b && is_contraction_pair(n1, ascii_lower(pc_cpt(p, pos + 2))))
                    pos += 3;
            }
            emit_to(e, pos);
            continue;
        }
        if (f_number(f)) {
            size_t ini = pos;
            while (f_number(pc_flags(p, pos))) {
                if (++pos - ini >= 3) {
                    emit_to(e, pos);
                    ini = pos;
                }
            }
            emit_to(e, pos);
            continue;
        }
        /* ?[^\s\p{L}\p{N}]+[\r\n]*: unlike Llama 3's, the space's follower must be in the piece */
        if (f_other(cpt == ' ' ? pc_flags(p, pos + 1) : f)) {
            pos += cpt == ' ';
            while (f_other(pc_flags(p, pos)))
                pos++;
            while (pc_cpt(p, pos) == '\r' || pc_cpt(p, pos) == '\n')
                pos++;
            emit_to(e, pos);
            continue;
        }
        const size_t n_ws = ws_match(p, pos);
        pos += n_ws ? n_ws : 1; /* no match: one code point alone */
        emit_to(e, pos);
    }
}

/* The regexes that llama.cpp runs through std::regex: each returns the match length at pos. */
enum rx {
    RX_PUNCT_DEFAULT, /* [\p{P}\$\+<=>\^~\|]+ */
    RX_PUNCT_FALCON,  /* [\p{P}\$\+<=>\^~\|`]+ */
    RX_DIGITS,        /* \p{N}+ */
    RX_DIGIT,         /* \p{N} */
    RX_ASCII_3DIGITS, /* [0-9][0-9][0-9] */
    RX_CRLF,          /* [\r\n] */
    RX_WS_LETTERS,    /* \s?\p{L}+ */
    RX_WS_PUNCT,      /* \s?\p{P}+ */
    RX_CJK,           /* [一-龥ࠀ-一가-퟿]+ */
    RX_DSLLM_LETTERS, /* \s?[A-Za-zµÀ-ÖØ-ö...]+ */
    RX_DSLLM_PUNCT,   /* \s?[!-/:-~！-／：-～‘-‟　-。]+ */
    RX_WS_TO_END,     /* \s+$ */
    RX_DIGITS_1_3,    /* \p{N}{1,3} */
    RX_CJK_KANA,      /* [一-龥぀-ゟ゠-ヿ]+ */
};

static bool rx_class(enum rx rx, const struct piece *p, size_t i)
{
    const uint8_t  f = pc_flags(p, i);
    const uint32_t c = pc_wcpt(p, i);
    if (!(f & F_VALID))
        return false;
    switch (rx) {
    case RX_PUNCT_DEFAULT:
        return f_punct(f) || (c < 0x80u && strchr("$+<=>^~|", (int)c) && c != 0);
    case RX_PUNCT_FALCON:
        return f_punct(f) || (c < 0x80u && strchr("$+<=>^~|`", (int)c) && c != 0);
    case RX_DIGITS:
    case RX_DIGIT:
    case RX_DIGITS_1_3:
        return f_number(f);
    case RX_ASCII_3DIGITS:
        return c >= '0' && c <= '9';
    case RX_CRLF:
        return c == '\r' || c == '\n';
    case RX_WS_LETTERS:
        return f_letter(f);
    case RX_WS_PUNCT:
        return f_punct(f);
    case RX_CJK:
        return in_ranges(k_cjk, N_RANGES(k_cjk), c);
    case RX_DSLLM_LETTERS:
        return in_ranges(k_dsllm_letters, N_RANGES(k_dsllm_letters), c);
    case RX_DSLLM_PUNCT:
        return in_ranges(k_dsllm_punct, N_RANGES(k_dsllm_punct), c);
    case RX_WS_TO_END:
        return f_space(f);
    case RX_CJK_KANA:
        return in_ranges(k_cjk_kana, N_RANGES(k_cjk_kana), c);
    }
    return false;
}

static size_t rx_match(enum rx rx, const struct piece *p, size_t pos, size_t trail_ws)
{
    size_t i = pos;
    switch (rx) {
    case RX_DIGIT:
    case RX_CRLF:
        return rx_class(rx, p, pos) ? 1 : 0;
    case RX_ASCII_3DIGITS:
        return rx_class(rx, p, pos) && rx_class(rx, p, pos + 1) && rx_class(rx, p, pos + 2) ? 3 : 0;
    case RX_DIGITS_1_3:
        while (i - pos < 3 && rx_class(rx, p, i))
            i++;
        return i - pos;
    case RX_WS_TO_END:
        return pos >= trail_ws ? p->b - pos : 0;
    case RX_WS_LETTERS:
    case RX_WS_PUNCT:
    case RX_DSLLM_LETTERS:
    case RX_DSLLM_PUNCT:
        /* \s? is greedy but gives its space back when the class does not follow */
        if (f_space(pc_flags(p, i)) && rx_class(rx, p, i + 1))
            i++;
        break;
    case RX_PUNCT_DEFAULT:
    case RX_PUNCT_FALCON:
    case RX_DIGITS:
    case RX_CJK:
    case RX_CJK_KANA:
        break;
    }
    while (rx_class(rx, p, i))
        i++;
    return i - pos;
}

/* One std::regex pass over a piece: matches and the gaps between them each become a word. */
static void split_rx(const struct piece *p, struct emit *e, enum rx rx)
{
    size_t trail_ws = p->b;
    if (rx == RX_WS_TO_END) {
        while (trail_ws > p->a && f_space(pc_flags(p, trail_ws - 1)))
            trail_ws--;
    }
    size_t pos = p->a;
    while (pos < p->b) {
        const size_t n = rx_match(rx, p, pos, trail_ws);
        if (n == 0) {
            pos++;
            continue;
        }
        emit_to(e, pos); /* the gap before the match, if any */
        pos += n;
        emit_to(e, pos);
    }
    emit_to(e, p->b);
}

/* A code point's class in llama.cpp's collapsed text: ASCII keeps itself, so only llama.cpp's
 * ASCII tables count (no ASCII marks; '~' and the controls are in no class), non-ASCII white
 * space becomes \v, other non-ASCII code points their category (separators and the rest fall
 * in none). */
enum ccls { CC_NONE = 0, CC_L, CC_N, CC_P, CC_S, CC_M };

static enum ccls collapsed_class(const struct piece *p, size_t i)
{
    const uint8_t  f = pc_flags(p, i);
    const uint32_t c = pc_cpt(p, i);
    if (!(f & F_VALID))
        return CC_NONE;
    if (c < 0x80u) {
        if (c >= '0' && c <= '9')
            return CC_N;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))
            return CC_L;
        if (c != 0 && strchr("!\"#%&'()*,-./:;?@[\\]_{}", (int)c))
            return CC_P;
        if (c != 0 && strchr("$+<=>^`|", (int)c))
            return CC_S;
        return CC_NONE;
    }
    if (f_space(f))
        return CC_NONE;
    switch ((enum router_ucat)(f & 7u)) {
    case ROUTER_UCAT_LETTER:
        return CC_L;
    case ROUTER_UCAT_NUMBER:
        return CC_N;
    case ROUTER_UCAT_PUNCT:
        return CC_P;
    case ROUTER_UCAT_SYMBOL:
        return CC_S;
    case ROUTER_UCAT_MARK:
        return CC_M;
    default:
        return CC_NONE;
    }
}

static bool is_crlf(const struct piece *p, size_t i)
{
    const uint32_t c = pc_cpt(p, i);
    return (pc_flags(p, i) & F_VALID) && (c == '\r' || c == '\n');
}

/* deepseek-v3's third regex at pos, in its alternation order:
 *   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
 *    ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 * Returns the match length, 0 when none starts here. */
static size_t dsv3_match(const struct piece *p, size_t pos)
{
    const uint32_t c0 = pc_cpt(p, pos);
    size_t         i;
#define DS_ALPHA(c) (((c) >= 'A' && (c) <= 'Z') || ((c) >= 'a' && (c) <= 'z'))
#define DS_LM(k)    (collapsed_class(p, k) == CC_L || collapsed_class(p, k) == CC_M)
#define DS_PS(k)    (collapsed_class(p, k) == CC_P || collapsed_class(p, k) == CC_S)
    if (c0 < 0x80u && c0 > 0x20u && c0 < 0x7Fu && !DS_ALPHA(c0) && !(c0 >= '0' && c0 <= '9') &&
        (pc_flags(p, pos + 1) & F_VALID) && DS_ALPHA(pc_cpt(p, pos + 1))) {
        for (i = pos + 1; (pc_flags(p, i) & F_VALID) && DS_ALPHA(pc_cpt(p, i)); i++)
            ;
        return i - pos;
    }
    /* [^\r\n\p{L}\p{P}\p{S}]? then [\p{L}\p{M}]+: the optional character is kept when
     * a letter or mark follows it, else given back. */
    const enum ccls k0 = collapsed_class(p, pos);
    const bool      opt =
        (pc_flags(p, pos) & F_VALID) && !is_crlf(p, pos) && k0 != CC_L && k0 != CC_P && k0 != CC_S;
    if ((opt && DS_LM(pos + 1)) || DS_LM(pos)) {
        for (i = opt && DS_LM(pos + 1) ? pos + 1 : pos; DS_LM(i); i++)
            ;
        return i - pos;
    }
    if ((c0 == ' ' && DS_PS(pos + 1)) || DS_PS(pos)) {
        for (i = c0 == ' ' && DS_PS(pos + 1) ? pos + 1 : pos; DS_PS(i); i++)
            ;
        while (is_crlf(p, i))
            i++;
        return i - pos;
    }
#undef DS_ALPHA
#undef DS_LM
#undef DS_PS
    return ws_match(p, pos);
}

/* One regex over a piece whose match at a position is `match` (0 = none there): matches and the
 * gaps between them become words (std::regex_iterator's leftmost matches). */
static void split_matches(const struct piece *p, struct emit *e,
                          size_t (*match)(const struct piece *, size_t))
{
    size_t pos = p->a;
    while (pos < p->b) {
        const size_t n = match(p, pos);
        if (n == 0) {
            pos++;
            continue;
        }
        emit_to(e, pos);
        pos += n;
        emit_to(e, pos);
    }
    emit_to(e, p->b);
}

/* gpt-4o's letter classes in the collapsed text: "upper" is a letter that is not [a-z] (ASCII
 * capitals and every non-ASCII letter), "lower" one that is not [A-Z]. */
static bool o200k_upper(const struct piece *p, size_t i)
{
    const uint32_t c = pc_cpt(p, i);
    return collapsed_class(p, i) == CC_L && !(c >= 'a' && c <= 'z');
}

static bool o200k_lower(const struct piece *p, size_t i)
{
    const uint32_t c = pc_cpt(p, i);
    return collapsed_class(p, i) == CC_L && !(c >= 'A' && c <= 'Z');
}

/* (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])? at i: its length. */
static size_t o200k_contraction(const struct piece *p, size_t i)
{
    if (pc_cpt(p, i) != '\'' || !(pc_flags(p, i + 1) & F_VALID))
        return 0;
    const uint32_t c1 = ascii_lower(pc_cpt(p, i + 1));
    if (is_contraction_letter(c1))
        return 2;
    if ((pc_flags(p, i + 2) & F_VALID) && is_contraction_pair(c1, ascii_lower(pc_cpt(p, i + 2))))
        return 3;
    return 0;
}

/* gpt-4o's regex at pos, in its alternation order (std::regex over the collapsed text):
 *   [^\r\n\p{L}\p{N}]?U*L+C? | [^\r\n\p{L}\p{N}]?U+L*C? | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n/]* |
 *   \s*[\r\n]+ | \s+(?!\S) | \s+
 * with U, L the "upper" and "lower" letters above and C the contraction. Returns the match
 * length, 0 when none starts here. */
static size_t o200k_match(const struct piece *p, size_t pos)
{
    const enum ccls k0 = collapsed_class(p, pos);
    size_t          j = pos;
    /* [^\r\n\p{L}\p{N}]? is kept only when a letter follows (else nothing here matches). */
    if ((pc_flags(p, pos) & F_VALID) && !is_crlf(p, pos) && k0 != CC_L && k0 != CC_N &&
        collapsed_class(p, pos + 1) == CC_L)
        j = pos + 1;
    if (collapsed_class(p, j) == CC_L) {
        /* U*L+: U* greedy, then backtracked until a "lower" letter can start L+. */
        size_t u = j;
        while (o200k_upper(p, u))
            u++;
        size_t end = 0;
        if (o200k_lower(p, u)) {
            end = u;
            while (o200k_lower(p, end))
                end++;
        } else {
            for (size_t k = u; k > j; k--)
                if (o200k_lower(p, k - 1)) {
                    end = k; /* L+ is the one letter k - 1 (k == u: the run's last) */
                    break;
                }
        }
        if (end == 0) { /* U+L*: the upper run, then any lower ones */
            end = u;
            while (o200k_lower(p, end))
                end++;
        }
        return end + o200k_contraction(p, end) - pos;
    }
    if (k0 == CC_N) {
        size_t i = pos;
        while (i - pos < 3 && collapsed_class(p, i) == CC_N)
            i++;
        return i - pos;
    }
#define O2_OTHER(k)                                                                                \
    ((pc_flags(p, k) & F_VALID) && !f_space(pc_flags(p, k)) && collapsed_class(p, k) != CC_L &&    \
     collapsed_class(p, k) != CC_N)
    if ((pc_cpt(p, pos) == ' ' && O2_OTHER(pos + 1)) || O2_OTHER(pos)) {
        size_t i = pc_cpt(p, pos) == ' ' && O2_OTHER(pos + 1) ? pos + 1 : pos;
        while (O2_OTHER(i))
            i++;
        while (is_crlf(p, i) || ((pc_flags(p, i) & F_VALID) && pc_cpt(p, i) == '/'))
            i++;
        return i - pos;
    }
#undef O2_OTHER
    return ws_match(p, pos);
}

/* A pass of a pre-tokenizer: a custom splitter or a regex. */
enum pass_kind { PASS_GPT2, PASS_LLAMA3, PASS_QWEN2, PASS_RX, PASS_DSV3, PASS_O200K, PASS_KIMI };

struct pass {
    enum pass_kind kind;
    enum rx        rx;
};

#define MAX_PASSES 6

struct pre_passes {
    size_t      n;
    struct pass p[MAX_PASSES];
};

static struct pre_passes pre_passes(enum router_pre pre)
{
    const struct pass gpt2 = {PASS_GPT2, RX_DIGIT};
    switch (pre) {
    case ROUTER_PRE_DEFAULT:
        return (struct pre_passes){
            4,
            {{PASS_RX, RX_PUNCT_DEFAULT}, gpt2, {PASS_RX, RX_DIGITS}, {PASS_RX, RX_ASCII_3DIGITS}}};
    case ROUTER_PRE_GPT2:
        return (struct pre_passes){1, {gpt2}};
    case ROUTER_PRE_LLAMA3:
        return (struct pre_passes){1, {{PASS_LLAMA3, RX_DIGIT}}};
    case ROUTER_PRE_QWEN2:
        return (struct pre_passes){1, {{PASS_QWEN2, RX_DIGIT}}};
    case ROUTER_PRE_STARCODER:
        return (struct pre_passes){2, {{PASS_RX, RX_DIGIT}, gpt2}};
    case ROUTER_PRE_DEEPSEEK_CODER:
        return (struct pre_passes){5,
                                   {{PASS_RX, RX_CRLF},
                                    {PASS_RX, RX_WS_LETTERS},
                                    {PASS_RX, RX_WS_PUNCT},
                                    {PASS_RX, RX_CJK},
                                    {PASS_RX, RX_DIGIT}}};
    case ROUTER_PRE_DEEPSEEK_LLM:
        return (struct pre_passes){6,
                                   {{PASS_RX, RX_CRLF},
                                    {PASS_RX, RX_DSLLM_LETTERS},
                                    {PASS_RX, RX_DSLLM_PUNCT},
                                    {PASS_RX, RX_WS_TO_END},
                                    {PASS_RX, RX_CJK},
                                    {PASS_RX, RX_DIGITS}}};
    case ROUTER_PRE_FALCON:
        return (struct pre_passes){3,
                                   {{PASS_RX, RX_PUNCT_FALCON}, gpt2, {PASS_RX, RX_ASCII_3DIGITS}}};
    case ROUTER_PRE_GPT4O:
        return (struct pre_passes){1, {{PASS_O200K, RX_DIGIT}}};
    case ROUTER_PRE_KIMI_K2:
        return (struct pre_passes){1, {{PASS_KIMI, RX_DIGIT}}};
    case ROUTER_PRE_DEEPSEEK3:
        return (struct pre_passes){
            3, {{PASS_RX, RX_DIGITS_1_3}, {PASS_RX, RX_CJK_KANA}, {PASS_DSV3, RX_DIGIT}}};
    }
    return (struct pre_passes){1, {gpt2}};
}

static int pretok_reserve(struct router_pretok *p, size_t n)
{
    if (n <= p->cap_cpts)
        return 0;
    if (n > SIZE_MAX / sizeof(uint32_t))
        return COMMON_ENOMEM;
    uint32_t *c = realloc(p->cpts, n * sizeof(*c));
    if (!c)
        return COMMON_ENOMEM;
    p->cpts = c;
    uint8_t *f = realloc(p->flags, n);
    if (!f)
        return COMMON_ENOMEM;
    p->flags = f;
    /* A pass never makes more words than code points (+1 for an empty text). */
    uint32_t *w = realloc(p->words, (n + 1) * sizeof(*w));
    if (!w)
        return COMMON_ENOMEM;
    p->words = w;
    uint32_t *t = realloc(p->tmp, (n + 1) * sizeof(*t));
    if (!t)
        return COMMON_ENOMEM;
    p->tmp = t;
    p->cap_cpts = n;
    p->cap_words = n + 1;
    return 0;
}

int router_pretok_split(struct router_pretok *p, enum router_pre pre, const char *text, size_t len)
{
    /* At most one code point per byte. */
    int rc = pretok_reserve(p, len ? len : 1);
    if (rc < 0)
        return rc;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        const uint32_t cp = router_utf8_decode(text, len, &i);
        p->cpts[n] = cp;
        p->flags[n] = (uint8_t)(F_VALID | (uint8_t)router_ucat_get(cp) |
                                (router_is_space(cp) ? F_SPACE : 0u));
        n++;
    }
    p->n_cpts = n;
    p->n_words = 0;
    if (n == 0)
        return 0;
    if (n > UINT32_MAX)
        return COMMON_ENOMEM;

    p->words[0] = (uint32_t)n;
    p->n_words = 1;
    const struct pre_passes passes = pre_passes(pre);
    for (size_t k = 0; k < passes.n; k++) {
        /* The previous pass's words become this pass's pieces. */
        uint32_t *prev = p->words;
        size_t    n_prev = p->n_words;
        p->words = p->tmp;
        p->tmp = prev;

        struct emit e = {.out = p->words, .n = 0, .prev_end = 0};
        size_t      start = 0;
        for (size_t w = 0; w < n_prev; w++) {
            const struct piece pc = {p->cpts, p->flags, start, start + prev[w]};
            switch (passes.p[k].kind) {
            case PASS_GPT2:
                split_gpt2(&pc, &e);
                break;
            case PASS_LLAMA3:
                split_llama3(&pc, &e, 3);
                break;
            case PASS_QWEN2:
                split_llama3(&pc, &e, 1);
                break;
            case PASS_RX:
                split_rx(&pc, &e, passes.p[k].rx);
                break;
            case PASS_DSV3:
                split_matches(&pc, &e, dsv3_match);
                break;
            case PASS_O200K:
                split_matches(&pc, &e, o200k_match);
                break;
            case PASS_KIMI:
                split_kimi(&pc, &e);
                break;
            }
            emit_to(&e, pc.b);
            start = pc.b;
        }
        p->n_words = e.n;
    }
    return 0;
}

void router_pretok_fini(struct router_pretok *p)
{
    free(p->cpts);
    free(p->flags);
    free(p->words);
    free(p->tmp);
    memset(p, 0, sizeof(*p));
}
