/* common/config.c - daemon config files: global keys and per-daemon sections turned into option
 * words. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define CONFIG_MAX_BYTES (1u << 20)

/* The section names a file may use: one per daemon. */
static const char *const config_sections[] = {"fetcher", "executor", "router", NULL};

/* What one line of a file holds. */
enum config_kind {
    CONFIG_BLANK,   /* blank or comment */
    CONFIG_SECTION, /* "[name]": `section` is set */
    CONFIG_KEY,     /* "key" or "key = value" */
};

/* One parsed line; the strings point into the line, which is rewritten in place. */
struct config_line {
    enum config_kind kind;    /* what the line is */
    int              section; /* CONFIG_SECTION: index in config_sections */
    char            *key;     /* CONFIG_KEY: NUL-terminated key */
    char            *value;   /* CONFIG_KEY: NUL-terminated value; NULL for a key alone */
};

const char *common_config_find(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0)
            return i + 1 < argc ? argv[i + 1] : NULL;
        if (strncmp(argv[i], "--config=", 9) == 0)
            return argv[i] + 9;
    }
    return NULL;
}

/* Index of section `name` in config_sections, or -1. */
static int config_section_index(const char *name)
{
    for (int i = 0; config_sections[i]; i++)
        if (strcmp(name, config_sections[i]) == 0)
            return i;
    return -1;
}

static char *config_skip_blanks(char *s)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    return s;
}

static void config_trim_end(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
}

static bool config_is_key_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

/* True when only blanks or a comment are left in `s`. */
static bool config_is_end(const char *s)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    return *s == '\0' || *s == '#';
}

/* Reads the double-quoted value starting at `q` (on the opening quote) in place: the unescaped
 * text is written from `q` on. Returns 0, or COMMON_EINVAL with the reason in `why`. */
static int config_unquote(char *q, char *why, size_t why_len)
{
    char *w = q;
    char *r = q + 1;
    for (;;) {
        if (*r == '\0') {
            snprintf(why, why_len, "unterminated quoted value (a closing '\"' is missing)");
            return COMMON_EINVAL;
        }
        if (*r == '"')
            break;
        if (*r == '\\' && r[1] != '\0') {
            if (r[1] != '"' && r[1] != '\\') {
                snprintf(why, why_len,
                         "unknown escape '\\%c' in a quoted value (only \\\" and \\\\ are escapes)",
                         r[1]);
                return COMMON_EINVAL;
            }
            r++;
        }
        *w++ = *r++;
    }
    if (!config_is_end(r + 1)) {
        snprintf(why, why_len, "unexpected text after the closing quote");
        return COMMON_EINVAL;
    }
    *w = '\0'; /* w < r: the text after the quote was checked above */
    return COMMON_OK;
}

/* Parses one line in place. Returns 0, or COMMON_EINVAL with the reason in `why`. */
static int config_parse_line(char *line, struct config_line *out, char *why, size_t why_len)
{
    char *p = config_skip_blanks(line);
    memset(out, 0, sizeof(*out));
    if (*p == '\0' || *p == '#') {
        out->kind = CONFIG_BLANK;
        return COMMON_OK;
    }
    if (*p == '[') {
        char *close = strchr(p, ']');
        if (!close) {
            snprintf(why, why_len, "expected ']' to close the section header");
            return COMMON_EINVAL;
        }
        *close = '\0';
        char *name = config_skip_blanks(p + 1);
        config_trim_end(name);
        if (!config_is_end(close + 1)) {
            snprintf(why, why_len, "unexpected text after the section header");
            return COMMON_EINVAL;
        }
        out->section = config_section_index(name);
        if (out->section < 0) {
            snprintf(why, why_len,
                     "unknown section '[%.64s]' (expected [fetcher], [executor] or [router])",
                     name);
            return COMMON_EINVAL;
        }
        out->kind = CONFIG_SECTION;
        return COMMON_OK;
    }
    char *key = p;
    while (config_is_key_char(*p))
        p++;
    char *key_end = p;
    p = config_skip_blanks(p);
    char next = *p;
    if (key_end == key || (next != '\0' && next != '#' && next != '=')) {
        snprintf(why, why_len, "expected 'key = value', 'key' or '[section]'");
        return COMMON_EINVAL;
    }
    *key_end = '\0';
    if (strcmp(key, "config") == 0) {
        snprintf(why, why_len, "'config' cannot be set in a config file");
        return COMMON_EINVAL;
    }
    out->kind = CONFIG_KEY;
    out->key = key;
    if (next != '=')
        return COMMON_OK; /* a key alone: a switch */
    char *v = config_skip_blanks(p + 1);
    if (*v == '\0' || *v == '#') {
        snprintf(why, why_len, "expected a value after '=' (write \"\" for an empty one)");
        return COMMON_EINVAL;
    }
    if (*v == '"') {
        int rc = config_unquote(v, why, why_len);
        if (rc < 0)
            return rc;
    } else {
        config_trim_end(v);
    }
    out->value = v;
    return COMMON_OK;
}

int common_config_argv(const char *path, const char *section, int argc, char **argv, int *out_argc,
                       char ***out_argv, struct common_errmsg *e)
{
    int want = -1; /* index of the daemon's section; -1 = global keys only */
    if (section && (want = config_section_index(section)) < 0)
        return common_errmsg_set(e, COMMON_EINVAL, "config %s: unknown section '%s' requested",
                                 path, section);
    FILE *f = fopen(path, "rb");
    if (!f)
        return common_errmsg_set(e, COMMON_ENOENT, "config %s: cannot open", path);
    char  *text = malloc(CONFIG_MAX_BYTES + 1);
    size_t len = text ? fread(text, 1, CONFIG_MAX_BYTES + 1, f) : 0;
    int    ferr = ferror(f);
    fclose(f);
    if (!text)
        return common_errmsg_set(e, COMMON_ENOMEM, "config %s: out of memory", path);
    if (ferr || len > CONFIG_MAX_BYTES) {
        free(text);
        return common_errmsg_set(e, COMMON_EIO, "config %s: %s", path,
                                 ferr ? "read failed" : "larger than 1 MiB");
    }
    text[len] = '\0';
    if (memchr(text, '\0', len)) {
        free(text);
        return common_errmsg_set(e, COMMON_EINVAL, "config %s: contains a NUL byte", path);
    }

    /* Two words per line at most, plus "--" prefixes; unquoting only shortens values: size the
     * output in one block. */
    size_t n_lines = 1;
    for (size_t i = 0; i < len; i++)
        n_lines += text[i] == '\n';
    size_t n_words = (size_t)argc + 2 * n_lines + 1;
    size_t bytes = n_words * sizeof(char *) + len + 3 * n_lines + 1;
    char **out = malloc(bytes);
    if (!out) {
        free(text);
        return common_errmsg_set(e, COMMON_ENOMEM, "config %s: out of memory", path);
    }
    char *pool = (char *)(out + n_words);
    int   n = 0;
    out[n++] = argv[0];

    size_t line_no = 0;
    int    cur = -1; /* section of the lines being read; -1 = before the first header */
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        line_no++;
        struct config_line cl;
        char               why[200];
        if (config_parse_line(line, &cl, why, sizeof(why)) < 0) {
            free(out);
            free(text);
            return common_errmsg_set(e, COMMON_EINVAL, "config %s:%zu: %s", path, line_no, why);
        }
        if (cl.kind == CONFIG_SECTION)
            cur = cl.section;
        if (cl.kind != CONFIG_KEY || (cur >= 0 && cur != want))
            continue; /* another daemon's section: checked, not taken */
        size_t kl = strlen(cl.key);
        out[n++] = pool;
        pool[0] = '-';
        pool[1] = '-';
        memcpy(pool + 2, cl.key, kl + 1);
        for (char *k = pool + 2; *k; k++)
            if (*k == '_')
                *k = '-';
        pool += kl + 3;
        if (cl.value) {
            size_t vl = strlen(cl.value);
            out[n++] = pool;
            memcpy(pool, cl.value, vl + 1);
            pool += vl + 1;
        }
    }
    free(text);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0) {
            i++; /* the file was read: drop the option and its value */
            continue;
        }
        if (strncmp(argv[i], "--config=", 9) == 0)
            continue;
        out[n++] = argv[i];
    }
    out[n] = NULL;
    *out_argc = n;
    *out_argv = out;
    return COMMON_OK;
}

int common_config_load(const char *prog, const char *section, int argc, char **argv, int *out_argc,
                       char ***out_argv, char ***owned)
{
    *out_argc = argc;
    *out_argv = argv;
    *owned = NULL;
    const char *cfg = common_config_find(argc, argv);
    if (!cfg) {
        for (int i = 1; i < argc; i++)
            if (strcmp(argv[i], "--config") == 0) {
                fprintf(stderr,
                        "%s: error: option '--config' needs a value\n"
                        "Try '%s --help' for more information.\n",
                        prog, prog);
                return COMMON_EINVAL;
            }
        return COMMON_OK;
    }
    struct common_errmsg e = {{0}};
    int                  rc = common_config_argv(cfg, section, argc, argv, out_argc, owned, &e);
    if (rc != COMMON_OK) {
        fprintf(stderr, "%s: error: %s\n", prog, e.text[0] ? e.text : common_strerror(rc));
        *out_argc = argc;
        return rc;
    }
    *out_argv = *owned;
    return COMMON_OK;
}
