/* proto/proto.h - public front door of proto/: the wire protocol version shared by all daemons. */
#ifndef PROTO_PROTO_H
#define PROTO_PROTO_H

#include <stdbool.h>
#include <stdint.h>

/* Protocol version spoken by this build; bumped on any incompatible message change. */
#define PROTO_VERSION_MAJOR 0
#define PROTO_VERSION_MINOR 1

/* True when a peer announcing (major, minor) can talk to this build: same major, any minor. */
bool proto_version_is_compatible(uint32_t major, uint32_t minor);

#endif /* PROTO_PROTO_H */
