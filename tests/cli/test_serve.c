/* tests/cli/test_serve.c - `sluice serve`: the HTTP API in one process (curl), its greedy text
 * equal to `sluice run`'s, a clean exit on SIGTERM, one clear line for a bad model. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"

#define SLUICE SLUICE_BINARY_DIR "/bin/sluice"
#define MODEL  "moe-tiny/moe-tiny-q4_0.gguf"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* `sluice serve` answers a greedy completion with `sluice run`'s text and exits cleanly on
 * SIGTERM. With `device_fault`, its layers are on the host backend's HOST0 (-ngl 999,
 * SLUICE_GPU_BACKEND=host) and its executor's 3rd batched step fails as a failing CUDA device's
 * does (SLUICE_TEST_DEVICE_FAULT): the step service drops the device and goes on on the CPU in
 * the same process, the router replays, and the text is the same. */
static void check_serve(bool device_fault)
{
    FIXTURE_OR_SKIP(model, MODEL);
    int st = 0;
    free(fixture_run("command -v curl >/dev/null", &st));
    if (st != 0)
        cr_skip_test("curl missing: skipped");
    char *dir = fixture_tmpdir();
    char  err_path[1100], cmd[4096];
    snprintf(err_path, sizeof(err_path), "%s/serve.err", dir);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        FILE *f = freopen(err_path, "w", stderr);
        (void)f;
        if (device_fault && (setenv("SLUICE_TEST_DEVICE_FAULT", "3", 1) != 0 ||
                             setenv("SLUICE_GPU_BACKEND", "host", 1) != 0))
            _exit(127);
        execl(SLUICE, "sluice", "serve", "-m", model, "--http", "127.0.0.1:0", "-t", "2",
              "--parallel", "2", "-ngl", device_fault ? "999" : "0", (char *)NULL);
        _exit(127);
    }
    /* The url comes on stderr once both services run. */
    char  *log = NULL, url[128] = "";
    double t0 = now_s();
    while (!url[0] && now_s() - t0 < 120) {
        free(log);
        log = fixture_read_all(err_path, NULL);
        const char *at = log ? strstr(log, "sluice serve: listening on http://") : NULL;
        if (at)
            sscanf(at + strlen("sluice serve: listening on "), "%127[^ \n]", url);
        else
            usleep(100 * 1000);
    }
    cr_assert(url[0], "no url from sluice serve:\n%s", log ? log : "");
    const char *sock = log ? strstr(log, "listening on ipc://") : NULL;
    char        run_dir[600] = "";
    if (sock)
        sscanf(sock + strlen("listening on ipc://"), "%599[^ \n]", run_dir);
    char *slash = strrchr(run_dir, '/');
    if (slash)
        *slash = '\0'; /* .../router.sock -> the run directory */
    cr_assert(run_dir[0], "the router did not say where it listens:\n%s", log);
    free(log);

    snprintf(cmd, sizeof(cmd),
             "curl -s -m 60 %s/v1/completions -H 'Content-Type: application/json' -d "
             "'{\"prompt\":\"hello world\",\"max_tokens\":12,\"temperature\":0}'",
             url);
    char *answer = fixture_run(cmd, &st);
    cr_assert(answer && st == 0, "curl failed");
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p 'hello world' -n 12 --temp 0 -t 2 2>/dev/null",
             SLUICE, model);
    char *single = fixture_run(cmd, &st);
    cr_assert(single && st == 0);
    single[strcspn(single, "\n")] = '\0';
    char want[1024];
    snprintf(want, sizeof(want), "\"text\":\"%s\"", single);
    cr_expect(strstr(answer, want) != NULL, "HTTP answer %s\nsluice run: %s", answer, single);
    char *after = fixture_read_all(err_path, NULL);
    cr_assert_not_null(after);
    const bool fell = strstr(after, "injected device failure; going on without the device") &&
                      strstr(after, "gpu: HOST0");
    cr_expect_eq(fell, device_fault, "the fall back to the CPU %s:\n%s",
                 device_fault ? "is not in the log" : "happened without a fault", after);
    free(after);

    cr_assert_eq(kill(pid, SIGTERM), 0);
    int    ws = 0;
    pid_t  r = 0;
    double t1 = now_s();
    while ((r = waitpid(pid, &ws, WNOHANG)) == 0 && now_s() - t1 < 60)
        usleep(50 * 1000);
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &ws, 0);
        cr_assert_fail("sluice serve did not exit on SIGTERM");
    }
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "sluice serve exit status %d", ws);
    struct stat sb;
    cr_expect_neq(stat(run_dir, &sb), 0, "its run directory %s was left behind", run_dir);
    free(answer);
    free(single);
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

Test(cli_serve, http_in_one_process_equals_run_and_exits_cleanly, .timeout = 300)
{
    check_serve(false);
}

Test(cli_serve, device_failure_in_one_process_falls_back_to_the_cpu, .timeout = 300)
{
    check_serve(true);
}

Test(cli_serve, bad_model_is_one_line_and_exit_1, .timeout = 60)
{
    char *dir = fixture_tmpdir();
    char  cmd[4096];
    int   st = 0;
    snprintf(cmd, sizeof(cmd),
             "echo nonsense > %s/x.gguf; %s serve -m %s/x.gguf --http 127.0.0.1:0 2>&1", dir,
             SLUICE, dir);
    char *out = fixture_run(cmd, &st);
    cr_assert_not_null(out);
    cr_assert_eq(st, 1, "exit %d: %s", st, out);
    cr_assert(strstr(out, "sluice serve: error:") && strchr(out, '\n') == out + strlen(out) - 1,
              "one line: %s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s serve --http 127.0.0.1:0 2>&1", SLUICE);
    out = fixture_run(cmd, &st);
    cr_assert_eq(st, 2, "no model is a usage error: %s", out);
    free(out);
    fixture_rmtree(dir);
    free(dir);
}
