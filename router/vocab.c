/* router/vocab.c - struct router_vocab: a tokenizer vocabulary built from GGUF tokenizer metadata.
 */
#include "vocab.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

#define LOG_COMP "router.vocab"

/* Token strings llama.cpp treats as end of generation (llama_vocab::impl::load). */
static const char *const k_eog_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
    "[EOT]", /* Kimi K2 */
    "[EOS]",
};

/* Token strings llama.cpp takes as EOT when tokenizer.ggml.eot_token_id is absent. */
static const char *const k_eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",         "<end_of_turn>",         "<|endoftext|>",
    "<EOT>",      "_<EOT>",     "<|end_of_text|>", "<｜end▁of▁sentence｜>", "[EOT]",
};

enum vocab_token_type {
    TT_UNDEFINED = 0,
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER_DEFINED = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6,
};

static uint32_t attr_from_type(int64_t t)
{
    switch (t) {
    case TT_NORMAL:
        return ROUTER_ATTR_NORMAL;
    case TT_UNKNOWN:
        return ROUTER_ATTR_UNKNOWN;
    case TT_CONTROL:
        return ROUTER_ATTR_CONTROL;
    case TT_USER_DEFINED:
        return ROUTER_ATTR_USER_DEFINED;
    case TT_UNUSED:
        return ROUTER_ATTR_UNUSED;
    case TT_BYTE:
        return ROUTER_ATTR_BYTE;
    default:
        return ROUTER_ATTR_UNDEFINED;
    }
}

static bool is_int_type(uint32_t t)
{
    return t == COMMON_GGUF_UINT8 || t == COMMON_GGUF_INT8 || t == COMMON_GGUF_UINT16 ||
           t == COMMON_GGUF_INT16 || t == COMMON_GGUF_UINT32 || t == COMMON_GGUF_INT32 ||
           t == COMMON_GGUF_UINT64 || t == COMMON_GGUF_INT64;
}

/* Finds an optional array key; *arr NULL when absent. */
static int vocab_find_arr(const struct common_gguf *g, const char *key,
                          const struct common_gguf_value **arr, struct common_errmsg *e)
{
    const struct common_gguf_kv *kv = common_gguf_find(g, key);
    *arr = NULL;
    if (!kv)
        return 0;
    if (kv->value.type != COMMON_GGUF_ARRAY)
        return common_errmsg_set(e, COMMON_ECORRUPT, "%s is a %s, not an array", key,
                                 common_gguf_vtype_name(kv->value.type));
    *arr = &kv->value;
    return 0;
}

static int vocab_get_bool(const struct common_gguf *g, const char *key, bool *out,
                          struct common_errmsg *e)
{
    int rc = common_gguf_get_bool(g, key, out);
    if (rc == COMMON_ENOENT)
        return 0;
    if (rc < 0)
        return common_errmsg_set(e, COMMON_ECORRUPT, "%s is not a bool", key);
    return 0;
}

/* Reads an optional special-token id; absent or negative keeps *id. */
static int vocab_get_id(const struct common_gguf *g, const char *key, uint32_t n_tokens,
                        int32_t *id, struct common_errmsg *e)
{
    int64_t v;
    int     rc = common_gguf_get_i64(g, key, &v);
    if (rc == COMMON_ENOENT)
        return 0;
    if (rc < 0)
        return common_errmsg_set(e, COMMON_ECORRUPT, "%s is not an integer", key);
    if (v < 0)
        return 0; /* some converters write -1 for "none" */
    if (v >= (int64_t)n_tokens)
        return common_errmsg_set(e, COMMON_ECORRUPT, "%s = %lld is out of range (%u tokens)", key,
                                 (long long)v, n_tokens);
    *id = (int32_t)v;
    return 0;
}

static int vocab_load_tokens(struct router_vocab *v, const struct common_gguf_value *toks,
                             struct common_errmsg *e)
{
    const uint32_t n = v->n_tokens;
    uint64_t       total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += toks->v.arr.strs[i].len ? toks->v.arr.strs[i].len + 1 : 24;
    v->text = malloc(total ? total : 1);
    v->text_off = calloc(n, sizeof(*v->text_off));
    v->text_len = calloc(n, sizeof(*v->text_len));
    if (!v->text || !v->text_off || !v->text_len)
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory for %u tokens", n);
    int rc = router_strmap_init(&v->token_map, n);
    if (rc < 0)
        return common_errmsg_set(e, rc, "out of memory for the token map");

    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct common_gguf_str *s = &toks->v.arr.strs[i];
        char                         *dst = v->text + off;
        size_t                        len;
        if (s->len == 0) {
            /* llama.cpp renames empty tokens so that they cannot match anything */
            len = (size_t)snprintf(dst, 24, "[EMPTY_%u]", i);
            COMMON_LOG_WARN(LOG_COMP, "empty token id=%u renamed to %s", i, dst);
        } else {
            if (s->len >= UINT32_MAX)
                return common_errmsg_set(e, COMMON_ECORRUPT, "token %u is too long", i);
            len = (size_t)s->len;
            memcpy(dst, s->ptr, len);
            dst[len] = '\0';
        }
        v->text_off[i] = off;
        v->text_len[i] = (uint32_t)len;
        off += len + 1;
        int32_t old = -1;
        rc = router_strmap_put(&v->token_map, dst, len, (int32_t)i, &old);
        if (rc < 0)
            return common_errmsg_set(e, rc, "out of memory for the token map");
        if (rc == 0)
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "duplicate token in vocabulary: ids %d and %u are both '%.*s'",
                                     old, i, (int)(len > 64 ? 64 : len), dst);
    }
    return 0;
}

static int vocab_load_scores_types(struct router_vocab *v, const struct common_gguf *g,
                                   struct common_errmsg *e)
{
    const uint32_t                  n = v->n_tokens;
    const struct common_gguf_value *arr;
    int                             rc;

    v->scores = calloc(n, sizeof(*v->scores));
    v->attr = calloc(n, sizeof(*v->attr));
    v->eog = calloc(n, sizeof(*v->eog));
    if (!v->scores || !v->attr || !v->eog)
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory for %u tokens", n);

    if ((rc = vocab_find_arr(g, "tokenizer.ggml.scores", &arr, e)) < 0)
        return rc;
    if (arr) {
        if (arr->v.arr.type != COMMON_GGUF_FLOAT32 && arr->v.arr.type != COMMON_GGUF_INT32)
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "tokenizer.ggml.scores holds %s, not float32",
                                     common_gguf_vtype_name(arr->v.arr.type));
        if (arr->v.arr.n != n)
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "tokenizer.ggml.scores has %llu entries but there are %u "
                                     "tokens",
                                     (unsigned long long)arr->v.arr.n, n);
        for (uint32_t i = 0; i < n; i++)
            v->scores[i] = (float)common_gguf_arr_f64(arr, i);
    }

    if ((rc = vocab_find_arr(g, "tokenizer.ggml.token_type", &arr, e)) < 0)
        return rc;
    if (arr) {
        if (!is_int_type(arr->v.arr.type))
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "tokenizer.ggml.token_type holds %s, not int32",
                                     common_gguf_vtype_name(arr->v.arr.type));
        if (arr->v.arr.n != n)
            return common_errmsg_set(e, COMMON_ECORRUPT,
                                     "tokenizer.ggml.token_type has %llu entries but there are "
                                     "%u tokens",
                                     (unsigned long long)arr->v.arr.n, n);
        for (uint32_t i = 0; i < n; i++)
            v->attr[i] = attr_from_type(common_gguf_arr_i64(arr, i));
    } else {
        for (uint32_t i = 0; i < n; i++)
            v->attr[i] = ROUTER_ATTR_NORMAL;
    }
    return 0;
}

static int vocab_load_merges(struct router_vocab *v, const struct common_gguf *g,
                             struct common_errmsg *e)
{
    const struct common_gguf_value *arr;
    int                             rc = vocab_find_arr(g, "tokenizer.ggml.merges", &arr, e);
    if (rc < 0)
        return rc;
    if (!arr)
        return common_errmsg_set(e, COMMON_ENOENT, "gpt2 tokenizer without tokenizer.ggml.merges");
    if (arr->v.arr.type != COMMON_GGUF_STRING)
        return common_errmsg_set(e, COMMON_ECORRUPT, "tokenizer.ggml.merges holds %s, not strings",
                                 common_gguf_vtype_name(arr->v.arr.type));
    const uint64_t n = arr->v.arr.n;
    uint64_t       total = 0;
    if (n > INT32_MAX)
        return common_errmsg_set(e, COMMON_ECORRUPT, "too many merges (%llu)",
                                 (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++)
        total += arr->v.arr.strs[i].len + 1;
    v->merges = malloc(total ? total : 1);
    if (!v->merges || router_strmap_init(&v->merge_map, (size_t)n) < 0)
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory for %llu merges",
                                 (unsigned long long)n);
    uint64_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        const struct common_gguf_str *s = &arr->v.arr.strs[i];
        if (s->len >= UINT32_MAX)
            return common_errmsg_set(e, COMMON_ECORRUPT, "merge %llu is too long",
                                     (unsigned long long)i);
        memcpy(v->merges + off, s->ptr, s->len);
        v->merges[off + s->len] = '\0';
        /* The first of duplicate merges keeps its rank, as in llama.cpp (map emplace). */
        if (router_strmap_put(&v->merge_map, v->merges + off, s->len, (int32_t)i, NULL) < 0)
            return common_errmsg_set(e, COMMON_ENOMEM, "out of memory for the merge map");
        if (s->len > v->max_merge_len)
            v->max_merge_len = s->len;
        off += s->len + 1;
    }
    return 0;
}

static void vocab_mark_control(struct router_vocab *v, int32_t id)
{
    if (!(v->attr[id] & ROUTER_ATTR_CONTROL)) {
        size_t      len;
        const char *t = router_vocab_str(v, id, &len);
        COMMON_LOG_DEBUG(LOG_COMP, "control-looking token id=%d '%.*s' made control", id, (int)len,
                         t);
        v->attr[id] |= ROUTER_ATTR_CONTROL;
    }
}

/* End-of-generation tokens and EOT, recognised by text as llama.cpp does. */
static void vocab_find_eog(struct router_vocab *v)
{
    for (size_t k = 0; k < sizeof(k_eot_texts) / sizeof(k_eot_texts[0]) && v->eot < 0; k++) {
        int32_t id = router_strmap_get(&v->token_map, k_eot_texts[k], strlen(k_eot_texts[k]));
        if (id >= 0) {
            v->eot = id;
            vocab_mark_control(v, id);
        }
    }
    for (size_t k = 0; k < sizeof(k_eog_texts) / sizeof(k_eog_texts[0]); k++) {
        int32_t id = router_strmap_get(&v->token_map, k_eog_texts[k], strlen(k_eog_texts[k]));
        if (id >= 0) {
            v->eog[id] = 1;
            vocab_mark_control(v, id);
        }
    }
    if (v->eos >= 0)
        v->eog[v->eos] = 1;
    if (v->eot >= 0)
        v->eog[v->eot] = 1;
}

/* A special token and its text length, for sorting longest first. */
struct special_key {
    uint32_t len;
    int32_t  id;
};

static int special_cmp(const void *a, const void *b)
{
    const struct special_key *ka = a, *kb = b;
    if (ka->len != kb->len)
        return ka->len > kb->len ? -1 : 1;
    return ka->id < kb->id ? -1 : ka->id > kb->id; /* ties by id: the same order everywhere */
}

static int vocab_build_special(struct router_vocab *v, const struct common_gguf *g,
                               struct common_errmsg *e)
{
    const uint32_t mask = ROUTER_ATTR_CONTROL | ROUTER_ATTR_USER_DEFINED | ROUTER_ATTR_UNKNOWN;
    uint32_t       n = 0;
    for (uint32_t i = 0; i < v->n_tokens; i++)
        n += (v->attr[i] & mask) != 0;
    v->special = calloc(n ? n : 1, sizeof(*v->special));
    struct special_key *keys = calloc(n ? n : 1, sizeof(*keys));
    if (!v->special || !keys) {
        free(keys);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (v->attr[i] & mask)
            keys[v->n_special++] = (struct special_key){v->text_len[i], (int32_t)i};
    }
    qsort(keys, v->n_special, sizeof(*keys), special_cmp);
    for (uint32_t k = 0; k < v->n_special; k++)
        v->special[k] = keys[k].id;
    free(keys);

    /* Phi-3: special tokens eat the white space after them (llama.cpp, by model name). */
    struct common_gguf_str name;
    if (common_gguf_get_str(g, "general.name", &name) == 0) {
        char   lower[128];
        size_t n_name = name.len < sizeof(lower) - 1 ? (size_t)name.len : sizeof(lower) - 1;
        for (size_t i = 0; i < n_name; i++)
            lower[i] = (char)tolower((unsigned char)name.ptr[i]);
        lower[n_name] = '\0';
        if (strstr(lower, "phi-3") || strstr(lower, "phi3")) {
            for (uint32_t k = 0; k < v->n_special; k++)
                v->attr[v->special[k]] |= ROUTER_ATTR_RSTRIP;
            int32_t id = router_strmap_get(&v->token_map, "</s>", 4);
            if (id >= 0)
                v->attr[id] |= ROUTER_ATTR_RSTRIP;
            static const char *const no_rstrip[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (size_t k = 0; k < 3; k++) {
                id = router_strmap_get(&v->token_map, no_rstrip[k], strlen(no_rstrip[k]));
                if (id >= 0)
                    v->attr[id] &= ~(uint32_t)ROUTER_ATTR_RSTRIP;
            }
        }
    }
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Byte of a "<0xHH>" token, or -1. */
static int byte_token_value(const char *t, size_t len)
{
    if (len != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>')
        return -1;
    int hi = hexval(t[3]), lo = hexval(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Appends the detokenized text of token `id` (special tokens rendered) to `out`, as llama.cpp's
 * token_to_piece(special = true) computes it. */
static int vocab_piece_of(const struct router_vocab *v, int32_t id, struct router_text *out)
{
    size_t         len;
    const char    *t = router_vocab_str(v, id, &len);
    const uint32_t attr = v->attr[id];
    if (attr & (ROUTER_ATTR_UNKNOWN | ROUTER_ATTR_CONTROL | ROUTER_ATTR_USER_DEFINED))
        return router_text_append(out, t, len);
    if (attr & ROUTER_ATTR_NORMAL) {
        if (v->type == ROUTER_VOCAB_SPM) {
            /* U+2581 stands for a space */
            size_t i = 0, run = 0;
            int    rc = 0;
            while (i < len && rc == 0) {
                if (len - i >= 3 && memcmp(t + i, "\xE2\x96\x81", 3) == 0) {
                    rc = router_text_append(out, t + run, i - run);
                    if (rc == 0)
                        rc = router_text_append(out, " ", 1);
                    i += 3;
                    run = i;
                } else {
                    i++;
                }
            }
            return rc ? rc : router_text_append(out, t + run, len - run);
        }
        /* BPE: each code point back to the byte it stands for */
        for (size_t i = 0; i < len;) {
            size_t         start = i;
            const uint32_t cp = router_utf8_decode(t, len, &i);
            const int      b = router_cpt_to_byte(cp);
            int            rc;
            if (b >= 0) {
                const char c = (char)b;
                rc = router_text_append(out, &c, 1);
            } else {
                /* llama.cpp writes this marker for code points outside the byte map */
                char hex[16];
                rc = router_text_append(out, "[UNK_BYTE_0x", 12);
                for (size_t k = start; k < i && rc == 0; k++) {
                    snprintf(hex, sizeof(hex), "%02x", (unsigned)(uint8_t)t[k]);
                    rc = router_text_append(out, hex, 2);
                }
                if (rc == 0)
                    rc = router_text_append(out, t, len);
                if (rc == 0)
                    rc = router_text_append(out, "]", 1);
            }
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (attr & ROUTER_ATTR_BYTE) {
        const int b = byte_token_value(t, len);
        if (b < 0)
            return router_text_append(out, t, len);
        const char c = (char)b;
        return router_text_append(out, &c, 1);
    }
    return 0; /* unused and undefined tokens have no text */
}

static int vocab_build_pieces(struct router_vocab *v, struct common_errmsg *e)
{
    struct router_text all = {0};
    v->piece_off = calloc(v->n_tokens, sizeof(*v->piece_off));
    v->piece_len = calloc(v->n_tokens, sizeof(*v->piece_len));
    if (!v->piece_off || !v->piece_len)
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory for token pieces");
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        const size_t start = all.len;
        if (vocab_piece_of(v, (int32_t)i, &all) < 0) {
            router_text_fini(&all);
            return common_errmsg_set(e, COMMON_ENOMEM, "out of memory for token pieces");
        }
        v->piece_off[i] = start;
        v->piece_len[i] = (uint32_t)(all.len - start);
    }
    if (router_text_append(&all, "", 0) < 0) {
        router_text_fini(&all);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory for token pieces");
    }
    v->piece = all.ptr; /* ownership moves to v */
    return 0;
}

static void vocab_build_bytes(struct router_vocab *v)
{
    for (unsigned b = 0; b < 256; b++) {
        char    buf[8];
        size_t  n = (size_t)snprintf(buf, sizeof(buf), "<0x%02X>", b);
        int32_t id = router_strmap_get(&v->token_map, buf, n);
        if (id < 0) {
            const char c = (char)b;
            id = router_strmap_get(&v->token_map, &c, 1);
        }
        v->byte_token[b] = id;
        char   enc[4];
        size_t k = router_utf8_encode(router_byte_to_cpt((uint8_t)b), enc);
        memcpy(v->byte_enc[b], enc, 2); /* the map's code points are < U+0800: <= 2 bytes */
        v->byte_enc_len[b] = (uint8_t)k;
    }
}

/* SPM text may be merged piece by piece, cut before each run of U+2581, when no token has U+2581
 * after another character (then no merge can cross such a cut). */
static void vocab_check_spm_split(struct router_vocab *v)
{
    v->spm_split_at_space = v->type == ROUTER_VOCAB_SPM;
    for (uint32_t id = 0; id < v->n_tokens && v->spm_split_at_space; id++) {
        size_t      len;
        const char *t = router_vocab_str(v, (int32_t)id, &len);
        size_t      i = 0;
        while (len - i >= 3 && memcmp(t + i, "\xE2\x96\x81", 3) == 0)
            i += 3; /* leading run */
        for (; i + 3 <= len; i++) {
            if (memcmp(t + i, "\xE2\x96\x81", 3) == 0) {
                v->spm_split_at_space = false;
                break;
            }
        }
    }
}

static int vocab_load(struct router_vocab *v, const struct common_gguf *g, struct common_errmsg *e)
{
    struct common_gguf_str model;
    int                    rc = common_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc == COMMON_ENOENT)
        return common_errmsg_set(e, COMMON_ENOENT, "no tokenizer.ggml.model in the model");
    if (rc < 0)
        return common_errmsg_set(e, COMMON_ECORRUPT, "tokenizer.ggml.model is not a string");

    const struct router_pre_info *pre = NULL;
    v->bos = v->eos = v->eot = v->pad = v->unk = ROUTER_TOKEN_NULL;
    if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0) {
        v->type = ROUTER_VOCAB_SPM;
        v->pre_name = "spm";
        v->bos = 1;
        v->eos = 2;
        v->unk = 0;
        v->add_bos = true;
        v->add_space_prefix = true;
    } else if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0) {
        v->type = ROUTER_VOCAB_BPE;
        struct common_gguf_str ps;
        rc = common_gguf_get_str(g, "tokenizer.ggml.pre", &ps);
        if (rc == COMMON_ENOENT) {
            COMMON_LOG_WARN(LOG_COMP, "missing tokenizer.ggml.pre, using 'default' (generation "
                                      "quality may suffer)");
            pre = router_pre_find("default", 7);
        } else if (rc < 0) {
            return common_errmsg_set(e, COMMON_ECORRUPT, "tokenizer.ggml.pre is not a string");
        } else {
            pre = router_pre_find(ps.ptr, (size_t)ps.len);
            if (!pre)
                return common_errmsg_set(e, COMMON_ENOTSUP,
                                         "unknown pre-tokenizer tokenizer.ggml.pre = '%.*s'",
                                         (int)(ps.len > 64 ? 64 : ps.len), ps.ptr);
        }
        v->pre = pre->pre;
        v->pre_name = pre->name;
        v->clean_spaces = pre->clean_spaces;
        v->ignore_merges = pre->ignore_merges;
        v->add_bos = pre->add_bos;
        v->bos = 11; /* llama.cpp's defaults for gpt2 vocabularies */
        v->eos = 11;
    } else {
        return common_errmsg_set(e, COMMON_ENOTSUP, "unsupported tokenizer model '%.*s'",
                                 (int)(model.len > 64 ? 64 : model.len), model.ptr);
    }
    if ((rc = vocab_get_bool(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, e)) < 0)
        return rc;

    const struct common_gguf_value *toks;
    if ((rc = vocab_find_arr(g, "tokenizer.ggml.tokens", &toks, e)) < 0)
        return rc;
    if (!toks)
        return common_errmsg_set(e, COMMON_ENOENT, "no tokenizer.ggml.tokens in the model");
    if (toks->v.arr.type != COMMON_GGUF_STRING)
        return common_errmsg_set(e, COMMON_ECORRUPT, "tokenizer.ggml.tokens holds %s, not strings",
                                 common_gguf_vtype_name(toks->v.arr.type));
    if (toks->v.arr.n == 0 || toks->v.arr.n > INT32_MAX)
        return common_errmsg_set(e, COMMON_ECORRUPT, "tokenizer.ggml.tokens has %llu entries",
                                 (unsigned long long)toks->v.arr.n);
    v->n_tokens = (uint32_t)toks->v.arr.n;

    if ((rc = vocab_load_tokens(v, toks, e)) < 0)
        return rc;
    if ((rc = vocab_load_scores_types(v, g, e)) < 0)
        return rc;
    if (v->type == ROUTER_VOCAB_BPE && (rc = vocab_load_merges(v, g, e)) < 0)
        return rc;

    /* Default ids that do not exist are dropped; ids given in the file must exist. */
    int32_t *defaults[] = {&v->bos, &v->eos, &v->unk};
    for (size_t k = 0; k < 3; k++) {
        if (*defaults[k] >= (int32_t)v->n_tokens)
            *defaults[k] = ROUTER_TOKEN_NULL;
    }
    if ((rc = vocab_get_id(g, "tokenizer.ggml.bos_token_id", v->n_tokens, &v->bos, e)) < 0 ||
        (rc = vocab_get_id(g, "tokenizer.ggml.eos_token_id", v->n_tokens, &v->eos, e)) < 0 ||
        (rc = vocab_get_id(g, "tokenizer.ggml.eot_token_id", v->n_tokens, &v->eot, e)) < 0 ||
        (rc = vocab_get_id(g, "tokenizer.ggml.padding_token_id", v->n_tokens, &v->pad, e)) < 0 ||
        (rc = vocab_get_id(g, "tokenizer.ggml.unknown_token_id", v->n_tokens, &v->unk, e)) < 0)
        return rc;
    if ((rc = vocab_get_bool(g, "tokenizer.ggml.add_bos_token", &v->add_bos, e)) < 0 ||
        (rc = vocab_get_bool(g, "tokenizer.ggml.add_eos_token", &v->add_eos, e)) < 0)
        return rc;
    if (v->add_bos && v->bos < 0)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "tokenizer.ggml.add_bos_token is true but there is no BOS id");
    if (v->add_eos && v->eos < 0)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "tokenizer.ggml.add_eos_token is true but there is no EOS id");

    vocab_check_spm_split(v);
    vocab_find_eog(v);
    if ((rc = vocab_build_special(v, g, e)) < 0)
        return rc;
    if ((rc = vocab_build_pieces(v, e)) < 0)
        return rc;
    vocab_build_bytes(v);
    return 0;
}

int router_vocab_load(const struct common_gguf *g, struct router_vocab **out,
                      struct common_errmsg *e)
{
    struct router_vocab *v = calloc(1, sizeof(*v));
    if (!v)
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    int rc = vocab_load(v, g, e);
    if (rc < 0) {
        router_vocab_destroy(v);
        return rc;
    }
    *out = v;
    return 0;
}

void router_vocab_destroy(struct router_vocab *v)
{
    if (!v)
        return;
    free(v->text);
    free(v->text_off);
    free(v->text_len);
    free(v->scores);
    free(v->attr);
    free(v->eog);
    router_strmap_fini(&v->token_map);
    free(v->merges);
    router_strmap_fini(&v->merge_map);
    free(v->piece);
    free(v->piece_off);
    free(v->piece_len);
    free(v->special);
    free(v);
}

enum router_vocab_type router_vocab_type(const struct router_vocab *v)
{
    return v->type;
}

const char *router_vocab_pre_name(const struct router_vocab *v)
{
    return v->pre_name;
}

uint32_t router_vocab_n_tokens(const struct router_vocab *v)
{
    return v->n_tokens;
}

void router_vocab_special(const struct router_vocab *v, struct router_vocab_special *out)
{
    *out = (struct router_vocab_special){
        .bos = v->bos,
        .eos = v->eos,
        .eot = v->eot,
        .pad = v->pad,
        .unk = v->unk,
        .add_bos = v->add_bos,
        .add_eos = v->add_eos,
        .add_space_prefix = v->add_space_prefix,
    };
}

uint32_t router_vocab_attr(const struct router_vocab *v, int32_t id)
{
    return id >= 0 && (uint32_t)id < v->n_tokens ? v->attr[id] : 0;
}

bool router_vocab_is_eog(const struct router_vocab *v, int32_t id)
{
    return id >= 0 && (uint32_t)id < v->n_tokens && v->eog[id];
}

int router_vocab_text(const struct router_vocab *v, int32_t id, const char **s, size_t *len)
{
    if (id < 0 || (uint32_t)id >= v->n_tokens)
        return COMMON_EINVAL;
    *s = router_vocab_str(v, id, len);
    return 0;
}

int32_t router_vocab_find(const struct router_vocab *v, const char *s, size_t len)
{
    return router_strmap_get(&v->token_map, s, len);
}
