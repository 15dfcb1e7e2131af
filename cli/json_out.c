/* cli/json_out.c - what the --json outputs of the commands are built from (jansson). */
#include "cli.h"

#include <math.h>
#include <stdlib.h>

json_t *cli_json_str(const char *s, size_t len)
{
    size_t  n = 0;
    char   *ok = common_utf8_repair(s ? s : "", s ? len : 0, &n);
    json_t *j = ok ? json_stringn(ok, n) : NULL;
    free(ok);
    return j ? j : json_null();
}

json_t *cli_json_num(double v)
{
    if (!isfinite(v))
        return json_null();
    if (v == floor(v) && fabs(v) < 9007199254740992.0)
        return json_integer((json_int_t)v);
    return json_real(v);
}

int cli_json_print(json_t *v, FILE *f)
{
    int rc = v && json_dumpf(v, f, JSON_COMPACT) == 0 && fputc('\n', f) != EOF ? 0 : -1;
    json_decref(v);
    return rc;
}
