/* tests/fuzz/fuzz_kld.c - libFuzzer target: llama-perplexity's KL-divergence base file on any
 * bytes (the header checks, the tokens, every chunk's rows). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "executor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    FILE *f = fmemopen((void *)(uintptr_t)data, size, "rb");
    if (!f)
        return 0;
    struct executor_kld_base *b = NULL;
    struct common_errmsg      e;
    if (executor_kld_base_read(f, size, &b, &e) == COMMON_OK) {
        uint32_t       n_ctx, n_vocab, n_chunk;
        const int32_t *toks;
        executor_kld_base_info(b, &n_ctx, &n_vocab, &n_chunk, &toks);
        const size_t              nv = executor_kld_row_len(n_vocab);
        const size_t              n = (size_t)executor_kld_rows_per_chunk(n_ctx) * nv;
        uint16_t                 *rows = malloc(n * sizeof(*rows));
        float                    *logits = calloc(n_vocab, sizeof(*logits));
        struct executor_kld_stats st;
        if (rows && logits && executor_kld_stats_init(&st, 16) == COMMON_OK) {
            while (executor_kld_base_next(b, rows, &e) == COMMON_OK)
                for (uint32_t r = 0; r < executor_kld_rows_per_chunk(n_ctx); r++)
                    executor_kld_accumulate(&st, logits, n_vocab, rows + (size_t)r * nv,
                                            toks[r % n_ctx]);
            executor_kld_stats_fini(&st);
        }
        free(rows);
        free(logits);
        executor_kld_base_close(b);
    }
    fclose(f);
    return 0;
}
