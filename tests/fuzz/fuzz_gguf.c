/* tests/fuzz/fuzz_gguf.c - libFuzzer target: the GGUF reader and model description on any bytes. */
#include <stddef.h>
#include <stdint.h>

#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct common_gguf  *g = NULL;
    struct common_errmsg e;
    if (common_gguf_parse(data, size, size, &g, &e) != COMMON_OK)
        return 0;
    /* Walk what was parsed: every accessor must stay in bounds. */
    for (uint64_t i = 0; i < common_gguf_n_kv(g); i++) {
        const struct common_gguf_kv *kv = common_gguf_kv_at(g, i);
        if (kv->value.type == COMMON_GGUF_ARRAY && kv->value.v.arr.type != COMMON_GGUF_STRING &&
            kv->value.v.arr.n > 0)
            (void)common_gguf_arr_f64(&kv->value, kv->value.v.arr.n - 1);
    }
    struct common_model m;
    if (common_model_init(&m, g, &e) == COMMON_OK) {
        for (uint32_t l = 0; l < m.hp.n_layer && m.hp.n_expert; l++) {
            struct common_span sp;
            (void)common_model_expert_span(&m, l, m.hp.n_expert - 1, COMMON_EXPERT_DOWN, &sp);
        }
        common_model_fini(&m);
    }
    common_gguf_close(g);
    return 0;
}
