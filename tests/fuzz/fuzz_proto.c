/* tests/fuzz/fuzz_proto.c - libFuzzer target: control-message decoding on any bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.h"
#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct proto_msg m;
    if (proto_decode(data, size, &m) != COMMON_OK)
        return 0;
    /* What decodes must encode again. */
    uint8_t *buf = NULL;
    size_t   len = 0;
    if (proto_encode(&m, &buf, &len) != COMMON_OK)
        abort();
    free(buf);
    return 0;
}
