/* common/err.c - error codes: names, errno mapping and the one-line error message buffer. */
#include "common.h"

#include <errno.h>
#include <stdio.h>

const char *common_strerror(int err)
{
    switch (err) {
    case COMMON_OK:
        return "ok";
    case COMMON_EINVAL:
        return "invalid argument";
    case COMMON_ENOMEM:
        return "out of memory";
    case COMMON_EIO:
        return "I/O error";
    case COMMON_EAGAIN:
        return "try again";
    case COMMON_ETIMEDOUT:
        return "timed out";
    case COMMON_ECLOSED:
        return "closed";
    case COMMON_EPROTO:
        return "protocol error";
    case COMMON_ECORRUPT:
        return "corrupt data";
    case COMMON_EBUSY:
        return "busy";
    case COMMON_ENOTSUP:
        return "not supported";
    case COMMON_ERANGE:
        return "out of range";
    case COMMON_ENOENT:
        return "not found";
    case COMMON_EDEVICE:
        return "device failure";
    default:
        return "unknown error";
    }
}

int common_err_from_errno(int errnum)
{
    switch (errnum) {
    case 0:
        return COMMON_OK;
    case ENOENT:
    case ENOTDIR:
        return COMMON_ENOENT;
    case ENOMEM:
        return COMMON_ENOMEM;
    case EINVAL:
        return COMMON_EINVAL;
    case EAGAIN:
        return COMMON_EAGAIN;
    case ETIMEDOUT:
        return COMMON_ETIMEDOUT;
    case EBUSY:
        return COMMON_EBUSY;
    case ERANGE:
    case EOVERFLOW:
        return COMMON_ERANGE;
    case ENOTSUP:
        return COMMON_ENOTSUP;
    case EPIPE:
    case ECONNRESET:
        return COMMON_ECLOSED;
    default:
        return COMMON_EIO;
    }
}

int common_errmsg_set(struct common_errmsg *e, int err, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->text, sizeof(e->text), fmt, ap);
        va_end(ap);
    }
    return err;
}
