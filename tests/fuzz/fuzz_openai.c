/* tests/fuzz/fuzz_openai.c - libFuzzer target: the HTTP API's request parser on any bytes (the
 * first byte picks /v1/completions or /v1/chat/completions, the rest is the body). It must
 * answer every body with a request or an error object, never read out of bounds or leak. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    static const char *const models[] = {"model", "sluice-synth", NULL};
    const enum openai_kind   kind = data[0] & 1 ? OPENAI_CHAT : OPENAI_COMPLETION;
    struct openai_req        r = {0};
    struct openai_err        err;
    if (openai_parse(kind, (const char *)data + 1, size - 1, models, &r, &err) == 0) {
        openai_req_fini(&r);
    } else {
        char *j = openai_error_json(&err);
        free(j);
    }
    return 0;
}
