/* proto/proto.c - wire protocol version checks. */
#include "proto.h"

bool proto_version_is_compatible(uint32_t major, uint32_t minor)
{
    (void)minor; /* minor versions only add optional fields */
    return major == PROTO_VERSION_MAJOR;
}
