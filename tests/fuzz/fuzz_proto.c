/* tests/fuzz/fuzz_proto.c - libFuzzer target: control-message decoding on any bytes; what decodes
 * encodes again and decodes to the same message. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Both NULL, or both strings with the same bytes. */
static int same_str(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

/* Compares two decoded messages: heap strings by content, then everything else byte for byte
 * (decoding starts from a zeroed message, so unused bytes are zero in both). */
static int same_msg(const struct proto_msg *a, const struct proto_msg *b)
{
    static struct proto_msg x, y; /* process singleton of the fuzz target: large */
    x = *a;
    y = *b;
    if (a->kind == PROTO_KIND_GENERATE) {
        if (!same_str(a->u.generate.prompt, b->u.generate.prompt) ||
            a->u.generate.n_messages != b->u.generate.n_messages)
            return 0;
        x.u.generate.prompt = y.u.generate.prompt = NULL;
        for (uint32_t i = 0; i < a->u.generate.n_messages && i < PROTO_MAX_MESSAGES; i++) {
            if (!same_str(a->u.generate.messages[i].content, b->u.generate.messages[i].content))
                return 0;
            x.u.generate.messages[i].content = y.u.generate.messages[i].content = NULL;
        }
        /* The resumed token ids (protocol 0.3) are on the heap too. */
        const uint32_t nr = a->u.generate.n_resume;
        if (nr != b->u.generate.n_resume || !a->u.generate.resume != !b->u.generate.resume ||
            (nr && memcmp(a->u.generate.resume, b->u.generate.resume, nr * sizeof(int32_t)) != 0))
            return 0;
        x.u.generate.resume = y.u.generate.resume = NULL;
    } else if (a->kind == PROTO_KIND_EVENTS) {
        /* The text is bytes (it may hold NUL): compare text_len bytes. */
        uint32_t n = a->u.events.text_len;
        if (n != b->u.events.text_len || !a->u.events.text != !b->u.events.text ||
            (n && memcmp(a->u.events.text, b->u.events.text, n) != 0))
            return 0;
        x.u.events.text = y.u.events.text = NULL;
    }
    return memcmp(&x, &y, sizeof(x)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct proto_msg m;
    if (proto_decode(data, size, &m) != COMMON_OK)
        return 0;
    /* What decodes must encode again, and decode to the same message. */
    uint8_t *buf = NULL;
    size_t   len = 0;
    if (proto_encode(&m, &buf, &len) != COMMON_OK)
        abort();
    struct proto_msg m2;
    if (proto_decode(buf, len, &m2) != COMMON_OK)
        abort();
    if (!same_msg(&m, &m2))
        abort();
    proto_msg_clear(&m2);
    proto_msg_clear(&m);
    free(buf);
    return 0;
}
