/* proto/proto.h - public front door of proto/: protocol version and the control messages in C. */
#ifndef PROTO_PROTO_H
#define PROTO_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Protocol version spoken by this build; bumped on any incompatible message change. */
#define PROTO_VERSION_MAJOR 0
#define PROTO_VERSION_MINOR 1

/* Limits on decoded messages; larger inbound messages are refused with COMMON_EPROTO. */
#define PROTO_MAX_MESSAGE_BYTES (1u << 20)
#define PROTO_MAX_SHARDS        64u
#define PROTO_MAX_NAME          64u  /* bytes, including the NUL */
#define PROTO_MAX_ERROR_TEXT    256u /* bytes, including the NUL */

/* True when a peer announcing (major, minor) can talk to this build: same major, any minor. */
bool proto_version_is_compatible(uint32_t major, uint32_t minor);

enum proto_role {
    PROTO_ROLE_FETCHER = 0,
    PROTO_ROLE_EXECUTOR = 1,
    PROTO_ROLE_ROUTER = 2,
    PROTO_ROLE_CLIENT = 3,
};

enum proto_kind {
    PROTO_KIND_HELLO = 1,
    PROTO_KIND_ERROR = 2,
};

/* One fetcher's share of the experts: [first_expert, first_expert + n_experts). */
struct proto_shard {
    uint32_t fetcher;
    uint32_t first_expert;
    uint32_t n_experts;
};

struct proto_hello {
    uint32_t           major;
    uint32_t           minor;
    enum proto_role    role;
    char               name[PROTO_MAX_NAME]; /* NUL-terminated */
    uint32_t           n_shards;
    struct proto_shard shards[PROTO_MAX_SHARDS];
};

struct proto_error {
    int32_t code;                          /* a common_err value */
    char    message[PROTO_MAX_ERROR_TEXT]; /* NUL-terminated */
};

/* A decoded control message: fixed-size, no pointers, safe to copy. */
struct proto_msg {
    enum proto_kind kind;
    uint64_t        request_id;
    union {
        struct proto_hello hello;
        struct proto_error error;
    } u;
};

/* Encodes `m` into a malloc'd buffer (*buf, *len; the caller frees it). Returns 0,
 * COMMON_EINVAL (unknown kind, too many shards, name or message too long) or COMMON_ENOMEM.
 * Thread-safe. */
int proto_encode(const struct proto_msg *m, uint8_t **buf, size_t *len);

/* Verifies `buf` with the generated FlatBuffers verifier, then decodes it into *out. Returns 0,
 * or COMMON_EPROTO for anything malformed, oversized, of another file identifier, or with a
 * string that does not fit; *out is unchanged on failure. Never reads outside buf[0, len).
 * Thread-safe. */
int proto_decode(const void *buf, size_t len, struct proto_msg *out);

#endif /* PROTO_PROTO_H */
