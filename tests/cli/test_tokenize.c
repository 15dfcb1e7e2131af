/* tests/cli/test_tokenize.c - `sluice tokenize`: the text as a positional, with -p or from -f
 * gives the same tokens. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"

#define SLUICE SLUICE_BINARY_DIR "/bin/sluice"
#define MODEL  "moe-tiny/moe-tiny-q4_0.gguf"
#define TEXT   "Hello world, said the king"

/* `sluice tokenize -m MODEL ARGS`: the printed tokens. */
static char *tokenize(const char *model, const char *args)
{
    char cmd[4096];
    int  st = 0;
    snprintf(cmd, sizeof(cmd), "%s tokenize -m %s %s 2>/dev/null", SLUICE, model, args);
    char *out = fixture_run(cmd, &st);
    cr_assert_not_null(out, "could not run %s", cmd);
    cr_assert_eq(st, 0, "%s exited %d", cmd, st);
    cr_assert(strstr(out, " -> "), "no tokens from %s:\n%s", cmd, out);
    return out;
}

Test(cli_tokenize, prompt_option_equals_positional_text)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *positional = tokenize(model, "'" TEXT "'");
    char *short_form = tokenize(model, "-p '" TEXT "'");
    char *long_form = tokenize(model, "--prompt='" TEXT "'");
    cr_assert_str_eq(short_form, positional);
    cr_assert_str_eq(long_form, positional);
    free(positional);
    free(short_form);
    free(long_form);
    free(model);
}

Test(cli_tokenize, file_equals_positional_text)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *dir = fixture_tmpdir();
    char  path[1024], args[1100];
    snprintf(path, sizeof(path), "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(TEXT, f); /* read byte for byte: no newline to drop */
    fclose(f);
    snprintf(args, sizeof(args), "-f %s", path);
    char *from_file = tokenize(model, args);
    char *positional = tokenize(model, "'" TEXT "'");
    cr_assert_str_eq(from_file, positional);
    free(from_file);
    free(positional);
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

/* -f of a device is refused at once (it read /dev/zero without limit before), in tokenize and in
 * perplexity alike. */
Test(cli_tokenize, file_that_is_a_device_is_refused, .timeout = 30)
{
    FIXTURE_OR_SKIP(model, MODEL);
    const char *cmds[] = {"tokenize", "perplexity"};
    for (size_t i = 0; i < 2; i++) {
        char cmd[4096];
        int  st = 0;
        snprintf(cmd, sizeof(cmd), "%s %s -m %s -f /dev/zero 2>&1", SLUICE, cmds[i], model);
        char *out = fixture_run(cmd, &st);
        cr_assert_not_null(out);
        cr_assert_neq(st, 0, "%s: %s", cmds[i], out);
        cr_assert(strstr(out, "not a regular file"), "%s: %s", cmds[i], out);
        free(out);
    }
    free(model);
}
