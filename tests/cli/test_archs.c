/* tests/cli/test_archs.c - every architecture against llama.cpp: greedy ids of random-weight
 * models written by `sluice mkmodel` equal the ids llama.cpp chose on the same files
 * (tests/reference/archs.txt, made by tests/reference/make-arch-refs.sh) for 16 steps at least and
 * up to the first step llama.cpp itself saw as a near-tie; MoE architectures stream to the same
 * ids under a budget; those the device's forward pass implements run it too, on the host backend.
 * The logit-level comparison (KL divergence against llama.cpp's own noise) is in
 * docs/executor.md. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"

#define SLUICE  SLUICE_BINARY_DIR "/bin/sluice"
#define REFS    SLUICE_SOURCE_DIR "/tests/reference/archs.txt"
#define PROMPT  "1,300,301,302,303,310,320,330,340,350,360,370,380,390,400,410"
#define N_STEPS 32
/* A step whose two best logits were closer than this (in llama.cpp's run) may go either way:
 * float summation order alone moves f32 logits by ~1e-5 here, 8-bit activations by ~1e-2. */
#define TIE_F32  2e-3
#define TIE_Q8   3e-2
#define MIN_SAME 16 /* steps that must agree before any tie */

/* One line of the reference file. */
struct arch_ref {
    char   name[32], type[16];
    char   args[512];
    int    ids[N_STEPS];
    double margin[N_STEPS];
};

/* Parses "N,N,..." into n numbers; returns how many were read. */
static int parse_list(const char *s, int n, int *ids, double *vals)
{
    int k = 0;
    while (k < n && *s) {
        char *end;
        if (ids)
            ids[k] = (int)strtol(s, &end, 10);
        else
            vals[k] = strtod(s, &end);
        if (end == s)
            break;
        k++;
        s = *end == ',' ? end + 1 : end;
    }
    return k;
}

/* Reads the reference lines of architecture `arch` (at most cap). */
static int load_refs(const char *arch, struct arch_ref *out, int cap)
{
    FILE *f = fopen(REFS, "r");
    cr_assert_not_null(f, "cannot read %s", REFS);
    char line[4096];
    int  n = 0;
    while (fgets(line, sizeof(line), f) && n < cap) {
        if (line[0] == '#')
            continue;
        char *f1 = strtok(line, "|"), *f2 = strtok(NULL, "|"), *f3 = strtok(NULL, "|"),
             *f4 = strtok(NULL, "|\n");
        cr_assert(f1 && f2 && f3 && f4, "bad line in %s", REFS);
        struct arch_ref *r = &out[n];
        cr_assert_eq(sscanf(f1, "%31s %15s", r->name, r->type), 2);
        if (strcmp(r->name, arch) != 0)
            continue;
        snprintf(r->args, sizeof(r->args), "%s", f2);
        cr_assert_eq(parse_list(f3 + strspn(f3, " "), N_STEPS, r->ids, NULL), N_STEPS);
        cr_assert_eq(parse_list(f4 + strspn(f4, " "), N_STEPS, NULL, r->margin), N_STEPS);
        n++;
    }
    fclose(f);
    cr_assert_gt(n, 0, "no reference for %s in %s", arch, REFS);
    return n;
}

/* Greedy ids of `sluice run` on `model` with extra `opts`; returns how many were read. With -ngl
 * in opts, the device must have taken the model (no warning that it runs on the CPU). */
static int run_ids(const char *model, const char *opts, int *ids)
{
    char cmd[4096];
    int  st = 0;
    snprintf(cmd, sizeof(cmd),
             "%s run -m %s --prompt-ids %s -n %d --temp 0 --ids --ignore-eos -t 2 %s 2>&1", SLUICE,
             model, PROMPT, N_STEPS, opts);
    char *out = fixture_run(cmd, &st);
    cr_assert_not_null(out);
    cr_assert_eq(st, 0, "%s:\n%s", cmd, out);
    cr_assert(!strstr(opts, "-ngl") || !strstr(out, "running on the CPU"),
              "the device refused the model: %s:\n%s", cmd, out);
    int n = 0;
    for (const char *p = out; (p = strstr(p, "gen: ")) && n < N_STEPS; p += 5)
        ids[n++] = atoi(p + 5);
    free(out);
    return n;
}

/* Writes `model` with `sluice mkmodel -q ARGS`, failing the test when it fails. */
static void mkmodel(const char *args, const char *model)
{
    char cmd[8192];
    int  st;
    snprintf(cmd, sizeof(cmd), "%s mkmodel -q %s -o %s 2>&1", SLUICE, args, model);
    char *out = fixture_run(cmd, &st);
    cr_assert_eq(st, 0, "%s:\n%s", cmd, out);
    free(out);
}

/* Checks greedy ids against llama.cpp's: the first MIN_SAME steps agree, and a later difference
 * is a near-tie of the logits in llama.cpp's run, except for sigmoid routing over expert groups
 * (deepseek2), where a choice decided by a hair upstream can move logits far apart: llama.cpp at
 * another batch size agrees with itself on the top token at only 99.5% of positions there. */
static void expect_like_llama(const struct arch_ref *r, const int *ids, const char *how)
{
    const double tie = strcmp(r->type, "f32") == 0 ? TIE_F32 : TIE_Q8;
    int          same = 0;
    while (same < N_STEPS && ids[same] == r->ids[same])
        same++;
    const bool routing_flips = strncmp(r->name, "deepseek2", 9) == 0;
    cr_expect_geq(same, MIN_SAME, "%s %s%s: step %d gives %d, llama.cpp %d (top-2 gap %.4f)",
                  r->name, r->type, how, same, same < N_STEPS ? ids[same] : -1,
                  same < N_STEPS ? r->ids[same] : -1, same < N_STEPS ? r->margin[same] : 0.0);
    if (same < N_STEPS && !routing_flips)
        cr_expect_lt(r->margin[same], tie,
                     "%s %s%s: step %d gives %d, llama.cpp %d, whose two best logits were %.4f "
                     "apart",
                     r->name, r->type, how, same, ids[same], r->ids[same], r->margin[same]);
    if (same < N_STEPS)
        cr_log_info("%s %s%s: %d of %d greedy steps as llama.cpp, then llama.cpp's top-2 gap "
                    "was %.4f",
                    r->name, r->type, how, same, N_STEPS, r->margin[same]);
    else
        cr_log_info("%s %s%s: %d of %d greedy steps as llama.cpp", r->name, r->type, how, same,
                    N_STEPS);
}

/* `device`: options that put the architecture on the device too (executor/gpu.c), NULL for
 * none: it is run there as well, on the host backend (SLUICE_GPU_BACKEND=host), which every
 * machine has. */
static void check_arch_on(const char *arch, bool moe, const char *device)
{
    struct arch_ref refs[4];
    int             n = load_refs(arch, refs, 4);
    char           *dir = fixture_tmpdir();
    for (int i = 0; i < n; i++) {
        const struct arch_ref *r = &refs[i];
        char                   model[4096], cmd[8192];
        int                    st;
        snprintf(model, sizeof(model), "%s/%s-%s.gguf", dir, r->name, r->type);
        mkmodel(r->args, model);
        int ids[N_STEPS];
        cr_assert_eq(run_ids(model, "", ids), N_STEPS);
        expect_like_llama(r, ids, "");
        if (device) {
            int dev[N_STEPS];
            cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
            const int got = run_ids(model, device, dev);
            cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
            cr_assert_eq(got, N_STEPS);
            char how[128];
            snprintf(how, sizeof(how), " %s (host backend)", device);
            expect_like_llama(r, dev, how);
        }
        if (strcmp(r->name, "gpt-oss") == 0) {
            /* Batches of 3 make the sliding layers' ring 16 + 3 cells for 48 positions: it
             * wraps twice, and every window read across the wrap gives the same ids. */
            int ring[N_STEPS];
            cr_assert_eq(run_ids(model, "-b 3", ring), N_STEPS);
            cr_expect_arr_eq(ring, ids, sizeof(ids), "%s %s: the wrapped ring changed the tokens",
                             r->name, r->type);
        }
        if (!moe)
            continue;
        /* Routed experts streamed from the file, shared experts and attention resident: the
         * smallest budget plus 4 slots holds 8 experts, of 16 or more. */
        snprintf(cmd, sizeof(cmd), "%s run -m %s --prompt-ids 1 -n 1 --ram-budget 1M 2>&1", SLUICE,
                 model);
        char              *out = fixture_run(cmd, &st);
        unsigned long long min = 0;
        double             slot_kib = 0;
        const char        *a = strstr(out, "MiB ("), *b = strstr(out, "expert slots of ");
        cr_assert(a && b && sscanf(a, "MiB (%llu bytes)", &min) == 1 &&
                      sscanf(b, "expert slots of %lf KiB", &slot_kib) == 1,
                  "no minimum in: %s", out);
        free(out);
        char opts[64];
        snprintf(opts, sizeof(opts), "--ram-budget %llu",
                 min + 4ull * (unsigned long long)(slot_kib * 1024));
        int streamed[N_STEPS];
        cr_assert_eq(run_ids(model, opts, streamed), N_STEPS);
        cr_expect_arr_eq(streamed, ids, sizeof(ids), "%s %s: streaming changed the tokens", r->name,
                         r->type);
    }
    fixture_rmtree(dir);
    free(dir);
}

static void check_arch(const char *arch, bool moe)
{
    check_arch_on(arch, moe, NULL);
}

Test(cli_archs, llama_matches_llama_cpp, .timeout = 300)
{
    check_arch_on("llama", false, "-ngl 999");
}

Test(cli_archs, qwen2_matches_llama_cpp, .timeout = 300)
{
    check_arch_on("qwen2", false, "-ngl 999");
}

Test(cli_archs, qwen3_matches_llama_cpp, .timeout = 300)
{
    check_arch_on("qwen3", false, "-ngl 999");
}

Test(cli_archs, qwen2moe_matches_llama_cpp_and_streams, .timeout = 300)
{
    check_arch_on("qwen2moe", true, "-ngl 999");
}

Test(cli_archs, qwen3moe_matches_llama_cpp_and_streams, .timeout = 300)
{
    check_arch_on("qwen3moe", true, "-ngl 999");
}

Test(cli_archs, olmoe_matches_llama_cpp_and_streams, .timeout = 300)
{
    check_arch_on("olmoe", true, "-ngl 999");
}

/* GLM-4.5's layout: q/k/v biases, rotary on half of each head, post-attention norm, a dense first
 * layer, one shared expert, sigmoid routing with a selection bias, a prediction block not run.
 * Not on the device path here: its Q8_0 model left llama.cpp's ids there at step 30 of 32 (the
 * device's prefill rounds activations to f16; with random weights such drift can move an
 * expert choice); the F32 device path gives the CPU's logits (executor_gpu::glm4moe_as_the_cpu). */
Test(cli_archs, glm4moe_matches_llama_cpp_and_streams, .timeout = 300)
{
    check_arch("glm4moe", true);
}

/* gpt-oss: sinks, a sliding window that the 48 positions exceed, biases everywhere, the clamped
 * SwiGLU, softmax over the chosen logits, YaRN; F32, Q8_0 and MXFP4; on the device path too. */
Test(cli_archs, gpt_oss_matches_llama_cpp_and_streams, .timeout = 300)
{
    check_arch_on("gpt-oss", true, "-ngl 999");
}

/* DeepSeek V3's shape: latent attention with q LoRA, a dense first layer, a shared expert,
 * sigmoid routing with a selection bias over 4 groups, renormalised and scaled weights, YaRN; on
 * the CPU and on the device path (host backend). */
Test(cli_archs, deepseek2_matches_llama_cpp_and_streams, .timeout = 300)
{
    check_arch_on("deepseek2", true, "-ngl 999");
}

/* V2-Lite's: one q projection, softmax routing; llama.cpp knows it by its 27 layers. CPU and
 * device path. */
Test(cli_archs, deepseek2_lite_matches_llama_cpp_and_streams, .timeout = 300)
{
    check_arch_on("deepseek2-lite", true, "-ngl 999");
}

/* bitnet: sub-norms before the output and down projections, a per-tensor scale after each of the
 * seven projections, NeoX RoPE, the embedding as the head; F32 and the ternary TQ1_0 and TQ2_0,
 * on the CPU and on the device path (host backend). Dense: under a budget its FFNs stream, one
 * "expert" per layer, with the same tokens. */
Test(cli_archs, bitnet_matches_llama_cpp_and_streams, .timeout = 300)
{
    check_arch_on("bitnet", true, "-ngl 999");
}

/* Microsoft's bitnet-b1.58 with I2_S weights streams its FFNs under a budget in Microsoft's
 * layout and with inline scales (same tokens as in RAM); the split layout, rebuilt in memory,
 * is refused there with the reason. */
Test(cli_archs, bitnet_b158_i2s_streams, .timeout = 300)
{
    static const char *layouts[] = {"qk256", "bitnet32", "split32"};
    char              *dir = fixture_tmpdir();
    for (int l = 0; l < 3; l++) {
        char model[4096], cmd[8192];
        int  st;
        snprintf(model, sizeof(model), "%s/b158-%s.gguf", dir, layouts[l]);
        snprintf(cmd, sizeof(cmd),
                 "--arch bitnet-b1.58 --type i2_s --i2s-layout %s --n-embd 256 --n-ff 384 "
                 "--n-head 8 --n-head-kv 2 --n-vocab 512",
                 layouts[l]);
        mkmodel(cmd, model);
        int in_ram[N_STEPS], streamed[N_STEPS];
        cr_assert_eq(run_ids(model, "", in_ram), N_STEPS);
        snprintf(cmd, sizeof(cmd),
                 "%s run -m %s --prompt-ids " PROMPT " -n %d --temp 0 --ids --ignore-eos -t 2 "
                 "-c 256 --ram-budget 64M 2>&1",
                 SLUICE, model, N_STEPS);
        char *out = fixture_run(cmd, &st);
        if (l == 2) {
            cr_expect_neq(st, 0, "the split layout streamed: %s", out);
            cr_expect(strstr(out, "cannot be streamed"), "the reason: %s", out);
            free(out);
            continue;
        }
        cr_assert_eq(st, 0, "%s:\n%s", cmd, out);
        cr_expect(strstr(out, "expert trace") != NULL, "no streaming in: %s", out);
        int n = 0;
        for (const char *p = out; (p = strstr(p, "gen: ")) && n < N_STEPS; p += 5)
            streamed[n++] = atoi(p + 5);
        free(out);
        cr_assert_eq(n, N_STEPS);
        cr_expect_arr_eq(streamed, in_ram, sizeof(in_ram), "%s: streaming changed the tokens",
                         layouts[l]);
    }
    fixture_rmtree(dir);
    free(dir);
}

/* The gate predictor guesses layer L+1's experts with L+1's own selection rule: on a DeepSeek V3
 * model (sigmoid scores, a selection bias, expert groups) whose routing follows the current
 * token, its guesses are nearly all right (with the raw router logits alone they were 75% right
 * here). The counts come from routing, not from I/O timing. */
Test(cli_archs, deepseek2_gate_predictor_follows_the_selection_rule, .timeout = 300)
{
    char *dir = fixture_tmpdir();
    char  model[4096], cmd[8192];
    int   st;
    snprintf(model, sizeof(model), "%s/ds-v3-balanced.gguf", dir);
    mkmodel("--arch deepseek2 --routing balanced --n-embd 256 --n-head 4 --n-ff 128 --n-expert 16 "
            "--n-expert-used 4 --n-layer 4 --type q8_0",
            model);
    snprintf(cmd, sizeof(cmd), "%s bench -m %s -p 0 -n 32 -r 1 -t 2 --ram-budget 25M 2>&1", SLUICE,
             model);
    char *out = fixture_run(cmd, &st);
    cr_assert_eq(st, 0, "%s:\n%s", cmd, out);
    const char *p = strstr(out, "predictor gate: precision ");
    double      prec = -1;
    cr_assert(p && sscanf(p, "predictor gate: precision %lf%%", &prec) == 1, "no predictor in %s",
              out);
    cr_expect_geq(prec, 90.0, "gate predictor precision %.1f%%:\n%s", prec, out);
    free(out);
    fixture_rmtree(dir);
    free(dir);
}
