/* tests/fuzz/fuzz_qsf.c - libFuzzer target: the QSF reader on any bytes. Checksums would stop a
 * mutated input at the first check, so the target first rewrites the header's, the metadata's
 * and the index's checksums of the input (offsets from docs/qsf.md), then parses, then decodes
 * every bundle with its checksum made to hold, so LZ4 blocks of any bytes are decoded too. */
#include <stdlib.h>
#include <string.h>

#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Makes the checksum at `at` hold for region (off, len) of b, when the region is inside. */
static void fix(uint8_t *b, size_t size, size_t at, uint64_t off, uint64_t len)
{
    if (off <= size && len <= size - off)
        wr64(b + at, common_qsf_hash(b + off, (size_t)len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *b = malloc(size ? size : 1);
    if (!b)
        return 0;
    memcpy(b, data, size);
    if (size >= 128) {
        fix(b, size, 96, rd64(b + 16), rd64(b + 24));  /* metadata */
        fix(b, size, 104, rd64(b + 40), rd64(b + 48)); /* index */
        fix(b, size, 120, 0, 120);                     /* header */
    }
    struct common_gguf  *g = NULL;
    struct common_errmsg e;
    if (common_qsf_parse(b, size, &g, &e) == COMMON_OK) {
        struct common_model m;
        if (common_model_init(&m, g, &e) == COMMON_OK) {
            for (uint32_t l = 0; l < m.hp.n_layer && m.hp.n_expert; l++) {
                struct common_span sp;
                (void)common_model_expert_span(&m, l, m.hp.n_expert - 1, COMMON_EXPERT_DOWN, &sp);
            }
            common_model_fini(&m);
        }
        for (uint32_t l = 0; l < 64; l++)
            for (uint32_t x = 0; x < 64; x++) {
                struct common_qsf_bundle bu;
                if (common_gguf_bundle(g, l, x, &bu) != COMMON_OK || bu.buf_bytes > (16u << 20))
                    continue;
                uint8_t *buf = aligned_alloc(COMMON_QSF_ALIGN, (size_t)bu.buf_bytes);
                if (!buf)
                    continue;
                memcpy(buf + bu.read_off, b + bu.offset, (size_t)bu.stored);
                bu.hash = common_qsf_hash(buf + bu.read_off, (size_t)bu.stored);
                (void)common_qsf_bundle_finish(&bu, buf, &e);
                free(buf);
            }
        common_gguf_close(g);
    }
    free(b);
    return 0;
}
