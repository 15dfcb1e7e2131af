/* tests/router/test_tokenizer.c - tokenizers against llama.cpp's vocabulary test vectors and the
 * prompt ids of the model fixtures. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "router.h"
#include "tjson.h"

/* Opens a GGUF fixture and loads its vocabulary (skips when absent). */
static struct router_vocab *load_vocab(const char *rel, struct common_gguf **g)
{
    char *path = fixture_path(rel);
    if (!path)
        cr_skip_test("fixture %s not found (../shared/fixtures absent): skipped", rel);
    struct common_errmsg e = {{0}};
    int                  rc = common_gguf_open(path, NULL, g, &e);
    cr_assert_eq(rc, 0, "common_gguf_open(%s): %s", path, e.text);
    struct router_vocab *v = NULL;
    rc = router_vocab_load(*g, &v, &e);
    cr_assert_eq(rc, 0, "router_vocab_load(%s): %s", path, e.text);
    free(path);
    return v;
}

/* Prints bytes as a C-ish string for failure messages. */
static const char *show(const char *s, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F)
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

/* Runs every vector of tokenizer/ggml-vocab-NAME.gguf.{inp,out}: exact ids, then the round trip
 * decode(encode(s)) == s (clean-up of spaces off, so the comparison is exact). */
static void check_family(const char *name)
{
    char rel[200], rel_inp[256], rel_out[256];
    snprintf(rel, sizeof(rel), "tokenizer/ggml-vocab-%s.gguf", name);
    snprintf(rel_inp, sizeof(rel_inp), "%s.inp", rel);
    snprintf(rel_out, sizeof(rel_out), "%s.out", rel);
    FIXTURE_OR_SKIP(p_inp, rel_inp);
    FIXTURE_OR_SKIP(p_out, rel_out);
    struct common_gguf  *g = NULL;
    struct router_vocab *v = load_vocab(rel, &g);

    size_t n_inp = 0, n_out = 0;
    char  *inp = fixture_read_all(p_inp, &n_inp);
    char  *out = fixture_read_all(p_out, &n_out);
    cr_assert(inp && out);

    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t      nsep = sizeof(sep) - 1;
    size_t            pos = 0, opos = 0, n_tests = 0, n_fail = 0, n_rt_fail = 0;
    while (pos < n_inp) {
        const char  *m = memmem(inp + pos, n_inp - pos, sep, nsep);
        const size_t end = m ? (size_t)(m - inp) : n_inp;
        const char  *s = inp + pos;
        const size_t slen = end - pos;
        pos = m ? end + nsep : n_inp;

        /* expected ids: one line of the .out file */
        cr_assert_lt(opos, n_out, "%s: fewer .out lines than tests", name);
        const char          *nl = memchr(out + opos, '\n', n_out - opos);
        size_t               lend = nl ? (size_t)(nl - out) : n_out;
        struct router_tokens want = {0};
        char                *q = out + opos;
        while (q < out + lend) {
            char *e2;
            long  id = strtol(q, &e2, 10);
            if (e2 == q) {
                q++;
                continue;
            }
            router_tokens_push(&want, (int32_t)id);
            q = e2;
        }
        opos = nl ? lend + 1 : n_out;

        struct router_tokens got = {0};
        cr_assert_eq(router_tokenize(v, s, slen, NULL, &got), 0);
        bool same = got.n == want.n;
        for (size_t i = 0; same && i < got.n; i++)
            same = got.ids[i] == want.ids[i];
        if (!same) {
            char buf[512];
            n_fail++;
            cr_log_error("%s test %zu '%s': got %zu ids, want %zu", name, n_tests,
                         show(s, slen, buf, sizeof(buf)), got.n, want.n);
            for (size_t i = 0; i < got.n || i < want.n; i++) {
                if (i < got.n && i < want.n && got.ids[i] == want.ids[i])
                    continue;
                cr_log_error("  first difference at %zu: got %d want %d", i,
                             i < got.n ? got.ids[i] : -1, i < want.n ? want.ids[i] : -1);
                break;
            }
        }

        struct router_text back = {0};
        cr_assert_eq(router_detokenize(v, got.ids, got.n,
                                       &(struct router_detok_opts){.no_clean_spaces = true}, &back),
                     0);
        if (back.len != slen || (slen && memcmp(back.ptr, s, slen) != 0)) {
            char b1[512], b2[512];
            n_rt_fail++;
            cr_log_error("%s test %zu round trip: '%s' came back as '%s'", name, n_tests,
                         show(s, slen, b1, sizeof(b1)), show(back.ptr, back.len, b2, sizeof(b2)));
        }
        router_text_fini(&back);
        router_tokens_fini(&got);
        router_tokens_fini(&want);
        n_tests++;
    }
    cr_assert_gt(n_tests, 10, "%s: too few tests parsed", name);
    cr_expect_eq(n_fail, 0, "%s: %zu of %zu vectors encode differently", name, n_fail, n_tests);
    cr_expect_eq(n_rt_fail, 0, "%s: %zu of %zu vectors do not round-trip", name, n_rt_fail,
                 n_tests);
    free(inp);
    free(out);
    free(p_inp);
    free(p_out);
    router_vocab_destroy(v);
    common_gguf_close(g);
}

Test(router_tokenizer, llama_spm_vectors_encode_exactly)
{
    check_family("llama-spm");
}

Test(router_tokenizer, phi3_vectors_encode_exactly)
{
    check_family("phi-3");
}

Test(router_tokenizer, gpt2_vectors_encode_exactly)
{
    check_family("gpt-2");
}

Test(router_tokenizer, starcoder_vectors_encode_exactly)
{
    check_family("starcoder");
}

Test(router_tokenizer, deepseek_coder_vectors_encode_exactly)
{
    check_family("deepseek-coder");
}

Test(router_tokenizer, mpt_vectors_encode_exactly)
{
    check_family("mpt");
}

static void expect_ids(struct router_vocab *v, const char *prompt, const struct router_tokens *want)
{
    struct router_tokens got = {0};
    cr_assert_eq(router_tokenize(v, prompt, strlen(prompt),
                                 &(struct router_tokenize_opts){.add_special = true}, &got),
                 0);
    cr_expect_eq(got.n, want->n, "'%s': got %zu ids, want %zu", prompt, got.n, want->n);
    for (size_t i = 0; i < got.n && i < want->n; i++)
        cr_expect_eq(got.ids[i], want->ids[i], "'%s': id %zu is %d, want %d", prompt, i, got.ids[i],
                     want->ids[i]);
    router_tokens_fini(&got);
}

Test(router_tokenizer, moe_tiny_prompts_match_llama_tokenize)
{
    FIXTURE_OR_SKIP(ref, "moe-tiny/reference.json");
    struct common_gguf  *g = NULL;
    struct router_vocab *v = load_vocab("moe-tiny/moe-tiny-f32.gguf", &g);
    struct tjson        *j = tjson_load(ref);
    cr_assert(j, "reference.json unreadable");
    const struct tjson *list = tjson_get(j, "tokenize");
    cr_assert(list && list->kind == TJSON_ARR && list->len == 5);
    for (size_t i = 0; i < list->len; i++) {
        const struct tjson *prompt = tjson_get(tjson_at(list, i), "prompt");
        const struct tjson *ids = tjson_get(tjson_at(list, i), "ids");
        cr_assert(prompt && prompt->kind == TJSON_STR && ids && ids->kind == TJSON_ARR);
        struct router_tokens want = {0};
        for (size_t k = 0; k < ids->len; k++)
            router_tokens_push(&want, (int32_t)tjson_at(ids, k)->num);
        expect_ids(v, prompt->str, &want);
        router_tokens_fini(&want);
    }
    tjson_free(j);
    free(ref);
    router_vocab_destroy(v);
    common_gguf_close(g);
}

Test(router_tokenizer, llama2_tiny_prompts_match_reference)
{
    FIXTURE_OR_SKIP(ref, "models/llama-2-tiny-random.reference.txt");
    struct common_gguf  *g = NULL;
    struct router_vocab *v = load_vocab("models/llama-2-tiny-random.gguf", &g);
    char                *t = fixture_read_all(ref, NULL);
    cr_assert(t);
    size_t      n_checked = 0;
    const char *p = t;
    while ((p = strstr(p, "### prompt: \"")) != NULL) {
        p += strlen("### prompt: \"");
        const char *q = strstr(p, "\"\n");
        cr_assert(q);
        char       *prompt = strndup(p, (size_t)(q - p));
        const char *ids = strstr(q, "prompt_ids:");
        cr_assert(ids);
        ids += strlen("prompt_ids:");
        struct router_tokens want = {0};
        while (*ids && *ids != '\n') {
            char *e;
            long  id = strtol(ids, &e, 10);
            if (e == ids) {
                ids++;
                continue;
            }
            router_tokens_push(&want, (int32_t)id);
            ids = e;
        }
        expect_ids(v, prompt, &want);
        n_checked++;
        free(prompt);
        router_tokens_fini(&want);
        p = ids;
    }
    cr_assert_eq(n_checked, 3);
    free(t);
    free(ref);
    router_vocab_destroy(v);
    common_gguf_close(g);
}

/* Copies the vocabulary-only GGUF `src` to `dst` with tokenizer.ggml.pre set to `pre`. */
static void rewrite_pre(const char *src, const char *dst, const char *pre)
{
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_open(src, NULL, &g, &e), 0, "%s", e.text);
    struct common_gguf_writer *w = NULL;
    cr_assert_eq(common_gguf_writer_create(&w, 32), 0);
    for (uint64_t i = 0; i < common_gguf_n_kv(g); i++) {
        const struct common_gguf_kv *kv = common_gguf_kv_at(g, i);
        if (strcmp(kv->key, "tokenizer.ggml.pre") == 0)
            cr_assert_eq(common_gguf_writer_set_str(w, kv->key, pre), 0);
        else
            cr_assert_eq(common_gguf_writer_copy_kv(w, kv), 0);
    }
    cr_assert_eq(common_gguf_writer_begin(w, dst, &e), 0, "%s", e.text);
    cr_assert_eq(common_gguf_writer_finish(w, &e), 0, "%s", e.text);
    common_gguf_writer_destroy(w);
    common_gguf_close(g);
}

/* The pre-tokenizers whose vocabularies are not fixtures (deepseek-v3, glm4, gpt-4o, kimi-k2), on
 * the GPT-2 vocabulary with tokenizer.ggml.pre rewritten: every string of
 * tests/reference/pretok.txt gives llama-tokenize's ids (made by
 * tests/reference/make-pretok-refs.py). */
static void check_pre(const char *pre)
{
    FIXTURE_OR_SKIP(src, "tokenizer/ggml-vocab-gpt-2.gguf");
    char *dir = fixture_tmpdir();
    char  path[4096];
    snprintf(path, sizeof(path), "%s/vocab.gguf", dir);
    rewrite_pre(src, path, pre);
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_open(path, NULL, &g, &e), 0, "%s", e.text);
    struct router_vocab *v = NULL;
    cr_assert_eq(router_vocab_load(g, &v, &e), 0, "%s", e.text);
    FILE *f = fopen(SLUICE_SOURCE_DIR "/tests/reference/pretok.txt", "r");
    cr_assert_not_null(f);
    static char line[1 << 16];
    size_t      n_tests = 0, n_fail = 0;
    while (fgets(line, sizeof(line), f)) {
        char *p_pre = strtok(line, " \n"), *p_hex = strtok(NULL, " \n"),
             *p_ids = strtok(NULL, " \n");
        if (!p_pre || p_pre[0] == '#' || strcmp(p_pre, pre) != 0)
            continue;
        cr_assert(p_hex && p_ids, "bad line in pretok.txt");
        size_t slen = strlen(p_hex) / 2;
        char  *s = malloc(slen + 1);
        for (size_t i = 0; i < slen; i++) {
            unsigned b;
            cr_assert_eq(sscanf(p_hex + 2 * i, "%2x", &b), 1);
            s[i] = (char)b;
        }
        struct router_tokens want = {0}, got = {0};
        for (char *q = p_ids; *q && *q != '-';) {
            router_tokens_push(&want, (int32_t)strtol(q, &q, 10));
            q += *q == ',';
        }
        cr_assert_eq(router_tokenize(v, s, slen, NULL, &got), 0);
        bool same = got.n == want.n;
        for (size_t i = 0; same && i < got.n; i++)
            same = got.ids[i] == want.ids[i];
        if (!same) {
            char buf[512];
            n_fail++;
            cr_log_error("%s '%s': got %zu ids, want %zu", pre, show(s, slen, buf, sizeof(buf)),
                         got.n, want.n);
        }
        router_tokens_fini(&got);
        router_tokens_fini(&want);
        free(s);
        n_tests++;
    }
    fclose(f);
    cr_assert_gt(n_tests, 100, "%s: too few strings in pretok.txt", pre);
    cr_expect_eq(n_fail, 0, "%s: %zu of %zu strings encode differently", pre, n_fail, n_tests);
    cr_log_info("%s: %zu strings as llama-tokenize", pre, n_tests);
    router_vocab_destroy(v);
    common_gguf_close(g);
    fixture_rmtree(dir);
    free(dir);
    free(src);
}

Test(router_tokenizer, deepseek_v3_pre_tokenizer_matches_llama_tokenize)
{
    check_pre("deepseek-v3");
}

Test(router_tokenizer, glm4_pre_tokenizer_matches_llama_tokenize)
{
    check_pre("glm4");
}

Test(router_tokenizer, gpt_4o_pre_tokenizer_matches_llama_tokenize)
{
    check_pre("gpt-4o");
}

Test(router_tokenizer, kimi_k2_pre_tokenizer_matches_llama_tokenize)
{
    check_pre("kimi-k2");
}
