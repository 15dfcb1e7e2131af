/* cli/error.c - the one message style of every error a subcommand reports: "sluice run: error:
 * ...". */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void cli_error(const char *prog, const char *fmt, ...)
{
    /* One fputs of the whole line, so that lines of concurrent writers do not interleave. */
    char    line[1024];
    int     n = snprintf(line, sizeof(line), "%s: error: ", prog ? prog : "sluice");
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

void cli_error_path(const char *prog, const char *path, int rc, const struct common_errmsg *e)
{
    const char *why = e && e->text[0] ? e->text : common_strerror(rc);
    if (strstr(why, path))
        cli_error(prog, "%s", why);
    else
        cli_error(prog, "%s: %s", path, why);
}
