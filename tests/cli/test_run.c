/* tests/cli/test_run.c - `sluice run`: the prompt from a file (-f) and the repetition penalties,
 * greedy on the MoE fixture. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fixture.h"

#define SLUICE SLUICE_BINARY_DIR "/bin/sluice"
#define MODEL  "moe-tiny/moe-tiny-q4_0.gguf"
#define PROMPT "Once upon a time there was a king"

/* Runs a shell command; returns its stdout (malloc'd) and exit status. */
static char *sh(const char *cmd, int *status)
{
    char *out = fixture_run(cmd, status);
    cr_assert_not_null(out, "could not run %s", cmd);
    return out;
}

/* `sluice run -m MODEL ARGS --ids --temp 0 -n 16`: the prompt ids and the generated ids. */
static char *greedy_ids(const char *model, const char *args)
{
    char cmd[4096];
    int  st = 0;
    snprintf(cmd, sizeof(cmd), "%s run -m %s %s --ids --temp 0 -n 16 -t 2 2>/dev/null", SLUICE,
             model, args);
    char *out = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s exited %d", cmd, st);
    cr_assert(strstr(out, "gen: "), "no tokens from %s:\n%s", cmd, out);
    return out;
}

/* Writes `text` to DIR/NAME; returns the malloc'd path. */
static char *write_file(const char *dir, const char *name, const char *text)
{
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

Test(cli_run, file_prompt_gives_the_tokens_of_the_text, .timeout = 60)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *dir = fixture_tmpdir();
    char *path = write_file(dir, "prompt.txt", PROMPT "\n"); /* the newline is dropped */
    char  args[1024];
    snprintf(args, sizeof(args), "-f %s", path);
    char *from_file = greedy_ids(model, args);
    char *from_text = greedy_ids(model, "-p '" PROMPT "'");
    cr_assert_str_eq(from_file, from_text);
    snprintf(args, sizeof(args), "--file=%s", path);
    char *long_form = greedy_ids(model, args);
    cr_assert_str_eq(long_form, from_text);
    free(long_form);
    free(from_file);
    free(from_text);
    free(path);
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

/* `sluice run -f PATH` is refused with `message`, exit status 1, without loading anything. */
static void file_is_refused(const char *model, const char *path, const char *message)
{
    char cmd[4096];
    int  st = 0;
    snprintf(cmd, sizeof(cmd), "%s run -m %s -f %s 2>&1 >/dev/null", SLUICE, model, path);
    char *err = sh(cmd, &st);
    cr_assert_eq(st, 1, "%s exited %d: %s", cmd, st, err);
    cr_assert(strncmp(err, "sluice run: error: ", 19) == 0, "%s", err);
    cr_assert(strstr(err, message), "'%s' not in: %s", message, err);
    free(err);
}

Test(cli_run, file_from_dev_zero_is_refused_quickly, .timeout = 10)
{
    FIXTURE_OR_SKIP(model, MODEL);
    file_is_refused(model, "/dev/zero", "'/dev/zero' is not a regular file");
    free(model);
}

Test(cli_run, file_that_is_a_fifo_is_refused_without_blocking, .timeout = 10)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *dir = fixture_tmpdir();
    char  path[1024];
    snprintf(path, sizeof(path), "%s/fifo", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    file_is_refused(model, path, "is not a regular file");
    fixture_rmtree(dir);
    free(dir);
    free(model);
}

Test(cli_run, missing_file_is_named_once, .timeout = 10)
{
    FIXTURE_OR_SKIP(model, MODEL);
    file_is_refused(model, "/nonexistent-sluice-dir/prompt.txt",
                    "cannot open '/nonexistent-sluice-dir/prompt.txt': No such file");
    free(model);
}

Test(cli_run, repeat_penalty_of_one_changes_nothing, .timeout = 60)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *plain = greedy_ids(model, "-p '" PROMPT "'");
    char *one = greedy_ids(model, "-p '" PROMPT "' --repeat-penalty 1.0 --repeat-last-n 32");
    cr_assert_str_eq(one, plain);
    free(one);
    free(plain);
    free(model);
}

Test(cli_run, strong_repeat_penalty_changes_greedy_tokens, .timeout = 60)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *plain = greedy_ids(model, "-p '" PROMPT "'");
    char *penalised = greedy_ids(model, "-p '" PROMPT "' --repeat-penalty 5");
    cr_assert_str_neq(penalised, plain, "greedy decoding ignored the penalty");
    free(penalised);
    free(plain);
    free(model);
}

Test(cli_run, repeat_last_n_zero_turns_the_penalties_off, .timeout = 60)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *plain = greedy_ids(model, "-p '" PROMPT "'");
    char *off = greedy_ids(model, "-p '" PROMPT "' --repeat-penalty 5 --presence-penalty 1 "
                                  "--frequency-penalty 1 --repeat-last-n 0");
    cr_assert_str_eq(off, plain);
    free(off);
    free(plain);
    free(model);
}

/* A trace file that cannot be written is a failure: the message and exit status 1, not 0. */
Test(cli_run, unwritable_trace_out_exits_1, .timeout = 60)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char cmd[4096];
    int  st = 0;
    snprintf(cmd, sizeof(cmd),
             "%s run -m %s -p hi -n 2 -t 2 --ram-budget 64M --trace-out /nonexistent/dir/t.json "
             "2>&1 >/dev/null",
             SLUICE, model);
    char *out = sh(cmd, &st);
    cr_assert_eq(st, 1, "exit %d: %s", st, out);
    cr_assert(strstr(out, "sluice run: error: cannot write the trace"), "%s", out);
    free(out);
    free(model);
}

/* The "kv cache" bytes of the memory plan `sluice run` prints for `args` (-1 when none). */
static double plan_kv_kib(const char *model, const char *args, int *n_plans)
{
    char cmd[4096];
    int  st = 0;
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p hi -n 2 --temp 0 -t 2 %s 2>&1 >/dev/null", SLUICE,
             model, args);
    char *err = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s", err);
    const char *at = strstr(err, "  kv cache ");
    double      v = -1;
    char        unit[8] = "";
    if (at && sscanf(at, "  kv cache %lf %7s", &v, unit) == 2)
        v *= strcmp(unit, "MiB") == 0 ? 1024 : strcmp(unit, "KiB") == 0 ? 1 : 1.0 / 1024;
    *n_plans = 0;
    for (const char *p = err; (p = strstr(p, "memory plan:")); p++)
        (*n_plans)++;
    free(err);
    return v;
}

/* Under a budget, the plan leaves out the KV of the layers on the device: none with -ngl 999,
 * half with 2 of 4 layers there; the CPU's when no device takes the model (its KV all in the
 * plan again, printed once). */
Test(cli_run, ngl_leaves_the_device_layers_kv_out_of_the_ram_plan, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, MODEL);
    int n = 0;
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    double cpu = plan_kv_kib(model, "--ram-budget 64M -c 1024", &n);
    cr_assert_gt(cpu, 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(plan_kv_kib(model, "--ram-budget 64M -c 1024 -ngl 999", &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_float_eq(plan_kv_kib(model, "--ram-budget 64M -c 1024 -ngl 2", &n), cpu / 2, 1e-6);
    cr_assert_eq(n, 1);
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "none", 1), 0);
    cr_assert_float_eq(plan_kv_kib(model, "--ram-budget 64M -c 1024 -ngl 999", &n), cpu, 1e-6);
    cr_assert_eq(n, 1);
    cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    free(model);
}

/* `sluice mkmodel` of a small model (n_embd 256, 2 heads, 259 tokens) and ARGS into DIR/NAME,
 * whose path goes to out. */
static void make_model(const char *dir, const char *name, const char *args, char *out, size_t len)
{
    char cmd[4096];
    int  st = 0;
    snprintf(out, len, "%s/%s", dir, name);
    snprintf(cmd, sizeof(cmd),
             "%s mkmodel -q -o %s --n-embd 256 --n-head 2 --n-head-kv 2 --n-vocab 259 %s 2>&1",
             SLUICE, out, args);
    free(sh(cmd, &st));
    cr_assert_eq(st, 0, "mkmodel %s", args);
}

/* A device that cannot take the model (a dense FFN streamed under --ram-budget in Microsoft's
 * I2_S layout, its per-tensor scale after the codes, is not on it yet): the model opens again
 * with every layer's KV in the plan, printed once, and runs on the CPU. */
Test(cli_run, ngl_refused_by_the_model_keeps_its_kv_in_the_ram_plan, .timeout = 120)
{
    char *dir = fixture_tmpdir();
    char  model[1024];
    int   n = 0;
    make_model(dir, "i2s.gguf", "--arch bitnet-b1.58 --n-ff 256 --n-layer 2 --type i2_s", model,
               sizeof(model));
    double cpu = plan_kv_kib(model, "--ram-budget 64M -c 1024", &n);
    cr_assert_gt(cpu, 0);
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    cr_assert_float_eq(plan_kv_kib(model, "--ram-budget 64M -c 1024 -ngl 999", &n), cpu, 1e-6);
    cr_assert_eq(n, 1, "the plan is printed once");
    cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    fixture_rmtree(dir);
    free(dir);
}

/* A dense model under --ram-budget streams its FFN (one bundle a layer): with -ngl the device
 * reads the FFN of its layers from the fetcher once, at the start, and keeps it; the CPU's layers
 * go on streaming theirs. The greedy tokens are those of the same -ngl without the budget (the
 * same bytes on the device), on llama-2-tiny (also the CPU's) and a 4-layer dense qwen3 made by
 * mkmodel: every layer, then the last two. */
Test(cli_run, ngl_takes_a_dense_ffn_streamed_under_a_ram_budget, .timeout = 180)
{
    FIXTURE_OR_SKIP(tiny, "models/llama-2-tiny-random.gguf");
    char *dir = fixture_tmpdir();
    char  dense[1024], cmd[4096];
    int   st = 0;
    make_model(dir, "dense.gguf", "--arch qwen3 --n-ff 512 --n-layer 4 --type q4_K", dense,
               sizeof(dense));
    const char *models[] = {tiny, dense};
    for (int i = 0; i < 2; i++) {
        char *cpu = greedy_ids(models[i], "-p '" PROMPT "' --ram-budget 64M");
        cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
        char *all = greedy_ids(models[i], "-p '" PROMPT "' --ram-budget 64M -ngl 999");
        char *two = greedy_ids(models[i], "-p '" PROMPT "' --ram-budget 64M -ngl 2");
        char *all_mapped = greedy_ids(models[i], "-p '" PROMPT "' -ngl 999");
        char *two_mapped = greedy_ids(models[i], "-p '" PROMPT "' -ngl 2");
        snprintf(cmd, sizeof(cmd),
                 "%s run -m %s -p hi -n 2 --temp 0 -t 2 --ram-budget 64M -ngl 999 2>&1 >/dev/null",
                 SLUICE, models[i]);
        char *err = sh(cmd, &st);
        cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
        cr_assert(st == 0 && strstr(err, "gpu: HOST0 (") && !strstr(err, "ignored"),
                  "%s: the device did not take its layers:\n%s", models[i], err);
        cr_assert_str_eq(all, all_mapped, "%s: -ngl 999 --ram-budget 64M", models[i]);
        cr_assert_str_eq(two, two_mapped, "%s: -ngl 2 --ram-budget 64M", models[i]);
        if (i == 0)
            cr_assert_str_eq(all, cpu, "llama-2-tiny: -ngl 999 --ram-budget 64M vs the CPU");
        free(err);
        free(cpu);
        free(all);
        free(two);
        free(all_mapped);
        free(two_mapped);
    }
    fixture_rmtree(dir);
    free(dir);
    free(tiny);
}

/* The number after `key` in text (its first occurrence), or -1. */
static double number_after(const char *text, const char *key)
{
    const char *at = strstr(text, key);
    double      v = -1.0;
    return at && sscanf(at + strlen(key), " %lf", &v) == 1 ? v : -1.0;
}

/* The CPU backend (SLUICE_GPU_BACKEND=cpu) under --ram-budget: the device pass leaves the routed
 * experts to the CPU's MoE, which streams them from the RAM pool where they are (no copy of them
 * in the backend's memory); its plan counts the device's KV and scratch as RAM (the minimum
 * budget grows by the scratch the start line reports); the greedy tokens are the CPU's own,
 * streamed or not. A dense FFN streamed under the budget stays with the CPU's path too (llama-2-
 * tiny: the CPU's tokens). */
Test(cli_run, cpu_backend_streams_the_experts_under_a_ram_budget, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, MODEL);
    FIXTURE_OR_SKIP(tiny, "models/llama-2-tiny-random.gguf");
    char  cmd[4096];
    int   st = 0;
    char *cpu = greedy_ids(model, "-p '" PROMPT "'");
    /* budgets of about 4 slots above each plan's minimum (the device's scratch is 5 MiB) */
    char *cpu_streamed = greedy_ids(model, "-p '" PROMPT "' --ram-budget 25.5M");
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p hi -n 2 --temp 0 -t 2 --ram-budget 25.5M 2>&1",
             SLUICE, model);
    char *plan_cpu = sh(cmd, &st);
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "cpu", 1), 0);
    char *dev = greedy_ids(model, "-p '" PROMPT "' -ngl 999");
    char *dev_streamed = greedy_ids(model, "-p '" PROMPT "' --ram-budget 30.6M -ngl 999");
    snprintf(cmd, sizeof(cmd),
             "%s run -m %s -p hi -n 2 --temp 0 -t 2 --ram-budget 30.6M -ngl 999 2>&1", SLUICE,
             model);
    char *plan_dev = sh(cmd, &st);
    snprintf(cmd, sizeof(cmd),
             "%s run -m %s -p hi -n 2 --temp 0 -t 2 --ram-budget 200M -ngl 999 2>&1 >/dev/null",
             SLUICE, tiny);
    char *dense = sh(cmd, &st);
    char *dense_dev = greedy_ids(tiny, "-p '" PROMPT "' --ram-budget 200M -ngl 999");
    cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    char *dense_cpu = greedy_ids(tiny, "-p '" PROMPT "' --ram-budget 200M");
    cr_assert(strstr(plan_dev, "0 MiB weights, 0 MiB KV") &&
                  strstr(plan_dev, "the MoE of 4 of them on the CPU's path, streamed where they "
                                   "are"),
              "the device did not leave the experts to the CPU's MoE:\n%s", plan_dev);
    const double min_cpu = number_after(plan_cpu, "minimum budget");
    const double min_dev = number_after(plan_dev, "minimum budget");
    const double scratch = number_after(plan_dev, "MiB KV (f16),");
    cr_assert(min_cpu > 0 && scratch > 0 && fabs(min_dev - min_cpu - scratch) <= 1.0,
              "the device's scratch (%.2f MiB) is not in the plan: minimum %.2f MiB, %.2f without "
              "-ngl:\n%s",
              scratch, min_dev, min_cpu, plan_dev);
    cr_assert(strstr(plan_cpu, "(32 of 32 bundles") == NULL &&
                  strstr(plan_dev, "(32 of 32 bundles") == NULL,
              "the budget did not stream:\n%s\n%s", plan_cpu, plan_dev);
    cr_assert_str_eq(cpu_streamed, cpu);
    cr_assert_str_eq(dev, cpu, "-ngl 999 on the CPU backend");
    cr_assert_str_eq(dev_streamed, cpu, "-ngl 999 --ram-budget 30.6M on the CPU backend");
    cr_assert(strstr(dense, "0 MiB weights") &&
                  strstr(dense, "the FFN of 1 of them on the CPU's path, streamed where they are"),
              "the device did not leave the streamed dense FFN to the CPU's path:\n%s", dense);
    cr_assert_str_eq(dense_dev, dense_cpu, "llama-2-tiny, -ngl 999 --ram-budget 200M");
    free(dense_dev);
    free(dense_cpu);
    free(cpu);
    free(cpu_streamed);
    free(plan_cpu);
    free(dev);
    free(dev_streamed);
    free(plan_dev);
    free(dense);
    free(model);
    free(tiny);
}

/* `sluice run ... ARGS -p hi -n 8 --temp 0` on the host backend: its stderr, exit status in *st. */
static char *run_err(const char *model, const char *args, int *st)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "SLUICE_GPU_BACKEND=host %s run -m %s -p '" PROMPT "' -n 8 --temp 0 -t 2 %s 2>&1 "
             ">/dev/null",
             SLUICE, model, args);
    return sh(cmd, st);
}

/* The N of "N parts read from storage through staging" in the pool's final line (-1: none). */
static long staged_parts(const char *err)
{
    const char *at = strstr(err, " parts read from storage through staging");
    if (!at)
        return -1;
    const char *p = at;
    while (p > err && p[-1] >= '0' && p[-1] <= '9')
        p--;
    return p < at ? strtol(p, NULL, 10) : -1;
}

/* --vram-fill storage in one process: the device pool's misses that the RAM pool does not hold
 * are read from storage into the fetcher's pinned staging and copied from there (on the pool's
 * own thread), as a fetcher daemon does for its executor: the CPU's tokens, the staging in the
 * plan, every miss's parts counted. auto stages when the RAM pool is no bigger than the device
 * pool; ram never does. A corrupt bundle found by the staging is named to the user as through the
 * RAM pool. */
Test(cli_run, vram_fill_storage_reads_the_device_pools_misses_from_storage, .timeout = 240)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *cpu = greedy_ids(model, "-p '" PROMPT "'");
    /* the default backend: CUDA's where there is a device (the GPU bundle), else the CPU's */
    char *dflt = greedy_ids(model, "-p '" PROMPT "' -ngl 999 --vram-budget 324K "
                                   "--ram-budget 27M --vram-fill storage");
    cr_assert_str_eq(dflt, cpu, "--vram-fill storage on the default backend");
    free(dflt);
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    char *ram = greedy_ids(model, "-p '" PROMPT "' -ngl 999 --vram-budget 324K --ram-budget 27M "
                                  "--vram-fill ram");
    char *storage = greedy_ids(model, "-p '" PROMPT "' -ngl 999 --vram-budget 324K "
                                      "--ram-budget 27M --vram-fill storage");
    char *storage_cpu =
        greedy_ids(model, "-p '" PROMPT "' -ngl 999 --vram-budget 324K "
                          "--ram-budget 27M --vram-fill storage --expert-miss auto");
    char *two = greedy_ids(model, "-p '" PROMPT "' -ngl 3 --vram-budget 324K --ram-budget 28M "
                                  "--vram-fill storage");
    /* two devices: a pool each, each with its own staging */
    cr_assert_eq(setenv("SLUICE_GPU_HOST_DEVICES", "2", 1), 0);
    char *devs = greedy_ids(model, "-p '" PROMPT "' -ngl 999 --vram-budget 324K "
                                   "--ram-budget 28M --vram-fill storage");
    cr_assert_eq(unsetenv("SLUICE_GPU_HOST_DEVICES"), 0);
    cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    cr_assert_str_eq(devs, cpu, "two devices, --vram-fill storage");
    free(devs);
    cr_assert_str_eq(ram, cpu, "--vram-fill ram");
    cr_assert_str_eq(storage, cpu, "--vram-fill storage");
    cr_assert_str_eq(storage_cpu, cpu, "--vram-fill storage --expert-miss auto");
    cr_assert_str_eq(two, cpu, "-ngl 3 --vram-fill storage");

    /* (no prefetch: no expert reaches the RAM pool ahead of its miss, so every miss stages, at
     * any speed of this machine) */
    int   st = 0;
    char *err = run_err(model,
                        "-ngl 999 --vram-budget 324K --ram-budget 27M --vram-fill storage "
                        "--no-prefetch",
                        &st);
    cr_assert_eq(st, 0, "%s", err);
    cr_assert(strstr(err, "  device staging    960.00 KiB") &&
                  strstr(err, "read from storage through its staging or copied in") &&
                  strstr(err, "(--vram-fill storage)"),
              "no staging in the plan or the placement:\n%s", err);
    /* 8 tokens with a 3-slot pool: nearly every pick a miss, its 3 parts staged */
    const long n = staged_parts(err);
    cr_assert_gt(n, 30, "too few parts staged:\n%s", err);
    cr_assert_eq(n % 3, 0, "a miss's parts are gate, up and down:\n%s", err);
    free(err);
    err = run_err(model, "-ngl 999 --vram-budget 324K --ram-budget 27M --vram-fill ram", &st);
    cr_assert(st == 0 && !strstr(err, "staging") && staged_parts(err) < 0, "%s", err);
    free(err);
    /* auto: a RAM pool of 6 slots (720 KiB) under a 2 MiB device pool stages; under 324 KiB not */
    err = run_err(model, "-ngl 999 --vram-budget 2M --ram-budget 26M --no-prefetch", &st);
    cr_assert(st == 0 && strstr(err, "(--vram-fill auto)") && staged_parts(err) > 0, "%s", err);
    free(err);
    err = run_err(model, "-ngl 999 --vram-budget 324K --ram-budget 27M", &st);
    cr_assert(st == 0 && staged_parts(err) < 0, "%s", err);
    free(err);
    /* a budget that cannot hold the staging says so in one line */
    err = run_err(model, "-ngl 999 --vram-budget 2M --ram-budget 25.5M --vram-fill storage", &st);
    cr_assert(st != 0 && strstr(err, "+ device staging 960.00 KiB (--vram-fill)") &&
                  !strchr(strchr(err, '\n') ? strchr(err, '\n') + 1 : "", '\n'),
              "%s", err);
    free(err);

    /* A QSF file whose layer-1 bundles fail their checksums. */
    char *dir = fixture_tmpdir();
    char  qsf[2048], cmd[4096];
    snprintf(qsf, sizeof(qsf), "%s/model.qsf", dir);
    snprintf(cmd, sizeof(cmd), "%s convert %s %s >/dev/null 2>&1", SLUICE, model, qsf);
    free(sh(cmd, &st));
    cr_assert_eq(st, 0, "sluice convert failed");
    cr_assert_gt(fixture_flip_bundles(qsf, 1), 0, "no bundle of layer 1 changed");
    err = run_err(
        qsf, "-ngl 999 --vram-budget 324K --ram-budget 27M --vram-fill storage --no-prefetch", &st);
    cr_assert_neq(st, 0, "a corrupt expert gave no error:\n%s", err);
    cr_assert(strstr(err, "staging read failed layer=1"), "the staging did not find it:\n%s", err);
    const char *line = strstr(err, "sluice run: error: ");
    cr_assert_not_null(line, "no error line:\n%s", err);
    char one[1024];
    snprintf(one, sizeof(one), "%.*s", (int)strcspn(line, "\n"), line);
    cr_assert(strstr(one, "layer 1 expert") && strstr(one, "checksum") && strstr(one, qsf), "%s",
              one);
    cr_log_info("%s", one);
    free(err);
    fixture_rmtree(dir);
    free(dir);
    free(cpu);
    free(ram);
    free(storage);
    free(storage_cpu);
    free(two);
    free(model);
}

/* -ngl puts layers on a CUDA device: the same greedy tokens as the CPU, and the placement said
 * once on stderr; where no device is usable (this build, no driver, no GPU), a one-line warning
 * and the CPU's tokens, as llama.cpp does. The host backend (SLUICE_GPU_BACKEND=host) runs the
 * device's forward pass on the CPU: the same tokens, placed on HOST0. */
Test(cli_run, ngl_gives_the_cpu_tokens_on_a_device_or_without_one, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *cpu = greedy_ids(model, "-p '" PROMPT "'");
    char *gpu = greedy_ids(model, "-p '" PROMPT "' -ngl 999");
    cr_assert_str_eq(gpu, cpu);
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    char *host = greedy_ids(model, "-p '" PROMPT "' -ngl 999");
    char *host2 = greedy_ids(model, "-p '" PROMPT "' -ngl 2");
    /* The CPU's layers streaming their experts under a budget, the device's uploaded. */
    char *host3 = greedy_ids(model, "-p '" PROMPT "' -ngl 2 --ram-budget 26M");
    /* Every layer on the device, the MoE of the first three on the CPU, streamed. */
    char *host4 = greedy_ids(model, "-p '" PROMPT "' -ngl 999 --n-cpu-moe 3 --ram-budget 26M");
    /* Every layer on the device, its experts in a pool of three slots, streamed into RAM. */
    char *host5 = greedy_ids(model, "-p '" PROMPT "' -ngl 999 --vram-budget 324K --ram-budget 26M");
    char  cmd[4096];
    int   st = 0;
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p hi -n 2 --temp 0 -t 2 -ngl 999 2>&1 >/dev/null",
             SLUICE, model);
    char *placed = sh(cmd, &st);
    /* A q8_0 cache on the device too (the placement says so), and the CPU's tokens of it. */
    snprintf(cmd, sizeof(cmd),
             "%s run -m %s -p hi -n 2 --temp 0 -t 2 -ngl 2 -ctk q8_0 2>&1 >/dev/null", SLUICE,
             model);
    char *q8kv = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s", q8kv);
    cr_assert(strstr(q8kv, "MiB KV (q8_0), "), "no q8_0 cache on the device:\n%s", q8kv);
    free(q8kv);
    snprintf(cmd, sizeof(cmd),
             "%s run -m %s -p hi -n 2 --temp 0 -t 2 -ngl 999 --vram-budget 324K 2>&1 >/dev/null",
             SLUICE, model);
    char *pooled = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s", pooled);
    cr_assert(strstr(pooled, "the experts in a pool of 3 slots") &&
                  strstr(pooled, "gpu expert pool: 3 slots; 32 picks"),
              "no pool in the plan or no pool line at the end:\n%s", pooled);
    cr_assert(strstr(pooled, "copied in from pageable memory"), "%s", pooled);
    /* Under --ram-budget the copies read the fetcher's RAM pool, registered as pinned. */
    snprintf(cmd, sizeof(cmd),
             "%s run -m %s -p hi -n 2 --temp 0 -t 2 -ngl 999 --vram-budget 324K --ram-budget 26M "
             "2>&1 >/dev/null",
             SLUICE, model);
    char *pinned = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s", pinned);
    cr_assert(strstr(pinned, "copied in from the RAM pool, pinned"), "%s", pinned);
    /* The overlap of the copies with the kernels, as the backend timed them. */
    cr_assert(strstr(pinned, "of the copy time hidden behind compute)"), "%s", pinned);
    free(pinned);
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p hi -n 2 -t 2 -ngl 999 --vram-budget 200K 2>&1",
             SLUICE, model);
    char *small = sh(cmd, &st);
    cr_assert_neq(st, 0, "%s", small);
    cr_assert(strstr(small, "sluice run: error: --vram-budget 200.00 KiB holds 1 of the experts") &&
                  !strchr(strchr(small, '\n') ? strchr(small, '\n') + 1 : "", '\n'),
              "not one clear line:\n%s", small);
    free(pooled);
    free(small);
    cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    cr_assert_str_eq(host, cpu, "-ngl 999 on the host backend");
    cr_assert_str_eq(host2, cpu, "-ngl 2 on the host backend");
    cr_assert_str_eq(host3, cpu, "-ngl 2 --ram-budget 26M on the host backend");
    cr_assert_str_eq(host4, cpu, "-ngl 999 --n-cpu-moe 3 --ram-budget 26M on the host backend");
    cr_assert_str_eq(host5, cpu,
                     "-ngl 999 --vram-budget 324K --ram-budget 26M on the host backend");
    cr_assert(strstr(placed, "gpu: HOST0 (") != NULL, "no placement on HOST0:\n%s", placed);
    free(host);
    free(host2);
    free(host3);
    free(host4);
    free(host5);
    free(placed);
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p hi -n 2 --temp 0 -t 2 -ngl 999 2>&1 >/dev/null",
             SLUICE, model);
    char *err = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s", err);
    cr_assert(strstr(err, "warning: -ngl 999 ignored, running on the CPU: ") != NULL ||
                  strstr(err, "gpu: CUDA0 (") != NULL,
              "neither a placement nor a warning:\n%s", err);
    cr_log_info("%s", err);
    /* Without a backend the warning says so, not that a weight type cannot be read. */
    snprintf(cmd, sizeof(cmd),
             "SLUICE_GPU_BACKEND=none %s run -m %s -p hi -n 2 --temp 0 -t 2 -ngl 999 2>&1 "
             ">/dev/null",
             SLUICE, model);
    char *none = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s", none);
    cr_assert(strstr(none, "warning: -ngl 999 ignored, running on the CPU: no device backend "
                           "(SLUICE_GPU_BACKEND=none)\n") != NULL,
              "%s", none);
    free(none);
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p hi -n 2 --device CUDA9x 2>&1", SLUICE, model);
    char *bad = sh(cmd, &st);
    cr_assert_eq(st, 2, "a bad --device is a usage error (exit 2), got %d:\n%s", st, bad);
    cr_assert(strstr(bad, "--device") != NULL, "%s", bad);
    free(cpu);
    free(gpu);
    free(err);
    free(bad);
    free(model);
}
