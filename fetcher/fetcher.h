/* fetcher/fetcher.h - public front door of fetcher/: reading model bytes (experts) from storage. */
#ifndef FETCHER_FETCHER_H
#define FETCHER_FETCHER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* Reads the bytes of `span` (a tensor or one expert part of model `g`) into `dst`, which holds
 * at least span->size bytes, with blocking pread calls. Returns 0, or COMMON_EIO with a message
 * naming the file, offset and errno (a short read is an error; `dst` is then undefined).
 * Thread-safe: pread does not move the file offset. */
int fetcher_read_span(const struct common_gguf *g, const struct common_span *span, void *dst,
                      struct common_errmsg *e);

#endif /* FETCHER_FETCHER_H */
