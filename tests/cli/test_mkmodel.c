/* tests/cli/test_mkmodel.c - mkmodel output round-trips through the reader, the model description
 * and `sluice inspect --json`. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "executor.h"
#include "fetcher.h"
#include "fixture.h"
#include "kernels/kernels.h"
#include "tjson.h"

/* Runs a shell command; returns its stdout (malloc'd) and exit status. */
static char *run_capture(const char *cmd, int *status)
{
    char *out = fixture_run(cmd, status);
    cr_assert_not_null(out, "could not run %s", cmd);
    return out;
}

static void check_model(const char *path, const struct executor_synth_opts *o)
{
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_open(path, NULL, &g, &e), COMMON_OK, "%s", e.text);
    struct common_model m;
    cr_assert_eq(common_model_init(&m, g, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(m.hp.n_embd, o->n_embd);
    cr_assert_eq(m.hp.n_layer, o->n_layer);
    cr_assert_eq(m.hp.n_head, o->n_head);
    cr_assert_eq(m.hp.n_expert, o->n_expert);
    cr_assert_eq(m.hp.n_vocab, 259, "byte-level vocabulary");
    const struct common_gguf_tensor *q = common_gguf_tensor_find(g, "blk.0.attn_q.weight");
    cr_assert_not_null(q);
    cr_assert_eq(q->type, o->type);
    if (o->n_expert) {
        struct common_span sp;
        cr_assert_eq(common_model_expert_span(&m, 1, o->n_expert - 1, COMMON_EXPERT_DOWN, &sp),
                     COMMON_OK);
        /* The last expert's bytes decode to finite values of the expected scale. */
        void  *buf = malloc(sp.size);
        float *row = malloc(sp.cols * sizeof(float));
        cr_assert_eq(common_gguf_read_span(g, &sp, buf, &e), COMMON_OK, "%s", e.text);
        cr_assert_eq(executor_dequantize_row(sp.type, buf, row, (int64_t)sp.cols), COMMON_OK);
        double ss = 0;
        for (uint64_t i = 0; i < sp.cols; i++) {
            cr_assert(row[i] == row[i], "NaN in expert weights");
            ss += (double)row[i] * (double)row[i];
        }
        cr_assert_gt(ss, 0.0);
        free(buf);
        free(row);
    }
    common_model_fini(&m);
    common_gguf_close(g);
}

Test(cli_mkmodel, synth_round_trips_in_every_type, .timeout = 300)
{
    static const uint32_t types[] = {
        COMMON_GGML_TYPE_F32,   COMMON_GGML_TYPE_F16,  COMMON_GGML_TYPE_BF16,
        COMMON_GGML_TYPE_Q8_0,  COMMON_GGML_TYPE_Q4_0, COMMON_GGML_TYPE_Q4_1,
        COMMON_GGML_TYPE_Q5_0,  COMMON_GGML_TYPE_Q5_1, COMMON_GGML_TYPE_Q4_K,
        COMMON_GGML_TYPE_Q5_K,  COMMON_GGML_TYPE_Q6_K, COMMON_GGML_TYPE_TQ1_0,
        COMMON_GGML_TYPE_TQ2_0,
    };
    char *dir = fixture_tmpdir();
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/m%zu.gguf", dir, i);
        struct executor_synth_opts o = {.path = path,
                                        .n_embd = 256,
                                        .n_layer = 2,
                                        .n_head = 4,
                                        .n_head_kv = 2,
                                        .n_ff = 256,
                                        .n_expert = i % 2 ? 4 : 0,
                                        .n_expert_used = 2,
                                        .type = types[i]};
        struct common_errmsg       e = {{0}};
        cr_assert_eq(executor_synth_write(&o, &e), COMMON_OK, "type %u: %s", types[i], e.text);
        check_model(path, &o);
    }
    fixture_rmtree(dir);
    free(dir);
}

/* The relative RMS error of n values of `type` quantized by the reference or the quick
 * quantizer and dequantized again. */
static double quant_error(uint32_t type, bool quick, const float *x, int64_t n)
{
    uint8_t *q = malloc((size_t)n * 2);
    float   *y = malloc((size_t)n * sizeof(float));
    cr_assert(q && y);
    cr_assert_eq(quick ? executor_quantize_row_quick(type, x, q, n)
                       : executor_quantize_row_ref(type, x, q, n),
                 0);
    cr_assert_eq(executor_dequantize_row(type, q, y, n), 0);
    double e2 = 0, x2 = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)y[i] - (double)x[i];
        e2 += d * d;
        x2 += (double)x[i] * (double)x[i];
    }
    free(q);
    free(y);
    return sqrt(e2 / x2);
}

/* --quick-quant: Q4_K and Q5_K without the scale search, a valid quantization a little coarser
 * than the reference's (and not the same bytes); other types as the reference; a model made
 * with it reads back. */
Test(cli_mkmodel, quick_quant_is_a_coarser_valid_k_quant, .timeout = 300)
{
    const int64_t n = 256 * 64;
    float        *x = malloc((size_t)n * sizeof(float));
    uint64_t      st = 12345;
    for (int64_t i = 0; i < n; i++) { /* a sum of uniforms: roughly Gaussian */
        double v = 0;
        for (int k = 0; k < 4; k++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            v += (double)(st >> 11) * 0x1p-53 - 0.5;
        }
        x[i] = (float)v * 0.05f;
    }
    const uint32_t k_types[] = {COMMON_GGML_TYPE_Q4_K, COMMON_GGML_TYPE_Q5_K};
    for (size_t t = 0; t < 2; t++) {
        const double ref = quant_error(k_types[t], false, x, n);
        const double quick = quant_error(k_types[t], true, x, n);
        cr_log_info("type %u: relative RMS error %.4f (reference) %.4f (quick)", k_types[t], ref,
                    quick);
        cr_assert(quick > ref && quick < 1.6 * ref,
                  "type %u: quick error %.4f against the reference's %.4f", k_types[t], quick, ref);
    }
    const double q8 = quant_error(COMMON_GGML_TYPE_Q8_0, true, x, n);
    cr_assert_eq(q8, quant_error(COMMON_GGML_TYPE_Q8_0, false, x, n), "Q8_0 as the reference");
    free(x);

    char *dir = fixture_tmpdir();
    char  a[512], b[512];
    snprintf(a, sizeof(a), "%s/ref.gguf", dir);
    snprintf(b, sizeof(b), "%s/quick.gguf", dir);
    struct executor_synth_opts o = {.path = a,
                                    .n_embd = 256,
                                    .n_layer = 2,
                                    .n_head = 4,
                                    .n_ff = 256,
                                    .n_expert = 4,
                                    .n_expert_used = 2,
                                    .type = COMMON_GGML_TYPE_Q4_K};
    struct common_errmsg       e = {{0}};
    cr_assert_eq(executor_synth_write(&o, &e), COMMON_OK, "%s", e.text);
    o.path = b;
    o.quick_quant = true;
    cr_assert_eq(executor_synth_write(&o, &e), COMMON_OK, "%s", e.text);
    check_model(b, &o);
    size_t la = 0, lb = 0;
    char  *da = fixture_read_all(a, &la), *db = fixture_read_all(b, &lb);
    cr_assert(da && db && la == lb, "the same layout");
    cr_assert(memcmp(da, db, la) != 0, "--quick-quant wrote the reference's bytes");
    free(da);
    free(db);
    fixture_rmtree(dir);
    free(dir);
}

Test(cli_mkmodel, bad_geometry_is_refused_and_leaves_no_file)
{
    char *dir = fixture_tmpdir();
    char  path[512];
    snprintf(path, sizeof(path), "%s/bad.gguf", dir);
    struct common_errmsg       e = {{0}};
    struct executor_synth_opts o = {
        .path = path, .n_embd = 96, .n_head = 4, .type = COMMON_GGML_TYPE_Q4_K};
    cr_assert_eq(executor_synth_write(&o, &e), COMMON_EINVAL);
    cr_assert_not_null(strstr(e.text, "block size"), "%s", e.text);
    o = (struct executor_synth_opts){.path = path, .n_embd = 256, .n_head = 3};
    cr_assert_eq(executor_synth_write(&o, &e), COMMON_EINVAL);
    cr_assert_not_null(strstr(e.text, "n_head"), "%s", e.text);
    FILE *f = fopen(path, "rb");
    cr_assert_null(f, "a refused model must not leave a file");
    fixture_rmtree(dir);
    free(dir);
}

Test(cli_mkmodel, target_size_and_vocab_copy_via_cli, .timeout = 300)
{
    FIXTURE_OR_SKIP(vocab, "models/llama-2-tiny-random.gguf");
    char *dir = fixture_tmpdir();
    char  cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s/bin/sluice mkmodel -q -o %s/s.gguf --type q4_0 --n-embd 256 --n-expert 4 "
             "--n-ff 256 --size 40M --vocab-from %s && %s/bin/sluice inspect --json %s/s.gguf",
             SLUICE_BINARY_DIR, dir, vocab, SLUICE_BINARY_DIR, dir);
    int   status = -1;
    char *out = run_capture(cmd, &status);
    cr_assert_eq(status, 0, "%s", out);
    struct tjson *j = tjson_parse(out);
    cr_assert_not_null(j, "inspect --json is not valid JSON:\n%s", out);
    const struct tjson *model = tjson_get(j, "model");
    cr_assert_not_null(model);
    cr_assert_eq(tjson_get(model, "n_vocab")->num, 32000.0, "vocabulary copied");
    cr_assert_eq(tjson_get(model, "n_expert")->num, 4.0);
    const struct tjson *totals = tjson_get(j, "totals");
    double              bytes = tjson_get(totals, "tensor_bytes")->num;
    cr_assert(bytes > 30e6 && bytes < 52e6, "--size 40M gave %.0f bytes", bytes);
    cr_assert_eq(tjson_get(totals, "resident_bytes")->num + tjson_get(totals, "expert_bytes")->num,
                 bytes);
    const struct tjson *tok = tjson_get(j, "tokenizer");
    cr_assert_str_eq(tjson_get(tok, "model")->str, "llama");
    tjson_free(j);
    free(out);
    fixture_rmtree(dir);
    free(dir);
    free(vocab);
}

Test(cli_inspect, json_on_every_fixture_kind)
{
    FIXTURE_OR_SKIP(moe, "moe-tiny/moe-tiny-q8_0.gguf");
    FIXTURE_OR_SKIP(voc, "tokenizer/ggml-vocab-gpt-2.gguf");
    char cmd[2048];
    int  status;
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice inspect --json %s", SLUICE_BINARY_DIR, moe);
    char         *out = run_capture(cmd, &status);
    struct tjson *j = tjson_parse(out);
    cr_assert_eq(status, 0);
    cr_assert_not_null(j, "%s", out);
    cr_assert_eq(tjson_get(tjson_get(j, "model"), "n_expert_used")->num, 2.0);
    cr_assert_eq(tjson_get(j, "tensors")->len, 43);
    cr_assert_str_eq(tjson_get(tjson_at(tjson_get(j, "tensors"), 0), "type")->str, "q8_0");
    tjson_free(j);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice inspect --json %s", SLUICE_BINARY_DIR, voc);
    out = run_capture(cmd, &status);
    j = tjson_parse(out);
    cr_assert_eq(status, 0, "a vocabulary-only file is inspectable");
    cr_assert_not_null(j, "%s", out);
    cr_assert_eq(tjson_get(j, "model")->kind, TJSON_NULL);
    cr_assert_eq(tjson_get(tjson_get(j, "tokenizer"), "vocab_size")->num, 50257.0);
    tjson_free(j);
    free(out);
    free(moe);
    free(voc);
}

Test(cli_inspect, corrupt_file_exits_nonzero_with_message)
{
    char *dir = fixture_tmpdir();
    char  cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "printf 'GGUF\\003\\000\\000\\000' > %s/c.gguf; %s/bin/sluice inspect %s/c.gguf 2>&1",
             dir, SLUICE_BINARY_DIR, dir);
    int   status;
    char *out = run_capture(cmd, &status);
    cr_assert_eq(status, 1);
    cr_assert_not_null(strstr(out, "truncated"), "%s", out);
    free(out);
    fixture_rmtree(dir);
    free(dir);
}

/* The file depends on the seed, not on the thread count: -t 1 and -t 3 write the same bytes, over
 * tensors of several chunks (the 8000-token q4_K embedding is three) and Microsoft's I2_S layout
 * with its tail after each tensor. */
Test(cli_mkmodel, output_does_not_depend_on_thread_count, .timeout = 300)
{
    static const char *const cases[] = {
        "--arch qwen3moe --type q4_K --n-embd 256 --n-head 4 --n-head-kv 2 --n-ff 256 "
        "--n-expert 8 --n-expert-used 2 --n-vocab 8000 --seed 5",
        "--arch bitnet-b1.58 --type i2_s --n-embd 256 --n-ff 512 --n-vocab 600",
    };
    char *dir = fixture_tmpdir();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char  *bytes[2] = {NULL, NULL};
        size_t len[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            char cmd[2048], path[512];
            snprintf(path, sizeof(path), "%s/t%d.gguf", dir, k);
            snprintf(cmd, sizeof(cmd), "%s/bin/sluice mkmodel -q -t %d -o %s %s 2>&1",
                     SLUICE_BINARY_DIR, k == 0 ? 1 : 3, path, cases[i]);
            int   status = -1;
            char *out = run_capture(cmd, &status);
            cr_assert_eq(status, 0, "%s: %s", cmd, out);
            free(out);
            bytes[k] = fixture_read_all(path, &len[k]);
            cr_assert_not_null(bytes[k], "%s not written", path);
        }
        cr_assert_gt(len[0], 0);
        cr_assert_eq(len[0], len[1], "%s: %zu bytes with -t 1, %zu with -t 3", cases[i], len[0],
                     len[1]);
        cr_assert(memcmp(bytes[0], bytes[1], len[0]) == 0, "%s: -t 1 and -t 3 differ", cases[i]);
        free(bytes[0]);
        free(bytes[1]);
    }
    char path[512];
    snprintf(path, sizeof(path), "%s/n.gguf", dir);
    struct executor_synth_opts o = {.path = path, .n_threads = 257};
    struct common_errmsg       e = {{0}};
    cr_assert_eq(executor_synth_write(&o, &e), COMMON_EINVAL);
    cr_assert_not_null(strstr(e.text, "n_threads"), "%s", e.text);
    fixture_rmtree(dir);
    free(dir);
}

/* Progress goes to a log as plain lines: no carriage return reaches a file. */
Test(cli_mkmodel, progress_to_a_file_has_no_carriage_returns, .timeout = 300)
{
    char *dir = fixture_tmpdir();
    char  cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s/bin/sluice mkmodel --preset demo -o %s/p.gguf 2>%s/err.txt; cat %s/err.txt",
             SLUICE_BINARY_DIR, dir, dir, dir);
    int   status;
    char *out = run_capture(cmd, &status);
    cr_assert_not_null(strstr(out, "% ("), "progress lines expected: %s", out);
    cr_assert_null(strchr(out, '\r'), "a carriage return in a file: %s", out);
    free(out);
    fixture_rmtree(dir);
    free(dir);
}

/* The routing summary (trace JSON) of 256 sampled tokens of a 4-layer, 32-expert top-4 model made
 * with the options `args` (file DIR/NAME.gguf). */
static void routing_with(const char *dir, const char *name, const char *args, double *entropy,
                         double *reuse1)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s/bin/sluice mkmodel -q -o %s/%s.gguf --n-embd 256 --n-layer 4 --n-expert 32 "
             "--n-expert-used 4 --n-ff 256 --n-vocab 512 --type q8_0 %s --seed 3 "
             "&& %s/bin/sluice run -m %s/%s.gguf -p ab -n 256 --temp 1 --seed 1 --ignore-eos -t 2 "
             "--ram-budget 50M --trace-out %s/%s.json > /dev/null 2>&1 && cat %s/%s.json",
             SLUICE_BINARY_DIR, dir, name, args, SLUICE_BINARY_DIR, dir, name, dir, name, dir,
             name);
    int   status = -1;
    char *out = run_capture(cmd, &status);
    cr_assert_eq(status, 0, "%s", out);
    struct tjson *j = tjson_parse(out);
    cr_assert_not_null(j, "trace is not valid JSON:\n%s", out);
    const struct tjson *r = tjson_get(j, "routing");
    cr_assert_not_null(r);
    *entropy = tjson_get(r, "entropy_mean")->num;
    const double accesses = tjson_get(tjson_get(j, "totals"), "accesses")->num;
    *reuse1 = tjson_at(tjson_get(r, "reuse_tokens_log2"), 0)->num / accesses;
    tjson_free(j);
    free(out);
}

/* Each of the n option sets `bad` (beside --n-expert 8) makes mkmodel fail with an error that
 * names `word`. */
static void expect_refused(const char *dir, const char *const *bad, int n, const char *word)
{
    for (int i = 0; i < n; i++) {
        char cmd[1024];
        int  status = -1;
        snprintf(cmd, sizeof(cmd), "%s/bin/sluice mkmodel -q -o %s/x.gguf --n-expert 8 %s 2>&1",
                 SLUICE_BINARY_DIR, dir, bad[i]);
        char *out = run_capture(cmd, &status);
        cr_expect_neq(status, 0, "'%s' accepted: %s", bad[i], out);
        cr_expect_not_null(strstr(out, word), "the error does not name the %s: %s", word, out);
        free(out);
    }
}

/* The same for --routing MODE (and --routing-skew SKEW when not NULL). */
static void routing_skewed(const char *dir, const char *mode, const char *skew, double *entropy,
                           double *reuse1)
{
    char name[64], args[256];
    snprintf(name, sizeof(name), "%s%s", mode, skew ? skew : "");
    snprintf(args, sizeof(args), "--routing %s %s%s", mode, skew ? "--routing-skew " : "",
             skew ? skew : "");
    routing_with(dir, name, args, entropy, reuse1);
}

static void routing_of(const char *dir, const char *mode, double *entropy, double *reuse1)
{
    routing_skewed(dir, mode, NULL, entropy, reuse1);
}

/* --routing-reuse carries the last few tokens into the routing: an expert is used again one token
 * later far more often than chance (4 of 32: 12.5%) while the load stays spread (entropy near 1,
 * unlike a skew's); it needs balanced routing and attention biases, and is refused otherwise. */
Test(cli_mkmodel, routing_reuse_repeats_experts_over_neighbouring_tokens, .timeout = 300)
{
    char  *dir = fixture_tmpdir();
    double h[2], r[2];
    routing_with(dir, "reuse0", "--arch qwen2moe --routing balanced", &h[0], &r[0]);
    routing_with(dir, "reuse4", "--arch qwen2moe --routing balanced --routing-reuse 4", &h[1],
                 &r[1]);
    cr_log_info("reuse 0/4: load entropy %.3f %.3f, reuse after 1 token %.3f %.3f", h[0], h[1],
                r[0], r[1]);
    cr_expect(r[0] > 0.08 && r[0] < 0.17, "reuse 0 is memoryless: %.3f, chance 0.125", r[0]);
    cr_expect_gt(r[1], r[0] + 0.15, "reuse 4 repeats experts: %.3f against %.3f", r[1], r[0]);
    cr_expect_gt(h[1], 0.93, "reuse 4 keeps the load spread: entropy %.3f", h[1]);
    static const char *bad[] = {"--routing balanced --routing-reuse 2",
                                "--arch qwen2moe --routing-reuse 2",
                                "--arch qwen2moe --routing balanced --routing-reuse -1"};
    expect_refused(dir, bad, 3, "reuse");
    fixture_rmtree(dir);
    free(dir);
}

/* --routing-skew tunes balanced routing from uniform towards a few experts taking most tokens:
 * the load entropy falls and the reuse one token later rises with it; a skew without balanced
 * routing, or a negative one, is refused. */
Test(cli_mkmodel, routing_skew_tunes_the_load, .timeout = 300)
{
    char       *dir = fixture_tmpdir();
    double      h[3], r[3];
    const char *skews[3] = {"0", "1", "4"};
    for (int i = 0; i < 3; i++)
        routing_skewed(dir, "balanced", skews[i], &h[i], &r[i]);
    cr_log_info("skew 0/1/4: load entropy %.3f %.3f %.3f, reuse after 1 token %.3f %.3f %.3f", h[0],
                h[1], h[2], r[0], r[1], r[2]);
    cr_expect_gt(h[0], 0.98, "skew 0 is balanced: entropy %.3f", h[0]);
    cr_expect(h[0] > h[1] + 0.1 && h[1] > h[2] + 0.1,
              "entropy should fall with the skew: %.3f %.3f %.3f", h[0], h[1], h[2]);
    cr_expect(r[2] > r[1] && r[1] > r[0], "reuse should rise with the skew: %.3f %.3f %.3f", r[0],
              r[1], r[2]);
    static const char *bad[] = {"--routing-skew 1", "--routing balanced --routing-skew -1"};
    expect_refused(dir, bad, 2, "skew");
    fixture_rmtree(dir);
    free(dir);
}

/* --routing balanced routes by the current token: near-uniform load (entropy near 1, above the
 * natural routing's) and, being memoryless, a bundle used again one token later about as often as
 * chance (4 of 32 experts: 12.5%). */
Test(cli_mkmodel, balanced_routing_is_uniform_and_memoryless, .timeout = 300)
{
    char  *dir = fixture_tmpdir();
    double h_nat = 0, h_bal = 0, r_nat = 0, r_bal = 0;
    routing_of(dir, "natural", &h_nat, &r_nat);
    routing_of(dir, "balanced", &h_bal, &r_bal);
    cr_log_info("load entropy natural %.3f balanced %.3f; reuse after 1 token %.3f, %.3f", h_nat,
                h_bal, r_nat, r_bal);
    cr_expect_gt(h_bal, 0.98, "balanced load entropy %.3f", h_bal);
    cr_expect_gt(h_bal, h_nat, "balanced %.3f should spread more than natural %.3f", h_bal, h_nat);
    cr_expect(r_bal > 0.08 && r_bal < 0.17, "balanced reuse after 1 token %.3f, chance 0.125",
              r_bal);
    int  status = -1;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice mkmodel -q -o %s/x.gguf --routing skewed 2>&1",
             SLUICE_BINARY_DIR, dir);
    char *out = run_capture(cmd, &status);
    cr_expect_eq(status, 2, "a bad mode is a usage error: %s", out);
    cr_expect_not_null(strstr(out, "natural or balanced"), "%s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice mkmodel -q -o %s/x.gguf --routing balanced 2>&1",
             SLUICE_BINARY_DIR, dir);
    out = run_capture(cmd, &status);
    cr_expect_neq(status, 0, "a dense model has no routing: %s", out);
    cr_expect_not_null(strstr(out, "needs experts"), "%s", out);
    free(out);
    fixture_rmtree(dir);
    free(dir);
}

/* inspect --json carries what the architecture table adds: latent attention ranks, routing,
 * sliding window, rope scaling, and the bytes of layers that are not run (glm4moe's prediction
 * block). */
Test(cli_inspect, json_shows_architecture_features, .timeout = 120)
{
    char *dir = fixture_tmpdir();
    static const struct {
        const char *args, *key, *str;
        double      num;
    } cases[] = {
        {"--arch deepseek2 --preset tiny --n-layer 3 --n-ff 128", "kv_lora_rank", NULL, 64},
        {"--arch deepseek2 --preset tiny --n-layer 3 --n-ff 128", "gating", "sigmoid", 0},
        {"--arch deepseek2 --preset tiny --n-layer 3 --n-ff 128", "n_layer_dense_lead", NULL, 1},
        {"--arch deepseek2 --preset tiny --n-layer 3 --n-ff 128", "rope_scaling", "yarn", 0},
        {"--arch gpt-oss --preset tiny --n-ff 128", "gating", "softmax_weight", 0},
        {"--arch gpt-oss --preset tiny --n-ff 128", "swa_period", NULL, 2},
        {"--arch qwen3moe --preset tiny --n-ff 128", "gating", "softmax", 0},
        {"--arch qwen3moe --preset tiny --n-ff 128", "kv_lora_rank", NULL, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char cmd[2048];
        snprintf(cmd, sizeof(cmd),
                 "%s/bin/sluice mkmodel -q -o %s/m.gguf --n-vocab 300 %s && %s/bin/sluice inspect "
                 "--json %s/m.gguf",
                 SLUICE_BINARY_DIR, dir, cases[i].args, SLUICE_BINARY_DIR, dir);
        int   status = -1;
        char *out = run_capture(cmd, &status);
        cr_assert_eq(status, 0, "%s", out);
        struct tjson *j = tjson_parse(out);
        cr_assert_not_null(j, "not JSON:\n%s", out);
        const struct tjson *v = tjson_get(tjson_get(j, "model"), cases[i].key);
        cr_assert_not_null(v, "%s: no model.%s", cases[i].args, cases[i].key);
        if (cases[i].str)
            cr_expect_str_eq(v->str, cases[i].str, "%s: %s", cases[i].args, cases[i].key);
        else
            cr_expect_eq(v->num, cases[i].num, "%s: %s = %g", cases[i].args, cases[i].key, v->num);
        tjson_free(j);
        free(out);
    }
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "%s/bin/sluice mkmodel -q -o %s/g.gguf --arch glm4moe --preset tiny --n-layer 3 "
             "--n-ff 128 --n-vocab 300 && %s/bin/sluice inspect --json %s/g.gguf",
             SLUICE_BINARY_DIR, dir, SLUICE_BINARY_DIR, dir);
    int   status = -1;
    char *out = run_capture(cmd, &status);
    cr_assert_eq(status, 0, "%s", out);
    struct tjson *j = tjson_parse(out);
    cr_assert_not_null(j);
    const struct tjson *tot = tjson_get(j, "totals");
    cr_expect_gt(tjson_get(tot, "unused_bytes")->num, 0.0, "the prediction block is not run");
    cr_expect_eq(tjson_get(tot, "resident_bytes")->num + tjson_get(tot, "expert_bytes")->num +
                     tjson_get(tot, "unused_bytes")->num,
                 tjson_get(tot, "tensor_bytes")->num);
    tjson_free(j);
    free(out);
    fixture_rmtree(dir);
    free(dir);
}
