/* tests/pipeline/test_faults.c - the real daemons under sluicectl: same tokens as one process,
 * kill -9 of each daemon mid-generation, many clients, garbage on every socket. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "common.h"
#include "fixture.h"
#include "proto.h"

#define BIN        SLUICE_BINARY_DIR "/bin"
#define SLUICECTL  SLUICE_SOURCE_DIR "/deploy/sluicectl"
#define TINY_MODEL "moe-tiny/moe-tiny-q8_0.gguf"

static const char *k_prompt = "Now it happened that";

/* ---- helpers ------------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs a shell command; returns its stdout (malloc'd) and exit status. */
static char *sh(const char *cmd, int *status)
{
    char *out = fixture_run(cmd, status);
    cr_assert_not_null(out, "could not run %s", cmd);
    return out;
}

static void skip_without_daemons(void)
{
    const char *bins[] = {BIN "/sluice-fetcher", BIN "/sluice-executor", BIN "/sluice-router"};
    for (size_t i = 0; i < 3; i++)
        if (access(bins[i], X_OK) != 0)
            cr_skip_test("%s is not built: skipped", bins[i]);
}

/* The run directory of the running test, stopped by fini() even after a failed assertion. */
static char g_dir[1024];

static void down(const char *dir);

static void fini(void)
{
    if (g_dir[0])
        down(g_dir);
    g_dir[0] = '\0';
}

/* Starts the daemons on `model` in `dir` with `fetchers` fetchers; asserts success. */
static void up(const char *dir, const char *model, int fetchers, const char *extra)
{
    char cmd[4096];
    int  st;
    snprintf(g_dir, sizeof(g_dir), "%s", dir);
    snprintf(cmd, sizeof(cmd),
             "%s up --model %s --run-dir %s --fetchers %d --bin %s %s >%s/up.out 2>&1; "
             "st=$?; [ $st -eq 0 ] || cat %s/up.out %s/logs/*.log >&2; exit $st",
             SLUICECTL, model, dir, fetchers, BIN, extra ? extra : "", dir, dir, dir);
    free(sh(cmd, &st));
    cr_assert_eq(st, 0, "sluicectl up failed (see stderr)");
}

/* Stops the daemons, then fails the test if a sanitizer reported anything in their logs (the
 * ASan build runs the daemons instrumented: leaks are reported at their exit). */
static void down(const char *dir)
{
    char cmd[2048];
    int  st;
    snprintf(cmd, sizeof(cmd), "%s down --run-dir %s >/dev/null 2>&1", SLUICECTL, dir);
    free(sh(cmd, &st));
    if (strcmp(dir, g_dir) == 0)
        g_dir[0] = '\0';
    snprintf(cmd, sizeof(cmd),
             "grep -h -m 3 -E '(Address|Leak|Thread|UndefinedBehavior)Sanitizer|runtime error:' "
             "%s/logs/*.log 2>/dev/null || true",
             dir);
    char *reports = sh(cmd, &st);
    bool  clean = reports[0] == '\0';
    if (!clean)
        cr_log_error("sanitizer reports in %s/logs: %s", dir, reports);
    free(reports);
    cr_assert(clean, "a daemon reported a sanitizer error (logs in %s/logs)", dir);
}

static pid_t read_pid(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s.pid", dir, name);
    char *s = fixture_read_all(path, NULL);
    cr_assert_not_null(s, "no pid file %s", path);
    pid_t pid = (pid_t)atol(s);
    free(s);
    cr_assert_gt(pid, 1);
    return pid;
}

/* Lines of DIR/logs/NAME.log that hold `text` (no quote in it). */
static int log_count(const char *dir, const char *name, const char *text)
{
    char cmd[2048];
    int  st;
    snprintf(cmd, sizeof(cmd), "grep -c -F '%s' '%s/logs/%s.log'", text, dir, name);
    char *out = sh(cmd, &st);
    int   n = atoi(out);
    free(out);
    return n;
}

/* The last lines of the client's errors and of the router's and the monitor's logs in `dir`, for
 * a failure message (CI shows the message, not the files). */
static const char *last_words(const char *dir)
{
    static char out[4096];
    char        cmd[2048];
    int         st;
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && for f in gen.err logs/router.log logs/sluicectl.log; do [ -s $f ] && "
             "echo \"  $f: $(tail -n 3 $f | cut -c1-200 | tr '\\n' '|')\"; done; true",
             dir);
    char *s = sh(cmd, &st);
    snprintf(out, sizeof(out), "%s", s);
    free(s);
    return out;
}

/* Waits until `name`'s pid file names a live process other than `old`. */
static void wait_restarted(const char *dir, const char *name, pid_t old, double secs)
{
    double t0 = now_s();
    while (now_s() - t0 < secs) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s.pid", dir, name);
        char *s = fixture_read_all(path, NULL);
        pid_t pid = s ? (pid_t)atol(s) : 0;
        free(s);
        if (pid > 1 && pid != old && kill(pid, 0) == 0)
            return;
        usleep(50 * 1000);
    }
    cr_assert_fail("%s was not restarted within %.0f s", name, secs);
}

/* The text `sluice run` (one process) prints for the prompt. */
static char *one_process(const char *model, int n, const char *sampling)
{
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd), "%s/sluice run -m %s -p '%s' -n %d %s 2>/dev/null", BIN, model,
             k_prompt, n, sampling);
    char *out = sh(cmd, &st);
    cr_assert_eq(st, 0, "sluice run failed");
    return out;
}

/* A `sluice generate` child whose stdout we read. */
struct gen {
    pid_t pid;
    int   out; /* read end of its stdout */
};

static struct gen gen_start(const char *dir, int n, const char *sampling)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "exec %s/sluice generate --run-dir %s -p '%s' -n %d %s 2>>%s/gen.err", BIN, dir,
             k_prompt, n, sampling, dir);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    return (struct gen){pid, fds[0]};
}

/* Reads until at least `want` bytes arrived (or EOF); returns the count read into buf. */
static size_t gen_read(struct gen *g, char *buf, size_t cap, size_t have, size_t want, double secs)
{
    double t0 = now_s();
    while (have < want && have + 1 < cap && now_s() - t0 < secs) {
        struct pollfd p = {.fd = g->out, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = read(g->out, buf + have, cap - have - 1);
        if (r <= 0)
            break;
        have += (size_t)r;
    }
    buf[have] = '\0';
    return have;
}

/* Reads to EOF and reaps; returns the exit status (-1 on a signal or timeout). */
static int gen_finish(struct gen *g, char *buf, size_t cap, size_t have, double secs)
{
    have = gen_read(g, buf, cap, have, cap, secs);
    (void)have;
    close(g->out);
    int    st = 0;
    double t0 = now_s();
    while (waitpid(g->pid, &st, WNOHANG) == 0) {
        if (now_s() - t0 > secs) {
            kill(g->pid, SIGKILL);
            waitpid(g->pid, &st, 0);
            return -1;
        }
        usleep(20 * 1000);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A model big enough that a generation lasts a while (random weights, made once per run). */
static char *slow_model(const char *dir)
{
    char *path = malloc(strlen(dir) + 32);
    sprintf(path, "%s/slow.gguf", dir);
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd), "%s/sluice mkmodel --preset demo --size 96M -o %s >/dev/null 2>&1",
             BIN, path);
    free(sh(cmd, &st));
    cr_assert_eq(st, 0, "mkmodel failed");
    return path;
}

/* ---- same tokens as one process ------------------------------------------------------------ */

/* The daemons running in `dir` generate 48 tokens of k_prompt with `sampling`, then are stopped:
 * the text must be what one process gives on `model` (`what` names the case in messages). */
static void assert_daemons_equal_one_process(const char *dir, const char *model,
                                             const char *sampling, const char *what)
{
    char *want = one_process(model, 48, sampling);
    char  cmd[4096];
    int   st;
    snprintf(cmd, sizeof(cmd), "%s/sluice generate --run-dir %s -p '%s' -n 48 %s 2>%s/gen.err", BIN,
             dir, k_prompt, sampling, dir);
    char *got = sh(cmd, &st);
    down(dir);
    cr_assert_eq(st, 0, "%s: sluice generate failed (%s/gen.err)\n%s", what, dir, last_words(dir));
    cr_assert_gt(strlen(want), 20);
    cr_assert_str_eq(got, want, "%s daemons: '%s'\none process: '%s'", what, got, want);
    cr_log_info("%s: %zu bytes of text identical through the daemons", what, strlen(got));
    free(got);
    free(want);
}

static void check_same_as_one_process(int fetchers, const char *sampling)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    char *dir = fixture_tmpdir();
    up(dir, model, fetchers, NULL);
    assert_daemons_equal_one_process(dir, model, sampling, "moe-tiny");
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

Test(pipeline_faults, greedy_tokens_equal_one_process, .timeout = 300, .fini = fini)
{
    check_same_as_one_process(1, "--temp 0");
}

/* The MoE architectures beyond llama's layout through the daemons: qwen2moe (shared expert
 * beside the streamed ones), olmoe (q/k norms), deepseek2 (latent attention, a dense first
 * layer without experts, sigmoid routing over groups) and glm4moe (a prediction block left
 * unread), random-weight models from mkmodel. */
Test(pipeline_faults, moe_architectures_give_the_same_tokens_as_one_process, .timeout = 600,
     .fini = fini)
{
    skip_without_daemons();
    static const char *archs[] = {"qwen2moe", "olmoe", "deepseek2", "glm4moe", "gpt-oss"};
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++) {
        char *dir = fixture_tmpdir();
        char  model[2048], cmd[4096];
        int   st;
        snprintf(model, sizeof(model), "%s/%s.gguf", dir, archs[i]);
        snprintf(cmd, sizeof(cmd),
                 "%s/sluice mkmodel -q --arch %s --preset tiny --n-vocab 2048 --n-ff 256 "
                 "--n-head-kv 8 --type q8_0 -o %s",
                 BIN, archs[i], model);
        free(sh(cmd, &st));
        cr_assert_eq(st, 0, "mkmodel --arch %s failed", archs[i]);
        up(dir, model, 1, NULL);
        assert_daemons_equal_one_process(dir, model, "--temp 0", archs[i]);
        fixture_rmtree(dir);
        free(dir);
    }
}

Test(pipeline_faults, sampled_tokens_equal_one_process_two_fetchers, .timeout = 300, .fini = fini)
{
    check_same_as_one_process(2, "--temp 0.8 --seed 42");
}

/* Converts `model` to DIR/model.qsf (its path to qsf) with the options `args`. */
static void convert_qsf(const char *dir, const char *model, const char *args, char *qsf, size_t len)
{
    char cmd[4096];
    int  st;
    snprintf(qsf, len, "%s/model.qsf", dir);
    snprintf(cmd, sizeof(cmd), "%s/sluice convert %s %s %s >/dev/null 2>&1", BIN, args, model, qsf);
    free(sh(cmd, &st));
    cr_assert_eq(st, 0, "sluice convert %s failed", args);
}

/* The daemons on the QSF file of the model, its bundles in two files in two directories (as on
 * two devices), one per fetcher (each reads its experts' bundles, each checked, one read per
 * expert): the GGUF's tokens in one process. */
Test(pipeline_faults, qsf_model_gives_the_tokens_of_its_gguf, .timeout = 300, .fini = fini)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    char *dir = fixture_tmpdir();
    char  qsf[2048], cmd[4096], args[2048];
    int   st;
    snprintf(cmd, sizeof(cmd), "mkdir %s/ssd1 %s/ssd2", dir, dir);
    free(sh(cmd, &st));
    cr_assert_eq(st, 0, "%s", cmd);
    snprintf(args, sizeof(args), "--shards 2 --shard-dir %s/ssd1 --shard-dir %s/ssd2", dir, dir);
    convert_qsf(dir, model, args, qsf, sizeof(qsf));
    up(dir, qsf, 2, NULL);
    /* Each fetcher reads its own file (its own device). */
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd), "grep -h 'reads bundle file' %s/logs/fetcher-%d*.log", dir, i);
        char *log = sh(cmd, &st);
        cr_assert(strstr(log, i ? "/ssd2/model-experts-00002-of-00002.qsf"
                                : "/ssd1/model-experts-00001-of-00002.qsf"),
                  "fetcher %d: %s", i, log);
        cr_assert(!strstr(log, i ? "ssd1" : "ssd2"), "fetcher %d reads both: %s", i, log);
        free(log);
    }
    /* The QSF daemons against the GGUF in one process. */
    assert_daemons_equal_one_process(dir, model, "--temp 0", "QSF");
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

/* A corrupt expert through the daemons (every bundle of layer 1 corrupt, so the first token needs
 * a bad one): the client's error line names what the fetcher found (the bundle's layer and
 * expert, its file, the checksum), as one process's does. `staged`: the device pool's misses read
 * from storage by the fetcher (--vram-fill storage, the host backend): its staging read fails the
 * checksum first, the next mark says so, the executor does the round again through the RAM
 * pool, and the fetcher's load there names the bundle. */
static void check_corrupt_bundle_named(bool staged)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    char *dir = fixture_tmpdir();
    char  qsf[2048], cmd[4096];
    int   st;
    convert_qsf(dir, model, "", qsf, sizeof(qsf));
    cr_assert_gt(fixture_flip_bundles(qsf, 1), 0, "no bundle of layer 1 changed");
    if (staged)
        cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    up(dir, qsf, 1,
       staged ? "-ngl 999 --vram-budget 1M --ram-budget 64M --vram-fill storage" : NULL);
    snprintf(cmd, sizeof(cmd),
             "%s/sluice generate --run-dir %s -p '%s' -n 8 --temp 0 2>&1 >/dev/null", BIN, dir,
             k_prompt);
    char *err = sh(cmd, &st);
    char *stats = NULL;
    if (staged) { /* the staging found it first, and the executor knew */
        snprintf(cmd, sizeof(cmd),
                 "%s/sluice ctl --run-dir %s --daemon fetcher-0 stats | grep -E "
                 "'^devpool\\.stage_failed +[1-9]' && %s/sluice ctl --run-dir %s --daemon "
                 "executor stats | grep -E '^gpu_pool\\.stage_failures +[1-9]'",
                 BIN, dir, BIN, dir);
        int sst = 0;
        stats = sh(cmd, &sst);
        cr_expect_eq(sst, 0, "no failed staging read counted: %s", stats);
        cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    }
    down(dir);
    cr_assert_neq(st, 0, "a corrupt expert gave no error:\n%s", err);
    /* (with a device, the line says first that a device batch failed) */
    const char *line = strstr(err, "executor step failed: ");
    cr_assert_not_null(line, "no step error:\n%s", err);
    char one[1024];
    snprintf(one, sizeof(one), "%.*s", (int)strcspn(line, "\n"), line);
    cr_assert(strstr(one, staged ? "fetcher 0: " : "executor step failed: fetcher 0: "),
              "the error does not carry the fetcher's reason:\n%s", one);
    cr_assert(strstr(one, "layer 1 expert") && strstr(one, "checksum") && strstr(one, qsf), "%s",
              one);
    cr_log_info("%s%s%s", one, stats ? "\n" : "", stats ? stats : "");
    free(stats);
    free(err);
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

/* Where it used to say "I/O error" (the executor asks the fetcher why, EXPERT_ERROR, and puts the
 * reason in the step's reply for the router). */
Test(pipeline_faults, qsf_corrupt_bundle_is_named_to_the_client, .timeout = 300, .fini = fini)
{
    check_corrupt_bundle_named(false);
}

Test(pipeline_faults, qsf_corrupt_bundle_staged_for_the_device_is_named_to_the_client,
     .timeout = 300, .fini = fini)
{
    check_corrupt_bundle_named(true);
}

/* `model` split by layer into DIR/ssd1 and DIR/ssd2 (one directory per SSD); the first split's
 * path in first (len bytes). */
static void split_on_two_ssds(const char *dir, const char *model, char *first, size_t len)
{
    char ssd[2][1024];
    for (int i = 0; i < 2; i++) {
        snprintf(ssd[i], sizeof(ssd[i]), "%s/ssd%d", dir, i + 1);
        cr_assert_eq(mkdir(ssd[i], 0700), 0);
    }
    cr_assert_eq(fixture_split_gguf_by_layer(model, ssd[0], ssd[1], "m", first, len), 0);
}

/* GGUF splits on two devices (directories; the second split a symlink beside the first, as a
 * user would place it): with --shard-by file, fetcher i serves the layers of the i-th directory
 * and reads only its split, and the text is the one-file model's in one process. The default
 * sharding (by expert) over the same splits gives it too. */
Test(pipeline_faults, split_gguf_on_two_devices_one_fetcher_each, .timeout = 300, .fini = fini)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    char *dir = fixture_tmpdir();
    char  first[2048], cmd[4096];
    int   st;
    split_on_two_ssds(dir, model, first, sizeof(first));
    up(dir, first, 2, "--shard-by file");
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd), "grep -h -E 'reads split file|^shard' %s/logs/fetcher-%d*.log",
                 dir, i);
        char *log = sh(cmd, &st);
        cr_assert(strstr(log, i ? "layers [2,4)" : "layers [0,2)"), "fetcher %d: %s", i, log);
        cr_assert(strstr(log, i ? "/ssd2/m-00002-of-00002.gguf" : "/ssd1/m-00001-of-00002.gguf"),
                  "fetcher %d: %s", i, log);
        cr_assert(!strstr(log, i ? "ssd1/" : "ssd2/"), "fetcher %d reads both: %s", i, log);
        free(log);
    }
    assert_daemons_equal_one_process(dir, model, "--temp 0", "splits, a fetcher per directory");
    up(dir, first, 2, NULL);
    assert_daemons_equal_one_process(dir, model, "--temp 0", "splits, by expert");
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

/* The same splits, one per SSD and one fetcher per GPU (two host devices, `sluicectl up --devices
 * 0,1 --shard-by file`): fetcher i reads the i-th directory's split and fills the device pool of
 * the GPU that runs its layers; the text is one process's on the same two devices. */
Test(pipeline_faults, split_gguf_one_fetcher_per_ssd_and_gpu, .timeout = 300, .fini = fini)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    cr_assert_eq(setenv("SLUICE_GPU_HOST_DEVICES", "2", 1), 0);
    char *dir = fixture_tmpdir();
    char  first[2048], cmd[4096];
    int   st;
    split_on_two_ssds(dir, model, first, sizeof(first));
    up(dir, first, 2, "--shard-by file --devices 0,1 -ngl 999 --vram-budget 640K --ram-budget 40M");
    snprintf(cmd, sizeof(cmd), "grep -h -E 'gpu: HOST' %s/logs/executor*.log", dir);
    char *log = sh(cmd, &st);
    cr_assert(strstr(log, "gpu: HOST0") && strstr(log, "in fetcher 0's device memory") &&
                  strstr(log, "gpu: HOST1") && strstr(log, "in fetcher 1's device memory"),
              "%s", log);
    free(log);
    char *want = one_process(model, 48, "--temp 0 -ngl 999 --vram-budget 640K");
    snprintf(cmd, sizeof(cmd),
             "%s/sluice generate --run-dir %s -p '%s' -n 48 --temp 0 2>%s/gen.err", BIN, dir,
             k_prompt, dir);
    char *got = sh(cmd, &st);
    down(dir);
    cr_assert_eq(st, 0, "sluice generate failed\n%s", last_words(dir));
    cr_assert_gt(strlen(want), 20);
    cr_assert_str_eq(got, want, "daemons: '%s'\none process: '%s'", got, want);
    free(got);
    free(want);
    fixture_rmtree(dir);
    free(dir);
    free(model);
    cr_assert_eq(unsetenv("SLUICE_GPU_HOST_DEVICES"), 0);
    cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
}

/* Four clients at once (the executor batches the requests that overlap: one batch per step for
 * all of them): each gets the text of its sampling settings in one process. */
/* Four clients at once, greedy and sampled, each getting its `sluice run` text. `host`: the
 * executor's layers on the host backend's device (-ngl 999), its four sequences sharing the
 * device's steps (executor/gpu.c's batched pass), the text each one's `sluice run -ngl 999`
 * text on the same device (sampling sees the device's logits, which are not the CPU's bits). */
static void check_concurrent_clients(bool host)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    static const char *samplings[] = {"--temp 0", "--temp 0.8 --seed 1", "--temp 0.8 --seed 2",
                                      "--temp 0.5 --top-k 5 --seed 3"};
    enum { N = sizeof(samplings) / sizeof(samplings[0]) };
    char *dir = fixture_tmpdir();
    char *want[N];
    if (host) /* one process on the same device: its sampling sees the device's logits */
        cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    for (int i = 0; i < N; i++) {
        char how[128];
        snprintf(how, sizeof(how), "%s%s", samplings[i], host ? " -ngl 999" : "");
        want[i] = one_process(model, 48, how);
    }
    up(dir, model, 1, host ? "--executor-args '-ngl 999'" : NULL);
    if (host)
        cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    struct gen g[N];
    for (int i = 0; i < N; i++)
        g[i] = gen_start(dir, 48, samplings[i]);
    char got[N][8192];
    int  st[N];
    for (int i = 0; i < N; i++)
        st[i] = gen_finish(&g[i], got[i], sizeof(got[i]), 0, 120);
    const int placed = log_count(dir, "executor", "gpu: HOST0");
    down(dir);
    cr_expect_eq(placed, host ? 1 : 0, "layers on HOST0: %d log lines", placed);
    for (int i = 0; i < N; i++) {
        cr_expect_eq(st[i], 0, "client %d (%s) exited %d", i, samplings[i], st[i]);
        cr_expect_gt(strlen(want[i]), 20);
        cr_expect_str_eq(got[i], want[i], "client %d (%s): '%s'\none process: '%s'", i,
                         samplings[i], got[i], want[i]);
        free(want[i]);
    }
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

Test(pipeline_faults, concurrent_clients_equal_one_process, .timeout = 300, .fini = fini)
{
    check_concurrent_clients(false);
}

Test(pipeline_faults, concurrent_clients_on_the_host_device_equal_one_process, .timeout = 300,
     .fini = fini)
{
    check_concurrent_clients(true);
}

/* ---- kill -9 mid-generation ---------------------------------------------------------------- */

/* kill -9 of `victim` mid-generation of n tokens of `model` by daemons started with `up_args`
 * (NULL: two fetchers): the text is one process's with `sampling` and `run_args`. */
static void check_kill_midway_of(const char *victim, const char *sampling, char *dir, char *model,
                                 int n, uint32_t n_fetchers, const char *up_args,
                                 const char *run_args)
{
    char how[512];
    snprintf(how, sizeof(how), "%s %s", sampling, run_args ? run_args : "");
    char *want = one_process(model, n, how);
    up(dir, model, n_fetchers, up_args);

    struct gen  g = gen_start(dir, n, sampling);
    static char buf[1 << 16];
    size_t      have = gen_read(&g, buf, sizeof(buf), 0, 8, 120);
    cr_assert_gt(have, 0, "no output before the kill");
    pid_t pid = read_pid(dir, victim);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    int st = gen_finish(&g, buf, sizeof(buf), have, 240);
    wait_restarted(dir, victim, pid, 30);
    if (up_args && strstr(up_args, "--vram-budget") && strstr(victim, "fetcher") &&
        !strstr(up_args, "--executor-args")) {
        /* The device pool was the fetchers' (sluicectl gives them the --vram-budget too): its
         * memory stays mapped in the executor, which copies into it itself until every fetcher
         * runs again; then they take it back (their side opened anew over the executor's
         * memory) and copy again. A second request, after the restart, gives the same text and
         * has the restarted fetcher copying. */
        static char again[1 << 16];
        struct gen  g2 = gen_start(dir, n, sampling);
        const int   st2 = gen_finish(&g2, again, sizeof(again), 0, 240);
        cr_expect_eq(st2, 0, "the request after the restart failed");
        cr_expect_str_eq(again, want, "after the restart: '%s'\nundisturbed: '%s'", again, want);
        char cmd[1024];
        int  sst = 0;
        snprintf(cmd, sizeof(cmd),
                 "%s/sluice ctl --run-dir %s --daemon executor stats | grep 'gpu_pool\\.[fi]'; "
                 "%s/sluice ctl --run-dir %s --daemon %s stats | grep -E "
                 "'devpool\\.(opens|copies|staged) '; grep -h -E 'WARN|ERR|gpu: |run again' "
                 "%s/logs/executor*.log | cut -c1-300",
                 BIN, dir, BIN, dir, victim, dir);
        char       *stats = sh(cmd, &sst);
        const char *m = strstr(stats, "gpu_pool.fetcher_memory"),
                   *i = strstr(stats, "gpu_pool.in_fetcher"),
                   *l = strstr(stats, "gpu_pool.fetcher_losses"),
                   *t = strstr(stats, "gpu_pool.fetcher_retakes"),
                   *o = strstr(stats, "devpool.opens"), *c = strstr(stats, "devpool.copies"),
                   *s2 = strstr(stats, "devpool.staged");
        unsigned memory = 0, in = 0, losses = 0, retakes = 0, opens = 0, copies = 0, staged = 0;
        /* two host devices without one fetcher per GPU: every fetcher serves both pools */
        const unsigned pools =
            getenv("SLUICE_GPU_HOST_DEVICES") && !strstr(up_args, "--devices") ? 2u : 1u;
        cr_expect(m && i && l && t && o && c && s2 &&
                      sscanf(m, "gpu_pool.fetcher_memory %u", &memory) == 1 &&
                      sscanf(i, "gpu_pool.in_fetcher %u", &in) == 1 &&
                      sscanf(l, "gpu_pool.fetcher_losses %u", &losses) == 1 &&
                      sscanf(t, "gpu_pool.fetcher_retakes %u", &retakes) == 1 &&
                      sscanf(o, "devpool.opens %u", &opens) == 1 &&
                      sscanf(c, "devpool.copies %u", &copies) == 1 &&
                      sscanf(s2, "devpool.staged %u", &staged) == 1 && memory == 1 && in == 1 &&
                      losses == pools && retakes == pools && opens == pools && copies + staged > 0,
                  "want the fetchers' %u pool(s) lost once, taken back by the restarted %s, "
                  "which copies:\n%s",
                  pools, victim, stats);
        cr_log_info("after the restart: %s", stats);
        free(stats);
    } else if (up_args && strstr(up_args, "--vram-budget") && !strstr(up_args, "--executor-args")) {
        /* The executor was killed: fetcher 0 dropped the pool when its connection closed and
         * made a new one for the restarted executor, which fills it as before. */
        char cmd[1024];
        int  sst = 0;
        snprintf(cmd, sizeof(cmd),
                 "%s/sluice ctl --run-dir %s --daemon fetcher-0 stats | grep -E "
                 "'devpool\\.(open|opens) '; %s/sluice ctl --run-dir %s --daemon executor stats | "
                 "grep 'gpu_pool\\.in_fetcher'",
                 BIN, dir, BIN, dir);
        char       *stats = sh(cmd, &sst);
        const char *o = strstr(stats, "devpool.open "), *os = strstr(stats, "devpool.opens"),
                   *i = strstr(stats, "gpu_pool.in_fetcher");
        unsigned open = 0, opens = 0, in = 0;
        cr_expect(o && os && i && sscanf(o, "devpool.open %u", &open) == 1 &&
                      sscanf(os, "devpool.opens %u", &opens) == 1 &&
                      sscanf(i, "gpu_pool.in_fetcher %u", &in) == 1 && open == 1 && opens == 2 &&
                      in == 1,
                  "want the fetcher's pool made anew for the new executor:\n%s", stats);
        free(stats);
    } else if (up_args && strstr(up_args, "--vram-budget") && strstr(victim, "fetcher")) {
        /* The executor registers each fetcher's pool with the device as pinned memory: the
         * restarted fetcher's new pool too, the dead one's unregistered before it is unmapped
         * (the host backend refuses a registration that overlaps one, as CUDA does). */
        char cmd[1024];
        int  sst = 0;
        snprintf(cmd, sizeof(cmd),
                 "%s/sluice ctl --run-dir %s --daemon executor stats | grep 'gpu_pool\\.p'", BIN,
                 dir);
        char       *stats = sh(cmd, &sst);
        const char *r = strstr(stats, "gpu_pool.pinned_regions "),
                   *a = strstr(stats, "gpu_pool.pin_adds ");
        unsigned regions = 0, adds = 0;
        cr_expect(r && a && sscanf(r, "gpu_pool.pinned_regions %u", &regions) == 1 &&
                      sscanf(a, "gpu_pool.pin_adds %u", &adds) == 1 && regions == 2 && adds >= 3,
                  "want both fetchers' pools pinned, the restarted one's anew:\n%s", stats);
        cr_log_info("executor after the restart: %s", stats);
        free(stats);
    }
    down(dir);
    cr_assert_eq(st, 0, "generate failed after kill -9 %s (%s/gen.err)\n%s", victim, dir,
                 last_words(dir));
    cr_assert_str_eq(buf, want, "after kill -9 %s: '%s'\nundisturbed: '%s'", victim, buf, want);
    free(want);
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

/* check_kill_midway_of on moe-tiny with every layer on the host backend's device and the
 * experts in a device pool of 640K (one process's text: -ngl 999 --vram-budget 640K). Under the
 * GPU bundle's check (SLUICE_GPU_BACKEND=cuda) on the machine's CUDA device instead: the driver's
 * interprocess memory and events, killed with their process. Cases of two devices
 * (SLUICE_GPU_HOST_DEVICES) skip there unless SLUICE_TEST_CUDA_DEVICES says it has two. */
static void check_kill_on_the_host_device(const char *victim, uint32_t n_fetchers,
                                          const char *up_args)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    const char *be = getenv("SLUICE_GPU_BACKEND"), *nd = getenv("SLUICE_TEST_CUDA_DEVICES");
    const bool  cuda = be && strcmp(be, "cuda") == 0;
    if (cuda && getenv("SLUICE_GPU_HOST_DEVICES") && (!nd || atoi(nd) < 2)) {
        free(model);
        cr_skip_test("two devices wanted, and SLUICE_TEST_CUDA_DEVICES does not say this machine "
                     "has them");
    }
    char *dir = fixture_tmpdir();
    if (!cuda)
        cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    check_kill_midway_of(victim, "--temp 0", dir, model, 200, n_fetchers, up_args,
                         "-ngl 999 --vram-budget 640K");
    if (!cuda)
        cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
}

static void check_kill_midway(const char *victim, const char *sampling)
{
    skip_without_daemons();
    char *dir = fixture_tmpdir();
    check_kill_midway_of(victim, sampling, dir, slow_model(dir), 300, 2, NULL, NULL);
}

/* The same on the device (the host backend): every layer there, the experts in a device pool of
 * three slots copied in from the fetchers' RAM pool, which a killed fetcher takes away
 * mid-copy; the executor relinks, and the text is one process's on the same device. */
Test(pipeline_faults, kill_fetcher_midway_with_a_device_pool_same_tokens, .timeout = 600,
     .fini = fini)
{
    check_kill_on_the_host_device("fetcher-1", 2,
                                  "--ram-budget 40M --executor-args '-ngl 999 --vram-budget 640K'");
}

/* The executor killed while the fetcher's device pool feeds it: the fetcher drops that pool and
 * makes one for the restarted executor; the text is one process's on the same device. */
Test(pipeline_faults, kill_the_executor_of_a_fetchers_device_pool_same_tokens, .timeout = 600,
     .fini = fini)
{
    check_kill_on_the_host_device("executor", 1, "--ram-budget 40M -ngl 999 --vram-budget 640K");
}

/* Two fetchers filling the device pool (fetcher 0's memory): the other one killed. */
Test(pipeline_faults, kill_a_fetcher_that_fills_the_device_pool_same_tokens, .timeout = 600,
     .fini = fini)
{
    check_kill_on_the_host_device("fetcher-1", 2, "--ram-budget 40M -ngl 999 --vram-budget 640K");
}

/* One fetcher per device (sluicectl up --devices 0,1 on two host devices): each fetcher serves
 * half the layers and owns the pool of the device that runs them; the fetcher of the second
 * device (which holds the head) is killed mid-generation, its pool taken back by the executor;
 * the text is one process's on the same two devices. */
Test(pipeline_faults, kill_the_fetcher_of_one_of_two_devices_same_tokens, .timeout = 600,
     .fini = fini)
{
    cr_assert_eq(setenv("SLUICE_GPU_HOST_DEVICES", "2", 1), 0);
    check_kill_on_the_host_device("fetcher-1", 2,
                                  "--ram-budget 40M -ngl 999 --devices 0,1 --vram-budget 640K");
    cr_assert_eq(unsetenv("SLUICE_GPU_HOST_DEVICES"), 0);
}

/* Two fetchers sharding the experts over two host devices, each serving both devices' pools
 * (--device-pools 2): fetcher 0, whose memory both pools are, killed mid-generation; the
 * executor keeps both pools' memory and copies into them itself until it runs again, then the
 * restarted fetcher takes both back; the text is one process's on the same two devices. */
Test(pipeline_faults, kill_the_fetcher_that_owns_both_devices_pools_same_tokens, .timeout = 600,
     .fini = fini)
{
    cr_assert_eq(setenv("SLUICE_GPU_HOST_DEVICES", "2", 1), 0);
    check_kill_on_the_host_device("fetcher-0", 2, "--ram-budget 40M -ngl 999 --vram-budget 640K");
    cr_assert_eq(unsetenv("SLUICE_GPU_HOST_DEVICES"), 0);
}

/* The same with the device pool in the fetcher (one fetcher, given --vram-budget by sluicectl):
 * the fetcher that made the pool's memory and copied the experts in is killed mid-copy; the
 * executor keeps the memory mapped, copies into it itself from then on (the round the fetcher
 * may have left half done is done again), and the text is one process's on the same device. */
Test(pipeline_faults, kill_the_fetcher_that_owns_the_device_pool_same_tokens, .timeout = 600,
     .fini = fini)
{
    check_kill_on_the_host_device("fetcher-0", 1, "--ram-budget 40M -ngl 999 --vram-budget 640K");
}

/* The same with the fetcher reading the device pool's misses from storage (--vram-fill storage):
 * killed with reads gathered in its staging; the executor copies from then on, through the
 * restarted fetcher's RAM pool. */
Test(pipeline_faults, kill_the_fetcher_that_stages_for_the_device_pool_same_tokens, .timeout = 600,
     .fini = fini)
{
    check_kill_on_the_host_device(
        "fetcher-0", 1, "--ram-budget 40M -ngl 999 --vram-budget 640K --vram-fill storage");
}

Test(pipeline_faults, kill_fetcher_midway_same_tokens, .timeout = 600, .fini = fini)
{
    check_kill_midway("fetcher-1", "--temp 0");
}

Test(pipeline_faults, kill_executor_midway_same_tokens, .timeout = 600, .fini = fini)
{
    check_kill_midway("executor", "--temp 0");
}

/* The device failing mid-generation: SLUICE_TEST_DEVICE_FAULT makes the executor's 6th batched
 * step fail as a failing CUDA device's does, here on the host backend (SLUICE_GPU_BACKEND=host:
 * -ngl 999 puts every layer on HOST0). The executor drops the device, makes its contexts again
 * on the CPU without restarting, takes a new instance id, the router replays its sequence, and
 * the text is the undisturbed one. */
Test(pipeline_faults, device_failure_falls_back_to_the_cpu_same_tokens, .timeout = 300,
     .fini = fini)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    char *dir = fixture_tmpdir();
    char *want = one_process(model, 48, "--temp 0");
    cr_assert_eq(setenv("SLUICE_TEST_DEVICE_FAULT", "6", 1), 0);
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    up(dir, model, 1, "--executor-args '-ngl 999'");
    cr_assert_eq(unsetenv("SLUICE_TEST_DEVICE_FAULT"), 0);
    cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    pid_t pid = read_pid(dir, "executor");
    char  cmd[4096];
    int   st;
    snprintf(cmd, sizeof(cmd),
             "%s/sluice generate --run-dir %s -p '%s' -n 48 --temp 0 2>%s/gen.err", BIN, dir,
             k_prompt, dir);
    char     *got = sh(cmd, &st);
    const int fell =
        log_count(dir, "executor", "injected device failure; going on without the device");
    const int replayed = log_count(dir, "router", "replaying 1 sequences");
    const int placed = log_count(dir, "executor", "gpu: HOST0");
    pid_t     after = read_pid(dir, "executor");
    down(dir);
    cr_assert_eq(fell, 1, "the executor did not report the fall back once (%s/logs)", dir);
    cr_assert_eq(replayed, 1, "the router did not replay once (%s/logs)", dir);
    cr_assert_eq(placed, 1, "the layers were not on HOST0 before (%s/logs)", dir);
    cr_assert_eq(after, pid, "the executor restarted (%d -> %d): it should have gone on", (int)pid,
                 (int)after);
    cr_assert_gt(strlen(want), 20);
    cr_assert_str_eq(got, want, "after the device failure: '%s'\nundisturbed: '%s'", got, want);
    free(got);
    free(want);
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

/* The --connect-timeout on daemon `name`'s command line (/proc/PID/cmdline), or -1. */
static long connect_timeout_of(const char *dir, const char *name)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/cmdline", (long)read_pid(dir, name));
    static char args[8192]; /* NUL-separated; /proc files have no size to read ahead of */
    FILE       *f = fopen(path, "rb");
    size_t      len = f ? fread(args, 1, sizeof(args) - 1, f) : 0;
    if (f)
        fclose(f);
    args[len] = '\0';
    long secs = -1;
    for (size_t at = 0; at < len; at += strlen(args + at) + 1) {
        const size_t next = at + strlen(args + at) + 1; /* the argument after this one */
        if (strcmp(args + at, "--connect-timeout") == 0 && next < len)
            secs = atol(args + next);
    }
    return secs;
}

/* Seven kills of the executor in a row during one generation: the monitor's restart delay
 * doubles up to its cap (0.5, 1, 2, 4, 4, 4, 4 s with --max-restart-delay 4; 30 s by default),
 * and the router waits for the executor as long as the monitor may take (it used to give up
 * after 30 s and fail the request): the cap plus the start timeout plus 10 s, given to the
 * router and the executor as --connect-timeout. The text is the undisturbed one. */
Test(pipeline_faults, executor_killed_seven_times_costs_time_not_the_request, .timeout = 900,
     .fini = fini)
{
    skip_without_daemons();
    char *dir = fixture_tmpdir();
    char *model = slow_model(dir);
    char *want = one_process(model, 600, "--temp 0");
    up(dir, model, 1, "--max-restart-delay 4 --start-timeout 50");
    cr_assert_eq(connect_timeout_of(dir, "router"), 4 + 50 + 10);
    cr_assert_eq(connect_timeout_of(dir, "executor"), 4 + 50 + 10);
    struct gen  g = gen_start(dir, 600, "--temp 0");
    static char buf[1 << 16];
    size_t      have = gen_read(&g, buf, sizeof(buf), 0, 4, 120);
    cr_assert_gt(have, 0, "no output before the first kill");
    for (int k = 0; k < 7; k++) {
        pid_t pid = read_pid(dir, "executor");
        cr_assert_eq(kill(pid, SIGKILL), 0);
        wait_restarted(dir, "executor", pid, 120);
    }
    int st = gen_finish(&g, buf, sizeof(buf), have, 300);
    down(dir);
    cr_assert_eq(st, 0, "generate failed after 7 kills of the executor (%s/gen.err)\n%s", dir,
                 last_words(dir));
    cr_assert_str_eq(buf, want, "after 7 kills: '%s'\nundisturbed: '%s'", buf, want);
    free(want);
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

/* An idle router notices by itself that its executor was killed (the pid gone, or a HELLO
 * every 2 s naming another instance): with no request at all it logs the loss, links to the
 * restarted executor (a restart in its stats, so in /metrics) before work comes, and the next
 * request gives the undisturbed text. Before, the loss was found by the next request only. */
Test(pipeline_faults, idle_router_notices_a_killed_executor, .timeout = 300, .fini = fini)
{
    skip_without_daemons();
    char *dir = fixture_tmpdir();
    char  model[1024], cmd[4096];
    int   st = 0;
    snprintf(model, sizeof(model), "%s/tiny.gguf", dir);
    snprintf(cmd, sizeof(cmd), "%s/sluice mkmodel -q --preset tiny -o %s 2>&1", BIN, model);
    free(sh(cmd, &st));
    cr_assert_eq(st, 0, "mkmodel failed");
    char *want = one_process(model, 16, "--temp 0");
    up(dir, model, 1, "--max-restart-delay 1");
    const pid_t pid = read_pid(dir, "executor");
    cr_assert_eq(kill(pid, SIGKILL), 0);
    wait_restarted(dir, "executor", pid, 120);
    const double t0 = now_s();
    while (log_count(dir, "router", "executor back") < 1 && now_s() - t0 < 120)
        usleep(100 * 1000);
    const int lost = log_count(dir, "router", "executor lost");
    const int back = log_count(dir, "router", "executor back");
    snprintf(cmd, sizeof(cmd), "%s/sluice ctl --run-dir %s --daemon router stats 2>&1", BIN, dir);
    char       *stats = sh(cmd, &st);
    struct gen  g = gen_start(dir, 16, "--temp 0");
    static char buf[1 << 16];
    st = gen_finish(&g, buf, sizeof(buf), 0, 120);
    down(dir);
    cr_assert_eq(lost, 1, "the idle router did not notice the executor's death\n%s",
                 last_words(dir));
    cr_assert_eq(back, 1, "the idle router did not link to the restarted executor\n%s",
                 last_words(dir));
    const char *rs = strstr(stats, "executor.restarts ");
    double      restarts = -1;
    cr_assert(rs && sscanf(rs, "executor.restarts %lf", &restarts) == 1 && restarts == 1,
              "not one restart in the router's stats:\n%s", stats);
    cr_assert_eq(st, 0, "generate failed after the restart (%s/gen.err)\n%s", dir, last_words(dir));
    cr_assert_str_eq(buf, want, "after the restart: '%s'\nundisturbed: '%s'", buf, want);
    free(stats);
    free(want);
    fixture_rmtree(dir);
    free(dir);
}

/* A router whose wait for a restarted executor never returns (SLUICE_TEST_ROUTER_WEDGE stands
 * for the nng call seen to hang there in CI) is ended by its watchdog once that wait made no
 * pass of its loops for --watchdog seconds (5 here, 20 by default); the monitor restarts it and
 * the client's request completes with the undisturbed text. Then an executor gone for good (its
 * monitor killed first) is no stuck wait: the router fails the request after its deadline
 * (--connect-timeout 3) and waits on, past the watchdog's time. */
Test(pipeline_faults, router_stuck_waiting_for_the_executor_exits_and_loses_nothing, .timeout = 600,
     .fini = fini)
{
    skip_without_daemons();
    char *dir = fixture_tmpdir();
    char *model = slow_model(dir);
    char *want = one_process(model, 200, "--temp 0");
    char  wedge[1024];
    snprintf(wedge, sizeof(wedge), "%s/wedge", dir);
    setenv("SLUICE_TEST_ROUTER_WEDGE", wedge, 1); /* the daemons inherit it; the router reads it */
    up(dir, model, 1, "--max-restart-delay 1 --router-args '--connect-timeout 3 --watchdog 5'");
    unsetenv("SLUICE_TEST_ROUTER_WEDGE");
    cr_assert_eq(connect_timeout_of(dir, "router"), 3);
    pid_t       router = read_pid(dir, "router");
    struct gen  g = gen_start(dir, 200, "--temp 0");
    static char buf[1 << 16];
    size_t      have = gen_read(&g, buf, sizeof(buf), 0, 4, 120);
    cr_assert_gt(have, 0, "no output before the kill");
    FILE *f = fopen(wedge, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_eq(kill(read_pid(dir, "executor"), SIGKILL), 0);
    wait_restarted(dir, "router", router, 240);
    int st = gen_finish(&g, buf, sizeof(buf), have, 300);
    cr_assert_eq(st, 0, "generate failed after the router was stuck (%s/gen.err)\n%s", dir,
                 last_words(dir));
    cr_assert_str_eq(buf, want, "after a stuck router: '%s'\nundisturbed: '%s'", buf, want);

    router = read_pid(dir, "router");
    const int lost = log_count(dir, "router", "executor lost");
    cr_assert_eq(kill(read_pid(dir, "sluicectl"), SIGKILL), 0);
    cr_assert_eq(kill(read_pid(dir, "executor"), SIGKILL), 0);
    /* A request finds it gone: it fails after the deadline. */
    struct gen g2 = gen_start(dir, 8, "--temp 0");
    st = gen_finish(&g2, buf, sizeof(buf), 0, 120);
    cr_assert(st > 0, "generate must fail when the executor is gone for good (status %d)", st);
    cr_assert_gt(log_count(dir, "router", "executor lost"), lost, "the router did not notice");
    cr_assert_eq(log_count(dir, "router", "executor did not come back"), 1);
    double t0 = now_s();
    while (now_s() - t0 < 8)
        usleep(200 * 1000);
    const bool alive = kill(router, 0) == 0;
    const int  stuck = log_count(dir, "router", "the wait for the executor is stuck");
    down(dir);
    cr_assert(alive, "the router exited while it waited for an executor gone for good\n%s",
              last_words(dir));
    cr_assert_eq(stuck, 1, "the watchdog's line is in the router's log once");
    /* Asked to stop, it stops (its drain used to wait for a slot the wait held: SIGKILL). */
    cr_assert_eq(log_count(dir, "router", "router stopped"), 1, "%s", last_words(dir));
    free(want);
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

/* kill -9 of the router mid-generation: the monitor restarts it, the client library sends the
 * request again with the tokens it has, and the text is the undisturbed one, greedy or sampled
 * (the seed the client fixed, the sampler's draws replayed). */
Test(pipeline_faults, kill_router_midway_same_tokens, .timeout = 600, .fini = fini)
{
    check_kill_midway("router", "--temp 0");
}

Test(pipeline_faults, kill_router_midway_same_sampled_tokens, .timeout = 600, .fini = fini)
{
    check_kill_midway("router", "--temp 0.9 --top-k 0 --top-p 1 --min-p 0 --seed 7");
}

/* A router that does not come back (its monitor killed first): the client waits for it a
 * bounded time, then fails naming the router; a restarted deployment serves again. */
Test(pipeline_faults, router_gone_for_good_gives_a_clear_error, .timeout = 600, .fini = fini)
{
    skip_without_daemons();
    char *dir = fixture_tmpdir();
    char *model = slow_model(dir);
    up(dir, model, 1, NULL);
    struct gen  g = gen_start(dir, 400, "--temp 0 --router-wait 8");
    static char buf[1 << 16];
    size_t      have = gen_read(&g, buf, sizeof(buf), 0, 4, 120);
    cr_assert_gt(have, 0);
    cr_assert_eq(kill(read_pid(dir, "sluicectl"), SIGKILL), 0);
    pid_t pid = read_pid(dir, "router");
    cr_assert_eq(kill(pid, SIGKILL), 0);
    /* The client retries and waits for a restarted router, --router-wait (8 s) in all; the
     * bound leaves a busy (sanitizer) machine room: only a hang fails it. */
    double t0 = now_s();
    int    st = gen_finish(&g, buf, sizeof(buf), have, 240);
    cr_assert_neq(st, 0, "generate must fail when the router is gone for good");
    cr_assert_neq(st, -1, "generate hung or crashed after the router died");
    cr_assert_lt(now_s() - t0, 150, "the client did not give up");
    char path[1024];
    snprintf(path, sizeof(path), "%s/gen.err", dir);
    char *err = fixture_read_all(path, NULL);
    cr_assert_not_null(err);
    cr_assert(strstr(err, "router"), "the error names the router: '%s'", err);
    free(err);
    down(dir);
    up(dir, model, 1, NULL);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s/sluice generate --run-dir %s -p hello -n 8 --temp 0 2>>%s/gen.err", BIN, dir, dir);
    char *out = sh(cmd, &st);
    down(dir);
    cr_assert_eq(st, 0, "generate after the restart failed");
    cr_assert_gt(strlen(out), 0);
    free(out);
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

/* ---- the client path: bare connections, a paused router ------------------------------------ */

struct bare_prober {
    char        path[1024];
    atomic_bool stop;
    unsigned    n;
};

/* A bare connection (connect, close, nothing sent) on the router's socket every 100 ms: with nng
 * 1.5.2 (#1518) it can stop the listener, and the router's watchdog then replaces it, closing
 * every client connection. */
static void *bare_probe_main(void *arg)
{
    struct bare_prober *p = arg;
    struct sockaddr_un  sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%.*s", (int)sizeof(sa.sun_path) - 1, p->path);
    while (!atomic_load(&p->stop)) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd >= 0) {
            if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
                p->n++;
            close(fd);
        }
        usleep(100 * 1000);
    }
    return NULL;
}

Test(pipeline_faults, bare_connections_during_eight_generations, .timeout = 600, .fini = fini)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    char *dir = fixture_tmpdir();
    char *want = one_process(model, 200, "--temp 0");
    up(dir, model, 1, NULL);
    struct bare_prober p = {0};
    snprintf(p.path, sizeof(p.path), "%s/router.sock", dir);
    pthread_t pt;
    cr_assert_eq(pthread_create(&pt, NULL, bare_probe_main, &p), 0);
    /* Eight generations at once, twice over, each to its own file. */
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd),
             "for round in 1 2; do for i in 1 2 3 4 5 6 7 8; do "
             "%s/sluice generate --run-dir %s -p '%s' -n 200 --temp 0 >%s/out.$round.$i "
             "2>>%s/gen.err & done; wait; done",
             BIN, dir, k_prompt, dir, dir);
    free(sh(cmd, &st));
    atomic_store(&p.stop, true);
    pthread_join(pt, NULL);
    snprintf(cmd, sizeof(cmd),
             "%s/sluice ctl --run-dir %s --daemon router --timeout 10000 stats 2>&1 | "
             "grep listener_restarts",
             BIN, dir);
    char *stats = sh(cmd, &st);
    cr_log_info("%u bare connections; router %s", p.n, stats);
    free(stats);
    for (int round = 1; round <= 2; round++)
        for (int i = 1; i <= 8; i++) {
            char path[1200];
            snprintf(path, sizeof(path), "%s/out.%d.%d", dir, round, i);
            char *got = fixture_read_all(path, NULL);
            cr_assert_not_null(got);
            cr_assert_str_eq(got, want, "round %d generation %d (%s/gen.err): '%s'", round, i, dir,
                             got);
            free(got);
        }
    down(dir);
    free(want);
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

/* The router stopped (SIGSTOP) 2, 5 and 12 s in the middle of a generation, with the monitor's
 * health checks 2 s apart (so the longest pause gets the router killed and restarted, the
 * shorter ones may): the client prints the same text as an undisturbed run, or fails with a
 * message; never a shorter text with exit 0. */
Test(pipeline_faults, paused_router_gives_the_same_text_or_an_error, .timeout = 900, .fini = fini)
{
    skip_without_daemons();
    char *dir = fixture_tmpdir();
    char *model = slow_model(dir);
    char *want = one_process(model, 200, "--temp 0");
    up(dir, model, 1, "--health-interval 2");
    const int pauses[] = {2, 5, 12};
    for (size_t k = 0; k < sizeof(pauses) / sizeof(pauses[0]); k++) {
        /* A router the monitor restarted is READY before the next round. */
        char cmd[2048];
        int  sst;
        snprintf(cmd, sizeof(cmd),
                 "until %s/sluice ctl --run-dir %s --daemon router health >/dev/null 2>&1; "
                 "do sleep 0.2; done",
                 BIN, dir);
        free(sh(cmd, &sst));
        struct gen  g = gen_start(dir, 200, "--temp 0");
        static char buf[1 << 16];
        size_t      have = gen_read(&g, buf, sizeof(buf), 0, 4, 120);
        cr_assert_gt(have, 0, "no output before the pause");
        pid_t pid = read_pid(dir, "router");
        cr_assert_eq(kill(pid, SIGSTOP), 0);
        sleep((unsigned)pauses[k]);
        /* The monitor may have killed the silent router meanwhile (3 health checks 2 s apart
         * without an answer) and started another: then there is nothing to resume. */
        bool resumed = kill(pid, SIGCONT) == 0;
        int  st = gen_finish(&g, buf, sizeof(buf), have, 240);
        cr_log_info("router paused %d s (%s): generate exited %d", pauses[k],
                    resumed ? "resumed" : "killed by the monitor", st);
        cr_assert(st == 0 || st == 1, "generate ended with %d after a %d s pause", st, pauses[k]);
        if (st == 0)
            cr_assert_str_eq(buf, want, "after a %d s pause: '%s'\nundisturbed: '%s'", pauses[k],
                             buf, want);
    }
    down(dir);
    free(want);
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

/* ---- one memory budget for all the daemons --------------------------------------------------- */

/* Proportional set size of a process in KiB (shared pages split between their users: the pool
 * is mapped by the fetcher and the executor), or -1. */
static long pss_kib(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%ld/smaps_rollup", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "Pss: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* `sluicectl up --ram-budget` with default options: the fetcher plans for the executor's four
 * sequences (it planned for one: 108 MiB for a 100 MiB budget here), the daemons together stay
 * within the budget with every context and the pool full, and a fetcher planned for fewer
 * sequences than the executor holds refuses it with one line naming both. */
Test(pipeline_faults, ram_budget_holds_for_all_the_daemons, .timeout = 600, .fini = fini)
{
    skip_without_daemons();
    char *dir = fixture_tmpdir();
    char *model = slow_model(dir);
    up(dir, model, 1, "--ram-budget 100M -c 256");
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd),
             "for i in 1 2 3 4; do %s/sluice generate --run-dir %s -p \"story $i\" -n 240 "
             "--temp 0.8 --seed $i >/dev/null 2>>%s/gen.err & done; wait",
             BIN, dir, dir);
    free(sh(cmd, &st));
    const char *names[] = {"fetcher-0", "executor", "router"};
    long        total = 0;
    for (size_t i = 0; i < 3; i++) {
        long k = pss_kib(read_pid(dir, names[i]));
        cr_assert_geq(k, 0, "no smaps_rollup for %s", names[i]);
        total += k;
    }
    down(dir);
    const char *san = getenv("SLUICE_SANITIZER");
    if (san && *san) {
        cr_log_info("daemons' memory %ld KiB not compared with the budget under %s", total, san);
    } else {
        cr_log_info("daemons' memory %.1f MiB for a 100 MiB budget", (double)total / 1024);
        cr_assert_leq(total, 100 * 1024, "the daemons use %ld KiB for a 100 MiB budget", total);
    }
    snprintf(cmd, sizeof(cmd),
             "%s up --model %s --run-dir %s/run2 --bin %s --ram-budget 100M -c 256 "
             "--fetcher-args '--parallel 1' 2>&1; cat %s/run2/logs/executor.log",
             SLUICECTL, model, dir, BIN, dir);
    char *out = sh(cmd, &st);
    snprintf(g_dir, sizeof(g_dir), "%s/run2", dir);
    cr_assert(strstr(out, "give every daemon the same --parallel and -c"), "%s", out);
    cr_assert(strstr(out, "4 sequences of 256 positions"), "%s", out);
    free(out);
    fini();
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

/* ---- Ctrl-C cancels ------------------------------------------------------------------------ */

Test(pipeline_faults, ctrl_c_cancels_the_request, .timeout = 300, .fini = fini)
{
    skip_without_daemons();
    char *dir = fixture_tmpdir();
    char *model = slow_model(dir);
    up(dir, model, 1, NULL);
    struct gen  g = gen_start(dir, 2000, "--temp 0");
    static char buf[1 << 16];
    size_t      have = gen_read(&g, buf, sizeof(buf), 0, 4, 120);
    cr_assert_gt(have, 0, "no output before Ctrl-C");
    /* The shell exec'd sluice generate, so the child pid is the generator itself. */
    cr_assert_eq(kill(g.pid, SIGINT), 0);
    int st = gen_finish(&g, buf, sizeof(buf), have, 60);
    cr_assert_eq(st, 130, "sluice generate should exit 130 after Ctrl-C, got %d", st);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s/sluice ctl --run-dir %s --daemon router stats | awk '$1 == \"requests.cancelled\" "
             "{ print $2 }'",
             BIN, dir);
    int   st2;
    char *cancelled = sh(cmd, &st2);
    down(dir);
    cr_assert_eq(atoi(cancelled), 1, "router counted %s cancelled requests", cancelled);
    free(cancelled);
    free(model);
    fixture_rmtree(dir);
    free(dir);
}

/* ---- config files and SIGTERM ---------------------------------------------------------------- */

/* Each daemon reads `key = value` lines from --config (the command line overrides them), refuses
 * an unknown key naming it, and on SIGTERM exits 0 and removes its files. */
Test(pipeline_faults, daemons_read_config_files_and_stop_on_sigterm, .timeout = 300)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    char *dir = fixture_tmpdir();
    char  cmd[8192];
    int   st;
    snprintf(
        cmd, sizeof(cmd),
        "set -e; cd %s; mkdir -m 700 run; "
        "printf 'model = %s\\n# a comment\\npolicy = lfu\\npool-slots = 3\\n"
        "run-dir = %s/run\\n' >good.conf; "
        "printf 'model = %s\\nbogus-key = 1\\n' >bad.conf; "
        /* An unknown key stops each daemon with a message naming it. */
        "for d in sluice-fetcher sluice-executor sluice-router; do "
        "  if %s/$d --config bad.conf --run-dir %s/run >/dev/null 2>err.txt; then exit 11; fi; "
        "  grep -q bogus-key err.txt || exit 12; done; "
        /* A good file: the fetcher starts from it (the command line's --pool-slots wins over
         * the file's), answers, and stops on SIGTERM. */
        "%s/sluice-fetcher --config good.conf --pool-slots 4 >fetcher.out 2>fetcher.log & "
        "pid=$!; "
        "for i in $(seq 100); do %s/sluice ctl --run-dir %s/run --daemon fetcher-0 health "
        ">/dev/null 2>&1 && break; sleep 0.1; done; "
        "%s/sluice ctl --run-dir %s/run --daemon fetcher-0 stats >stats.txt "
        "|| { kill -9 $pid; exit 13; }; "
        "grep -q 'policy lfu' fetcher.log || { kill -9 $pid; exit 14; }; "
        "awk '$1 == \"pool.slots\" && $2 == 4 { ok = 1 } END { exit !ok }' stats.txt "
        "|| { kill -9 $pid; exit 17; }; "
        "kill -TERM $pid; wait $pid || exit 15; "
        "[ ! -e run/fetcher-0.ctl ] && [ ! -e run/fetcher-0.pid ] && [ ! -e run/fetcher-0.pool ] "
        "|| exit 16",
        dir, model, dir, model, BIN, dir, BIN, BIN, dir, BIN, dir);
    free(sh(cmd, &st));
    cr_assert_eq(st, 0,
                 "step %d failed (11/12 bad key, 13 no stats, 14 policy from the file, 15 exit "
                 "status, 16 files left, 17 pool slots from the command line; see %s)",
                 st, dir);
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

/* ---- many clients ---------------------------------------------------------------------------- */

Test(pipeline_faults, sixteen_clients_complete_or_get_errors, .timeout = 900, .fini = fini)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    const char *env = getenv("SLUICE_SOAK_SECONDS");
    int         secs = env ? atoi(env) : 30;
    char       *dir = fixture_tmpdir();
    up(dir, model, 2, NULL);
    /* 16 shell loops, each issuing requests back to back for `secs` seconds and counting
     * completions (exit 0) and explicit errors (exit 1 with a message); anything else (a
     * signal, a hang past the loop's timeout) is a failure. */
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "end=$(( $(date +%%s) + %d )); pids=; "
             "for c in $(seq 16); do ( ok=0; err=0; bad=0; "
             "while [ $(date +%%s) -lt $end ]; do "
             "timeout 120 %s/sluice generate --run-dir %s -p \"client $c says\" -n $((4 + c)) "
             "--temp 0.7 --seed $c >/dev/null 2>>%s/c$c.err; st=$?; "
             "if [ $st -eq 0 ]; then ok=$((ok+1)); elif [ $st -eq 1 ]; then err=$((err+1)); "
             "else bad=$((bad+1)); fi; done; echo \"$ok $err $bad\" >%s/c$c.res ) & "
             "pids=\"$pids $!\"; done; wait $pids; cat %s/c*.res",
             secs, BIN, dir, dir, dir, dir);
    int   st;
    char *res = sh(cmd, &st);
    cr_assert_eq(st, 0);
    long ok = 0, err = 0, bad = 0;
    int  lines = 0;
    for (char *line = strtok(res, "\n"); line; line = strtok(NULL, "\n")) {
        long a, b, c;
        cr_assert_eq(sscanf(line, "%ld %ld %ld", &a, &b, &c), 3, "line '%s'", line);
        ok += a;
        err += b;
        bad += c;
        lines++;
    }
    /* The daemons are still healthy afterwards. */
    snprintf(cmd, sizeof(cmd), "%s status --run-dir %s", SLUICECTL, dir);
    char *status = sh(cmd, &st);
    down(dir);
    cr_log_info("16 clients for %d s: %ld completed, %ld explicit errors", secs, ok, err);
    cr_assert_eq(lines, 16);
    cr_assert_eq(bad, 0, "%ld requests ended without completing or an explicit error", bad);
    cr_assert_gt(ok, 16, "too few completions: %ld", ok);
    cr_assert_eq(st, 0, "status after the soak: %s", status);
    free(status);
    free(res);
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

/* ---- garbage on every socket --------------------------------------------------------------- */

/* Sends `len` bytes on a raw req0 socket to `url` and checks the reply: an ERROR for bytes that
 * do not decode (bytes that happen to form a valid message may get any reply). */
static void send_garbage(const char *url, const void *bytes, size_t len)
{
    struct proto_msg local;
    bool             valid = proto_decode(bytes, len, &local) == COMMON_OK;
    if (valid)
        proto_msg_clear(&local);
    nng_socket s;
    cr_assert_eq(nng_req0_open(&s), 0);
    nng_setopt_ms(s, NNG_OPT_RECVTIMEO, 5000);
    nng_setopt_ms(s, NNG_OPT_SENDTIMEO, 5000);
    cr_assert_eq(nng_dial(s, url, NULL, 0), 0, "dial %s", url);
    void *copy = nng_alloc(len ? len : 1);
    cr_assert_not_null(copy);
    if (len)
        memcpy(copy, bytes, len);
    cr_assert_eq(nng_send(s, copy, len, NNG_FLAG_ALLOC), 0); /* takes the buffer */
    void  *rep = NULL;
    size_t rlen = 0;
    int    rc = nng_recv(s, &rep, &rlen, NNG_FLAG_ALLOC);
    cr_assert_eq(rc, 0, "%s gave no reply to %zu garbage bytes: %s", url, len, nng_strerror(rc));
    struct proto_msg m;
    cr_assert_eq(proto_decode(rep, rlen, &m), COMMON_OK, "%s: the reply does not verify", url);
    if (!valid)
        cr_assert_eq(m.kind, PROTO_KIND_ERROR, "%s: a %s reply to %zu garbage bytes", url,
                     proto_kind_name(m.kind), len);
    proto_msg_clear(&m);
    nng_free(rep, rlen);
    nng_close(s);
}

/* Sends one request of `size` zero bytes on the nng ipc socket `path` by hand: the SP header
 * (req0), then a frame (type 1, 64-bit big-endian length, 4-byte request id, body), and reads
 * whatever comes back until the peer closes or 5 s pass. Best effort: errors are ignored. */
static void raw_oversized(const char *path, size_t size)
{
    int fd;
    if (common_unix_connect(path, &fd) != COMMON_OK)
        return;
    const uint8_t hdr[8] = {0x00, 'S', 'P', 0x00, 0x00, 0x30, 0x00, 0x00};
    uint8_t       peer[8];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL) != (ssize_t)sizeof(hdr) ||
        poll(&p, 1, 5000) <= 0 ||
        recv(fd, peer, sizeof(peer), MSG_WAITALL) != (ssize_t)sizeof(peer)) {
        close(fd);
        return;
    }
    uint8_t  frame[13] = {1};
    uint64_t len = size + 4;
    for (int k = 0; k < 8; k++)
        frame[1 + k] = (uint8_t)(len >> (56 - 8 * k));
    frame[9] = 0x80; /* request id 0x80000001 */
    frame[12] = 0x01;
    static uint8_t zeros[1 << 16];
    bool           ok = send(fd, frame, sizeof(frame), MSG_NOSIGNAL) == (ssize_t)sizeof(frame);
    for (size_t sent = 0; ok && sent < size;) {
        size_t  n = size - sent < sizeof(zeros) ? size - sent : sizeof(zeros);
        ssize_t w = send(fd, zeros, n, MSG_NOSIGNAL);
        ok = w > 0;
        sent += ok ? (size_t)w : 0;
    }
    uint8_t sink[4096];
    double  t0 = now_s();
    while (now_s() - t0 < 5 && poll(&p, 1, 200) >= 0)
        if (p.revents && recv(fd, sink, sizeof(sink), 0) <= 0)
            break;
    close(fd);
}

Test(pipeline_faults, garbage_on_every_socket_gets_errors, .timeout = 300, .fini = fini)
{
    skip_without_daemons();
    FIXTURE_OR_SKIP(model, TINY_MODEL);
    char *dir = fixture_tmpdir();
    up(dir, model, 2, NULL);
    const char *names[] = {"fetcher-0.ctl", "fetcher-1.ctl", "executor.ctl", "router.sock"};
    /* A valid message, then truncations and flips of it, then random bytes and an empty one. */
    struct proto_msg hello = {.kind = PROTO_KIND_HELLO, .request_id = 7};
    hello.u.hello.major = PROTO_VERSION_MAJOR;
    hello.u.hello.role = PROTO_ROLE_CLIENT;
    uint8_t *enc = NULL;
    size_t   enc_len = 0;
    cr_assert_eq(proto_encode(&hello, &enc, &enc_len), COMMON_OK);
    srand(12345);
    for (size_t i = 0; i < 4; i++) {
        char url[1024];
        snprintf(url, sizeof(url), "ipc://%s/%s", dir, names[i]);
        for (size_t cut = 0; cut < enc_len; cut += 3)
            send_garbage(url, enc, cut);
        for (int k = 0; k < 20; k++) {
            uint8_t junk[512];
            size_t  n = 1 + (size_t)(rand() % (int)sizeof(junk));
            for (size_t j = 0; j < n; j++)
                junk[j] = (uint8_t)rand();
            if (k < 8) {
                memcpy(junk, enc, enc_len < n ? enc_len : n);
                junk[(size_t)rand() % n] ^= (uint8_t)(1 + rand() % 255);
            }
            send_garbage(url, junk, n);
        }
        /* Oversized: a little above the largest message, spoken by hand in SP-over-IPC framing
         * (nng's own client may hang closing a socket whose message was refused, and nng may not
         * be used after fork). The daemon may drop the connection or answer; its health is
         * checked below. */
        raw_oversized(url + strlen("ipc://"), PROTO_MAX_MESSAGE_BYTES + 64);
    }
    /* Raw bytes into the pool handover sockets (a client that sends instead of receiving). */
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/fetcher-%d.pool", dir, i);
        int fd;
        if (common_unix_connect(path, &fd) == COMMON_OK) {
            (void)!send(fd, "garbage", 7, MSG_NOSIGNAL); /* it may have closed already */
            close(fd);
        }
    }
    free(enc);
    /* Every daemon still answers and serves a generation. */
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd),
             "%s status --run-dir %s && %s/sluice generate --run-dir %s -p hi -n 4", SLUICECTL, dir,
             BIN, dir);
    char *out = sh(cmd, &st);
    snprintf(cmd, sizeof(cmd), "grep -c 'restart' %s/logs/sluicectl.log 2>/dev/null || true", dir);
    int   st2;
    char *restarts = sh(cmd, &st2);
    down(dir);
    cr_assert_eq(st, 0, "after garbage: %s", out);
    cr_assert_eq(atoi(restarts), 0, "a daemon was restarted during the garbage test");
    free(restarts);
    free(out);
    fixture_rmtree(dir);
    free(dir);
    free(model);
}
