/* tests/pipeline/test_client_pkg.c - the installed client library builds a program through
 * pkg-config, under any install prefix. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
    /* Installed: the shared library alone (no C++ runtime, no internal library needed), then the
     * static one with what `pkg-config --static` adds; and from the build tree. */
    snprintf(
        cmd, sizeof(cmd),
        "set -e; cd %s; cmake --install %s --prefix %s/prefix >install.log 2>&1; "
        "p=%s/prefix; l=$(dirname $(ls $p/lib*/libsluice_client.so $p/lib/*/libsluice_client.so"
        " 2>/dev/null | head -1)); export PKG_CONFIG_PATH=$l/pkgconfig; "
        "cc -std=c11 -Wall -Werror c.c $(pkg-config --cflags --libs sluice-client) -o c "
        "2>cc.log; LD_LIBRARY_PATH=$l ./c >out.txt; "
        "readelf -d c $l/libsluice_client.so | grep NEEDED >needed.txt; "
        "cc -std=c11 -Wall -Werror c.c $(pkg-config --cflags sluice-client) -L$l "
        "-Wl,-Bstatic -lsluice_client -Wl,-Bdynamic "
        "$(pkg-config --static --libs-only-other --libs-only-l sluice-client | "
        "sed 's/-lsluice_client//') -L$l/sluice -o cs 2>ccs.log; ./cs >out-static.txt; "
        "PKG_CONFIG_PATH=%s/pkgconfig cc -std=c11 -Wall -Werror c.c "
        "$(PKG_CONFIG_PATH=%s/pkgconfig pkg-config --cflags --libs sluice-client) -o cb "
        "2>ccb.log; LD_LIBRARY_PATH=%s/router ./cb >out-build.txt",
        dir, SLUICE_BINARY_DIR, dir, dir, SLUICE_BINARY_DIR, SLUICE_BINARY_DIR, SLUICE_BINARY_DIR);
    cr_assert_eq(run(cmd), 0, "install, compile or run failed (see %s)", dir);
    const char *outs[] = {"out.txt", "out-static.txt", "out-build.txt"};
    for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, outs[i]);
        char *out = fixture_read_all(path, NULL);
        cr_assert_not_null(out);
        cr_assert(strstr(out, "router not running"), "%s: the client says why: '%s'", outs[i], out);
        free(out);
    }
    char path[1024];
    snprintf(path, sizeof(path), "%s/needed.txt", dir);
    char *needed = fixture_read_all(path, NULL);
    cr_assert_not_null(needed);
    cr_assert(!strstr(needed, "libstdc++") && !strstr(needed, "libproto") &&
                  !strstr(needed, "libcommon") && strstr(needed, "libsluice_client"),
              "the program and the library need:\n%s", needed);
    free(needed);
    /* The supervisor, its units and the documentation come with the install; the installed
     * sluicectl finds the binaries beside it. */
    const char *files[] = {"bin/sluicectl",
                           "bin/sluice-router",
                           "share/doc/sluice/README.md",
                           "share/doc/sluice/serving.md",
                           "lib/systemd/system/sluice.target",
                           "lib/systemd/system/sluice-executor.service"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/prefix/%s", dir, files[i]);
        cr_assert(access(path, F_OK) == 0, "%s was not installed", files[i]);
    }
    snprintf(cmd, sizeof(cmd),
             "cd %s; env -u SLUICE_BIN prefix/bin/sluicectl up --model c.c --run-dir run "
             "--start-timeout 10 >up.txt 2>&1; prefix/bin/sluicectl down --run-dir run "
             ">/dev/null 2>&1; grep -q 'not a GGUF file' up.txt && ! grep -q 'is not built' up.txt",
             dir);
    cr_assert_eq(run(cmd), 0, "the installed sluicectl looked for the binaries elsewhere");
    fixture_rmtree(dir);
    free(dir);
}
