/* common/opts.c - the table-driven command-line parser: values, usage errors, generated --help. */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define OPTS_LEFT_MAX 32 /* widest option column before the help text moves to the next line */

/* The row behind the built-in -h/--help, listed with the first table. */
static const struct common_opt opts_help_row = {.name = "help",
                                                .short_name = "h",
                                                .type = COMMON_OPT_SWITCH,
                                                .help = "show this help and exit"};

/* ---- small text helpers --------------------------------------------------------------------- */

/* A bounded string being built: always NUL-terminated, silently truncated when full. */
struct opts_buf {
    char  *p;   /* borrowed: cap bytes */
    size_t cap; /* bytes of p, > 0 */
    size_t len; /* bytes used, < cap */
};

static void opts_buf_add(struct opts_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void opts_buf_add(struct opts_buf *b, const char *fmt, ...)
{
    if (b->len + 1 >= b->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        b->len += (size_t)n;
    if (b->len >= b->cap)
        b->len = b->cap - 1;
}

/* "a, b or c" from a NULL-terminated list of names. */
static void opts_buf_add_choices(struct opts_buf *b, const char *const *names, const char *sep,
                                 const char *last_sep)
{
    for (size_t i = 0; names[i]; i++)
        opts_buf_add(b, "%s%s", i == 0 ? "" : names[i + 1] ? sep : last_sep, names[i]);
}

/* ---- tables ---------------------------------------------------------------------------------- */

/* The k-th table of `spec` (its own rows first, then the groups'), with its title in *title; NULL
 * past the last. */
static const struct common_opt *opts_table(const struct common_opts_spec *spec, size_t k,
                                           const char **title)
{
    *title = NULL;
    if (spec->opts) {
        if (k == 0)
            return spec->opts;
        k--;
    }
    for (size_t g = 0; spec->groups && spec->groups[g].opts; g++) {
        if (g == k) {
            *title = spec->groups[g].title;
            return spec->groups[g].opts;
        }
    }
    return NULL;
}

static bool opts_takes_value(const struct common_opt *row)
{
    return row->type != COMMON_OPT_SWITCH && row->type != COMMON_OPT_SWITCH_OFF;
}

/* Checks one row for programming errors (asserts: tables are our own code). */
static void opts_check_row(const struct common_opt *row)
{
    assert(row->type >= COMMON_OPT_SWITCH && row->type <= COMMON_OPT_CALLBACK);
    assert(row->name[0] != '\0' && row->name[0] != '-');
    assert(strcmp(row->name, "help") != 0);
    assert(!row->short_name || (row->short_name[0] != '\0' && row->short_name[0] != '-' &&
                                strcmp(row->short_name, "h") != 0));
    assert(row->type != COMMON_OPT_CHOICE || row->choices);
    assert(row->type != COMMON_OPT_CALLBACK || row->parse);
    assert(row->max == 0.0 || row->min <= row->max);
    (void)row;
}

/* Finds the row named `name` (`len` bytes; a short name when `is_short`); sets *index to its
 * position among all rows. */
static const struct common_opt *opts_find(const struct common_opts_spec *spec, const char *name,
                                          size_t len, bool is_short, size_t *index)
{
    const char *title;
    size_t      idx = 0;
    for (size_t k = 0;; k++) {
        const struct common_opt *t = opts_table(spec, k, &title);
        if (!t)
            return NULL;
        for (const struct common_opt *row = t; row->name; row++, idx++) {
            const char *n = is_short ? row->short_name : row->name;
            if (n && strlen(n) == len && memcmp(n, name, len) == 0) {
                *index = idx;
                return row;
            }
        }
    }
}

/* ---- errors ---------------------------------------------------------------------------------- */

static int opts_vreport(const struct common_opts_spec *spec, int rc, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Prints "PROG: error: MESSAGE" and, for a usage error, the hint line, in one call; returns rc. */
static int opts_vreport(const struct common_opts_spec *spec, int rc, const char *fmt, va_list ap)
{
    const char     *prog = spec->prog ? spec->prog : "sluice";
    char            text[1200];
    struct opts_buf b = {text, sizeof(text) - 1, 0};
    opts_buf_add(&b, "%s: error: ", prog);
    if (b.len + 1 < b.cap) {
        int n = vsnprintf(b.p + b.len, b.cap - b.len, fmt, ap);
        b.len += n > 0 ? (size_t)n : 0;
        if (b.len >= b.cap)
            b.len = b.cap - 1;
    }
    text[b.len++] = '\n'; /* the buffer keeps one byte spare for this */
    text[b.len] = '\0';
    b.cap = sizeof(text);
    if (rc == COMMON_EINVAL)
        opts_buf_add(&b, "Try '%s --help' for more information.\n", prog);
    fputs(text, spec->err ? spec->err : stderr);
    return rc;
}

static int opts_report(const struct common_opts_spec *spec, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int opts_report(const struct common_opts_spec *spec, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    opts_vreport(spec, rc, fmt, ap);
    va_end(ap);
    return rc;
}

int common_opts_error(const struct common_opts_spec *spec, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    opts_vreport(spec, COMMON_EINVAL, fmt, ap);
    va_end(ap);
    return COMMON_EINVAL;
}

int common_opts_exit_status(int rc)
{
    if (rc == COMMON_OPTS_HELP || rc == COMMON_OK)
        return 0;
    return rc == COMMON_EINVAL ? 2 : 1;
}

/* ---- values ---------------------------------------------------------------------------------- */

static bool opts_is_digits(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return false;
    return true;
}

/* Decimal digits only, no sign or blank, in range of uint64_t. */
static bool opts_parse_unsigned(const char *s, uint64_t *out)
{
    if (!opts_is_digits(s))
        return false;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return false;
    *out = x;
    return true;
}

/* An optional '-' then decimal digits, in range of int64_t. */
static bool opts_parse_signed(const char *s, int64_t *out)
{
    if (!opts_is_digits(s[0] == '-' ? s + 1 : s))
        return false;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return false;
    *out = x;
    return true;
}

/* An unsigned limit from a row's double, clamped to [0, type_max]. */
static uint64_t opts_ulimit(double v, uint64_t type_max)
{
    if (!(v > 0.0))
        return 0;
    if (v >= (double)type_max)
        return type_max;
    return (uint64_t)v;
}

/* A signed limit from a row's double, clamped to [lo, hi]. */
static int64_t opts_slimit(double v, int64_t lo, int64_t hi)
{
    if (v <= (double)lo)
        return lo;
    if (v >= (double)hi)
        return hi;
    return (int64_t)v;
}

/* The accepted range of an unsigned row of a type whose largest value is `type_max`. */
static void opts_urange(const struct common_opt *row, uint64_t type_max, uint64_t *lo, uint64_t *hi)
{
    *lo = opts_ulimit(row->min, type_max);
    *hi = row->max == 0.0 ? type_max : opts_ulimit(row->max, type_max);
}

/* Writes into `b` the text after the option name for a bad value of `row`. */
static void opts_expected(const struct common_opt *row, struct opts_buf *b)
{
    uint64_t ulo, uhi;
    switch (row->type) {
    case COMMON_OPT_BOOL:
        opts_buf_add(b, "expects on or off");
        break;
    case COMMON_OPT_U32:
        opts_urange(row, UINT32_MAX, &ulo, &uhi);
        opts_buf_add(b, "expects a number in [%llu, %llu]", (unsigned long long)ulo,
                     (unsigned long long)uhi);
        break;
    case COMMON_OPT_U64:
        opts_urange(row, UINT64_MAX, &ulo, &uhi);
        opts_buf_add(b, "expects a number in [%llu, %llu]", (unsigned long long)ulo,
                     (unsigned long long)uhi);
        break;
    case COMMON_OPT_I32:
    case COMMON_OPT_I64: {
        int64_t tlo = row->type == COMMON_OPT_I32 ? INT32_MIN : INT64_MIN;
        int64_t thi = row->type == COMMON_OPT_I32 ? INT32_MAX : INT64_MAX;
        int64_t lo = opts_slimit(row->min, tlo, thi);
        int64_t hi = row->max == 0.0 ? thi : opts_slimit(row->max, tlo, thi);
        opts_buf_add(b, "expects a number in [%lld, %lld]", (long long)lo, (long long)hi);
        break;
    }
    case COMMON_OPT_F32:
        if (row->max == 0.0)
            opts_buf_add(b, "expects a number >= %g",
                         row->min < -(double)FLT_MAX ? -(double)FLT_MAX : row->min);
        else
            opts_buf_add(b, "expects a number in [%g, %g]", row->min, row->max);
        break;
    case COMMON_OPT_SIZE: {
        char lo_s[32], hi_s[32];
        opts_urange(row, UINT64_MAX, &ulo, &uhi);
        opts_buf_add(b, "expects a size like 512M or 1.5G");
        if (uhi != UINT64_MAX)
            opts_buf_add(b, " in [%s, %s]", common_format_size(ulo, lo_s, sizeof(lo_s)),
                         common_format_size(uhi, hi_s, sizeof(hi_s)));
        else if (ulo > 0)
            opts_buf_add(b, " of at least %s", common_format_size(ulo, lo_s, sizeof(lo_s)));
        break;
    }
    case COMMON_OPT_CHOICE:
        opts_buf_add(b, "expects ");
        opts_buf_add_choices(b, row->choices, ", ", " or ");
        break;
    default:
        opts_buf_add(b, "has an invalid value");
        break;
    }
}

/* Stores `value` for `row`; on a bad value fills `why` (phrased to follow the option name) and
 * returns COMMON_EINVAL, or a callback's COMMON_ENOMEM. */
static int opts_apply(const struct common_opt *row, const char *value, struct opts_buf *why)
{
    void                *t = row->target;
    uint64_t             u = 0, lo, hi;
    int64_t              s = 0;
    struct common_errmsg e = {{0}};
    switch (row->type) {
    case COMMON_OPT_SWITCH:
    case COMMON_OPT_SWITCH_OFF:
        if (t)
            *(bool *)t = row->type == COMMON_OPT_SWITCH;
        return COMMON_OK;
    case COMMON_OPT_BOOL: {
        static const char *const on[] = {"on", "true", "yes", "1"};
        static const char *const off[] = {"off", "false", "no", "0"};
        for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
            if (strcmp(value, on[i]) == 0 || strcmp(value, off[i]) == 0) {
                if (t)
                    *(bool *)t = strcmp(value, on[i]) == 0;
                return COMMON_OK;
            }
        }
        break;
    }
    case COMMON_OPT_STR:
        if (t)
            *(const char **)t = value;
        return COMMON_OK;
    case COMMON_OPT_STRS: {
        struct common_opt_strs *l = t;
        if (!l)
            return COMMON_OK;
        if (l->n >= l->cap) {
            opts_buf_add(why, "may be given at most %u times", l->cap);
            return COMMON_EINVAL;
        }
        l->v[l->n++] = value;
        return COMMON_OK;
    }
    case COMMON_OPT_U32:
    case COMMON_OPT_U64:
    case COMMON_OPT_SIZE:
        opts_urange(row, row->type == COMMON_OPT_U32 ? UINT32_MAX : UINT64_MAX, &lo, &hi);
        if (row->type == COMMON_OPT_SIZE ? common_parse_size(value, &u) != COMMON_OK
                                         : !opts_parse_unsigned(value, &u))
            break;
        if (u < lo || u > hi)
            break;
        if (t && row->type == COMMON_OPT_U32)
            *(uint32_t *)t = (uint32_t)u;
        else if (t)
            *(uint64_t *)t = u;
        return COMMON_OK;
    case COMMON_OPT_I32:
    case COMMON_OPT_I64: {
        int64_t tlo = row->type == COMMON_OPT_I32 ? INT32_MIN : INT64_MIN;
        int64_t thi = row->type == COMMON_OPT_I32 ? INT32_MAX : INT64_MAX;
        int64_t slo = opts_slimit(row->min, tlo, thi);
        int64_t shi = row->max == 0.0 ? thi : opts_slimit(row->max, tlo, thi);
        if (!opts_parse_signed(value, &s) || s < slo || s > shi)
            break;
        if (t && row->type == COMMON_OPT_I32)
            *(int32_t *)t = (int32_t)s;
        else if (t)
            *(int64_t *)t = s;
        return COMMON_OK;
    }
    case COMMON_OPT_F32: {
        double flo = row->min < -(double)FLT_MAX ? -(double)FLT_MAX : row->min;
        double fhi = row->max == 0.0 || row->max > (double)FLT_MAX ? (double)FLT_MAX : row->max;
        char  *end = NULL;
        if (!*value || isspace((unsigned char)*value))
            break;
        errno = 0;
        double x = strtod(value, &end);
        if (*end != '\0' || errno == ERANGE || !isfinite(x) || x < flo || x > fhi)
            break;
        if (t)
            *(float *)t = (float)x;
        return COMMON_OK;
    }
    case COMMON_OPT_CHOICE:
        for (size_t i = 0; row->choices[i]; i++) {
            if (strcmp(value, row->choices[i]) == 0) {
                if (t)
                    *(int *)t = row->choice_values ? row->choice_values[i] : (int)i;
                return COMMON_OK;
            }
        }
        break;
    case COMMON_OPT_U32_LIST: {
        uint32_t lo32 = (uint32_t)opts_ulimit(row->min, UINT32_MAX);
        uint32_t hi32 = row->max == 0.0 ? UINT32_MAX : (uint32_t)opts_ulimit(row->max, UINT32_MAX);
        struct common_opt_u32_list scratch = {.v = NULL, .cap = UINT32_MAX};
        int rc = common_opt_parse_u32_list(value, lo32, hi32, t ? t : &scratch, &e);
        if (rc >= 0)
            return COMMON_OK;
        opts_buf_add(why, "%s", e.text);
        return COMMON_EINVAL;
    }
    case COMMON_OPT_CALLBACK: {
        int rc = row->parse(t, value, &e);
        if (rc >= 0)
            return COMMON_OK;
        if (e.text[0])
            opts_buf_add(why, "%s", e.text);
        return rc == COMMON_ENOMEM ? rc : COMMON_EINVAL;
    }
    }
    opts_expected(row, why);
    opts_buf_add(why, ", got '%s'", value);
    return COMMON_EINVAL;
}

/* ---- parsing --------------------------------------------------------------------------------- */

/* Takes one positional argument; returns 0 or a usage error. */
static int opts_positional(const struct common_opts_spec *spec, const char *arg)
{
    struct common_opt_strs *p = spec->positional;
    if (!p || p->n >= p->cap)
        return opts_report(spec, COMMON_EINVAL, "unexpected argument '%s'", arg);
    p->v[p->n++] = arg;
    return COMMON_OK;
}

int common_opts_parse(const struct common_opts_spec *spec, int argc, char *const *argv)
{
    bool        given[COMMON_OPTS_MAX_ROWS] = {false};
    bool        only_positional = false;
    size_t      n_rows = 0;
    const char *title;
    for (size_t k = 0; opts_table(spec, k, &title); k++)
        for (const struct common_opt *row = opts_table(spec, k, &title); row->name; row++) {
            opts_check_row(row);
            n_rows++;
        }
    assert(n_rows <= COMMON_OPTS_MAX_ROWS);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_positional || a[0] != '-' || a[1] == '\0') {
            int rc = opts_positional(spec, a);
            if (rc < 0)
                return rc;
            only_positional = only_positional || spec->stop_at_positional;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_positional = true;
            continue;
        }
        bool        is_long = a[1] == '-';
        const char *name = a + (is_long ? 2 : 1);
        const char *eq = strchr(name, '=');
        size_t      name_len = eq ? (size_t)(eq - name) : strlen(name);
        int         typed_len = (int)(name - a + (ptrdiff_t)name_len); /* "--temp" of "--temp=1" */
        if (name_len == (is_long ? 4u : 1u) &&
            memcmp(name, is_long ? "help" : "h", name_len) == 0) {
            if (eq)
                return opts_report(spec, COMMON_EINVAL, "option '%.*s' takes no value", typed_len,
                                   a);
            common_opts_help(spec, spec->out ? spec->out : stdout);
            return COMMON_OPTS_HELP;
        }
        size_t                   index = 0;
        const struct common_opt *row = opts_find(spec, name, name_len, !is_long, &index);
        if (!row)
            return opts_report(spec, COMMON_EINVAL, "unknown option '%.*s'", typed_len, a);
        const char *value = NULL;
        if (!opts_takes_value(row)) {
            if (eq)
                return opts_report(spec, COMMON_EINVAL, "option '%.*s' takes no value", typed_len,
                                   a);
        } else if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            return opts_report(spec, COMMON_EINVAL, "option '%.*s' needs a value", typed_len, a);
        }
        char            why_text[600];
        struct opts_buf why = {why_text, sizeof(why_text), 0};
        why_text[0] = '\0';
        int rc = opts_apply(row, value, &why);
        if (rc < 0) {
            if (why.len == 0)
                return opts_report(spec, rc, "%.*s: invalid value '%s'", typed_len, a, value);
            return opts_report(spec, rc, "%.*s %s", typed_len, a, why_text);
        }
        if (index < COMMON_OPTS_MAX_ROWS)
            given[index] = true;
        if (row->seen)
            *row->seen = true;
    }

    size_t idx = 0;
    for (size_t k = 0; opts_table(spec, k, &title); k++)
        for (const struct common_opt *row = opts_table(spec, k, &title); row->name; row++, idx++)
            if (row->required && idx < COMMON_OPTS_MAX_ROWS && !given[idx])
                return opts_report(spec, COMMON_EINVAL, "option '--%s' is required", row->name);
    return COMMON_OK;
}

/* ---- list values ----------------------------------------------------------------------------- */

int common_opt_parse_u32_list(const char *s, uint32_t min, uint32_t max,
                              struct common_opt_u32_list *out, struct common_errmsg *e)
{
    /* Two passes: check and count every item first, so a bad list leaves `out` unchanged. */
    for (int pass = 0; pass < 2; pass++) {
        uint32_t    n = 0;
        const char *p = s;
        for (;;) {
            size_t len = strcspn(p, ",");
            n++;
            if (pass == 0) {
                char     item[24];
                uint64_t v = 0;
                if (len == 0)
                    return common_errmsg_set(e, COMMON_EINVAL,
                                             "expects comma-separated numbers in [%u, %u], got "
                                             "'%s' (item %u is empty)",
                                             min, max, s, n);
                bool ok = len < sizeof(item);
                if (ok) {
                    memcpy(item, p, len);
                    item[len] = '\0';
                    ok = opts_parse_unsigned(item, &v) && v >= min && v <= max;
                }
                if (!ok)
                    return common_errmsg_set(e, COMMON_EINVAL,
                                             "expects comma-separated numbers in [%u, %u], got "
                                             "'%s' (item %u is '%.*s')",
                                             min, max, s, n, (int)len, p);
                if (n > out->cap)
                    return common_errmsg_set(e, COMMON_ERANGE,
                                             "takes at most %u comma-separated numbers, got '%s'",
                                             out->cap, s);
            } else {
                out->v[n - 1] = (uint32_t)strtoul(p, NULL, 10); /* checked in the first pass */
            }
            if (p[len] == '\0')
                break;
            p += len + 1;
        }
        if (pass == 1 || !out->v) {
            if (out->v)
                out->n = n;
            return COMMON_OK;
        }
    }
    return COMMON_OK;
}

/* ---- help ------------------------------------------------------------------------------------ */

/* A word wrapper writing to `f`: words go on the current line while they fit in `width`
 * columns, otherwise on a new line indented by `indent` spaces. */
struct opts_wrap {
    FILE  *f;      /* borrowed: the help stream */
    size_t col;    /* current column */
    size_t indent; /* column where continuation lines start */
    size_t width;  /* last usable column */
    bool   fresh;  /* nothing written on this line since the indent: no space before a word */
};

static void opts_pad(FILE *f, size_t from, size_t to)
{
    for (; from < to; from++)
        fputc(' ', f);
}

static void opts_wrap_newline(struct opts_wrap *w)
{
    fputc('\n', w->f);
    opts_pad(w->f, 0, w->indent);
    w->col = w->indent;
    w->fresh = true;
}

static void opts_wrap_word(struct opts_wrap *w, const char *s, size_t n)
{
    if (!w->fresh && w->col + 1 + n > w->width)
        opts_wrap_newline(w);
    if (!w->fresh) {
        fputc(' ', w->f);
        w->col++;
    }
    fwrite(s, 1, n, w->f);
    w->col += n;
    w->fresh = false;
}

/* Wraps `len` bytes of `s`: blanks separate words, '\n' forces a line break. */
static void opts_wrap_text(struct opts_wrap *w, const char *s, size_t len)
{
    const char *end = s + len;
    while (s < end) {
        if (*s == '\n') {
            opts_wrap_newline(w);
            s++;
        } else if (*s == ' ') {
            s++;
        } else {
            size_t n = 0;
            while (s + n < end && s[n] != ' ' && s[n] != '\n')
                n++;
            opts_wrap_word(w, s, n);
            s += n;
        }
    }
}

/* Prints a description or epilog: lines that fit are kept as written, longer ones wrapped with
 * continuation lines indented like the line itself. */
static void opts_paragraph(FILE *f, const char *text)
{
    while (*text) {
        size_t len = strcspn(text, "\n");
        if (len <= COMMON_OPTS_HELP_WIDTH) {
            fwrite(text, 1, len, f);
        } else {
            size_t indent = strspn(text, " ");
            opts_pad(f, 0, indent);
            struct opts_wrap w = {f, indent, indent, COMMON_OPTS_HELP_WIDTH, true};
            opts_wrap_text(&w, text + indent, len - indent);
        }
        fputc('\n', f);
        text += len;
        if (*text == '\n')
            text++;
    }
}

/* Writes the metavar of a row taking a value. */
static void opts_add_metavar(struct opts_buf *b, const struct common_opt *row)
{
    static const char *const names[] = {
        [COMMON_OPT_BOOL] = "on|off",    [COMMON_OPT_STR] = "TEXT",
        [COMMON_OPT_STRS] = "TEXT",      [COMMON_OPT_U32] = "N",
        [COMMON_OPT_U64] = "N",          [COMMON_OPT_I32] = "N",
        [COMMON_OPT_I64] = "N",          [COMMON_OPT_F32] = "X",
        [COMMON_OPT_SIZE] = "SIZE",      [COMMON_OPT_U32_LIST] = "N,N,...",
        [COMMON_OPT_CALLBACK] = "VALUE",
    };
    if (row->metavar)
        opts_buf_add(b, "%s", row->metavar);
    else if (row->type == COMMON_OPT_CHOICE)
        opts_buf_add_choices(b, row->choices, "|", "|");
    else
        opts_buf_add(b, "%s", names[row->type]);
}

/* The option column of a row: "-m, --model PATH", short names padded to `short_w`. */
static size_t opts_left(const struct common_opt *row, size_t short_w, char *text, size_t cap)
{
    struct opts_buf b = {text, cap, 0};
    text[0] = '\0';
    if (row->short_name)
        opts_buf_add(&b, "-%s, ", row->short_name);
    while (b.len < short_w && b.len + 1 < b.cap)
        opts_buf_add(&b, " ");
    opts_buf_add(&b, "--%s", row->name);
    if (opts_takes_value(row)) {
        opts_buf_add(&b, " ");
        opts_add_metavar(&b, row);
    }
    return b.len;
}

/* Columns of the help text of a row, "(required)" included; SIZE_MAX when it has a '\n'. */
static size_t opts_help_len(const struct common_opt *row)
{
    const char *h = row->help ? row->help : "";
    if (strchr(h, '\n'))
        return SIZE_MAX;
    return strlen(h) + (row->required ? strlen(" (required)") : 0);
}

/* Column layout shared by every row of one --help. */
struct opts_layout {
    size_t short_w;  /* width of the "-m, " column; 0 when no row has a short name */
    size_t help_col; /* column where help texts start */
    size_t def_col;  /* column where "[default]" starts on rows whose help fits before it */
};

static void opts_row_help(FILE *f, const struct common_opt *row, const struct opts_layout *lay)
{
    char   left[256];
    size_t n = opts_left(row, lay->short_w, left, sizeof(left));
    fprintf(f, "  %s", left);
    struct opts_wrap w = {f, 2 + n, lay->help_col, COMMON_OPTS_HELP_WIDTH, true};
    if (!row->help && !row->def && !row->required) {
        fputc('\n', f);
        return;
    }
    if (w.col + 2 > lay->help_col) {
        opts_wrap_newline(&w);
    } else {
        opts_pad(f, w.col, lay->help_col);
        w.col = lay->help_col;
    }
    if (row->help)
        opts_wrap_text(&w, row->help, strlen(row->help));
    if (row->required)
        opts_wrap_word(&w, "(required)", strlen("(required)"));
    if (row->def) {
        char            def[160];
        struct opts_buf b = {def, sizeof(def), 0};
        opts_buf_add(&b, "[%s]", row->def);
        size_t hl = opts_help_len(row);
        if (hl != SIZE_MAX && lay->help_col + hl + 2 <= lay->def_col &&
            lay->def_col + b.len <= COMMON_OPTS_HELP_WIDTH) {
            opts_pad(f, w.col, lay->def_col);
            fputs(def, f);
        } else {
            opts_wrap_word(&w, def, b.len);
        }
    }
    fputc('\n', f);
}

void common_opts_help(const struct common_opts_spec *spec, FILE *f)
{
    const char              *prog = spec->prog ? spec->prog : "sluice";
    const char              *title;
    const struct common_opt *t;
    struct opts_layout       lay = {0, 0, 0};
    size_t                   left_w = 0, help_w = 0;
    char                     left[256];
    const struct common_opt *first = opts_table(spec, 0, &title);

    if (spec->usage)
        fprintf(f, "usage: %s\n", spec->usage);
    else
        fprintf(f, "usage: %s [options]\n", prog);
    if (spec->description) {
        fputc('\n', f);
        opts_paragraph(f, spec->description);
    }

    /* Layout: the short column fits the longest short name, the help column the longest option
     * column (up to OPTS_LEFT_MAX), the default column the longest one-line help with a default
     * that still leaves room for it. */
    for (size_t pass = 0; pass < 3; pass++) {
        for (size_t k = 0; (t = opts_table(spec, k, &title)) || k == 0; k++) {
            for (const struct common_opt *row = t; row && row->name; row++) {
                if (pass == 0 && row->short_name && strlen(row->short_name) + 3 > lay.short_w)
                    lay.short_w = strlen(row->short_name) + 3;
                if (pass == 1) {
                    size_t n = opts_left(row, lay.short_w, left, sizeof(left));
                    if (n <= OPTS_LEFT_MAX && n > left_w)
                        left_w = n;
                }
                size_t hl = opts_help_len(row);
                if (pass == 2 && row->def && hl != SIZE_MAX &&
                    lay.help_col + hl + 2 + strlen(row->def) + 2 <= COMMON_OPTS_HELP_WIDTH &&
                    hl > help_w)
                    help_w = hl;
            }
            if (!t)
                break;
        }
        if (pass == 0 && lay.short_w < strlen(opts_help_row.short_name) + 3)
            lay.short_w = strlen(opts_help_row.short_name) + 3;
        if (pass == 1) {
            size_t n = opts_left(&opts_help_row, lay.short_w, left, sizeof(left));
            left_w = n > left_w ? n : left_w;
            lay.help_col = 2 + left_w + 2;
        }
    }
    lay.def_col = lay.help_col + help_w + 2;

    for (size_t k = 0; (t = opts_table(spec, k, &title)) || k == 0; k++) {
        fprintf(f, "\n%s:\n", title ? title : "Options");
        for (const struct common_opt *row = t; row && row->name; row++)
            opts_row_help(f, row, &lay);
        if (t == first)
            opts_row_help(f, &opts_help_row, &lay);
        if (!t)
            break;
    }
    if (spec->epilog) {
        fputc('\n', f);
        opts_paragraph(f, spec->epilog);
    }
}

int common_opts_parse_shares(const char *v, float *out, uint32_t cap, uint32_t *n,
                             struct common_errmsg *e)
{
    float    sp[64];
    uint32_t k = 0;
    double   sum = 0;
    cap = cap < 64 ? cap : 64;
    for (const char *p = v;; p++) {
        char       *end = NULL;
        const float f = strtof(p, &end);
        if (end == p || (*end && *end != ',' && *end != '/') || !(f >= 0.0f) || f > 1e9f ||
            k == cap)
            return common_errmsg_set(e, COMMON_EINVAL,
                                     "expects shares >= 0 separated by commas (e.g. 3,1; at most "
                                     "%u), got '%s'",
                                     cap, v);
        sp[k++] = f;
        sum += (double)f;
        if (!*end)
            break;
        p = end;
    }
    if (!(sum > 0))
        return common_errmsg_set(e, COMMON_EINVAL, "expects a share above 0, got '%s'", v);
    memcpy(out, sp, k * sizeof(*sp));
    *n = k;
    return COMMON_OK;
}

void common_shares_starts(const double *share, uint32_t n, uint32_t n_items, uint32_t *start)
{
    double total = 0, cum = 0;
    for (uint32_t k = 0; k < n; k++)
        total += share[k];
    start[0] = 0;
    for (uint32_t k = 0; k < n; k++) {
        cum += total > 0 ? share[k] : 1.0;
        const double   at = (double)n_items * cum / (total > 0 ? total : (double)n);
        const uint32_t l = (uint32_t)ceil(at - 1e-9);
        start[k + 1] = l > n_items ? n_items : l < start[k] ? start[k] : l;
    }
    start[n] = n_items;
}
