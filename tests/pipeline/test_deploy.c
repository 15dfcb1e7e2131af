/* tests/pipeline/test_deploy.c - the deployment files: the sample config is valid for every
 * daemon, and a bad one stops a daemon with the file and line. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"

static const char *const k_daemons[] = {"sluice-fetcher", "sluice-executor", "sluice-router"};

Test(pipeline_deploy, sample_config_is_accepted_by_every_daemon)
{
    for (size_t i = 0; i < sizeof(k_daemons) / sizeof(k_daemons[0]); i++) {
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "%s/bin/%s --config %s/deploy/sluice.conf.example --help 2>&1",
                 SLUICE_BINARY_DIR, k_daemons[i], SLUICE_SOURCE_DIR);
        int   status = -1;
        char *out = fixture_run(cmd, &status);
        cr_assert_not_null(out);
        cr_expect_eq(status, 0, "%s: %s", k_daemons[i], out);
        cr_expect(strstr(out, "usage:") != NULL, "%s: %s", k_daemons[i], out);
        free(out);
    }
}

Test(pipeline_deploy, config_error_names_file_and_line_and_exits_2)
{
    char *dir = fixture_tmpdir();
    char  path[512], cmd[1024];
    snprintf(path, sizeof(path), "%s/bad.conf", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("model = /m.gguf\n[executor]\nthreads = 2\n[fetcher]\nno-such-option = 1\n", f);
    fclose(f);
    /* The executor skips the fetcher's section; the fetcher refuses its unknown key. */
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice-fetcher --config %s --help 2>&1", SLUICE_BINARY_DIR,
             path);
    int   status = -1;
    char *out = fixture_run(cmd, &status);
    cr_expect_eq(status, 2, "%s", out);
    cr_expect(strstr(out, "unknown option '--no-such-option'") != NULL, "%s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice-executor --config %s --help 2>&1",
             SLUICE_BINARY_DIR, path);
    out = fixture_run(cmd, &status);
    cr_expect_eq(status, 0, "%s", out);
    free(out);
    f = fopen(path, "w");
    fputs("model = /m.gguf\n\n[scheduler]\n", f);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice-router --config %s --help 2>&1", SLUICE_BINARY_DIR,
             path);
    out = fixture_run(cmd, &status);
    cr_expect_neq(status, 0, "%s", out);
    cr_expect(strstr(out, "bad.conf:3") != NULL, "file:line named: %s", out);
    free(out);
    fixture_rmtree(dir);
    free(dir);
}
