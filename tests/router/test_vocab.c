/* tests/router/test_vocab.c - vocabulary loading errors, streaming detokenizer, stop conditions. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "router.h"

static char *t_dir;

static void setup(void)
{
    t_dir = fixture_tmpdir();
    cr_assert(t_dir);
}

static void teardown(void)
{
    fixture_rmtree(t_dir);
    free(t_dir);
}

/* A small SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then `extra`. */
struct mini {
    const char *model;       /* tokenizer.ggml.model */
    const char *pre;         /* tokenizer.ggml.pre or NULL */
    int         drop_scores; /* write one score fewer than tokens */
    int         drop_types;  /* write one token type fewer */
    int64_t     bos;         /* bos id written */
};

static const char *const k_extra[] = {"\xE2\x96\x81h", "\xE2\x96\x81he", "llo", "\xE2\x96\x81hello",
                                      "\xC3\xA9"};
#define N_EXTRA 5
#define N_TOK   (3 + 256 + N_EXTRA)

/* Writes the vocabulary and loads it; returns the load status. */
static int load_mini(const struct mini *m, struct router_vocab **v, struct common_gguf **g,
                     struct common_errmsg *e)
{
    static char            names[256][8];
    struct common_gguf_str toks[N_TOK];
    float                  scores[N_TOK];
    int32_t                types[N_TOK];
    toks[0] = (struct common_gguf_str){"<unk>", 5};
    toks[1] = (struct common_gguf_str){"<s>", 3};
    toks[2] = (struct common_gguf_str){"</s>", 4};
    types[0] = 2;
    types[1] = types[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(names[b], sizeof(names[b]), "<0x%02X>", b);
        toks[3 + b] = (struct common_gguf_str){names[b], 6};
        types[3 + b] = 6;
    }
    for (int i = 0; i < N_EXTRA; i++) {
        toks[259 + i] = (struct common_gguf_str){k_extra[i], strlen(k_extra[i])};
        types[259 + i] = 1;
    }
    for (int i = 0; i < N_TOK; i++)
        scores[i] = i >= 259 ? -(float)(i - 259) : 0.0f;

    char path[512];
    snprintf(path, sizeof(path), "%s/v.gguf", t_dir);
    struct common_gguf_writer *w = NULL;
    cr_assert_eq(common_gguf_writer_create(&w, 32), 0);
    cr_assert_eq(common_gguf_writer_set_str(w, "general.architecture", "llama"), 0);
    cr_assert_eq(common_gguf_writer_set_str(w, "tokenizer.ggml.model", m->model), 0);
    if (m->pre)
        cr_assert_eq(common_gguf_writer_set_str(w, "tokenizer.ggml.pre", m->pre), 0);
    cr_assert_eq(
        common_gguf_writer_set_arr(w, "tokenizer.ggml.tokens", COMMON_GGUF_STRING, toks, N_TOK), 0);
    cr_assert_eq(common_gguf_writer_set_arr(w, "tokenizer.ggml.scores", COMMON_GGUF_FLOAT32, scores,
                                            N_TOK - (m->drop_scores ? 1 : 0)),
                 0);
    cr_assert_eq(common_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", COMMON_GGUF_INT32,
                                            types, N_TOK - (m->drop_types ? 1 : 0)),
                 0);
    if (!strcmp(m->model, "gpt2")) {
        const struct common_gguf_str merges[] = {{"l l", 3}};
        cr_assert_eq(
            common_gguf_writer_set_arr(w, "tokenizer.ggml.merges", COMMON_GGUF_STRING, merges, 1),
            0);
    }
    cr_assert_eq(common_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)m->bos), 0);
    cr_assert_eq(common_gguf_writer_begin(w, path, e), 0, "%s", e->text);
    cr_assert_eq(common_gguf_writer_finish(w, e), 0, "%s", e->text);
    common_gguf_writer_destroy(w);
    cr_assert_eq(common_gguf_open(path, NULL, g, e), 0, "%s", e->text);
    return router_vocab_load(*g, v, e);
}

Test(router_vocab, loads_a_consistent_vocabulary, .init = setup, .fini = teardown)
{
    struct router_vocab *v = NULL;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(load_mini(&(struct mini){.model = "llama", .bos = 1}, &v, &g, &e), 0, "%s",
                 e.text);
    struct router_tokens t = {0};
    /* " hello é\x01" after the space prefix: "▁h" (score 0) then "▁he" (-1) merge; "ll" is no
     * token so "llo" never forms; a lone "▁", "l", "o" and \x01 fall back to byte tokens */
    cr_assert_eq(router_tokenize(v, "hello \xC3\xA9\x01", 9,
                                 &(struct router_tokenize_opts){.add_special = true}, &t),
                 0);
    const int32_t want[] = {1,        260,      3 + 'l',  3 + 'l', 3 + 'o',
                            3 + 0xE2, 3 + 0x96, 3 + 0x81, 263,     3 + 0x01};
    cr_assert_eq(t.n, 10);
    cr_expect_arr_eq(t.ids, want, sizeof(want));
    struct router_text s = {0};
    cr_assert_eq(router_detokenize(v, t.ids, t.n, NULL, &s), 0);
    /* llama.cpp strips the SentencePiece space from the first piece, here BOS's empty one; a
     * U+2581 spelled with byte tokens comes back as those bytes, not as a space */
    cr_expect_str_eq(s.ptr, " hello\xE2\x96\x81\xC3\xA9\x01");
    router_text_fini(&s);
    router_tokens_fini(&t);
    router_vocab_destroy(v);
    common_gguf_close(g);
}

Test(router_vocab, refuses_scores_count_mismatch, .init = setup, .fini = teardown)
{
    struct router_vocab *v = NULL;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_expect_eq(
        load_mini(&(struct mini){.model = "llama", .bos = 1, .drop_scores = 1}, &v, &g, &e),
        COMMON_ECORRUPT);
    cr_expect(strstr(e.text, "scores"), "message: %s", e.text);
    cr_expect_null(v);
    common_gguf_close(g);
}

Test(router_vocab, refuses_token_type_count_mismatch, .init = setup, .fini = teardown)
{
    struct router_vocab *v = NULL;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_expect_eq(load_mini(&(struct mini){.model = "llama", .bos = 1, .drop_types = 1}, &v, &g, &e),
                 COMMON_ECORRUPT);
    cr_expect(strstr(e.text, "token_type"), "message: %s", e.text);
    common_gguf_close(g);
}

Test(router_vocab, refuses_special_id_out_of_range, .init = setup, .fini = teardown)
{
    struct router_vocab *v = NULL;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_expect_eq(load_mini(&(struct mini){.model = "llama", .bos = 100000}, &v, &g, &e),
                 COMMON_ECORRUPT);
    cr_expect(strstr(e.text, "bos_token_id"), "message: %s", e.text);
    common_gguf_close(g);
}

Test(router_vocab, unknown_pre_tokenizer_is_named, .init = setup, .fini = teardown)
{
    struct router_vocab *v = NULL;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_expect_eq(
        load_mini(&(struct mini){.model = "gpt2", .pre = "no-such-pre", .bos = 1}, &v, &g, &e),
        COMMON_ENOTSUP);
    cr_expect(strstr(e.text, "no-such-pre"), "message: %s", e.text);
    common_gguf_close(g);
}

Test(router_vocab, missing_pre_means_default, .init = setup, .fini = teardown)
{
    struct router_vocab *v = NULL;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(load_mini(&(struct mini){.model = "gpt2", .bos = 1}, &v, &g, &e), 0, "%s", e.text);
    cr_expect_str_eq(router_vocab_pre_name(v), "default");
    router_vocab_destroy(v);
    common_gguf_close(g);
}

Test(router_vocab, unknown_model_is_refused, .init = setup, .fini = teardown)
{
    struct router_vocab *v = NULL;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_expect_eq(load_mini(&(struct mini){.model = "bert", .bos = 1}, &v, &g, &e), COMMON_ENOTSUP);
    cr_expect(strstr(e.text, "bert"), "message: %s", e.text);
    common_gguf_close(g);
}

Test(router_vocab, stream_holds_split_utf8_until_complete, .init = setup, .fini = teardown)
{
    struct router_vocab *v = NULL;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(load_mini(&(struct mini){.model = "llama", .bos = 1}, &v, &g, &e), 0);
    struct router_detok_stream s;
    struct router_text         out = {0};
    router_detok_stream_init(&s, v, NULL);
    /* "é" as two byte tokens, then a byte that cannot start a character */
    cr_expect_eq(router_detok_stream_push(&s, 3 + 0xC3, &out), 0, "half a character is held");
    cr_expect_eq(out.len, 0);
    cr_expect_eq(router_detok_stream_push(&s, 3 + 0xA9, &out), 2);
    cr_expect_str_eq(out.ptr, "\xC3\xA9");
    cr_expect_eq(router_detok_stream_push(&s, 3 + 0xFF, &out), 3, "invalid byte -> U+FFFD");
    cr_expect_eq(router_detok_stream_push(&s, 3 + 0xE2, &out), 0);
    cr_expect_eq(router_detok_stream_flush(&s, &out), 3, "unfinished character -> U+FFFD");
    cr_expect_str_eq(out.ptr, "\xC3\xA9\xEF\xBF\xBD\xEF\xBF\xBD");
    cr_expect_eq(router_detok_stream_push(&s, 100000, &out), COMMON_EINVAL);
    router_text_fini(&out);
    router_vocab_destroy(v);
    common_gguf_close(g);
}

Test(router_vocab, stop_string_ends_and_is_not_emitted, .init = setup, .fini = teardown)
{
    struct router_vocab *v = NULL;
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(load_mini(&(struct mini){.model = "llama", .bos = 1}, &v, &g, &e), 0);
    const char *const  stops[] = {"llo"};
    struct router_stop st;
    struct router_text out = {0};
    cr_assert_eq(router_stop_init(&st, v, &(struct router_stop_opts){.stop = stops, .n_stop = 1}),
                 0);
    /* " he" then "l" held (could start "llo"), then "lo" completes the stop string */
    cr_expect_eq(router_stop_push(&st, 260, &out), ROUTER_STOP_NONE);
    cr_expect_eq(router_stop_push(&st, 3 + 'l', &out), ROUTER_STOP_NONE);
    cr_expect_str_eq(out.ptr, " he");
    cr_expect_eq(router_stop_push(&st, 3 + 'l', &out), ROUTER_STOP_NONE);
    cr_expect_eq(router_stop_push(&st, 3 + 'o', &out), ROUTER_STOP_STRING);
    cr_expect_str_eq(out.ptr, " he");
    router_stop_fini(&st);
    router_text_fini(&out);

    cr_assert_eq(router_stop_init(&st, v, &(struct router_stop_opts){.max_tokens = 2}), 0);
    cr_expect_eq(router_stop_push(&st, 262, &out), ROUTER_STOP_NONE);
    cr_expect_eq(router_stop_push(&st, 2, &out), ROUTER_STOP_EOS, "</s> ends the sequence");
    router_stop_fini(&st);
    cr_assert_eq(router_stop_init(&st, v, &(struct router_stop_opts){.max_tokens = 2}), 0);
    cr_expect_eq(router_stop_push(&st, 262, &out), ROUTER_STOP_NONE);
    cr_expect_eq(router_stop_push(&st, 262, &out), ROUTER_STOP_MAX_TOKENS);
    router_stop_fini(&st);
    router_text_fini(&out);
    router_vocab_destroy(v);
    common_gguf_close(g);
}
