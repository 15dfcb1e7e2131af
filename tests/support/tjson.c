/* tests/support/tjson.c - a minimal recursive-descent JSON reader (tests only). */
#include "tjson.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"

struct tjson_p {
    const char *s;
    int         depth;
};

static void tjson_ws(struct tjson_p *p)
{
    while (*p->s == ' ' || *p->s == '\n' || *p->s == '\r' || *p->s == '\t')
        p->s++;
}

static struct tjson *tjson_value(struct tjson_p *p);

static void tjson_put_utf8(char *out, size_t *n, uint32_t cp)
{
    if (cp < 0x80) {
        out[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*n)++] = (char)(0xC0 | (cp >> 6));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*n)++] = (char)(0xE0 | (cp >> 12));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*n)++] = (char)(0xF0 | (cp >> 18));
        out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int tjson_hex4(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Parses a string literal at p->s (which points at the quote). */
static char *tjson_string(struct tjson_p *p, size_t *len)
{
    const char *s = ++p->s;
    size_t      cap = 0;
    while (s[cap] && s[cap] != '"')
        cap += s[cap] == '\\' && s[cap + 1] ? 2 : 1;
    char  *out = malloc(cap * 2 + 8);
    size_t n = 0;
    if (!out)
        return NULL;
    while (*s && *s != '"') {
        if (*s != '\\') {
            out[n++] = *s++;
            continue;
        }
        s++;
        switch (*s) {
        case 'n':
            out[n++] = '\n';
            break;
        case 't':
            out[n++] = '\t';
            break;
        case 'r':
            out[n++] = '\r';
            break;
        case 'b':
            out[n++] = '\b';
            break;
        case 'f':
            out[n++] = '\f';
            break;
        case 'u': {
            uint32_t cp, lo;
            if (tjson_hex4(s + 1, &cp) != 0)
                goto out_bad;
            s += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && s[1] == '\\' && s[2] == 'u' &&
                tjson_hex4(s + 3, &lo) == 0) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                s += 6;
            }
            tjson_put_utf8(out, &n, cp);
            break;
        }
        case '\0':
            goto out_bad;
        default:
            out[n++] = *s;
            break;
        }
        s++;
    }
    if (*s != '"')
        goto out_bad;
    p->s = s + 1;
    out[n] = '\0';
    *len = n;
    return out;
out_bad:
    free(out);
    return NULL;
}

static struct tjson *tjson_new(enum tjson_kind k)
{
    struct tjson *v = calloc(1, sizeof(*v));
    if (v)
        v->kind = k;
    return v;
}

static int tjson_push(struct tjson *v, struct tjson *item, char *key)
{
    struct tjson **items = realloc(v->items, (v->len + 1) * sizeof(*items));
    if (!items)
        return -1;
    v->items = items;
    if (v->kind == TJSON_OBJ) {
        char **keys = realloc(v->keys, (v->len + 1) * sizeof(*keys));
        if (!keys)
            return -1;
        v->keys = keys;
        v->keys[v->len] = key;
    }
    v->items[v->len++] = item;
    return 0;
}

static struct tjson *tjson_container(struct tjson_p *p, enum tjson_kind kind, char close)
{
    struct tjson *v = tjson_new(kind);
    if (!v || ++p->depth > 64)
        goto out_bad;
    p->s++;
    tjson_ws(p);
    if (*p->s == close) {
        p->s++;
        p->depth--;
        return v;
    }
    for (;;) {
        char  *key = NULL;
        size_t klen;
        tjson_ws(p);
        if (kind == TJSON_OBJ) {
            if (*p->s != '"' || !(key = tjson_string(p, &klen)))
                goto out_bad;
            tjson_ws(p);
            if (*p->s++ != ':') {
                free(key);
                goto out_bad;
            }
        }
        struct tjson *item = tjson_value(p);
        if (!item || tjson_push(v, item, key) != 0) {
            free(key);
            tjson_free(item);
            goto out_bad;
        }
        tjson_ws(p);
        if (*p->s == ',') {
            p->s++;
            continue;
        }
        if (*p->s == close) {
            p->s++;
            p->depth--;
            return v;
        }
        goto out_bad;
    }
out_bad:
    tjson_free(v);
    return NULL;
}

static struct tjson *tjson_value(struct tjson_p *p)
{
    tjson_ws(p);
    char c = *p->s;
    if (c == '{')
        return tjson_container(p, TJSON_OBJ, '}');
    if (c == '[')
        return tjson_container(p, TJSON_ARR, ']');
    if (c == '"') {
        struct tjson *v = tjson_new(TJSON_STR);
        if (v && !(v->str = tjson_string(p, &v->len))) {
            free(v);
            return NULL;
        }
        return v;
    }
    if (strncmp(p->s, "true", 4) == 0 || strncmp(p->s, "false", 5) == 0) {
        struct tjson *v = tjson_new(TJSON_BOOL);
        if (v)
            v->num = c == 't' ? 1.0 : 0.0;
        p->s += c == 't' ? 4 : 5;
        return v;
    }
    if (strncmp(p->s, "null", 4) == 0) {
        p->s += 4;
        return tjson_new(TJSON_NULL);
    }
    char  *end = NULL;
    double d = strtod(p->s, &end);
    if (end == p->s)
        return NULL;
    p->s = end;
    struct tjson *v = tjson_new(TJSON_NUM);
    if (v)
        v->num = d;
    return v;
}

struct tjson *tjson_parse(const char *text)
{
    struct tjson_p p = {.s = text};
    struct tjson  *v = tjson_value(&p);
    tjson_ws(&p);
    if (v && *p.s != '\0') {
        tjson_free(v);
        return NULL;
    }
    return v;
}

void tjson_free(struct tjson *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->len && v->items; i++) {
        tjson_free(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

const struct tjson *tjson_get(const struct tjson *v, const char *key)
{
    if (!v || v->kind != TJSON_OBJ)
        return NULL;
    for (size_t i = 0; i < v->len; i++)
        if (strcmp(v->keys[i], key) == 0)
            return v->items[i];
    return NULL;
}

const struct tjson *tjson_at(const struct tjson *v, size_t i)
{
    if (!v || (v->kind != TJSON_ARR && v->kind != TJSON_OBJ) || i >= v->len)
        return NULL;
    return v->items[i];
}

struct tjson *tjson_load(const char *path)
{
    char *text = fixture_read_all(path, NULL);
    if (!text)
        return NULL;
    struct tjson *v = tjson_parse(text);
    free(text);
    return v;
}
