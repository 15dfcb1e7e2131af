/* tests/fuzz/fuzz_tokenize.c - libFuzzer target: tokenizing any bytes with the fixture vocabularies
 * (SentencePiece and byte-level BPE, and the GPT-2 one under the deepseek-v3, gpt-4o and kimi-k2
 * pre-tokenizers), with and without special-token parsing, then detokenizing. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_N_VOCABS 6

/* Process singleton of the fuzz target: vocabularies loaded on the first input. */
static struct router_vocab *g_vocabs[FUZZ_N_VOCABS];
static struct common_gguf  *g_ggufs[FUZZ_N_VOCABS];
static int                  g_loaded;

/* Loads the GPT-2 vocabulary (slot 1) into slot `slot` with tokenizer.ggml.pre = `pre`. */
static void fuzz_load_with_pre(int slot, const char *pre)
{
    struct common_gguf_writer *w = NULL;
    char                       tmp[] = "/tmp/sluice-fuzz-vocab-XXXXXX";
    int                        fd = mkstemp(tmp);
    if (fd < 0)
        return;
    close(fd);
    if (g_ggufs[1] && common_gguf_writer_create(&w, 32) == COMMON_OK) {
        int rc = COMMON_OK;
        for (uint64_t i = 0; rc == COMMON_OK && i < common_gguf_n_kv(g_ggufs[1]); i++) {
            const struct common_gguf_kv *kv = common_gguf_kv_at(g_ggufs[1], i);
            rc = strcmp(kv->key, "tokenizer.ggml.pre") == 0
                     ? common_gguf_writer_set_str(w, kv->key, pre)
                     : common_gguf_writer_copy_kv(w, kv);
        }
        if (rc == COMMON_OK && common_gguf_writer_begin(w, tmp, NULL) == COMMON_OK &&
            common_gguf_writer_finish(w, NULL) == COMMON_OK &&
            common_gguf_open(tmp, NULL, &g_ggufs[slot], NULL) == COMMON_OK &&
            router_vocab_load(g_ggufs[slot], &g_vocabs[slot], NULL) != COMMON_OK)
            g_vocabs[slot] = NULL;
        common_gguf_writer_destroy(w);
    }
    unlink(tmp);
}

static void fuzz_load(void)
{
    static const char *names[FUZZ_N_VOCABS] = {
        "tokenizer/ggml-vocab-llama-spm.gguf",
        "tokenizer/ggml-vocab-gpt-2.gguf",
        "tokenizer/ggml-vocab-deepseek-coder.gguf",
    };
    const char *dir = getenv("SLUICE_FIXTURES");
    if (!dir || !*dir)
        dir = SLUICE_FIXTURES_DIR;
    for (int i = 0; i < FUZZ_N_VOCABS - 3; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        if (common_gguf_open(path, NULL, &g_ggufs[i], NULL) != COMMON_OK ||
            router_vocab_load(g_ggufs[i], &g_vocabs[i], NULL) != COMMON_OK)
            g_vocabs[i] = NULL;
    }
    /* The GPT-2 vocabulary again under three more pre-tokenizers (temporary copies). */
    fuzz_load_with_pre(FUZZ_N_VOCABS - 3, "deepseek-v3");
    fuzz_load_with_pre(FUZZ_N_VOCABS - 2, "kimi-k2");
    fuzz_load_with_pre(FUZZ_N_VOCABS - 1, "gpt-4o");
    g_loaded = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_loaded)
        fuzz_load();
    if (size == 0)
        return 0;
    /* The first byte picks the vocabulary and the options; the rest is the text. */
    const struct router_vocab *v = g_vocabs[data[0] % FUZZ_N_VOCABS];
    if (!v)
        return 0;
    struct router_tokenize_opts o = {.add_special = (data[0] & 4) != 0,
                                     .parse_special = (data[0] & 8) != 0};
    struct router_tokens        toks = {0};
    if (router_tokenize(v, (const char *)data + 1, size - 1, &o, &toks) >= 0) {
        struct router_text text = {0};
        router_detokenize(v, toks.ids, toks.n, NULL, &text);
        router_text_fini(&text);
    }
    router_tokens_fini(&toks);
    return 0;
}
