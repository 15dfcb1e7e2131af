/* tests/cli/test_chat.c - `sluice chat` and `sluice run` end to end on the MoE fixture. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "fixture.h"

/* Runs a shell command; returns its stdout (malloc'd) and exit status. */
static char *sh(const char *cmd, int *status)
{
    char *out = fixture_run(cmd, status);
    cr_assert_not_null(out, "could not run %s", cmd);
    return out;
}

/* A one-shot greedy chat reply is exactly `sluice run` on the rendered prompt's token ids. */
Test(cli_chat, one_shot_reply_equals_run_on_rendered_ids, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, "moe-tiny/moe-tiny-f32.gguf");
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd),
             "%s/bin/sluice chat -m %s -p 'Who is the king?' --dry-run 2>/dev/null | tail -n 1",
             SLUICE_BINARY_DIR, model);
    char *ids = sh(cmd, &st);
    cr_assert_eq(st, 0);
    cr_assert_eq(ids[0], '[', "dry run ends with the id list: %s", ids);
    /* "[1, 2, 3]\n" -> "1,2,3" */
    char  *list = calloc(strlen(ids) + 1, 1);
    size_t k = 0;
    for (const char *p = ids; *p; p++)
        if ((*p >= '0' && *p <= '9') || *p == ',')
            list[k++] = *p;
    cr_assert_gt(k, 10);
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice run -m %s --prompt-ids %s -n 24 --temp 0 2>/dev/null",
             SLUICE_BINARY_DIR, model, list);
    char *run = sh(cmd, &st);
    cr_assert_eq(st, 0);
    snprintf(cmd, sizeof(cmd),
             "%s/bin/sluice chat -m %s -p 'Who is the king?' -n 24 --temp 0 2>/dev/null",
             SLUICE_BINARY_DIR, model);
    char *chat = sh(cmd, &st);
    cr_assert_eq(st, 0);
    cr_assert_gt(strlen(chat), 10, "an empty reply: '%s'", chat);
    cr_assert_str_eq(chat, run);
    free(ids);
    free(list);
    free(run);
    free(chat);
    free(model);
}

/* Two user lines on stdin get two replies; the second turn reuses the context. */
Test(cli_chat, two_turns_from_stdin, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, "moe-tiny/moe-tiny-q8_0.gguf");
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd),
             "printf 'Who is the king?\\nAnd the queen?\\n' | %s/bin/sluice chat -m %s -n 12 "
             "--temp 0.7 --seed 7 -sys 'You are a scribe.' 2>/dev/null",
             SLUICE_BINARY_DIR, model);
    char *out = sh(cmd, &st);
    cr_assert_eq(st, 0);
    int lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    cr_assert_eq(lines, 2, "two replies expected:\n%s", out);
    /* Same seed, same replies. */
    char *again = sh(cmd, &st);
    cr_assert_str_eq(out, again);
    free(out);
    free(again);
    free(model);
}

Test(cli_run, prompt_longer_than_context_is_refused_with_numbers)
{
    FIXTURE_OR_SKIP(model, "moe-tiny/moe-tiny-f32.gguf");
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd),
             "%s/bin/sluice run -m %s -c 8 -n 4 -p 'In the beginning God created the heavens "
             "and the earth' 2>&1 >/dev/null",
             SLUICE_BINARY_DIR, model);
    char *err = sh(cmd, &st);
    cr_assert_eq(st, 1);
    cr_assert_not_null(strstr(err, "context holds 8"), "%s", err);
    free(err);
    free(model);
}

Test(cli_run, unsupported_architecture_is_named)
{
    FIXTURE_OR_SKIP(model, "tokenizer/ggml-vocab-gpt-2.gguf");
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice run -m %s -p hi 2>&1 >/dev/null", SLUICE_BINARY_DIR,
             model);
    char *err = sh(cmd, &st);
    cr_assert_eq(st, 1);
    cr_assert_not_null(strstr(err, "gpt2"), "%s", err);
    free(err);
    free(model);
}
