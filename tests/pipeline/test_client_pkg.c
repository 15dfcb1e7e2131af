/* tests/pipeline/test_client_pkg.c - the installed client library builds a program through
 * pkg-config, under any install prefix. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "fixture.h"

static int run(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(pipeline_client_pkg, installed_library_links_through_pkg_config, .timeout = 300)
{
    const char *san = getenv("SLUICE_SANITIZER");
    if (san && *san)
        cr_skip_test("sanitizer build (%s): its static libraries need the sanitizer runtime", san);
    if (run("command -v pkg-config >/dev/null && command -v cc >/dev/null") != 0)
        cr_skip_test("pkg-config or cc missing");
    char *dir = fixture_tmpdir();
    char  src[1024];
    snprintf(src, sizeof(src), "%s/c.c", dir);
    FILE *f = fopen(src, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "#include <stdio.h>\n#include <sluice_client.h>\n"
            "int main(void)\n{\n    struct sluice_client *c = NULL;\n"
            "    int rc = sluice_client_connect(\"%s/none.sock\", &c);\n"
            "    printf(\"%%s\\n\", sluice_last_error());\n    return rc == 0;\n}\n",
            dir);
    fclose(f);
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "set -e; cd %s; cmake --install %s --prefix %s/prefix >install.log 2>&1; "
             "p=%s/prefix; export PKG_CONFIG_PATH=$p/lib/pkgconfig:$p/lib64/pkgconfig:"
             "$p/lib/x86_64-linux-gnu/pkgconfig; "
             "cc -std=c11 -Wall -Werror c.c $(pkg-config --cflags --libs sluice-client) -o c "
             "2>cc.log; ./c >out.txt",
             dir, SLUICE_BINARY_DIR, dir, dir);
    cr_assert_eq(run(cmd), 0, "install, compile or run failed (see %s)", dir);
    char path[1024];
    snprintf(path, sizeof(path), "%s/out.txt", dir);
    char *out = fixture_read_all(path, NULL);
    cr_assert_not_null(out);
    cr_assert(strstr(out, "router not running"), "the client says why: '%s'", out);
    free(out);
    fixture_rmtree(dir);
    free(dir);
}
