/* common/config.c - daemon config files: "key = value" lines turned into option words. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define CONFIG_MAX_BYTES (1u << 20)

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

static char *config_trim(char *s)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

int common_config_argv(const char *path, int argc, char **argv, int *out_argc, char ***out_argv,
                       struct common_errmsg *e)
{
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

    /* Two words per line at most, plus "--" prefixes: size the output in one block. */
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
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        line_no++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *l = config_trim(line);
        if (!*l)
            continue;
        char *eq = strchr(l, '=');
        char *val = NULL;
        if (eq) {
            *eq = '\0';
            val = config_trim(eq + 1);
        }
        char *key = config_trim(l);
        bool  ok = *key != '\0' && (!eq || *val != '\0');
        for (char *k = key; ok && *k; k++)
            ok = isalnum((unsigned char)*k) || *k == '-' || *k == '_' || *k == '.';
        if (!ok || strcmp(key, "config") == 0) {
            free(out);
            free(text);
            return common_errmsg_set(
                e, COMMON_EINVAL, "config %s:%zu: expected 'key = value' or 'key'", path, line_no);
        }
        size_t kl = strlen(key);
        out[n++] = pool;
        pool[0] = '-';
        pool[1] = '-';
        memcpy(pool + 2, key, kl + 1);
        for (char *k = pool + 2; *k; k++)
            if (*k == '_')
                *k = '-';
        pool += kl + 3;
        if (eq) {
            size_t vl = strlen(val);
            out[n++] = pool;
            memcpy(pool, val, vl + 1);
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

int common_config_load(const char *prog, int argc, char **argv, int *out_argc, char ***out_argv,
                       char ***owned)
{
    *out_argc = argc;
    *out_argv = argv;
    *owned = NULL;
    const char *cfg = common_config_find(argc, argv);
    if (!cfg) {
        for (int i = 1; i < argc; i++)
            if (strcmp(argv[i], "--config") == 0) {
                fprintf(stderr, "%s: error: --config needs a value\n", prog);
                return COMMON_EINVAL;
            }
        return COMMON_OK;
    }
    struct common_errmsg e = {{0}};
    int                  rc = common_config_argv(cfg, argc, argv, out_argc, owned, &e);
    if (rc != COMMON_OK) {
        fprintf(stderr, "%s: error: %s\n", prog, e.text[0] ? e.text : common_strerror(rc));
        *out_argc = argc;
        return rc;
    }
    *out_argv = *owned;
    return COMMON_OK;
}
