/* tests/common/test_gguf.c - GGUF reader: fixtures, known values, truncation, corruption, splits.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fixture.h"
#include "tjson.h"

/* ---- a byte builder for hand-made GGUF images ---------------------------------------------- */

struct bb {
    uint8_t *p;
    size_t   n;
    size_t   cap;
};

static void bb_put(struct bb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert_not_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void bb_u32(struct bb *b, uint32_t v)
{
    bb_put(b, &v, 4);
}

static void bb_u64(struct bb *b, uint64_t v)
{
    bb_put(b, &v, 8);
}

static void bb_str(struct bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}

static void bb_pad(struct bb *b, size_t align)
{
    static const uint8_t z[64];
    bb_put(b, z, (align - b->n % align) % align);
}

/* A valid little image: 2 kvs (arch string, u32), 1 f32 tensor [8, 2] with data. */
static struct bb make_image(void)
{
    struct bb b = {0};
    bb_u32(&b, COMMON_GGUF_MAGIC);
    bb_u32(&b, 3);
    bb_u64(&b, 1); /* tensors */
    bb_u64(&b, 2); /* kvs */
    bb_str(&b, "general.architecture");
    bb_u32(&b, COMMON_GGUF_STRING);
    bb_str(&b, "llama");
    bb_str(&b, "test.count");
    bb_u32(&b, COMMON_GGUF_UINT32);
    bb_u32(&b, 7);
    bb_str(&b, "w");
    bb_u32(&b, 2);
    bb_u64(&b, 8);
    bb_u64(&b, 2);
    bb_u32(&b, COMMON_GGML_TYPE_F32);
    bb_u64(&b, 0);
    bb_pad(&b, 32);
    for (int i = 0; i < 16; i++) {
        float f = (float)i;
        bb_put(&b, &f, 4);
    }
    return b;
}

static int parse(const struct bb *b, struct common_errmsg *e)
{
    struct common_gguf *g = NULL;
    int                 rc = common_gguf_parse(b->p, b->n, b->n, &g, e);
    common_gguf_close(g);
    return rc;
}

Test(common_gguf, parse_valid_image)
{
    struct bb           b = make_image();
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_parse(b.p, b.n, b.n, &g, NULL), COMMON_OK);
    cr_assert_eq(common_gguf_version(g), 3);
    cr_assert_eq(common_gguf_n_kv(g), 2);
    uint32_t v = 0;
    cr_assert_eq(common_gguf_get_u32(g, "test.count", &v), COMMON_OK);
    cr_assert_eq(v, 7);
    uint64_t v64 = 0;
    cr_assert_eq(common_gguf_get_u64(g, "test.count", &v64), COMMON_OK);
    cr_assert_eq(v64, 7);
    struct common_gguf_str s;
    cr_assert_eq(common_gguf_get_str(g, "general.architecture", &s), COMMON_OK);
    cr_assert_eq(s.len, 5);
    cr_assert_eq(memcmp(s.ptr, "llama", 5), 0);
    cr_assert_eq(common_gguf_get_str(g, "test.count", &s), COMMON_EINVAL, "u32 is not a string");
    cr_assert_eq(common_gguf_get_u32(g, "nope", &v), COMMON_ENOENT);
    const struct common_gguf_tensor *t = common_gguf_tensor_find(g, "w");
    cr_assert_not_null(t);
    cr_assert_eq(t->ne[0], 8);
    cr_assert_eq(t->ne[1], 2);
    cr_assert_eq(t->size, 64);
    float f;
    memcpy(&f, b.p + t->offset + 4 * 9, 4);
    cr_assert_float_eq(f, 9.0f, 0.0f, "tensor offset must be absolute");
    cr_assert_null(common_gguf_tensor_find(g, "x"));
    common_gguf_close(g);
    free(b.p);
}

Test(common_gguf, truncated_image_every_prefix_is_refused)
{
    struct bb b = make_image();
    for (size_t n = 0; n < b.n; n++) {
        struct common_errmsg e = {{0}};
        struct common_gguf  *g = NULL;
        int                  rc = common_gguf_parse(b.p, n, n, &g, &e);
        cr_assert_eq(rc, COMMON_ECORRUPT, "prefix %zu: rc %d", n, rc);
        cr_assert_null(g);
        cr_assert_neq(e.text[0], '\0', "prefix %zu: no message", n);
    }
    free(b.p);
}

/* Patches 4 or 8 bytes at `off` and expects `want` with a message containing `needle`. */
static void expect_patch(size_t off, uint64_t value, size_t width, int want, const char *needle)
{
    struct bb b = make_image();
    memcpy(b.p + off, &value, width);
    struct common_errmsg e = {{0}};
    int                  rc = parse(&b, &e);
    cr_assert_eq(rc, want, "patch at %zu: rc %d (%s)", off, rc, e.text);
    cr_assert_not_null(strstr(e.text, needle), "message '%s' lacks '%s'", e.text, needle);
    free(b.p);
}

/* Offsets inside make_image(). */
#define OFF_VERSION   4
#define OFF_NTENSORS  8
#define OFF_NKV       16
#define OFF_KEY0_LEN  24
#define OFF_KV0_TYPE  (24 + 8 + 20)
#define OFF_KV1       (OFF_KV0_TYPE + 4 + 8 + 5)
#define OFF_KV1_TYPE  (OFF_KV1 + 8 + 10)
#define OFF_T0        (OFF_KV1_TYPE + 4 + 4)
#define OFF_T0_NDIMS  (OFF_T0 + 8 + 1)
#define OFF_T0_NE0    (OFF_T0_NDIMS + 4)
#define OFF_T0_TYPE   (OFF_T0_NE0 + 16)
#define OFF_T0_OFFSET (OFF_T0_TYPE + 4)

Test(common_gguf, bad_magic_is_refused)
{
    expect_patch(0, 0x12345678, 4, COMMON_ECORRUPT, "magic");
}

Test(common_gguf, unsupported_versions_are_refused)
{
    expect_patch(OFF_VERSION, 1, 4, COMMON_ENOTSUP, "version 1");
    expect_patch(OFF_VERSION, 4, 4, COMMON_ENOTSUP, "version 4");
    expect_patch(OFF_VERSION, 0x03000000u, 4, COMMON_ENOTSUP, "big-endian");
}

Test(common_gguf, huge_counts_are_refused_before_allocating)
{
    expect_patch(OFF_NTENSORS, UINT64_MAX, 8, COMMON_ECORRUPT, "tensor count");
    expect_patch(OFF_NKV, 1ull << 40, 8, COMMON_ECORRUPT, "metadata count");
    expect_patch(OFF_KEY0_LEN, 1ull << 62, 8, COMMON_ECORRUPT, "exceeds the file");
}

/* A string array whose count fits a (virtual) file far larger than the header given, as a QSF
 * file's metadata image declares: refused from the header's bytes, before a table for the count
 * is allocated (a fuzzed QSF file asked for 14 GB here). */
Test(common_gguf, string_arrays_larger_than_the_header_are_refused_before_allocating)
{
    struct bb b = {0};
    bb_u32(&b, COMMON_GGUF_MAGIC);
    bb_u32(&b, 3);
    bb_u64(&b, 0); /* tensors */
    bb_u64(&b, 1); /* kvs */
    bb_str(&b, "tokenizer.ggml.tokens");
    bb_u32(&b, COMMON_GGUF_ARRAY);
    bb_u32(&b, COMMON_GGUF_STRING);
    bb_u64(&b, 1ull << 36); /* 64 Gi strings: 1 TiB of table */
    bb_str(&b, "a");
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_parse(b.p, b.n, 1ull << 42, &g, &e), COMMON_ECORRUPT);
    cr_assert(strstr(e.text, "strings") && strstr(e.text, "header's limit"), "%s", e.text);
    common_gguf_close(g);
    free(b.p);
}

Test(common_gguf, bad_value_types_are_refused)
{
    expect_patch(OFF_KV0_TYPE, 13, 4, COMMON_ECORRUPT, "general.architecture");
    expect_patch(OFF_KV1_TYPE, 200, 4, COMMON_ECORRUPT, "test.count");
}

Test(common_gguf, bad_tensor_infos_are_refused)
{
    expect_patch(OFF_T0_NDIMS, 0, 4, COMMON_ECORRUPT, "'w'");
    expect_patch(OFF_T0_NDIMS, 5, 4, COMMON_ECORRUPT, "dimensions");
    expect_patch(OFF_T0_NE0, 1ull << 62, 8, COMMON_ECORRUPT, "'w'");
    expect_patch(OFF_T0_NE0, UINT64_MAX, 8, COMMON_ECORRUPT, "overflow");
    expect_patch(OFF_T0_TYPE, 4, 4, COMMON_ENOTSUP, "type id 4");
    expect_patch(OFF_T0_TYPE, 1000, 4, COMMON_ENOTSUP, "'w'");
    expect_patch(OFF_T0_TYPE, COMMON_GGML_TYPE_Q4_0, 4, COMMON_ECORRUPT, "block size");
    expect_patch(OFF_T0_OFFSET, 3, 8, COMMON_ECORRUPT, "alignment");
    expect_patch(OFF_T0_OFFSET, 64, 8, COMMON_ECORRUPT, "beyond the end");
    expect_patch(OFF_T0_OFFSET, UINT64_MAX - 31, 8, COMMON_ECORRUPT, "beyond the end");
}

Test(common_gguf, arrays_of_arrays_and_duplicates_are_refused)
{
    struct bb b = {0};
    bb_u32(&b, COMMON_GGUF_MAGIC);
    bb_u32(&b, 2);
    bb_u64(&b, 0);
    bb_u64(&b, 1);
    bb_str(&b, "a.nested");
    bb_u32(&b, COMMON_GGUF_ARRAY);
    bb_u32(&b, COMMON_GGUF_ARRAY);
    bb_u64(&b, 1);
    struct common_errmsg e = {{0}};
    cr_assert_eq(parse(&b, &e), COMMON_ENOTSUP);
    cr_assert_not_null(strstr(e.text, "arrays of arrays"), "%s", e.text);
    free(b.p);

    struct bb d = {0};
    bb_u32(&d, COMMON_GGUF_MAGIC);
    bb_u32(&d, 3);
    bb_u64(&d, 0);
    bb_u64(&d, 2);
    for (int i = 0; i < 2; i++) {
        bb_str(&d, "dup.key");
        bb_u32(&d, COMMON_GGUF_UINT8);
        uint8_t one = 1;
        bb_put(&d, &one, 1);
    }
    cr_assert_eq(parse(&d, &e), COMMON_ECORRUPT);
    cr_assert_not_null(strstr(e.text, "duplicate metadata key 'dup.key'"), "%s", e.text);
    free(d.p);
}

Test(common_gguf, v2_arrays_and_alignment_are_read)
{
    struct bb b = {0};
    bb_u32(&b, COMMON_GGUF_MAGIC);
    bb_u32(&b, 2);
    bb_u64(&b, 1);
    bb_u64(&b, 3);
    bb_str(&b, "general.alignment");
    bb_u32(&b, COMMON_GGUF_UINT32);
    bb_u32(&b, 64);
    bb_str(&b, "x.strs");
    bb_u32(&b, COMMON_GGUF_ARRAY);
    bb_u32(&b, COMMON_GGUF_STRING);
    bb_u64(&b, 3);
    bb_str(&b, "a");
    bb_str(&b, "");
    bb_str(&b, "ccc");
    bb_str(&b, "x.i16");
    bb_u32(&b, COMMON_GGUF_ARRAY);
    bb_u32(&b, COMMON_GGUF_INT16);
    bb_u64(&b, 2);
    int16_t vals[2] = {-5, 300};
    bb_put(&b, vals, 4);
    bb_str(&b, "t");
    bb_u32(&b, 1);
    bb_u64(&b, 32);
    bb_u32(&b, COMMON_GGML_TYPE_F16);
    bb_u64(&b, 0);
    bb_pad(&b, 64);
    uint8_t data[64] = {0};
    bb_put(&b, data, 64);

    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_parse(b.p, b.n, b.n, &g, NULL), COMMON_OK);
    cr_assert_eq(common_gguf_alignment(g), 64);
    const struct common_gguf_value *arr;
    cr_assert_eq(common_gguf_get_arr(g, "x.strs", COMMON_GGUF_STRING, &arr), COMMON_OK);
    cr_assert_eq(arr->v.arr.n, 3);
    cr_assert_eq(arr->v.arr.strs[2].len, 3);
    cr_assert_eq(memcmp(arr->v.arr.strs[2].ptr, "ccc", 3), 0);
    cr_assert_eq(common_gguf_get_arr(g, "x.i16", COMMON_GGUF_INT16, &arr), COMMON_OK);
    cr_assert_eq(common_gguf_arr_i64(arr, 0), -5);
    cr_assert_eq(common_gguf_arr_i64(arr, 1), 300);
    cr_assert_eq(common_gguf_get_arr(g, "x.i16", COMMON_GGUF_INT32, &arr), COMMON_EINVAL);
    cr_assert_eq(common_gguf_tensor_find(g, "t")->offset % 64, 0);
    common_gguf_close(g);

    /* A non-power-of-two alignment is refused. */
    uint32_t bad = 48;
    memcpy(b.p + 24 + 8 + 17 + 4, &bad, 4);
    struct common_errmsg e = {{0}};
    cr_assert_eq(parse(&b, &e), COMMON_ECORRUPT);
    cr_assert_not_null(strstr(e.text, "alignment"), "%s", e.text);
    free(b.p);
}

/* ---- fixtures -------------------------------------------------------------------------------- */

/* Calls fn on every fixture GGUF; returns how many. */
static int each_fixture(void (*fn)(const char *path))
{
    char *root = fixture_path("");
    if (!root)
        return -1;
    static const char *dirs[] = {"moe-tiny", "models", "tokenizer"};
    int                count = 0;
    for (size_t d = 0; d < 3; d++) {
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s/%s", root, dirs[d]);
        DIR *dp = opendir(dir);
        if (!dp)
            continue;
        struct dirent *de;
        while ((de = readdir(dp))) {
            size_t n = strlen(de->d_name);
            if (n > 5 && strcmp(de->d_name + n - 5, ".gguf") == 0) {
                char path[8192];
                snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
                fn(path);
                count++;
            }
        }
        closedir(dp);
    }
    free(root);
    return count;
}

static void open_one(const char *path)
{
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    int                  rc = common_gguf_open(path, NULL, &g, &e);
    cr_assert_eq(rc, COMMON_OK, "%s: %s", path, e.text);
    cr_assert(common_gguf_n_kv(g) > 0, "%s has no metadata", path);
    const struct common_gguf_value *toks;
    cr_assert_eq(common_gguf_get_arr(g, "tokenizer.ggml.tokens", COMMON_GGUF_STRING, &toks),
                 COMMON_OK, "%s: no token list", path);
    if (common_gguf_n_tensors(g) > 0) {
        struct common_model m;
        cr_assert_eq(common_model_init(&m, g, &e), COMMON_OK, "%s: %s", path, e.text);
        cr_assert_eq(m.bytes_resident + m.bytes_experts, m.bytes_total);
        cr_assert_eq(m.hp.n_vocab, toks->v.arr.n, "%s: vocab size", path);
        common_model_fini(&m);
    }
    common_gguf_close(g);
}

Test(common_gguf, every_fixture_parses)
{
    int n = each_fixture(open_one);
    if (n < 0)
        cr_skip_test("../shared/fixtures absent: skipped");
    cr_assert_geq(n, 12, "expected at least 12 fixture GGUFs, found %d", n);
}

Test(common_gguf, moe_tiny_known_values)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_k_m.gguf");
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(path, NULL, &g, NULL), COMMON_OK);
    uint32_t v = 0;
    cr_assert_eq(common_gguf_get_u32(g, "llama.expert_count", &v), COMMON_OK);
    cr_assert_eq(v, 8);
    cr_assert_eq(common_gguf_get_u32(g, "llama.expert_used_count", &v), COMMON_OK);
    cr_assert_eq(v, 2);
    cr_assert_eq(common_gguf_get_u32(g, "llama.context_length", &v), COMMON_OK);
    cr_assert_eq(v, 256);
    float eps = 0;
    cr_assert_eq(common_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), COMMON_OK);
    cr_assert_float_eq(eps, 1e-5f, 1e-9f);
    cr_assert_eq(common_gguf_n_tensors(g), 43);
    const struct common_gguf_tensor *t = common_gguf_tensor_find(g, "blk.2.ffn_down_exps.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->type, COMMON_GGML_TYPE_Q6_K);
    cr_assert_eq(t->n_dims, 3);
    cr_assert_eq(t->ne[2], 8);

    struct common_model  m;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_model_init(&m, g, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(m.arch, COMMON_ARCH_LLAMA);
    cr_assert_eq(m.hp.n_layer, 4);
    cr_assert_eq(m.hp.n_head, 8);
    cr_assert_eq(m.hp.n_head_kv, 2);
    cr_assert_eq(m.hp.n_expert, 8);
    cr_assert_eq(m.hp.n_ff_exp, 256);
    cr_assert_eq(m.hp.n_rot, 32);
    cr_assert_eq(m.hp.rope_neox, 0);
    cr_assert(common_model_is_moe(&m));
    /* Expert 5 of layer 2, down part: the 6th eighth of the tensor. */
    struct common_span sp;
    cr_assert_eq(common_model_expert_span(&m, 2, 5, COMMON_EXPERT_DOWN, &sp), COMMON_OK);
    cr_assert_eq(sp.size, t->size / 8);
    cr_assert_eq(sp.offset, t->offset + 5 * (t->size / 8));
    cr_assert_eq(sp.type, COMMON_GGML_TYPE_Q6_K);
    cr_assert_eq(common_model_expert_span(&m, 4, 0, COMMON_EXPERT_UP, &sp), COMMON_EINVAL);
    cr_assert_eq(common_model_expert_span(&m, 0, 8, COMMON_EXPERT_UP, &sp), COMMON_EINVAL);
    /* Layers 2 and 3 keep Q6_K down projections, so their bundles are the largest. */
    uint64_t bundle2 = 0;
    for (int p = 0; p < 3; p++) {
        common_model_expert_span(&m, 2, 0, (enum common_expert_part)p, &sp);
        bundle2 += sp.size;
    }
    cr_assert_eq(m.bytes_expert_bundle, bundle2);
    common_model_fini(&m);
    common_gguf_close(g);
    free(path);
}

/* The tensor type counts of each quantised fixture equal what llama.cpp's loader reported. */
Test(common_gguf, type_counts_match_reference)
{
    FIXTURE_OR_SKIP(ref_path, "moe-tiny/reference.json");
    struct tjson *ref = tjson_load(ref_path);
    cr_assert_not_null(ref);
    const struct tjson *types = tjson_get(ref, "types");
    cr_assert_not_null(types);
    cr_assert_geq(types->len, 5);
    for (size_t i = 0; i < types->len; i++) {
        char rel[256];
        snprintf(rel, sizeof(rel), "moe-tiny/moe-tiny-%s.gguf", types->keys[i]);
        char *path = fixture_path(rel);
        cr_assert_not_null(path, "%s missing", rel);
        struct common_gguf *g = NULL;
        cr_assert_eq(common_gguf_open(path, NULL, &g, NULL), COMMON_OK);
        const struct tjson *want = types->items[i];
        uint64_t            seen = 0;
        for (size_t k = 0; k < want->len; k++) {
            uint32_t type;
            cr_assert_eq(common_ggml_type_from_name(want->keys[k], &type), COMMON_OK);
            uint64_t count = 0;
            for (uint64_t j = 0; j < common_gguf_n_tensors(g); j++)
                count += common_gguf_tensor_at(g, j)->type == type;
            cr_assert_eq(count, (uint64_t)want->items[k]->num, "%s: %s count %llu", rel,
                         want->keys[k], (unsigned long long)count);
            seen += count;
        }
        cr_assert_eq(seen, common_gguf_n_tensors(g), "%s: types outside the reference", rel);
        common_gguf_close(g);
        free(path);
    }
    tjson_free(ref);
    free(ref_path);
}

/* Every prefix of the header region, and a dense sample of the data region, is refused unless
 * all tensor data is present. */
Test(common_gguf, truncated_fixture_prefixes_are_refused, .timeout = 600)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_k_m.gguf");
    size_t len = 0;
    char  *file = fixture_read_all(path, &len);
    cr_assert_not_null(file);
    struct common_gguf *full = NULL;
    cr_assert_eq(common_gguf_parse(file, len, len, &full, NULL), COMMON_OK);
    uint64_t data_start = common_gguf_split_data_offset(full, 0);
    uint64_t data_end = 0;
    for (uint64_t i = 0; i < common_gguf_n_tensors(full); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(full, i);
        if (t->offset + t->size > data_end)
            data_end = t->offset + t->size;
    }
    common_gguf_close(full);
    size_t tested = 0;
    for (size_t n = 0; n <= len; n += n < data_start + 64 ? 1 : 997) {
        struct common_gguf  *g = NULL;
        struct common_errmsg e = {{0}};
        int                  rc = common_gguf_parse(file, n, n, &g, &e);
        if (n >= data_end) {
            cr_assert_eq(rc, COMMON_OK, "prefix %zu: %s", n, e.text);
        } else {
            cr_assert_eq(rc, COMMON_ECORRUPT, "prefix %zu: rc %d", n, rc);
            cr_assert_neq(e.text[0], '\0');
        }
        common_gguf_close(g);
        tested++;
    }
    cr_log_info("tested %zu prefixes", tested);
    free(file);
    free(path);
}

/* Random byte corruption of the header never crashes (ASan/UBSan build checks the reads). */
Test(common_gguf, random_header_corruption_is_survived, .timeout = 600)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_0.gguf");
    size_t len = 0;
    char  *file = fixture_read_all(path, &len);
    cr_assert_not_null(file);
    struct common_gguf *g0 = NULL;
    cr_assert_eq(common_gguf_parse(file, len, len, &g0, NULL), COMMON_OK);
    size_t hdr = (size_t)common_gguf_split_data_offset(g0, 0);
    common_gguf_close(g0);
    char    *copy = malloc(hdr);
    uint64_t state = 12345;
    int      ok = 0, bad = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(copy, file, hdr);
        for (int k = 0; k < 1 + iter % 4; k++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(state >> 33) % hdr;
            copy[at] = (char)(state >> 13);
        }
        struct common_gguf *g = NULL;
        /* Only the header bytes are handed over; the file size still bounds the data. */
        if (common_gguf_parse(copy, hdr, len, &g, NULL) == COMMON_OK) {
            struct common_model m;
            if (common_model_init(&m, g, NULL) == COMMON_OK)
                common_model_fini(&m);
            ok++;
        } else {
            bad++;
        }
        common_gguf_close(g);
    }
    cr_log_info("corrupted headers: %d parsed, %d refused", ok, bad);
    cr_assert_gt(bad, 0);
    free(copy);
    free(file);
    free(path);
}

Test(common_gguf, missing_file_is_named)
{
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_open("/nonexistent/model.gguf", NULL, &g, &e), COMMON_ENOENT);
    cr_assert_null(g);
    cr_assert_not_null(strstr(e.text, "/nonexistent/model.gguf"), "%s", e.text);
}

/* ---- writer round trip and split files ------------------------------------------------------- */

Test(common_gguf, writer_round_trip)
{
    char *dir = fixture_tmpdir();
    cr_assert_not_null(dir);
    char path[512];
    snprintf(path, sizeof(path), "%s/rt.gguf", dir);
    struct common_gguf_writer *w = NULL;
    cr_assert_eq(common_gguf_writer_create(&w, 32), COMMON_OK);
    cr_assert_eq(common_gguf_writer_set_str(w, "general.architecture", "llama"), COMMON_OK);
    cr_assert_eq(common_gguf_writer_set_u32(w, "a.u32", 42), COMMON_OK);
    cr_assert_eq(common_gguf_writer_set_i32(w, "a.i32", -42), COMMON_OK);
    cr_assert_eq(common_gguf_writer_set_u64(w, "a.u64", 1ull << 40), COMMON_OK);
    cr_assert_eq(common_gguf_writer_set_f32(w, "a.f32", 0.5f), COMMON_OK);
    cr_assert_eq(common_gguf_writer_set_bool(w, "a.bool", true), COMMON_OK);
    cr_assert_eq(common_gguf_writer_set_u32(w, "a.u32", 1), COMMON_EINVAL, "duplicate key");
    struct common_gguf_str strs[2] = {{"x", 1}, {"yz", 2}};
    cr_assert_eq(common_gguf_writer_set_arr(w, "a.strs", COMMON_GGUF_STRING, strs, 2), COMMON_OK);
    float fl[3] = {1.0f, 2.0f, 3.0f};
    cr_assert_eq(common_gguf_writer_set_arr(w, "a.fl", COMMON_GGUF_FLOAT32, fl, 3), COMMON_OK);
    cr_assert_eq(
        common_gguf_writer_add_tensor(w, "t0", COMMON_GGML_TYPE_F32, 2, (uint64_t[]){3, 2}),
        COMMON_OK);
    cr_assert_eq(common_gguf_writer_add_tensor(w, "t1", COMMON_GGML_TYPE_Q8_0, 1, (uint64_t[]){64}),
                 COMMON_OK);
    cr_assert_eq(
        common_gguf_writer_add_tensor(w, "bad", COMMON_GGML_TYPE_Q8_0, 1, (uint64_t[]){33}),
        COMMON_EINVAL, "row not a multiple of the block");
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_writer_begin(w, path, &e), COMMON_OK, "%s", e.text);
    float   d0[6];
    uint8_t d1[68];
    for (int i = 0; i < 6; i++)
        d0[i] = (float)i * 1.5f;
    for (int i = 0; i < 68; i++)
        d1[i] = (uint8_t)i;
    cr_assert_eq(common_gguf_writer_write_data(w, d0, 10, &e), COMMON_OK);
    cr_assert_eq(common_gguf_writer_write_data(w, (uint8_t *)d0 + 10, 14, &e), COMMON_OK);
    cr_assert_eq(common_gguf_writer_write_data(w, d1, 68, &e), COMMON_OK);
    cr_assert_eq(common_gguf_writer_finish(w, &e), COMMON_OK, "%s", e.text);
    common_gguf_writer_destroy(w);

    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(path, NULL, &g, &e), COMMON_OK, "%s", e.text);
    uint32_t u;
    int64_t  i64;
    uint64_t u64;
    float    f;
    bool     b;
    cr_assert_eq(common_gguf_get_u32(g, "a.u32", &u), COMMON_OK);
    cr_assert_eq(u, 42);
    cr_assert_eq(common_gguf_get_i64(g, "a.i32", &i64), COMMON_OK);
    cr_assert_eq(i64, -42);
    cr_assert_eq(common_gguf_get_u32(g, "a.i32", &u), COMMON_EINVAL, "negative is not a u32");
    cr_assert_eq(common_gguf_get_u64(g, "a.u64", &u64), COMMON_OK);
    cr_assert_eq(u64, 1ull << 40);
    cr_assert_eq(common_gguf_get_u32(g, "a.u64", &u), COMMON_EINVAL, "out of u32 range");
    cr_assert_eq(common_gguf_get_f32(g, "a.f32", &f), COMMON_OK);
    cr_assert_float_eq(f, 0.5f, 0.0f);
    cr_assert_eq(common_gguf_get_bool(g, "a.bool", &b), COMMON_OK);
    cr_assert(b);
    const struct common_gguf_value *arr;
    cr_assert_eq(common_gguf_get_arr(g, "a.strs", COMMON_GGUF_STRING, &arr), COMMON_OK);
    cr_assert_eq(arr->v.arr.strs[1].len, 2);
    cr_assert_eq(common_gguf_get_arr(g, "a.fl", COMMON_GGUF_FLOAT32, &arr), COMMON_OK);
    cr_assert_float_eq(common_gguf_arr_f64(arr, 2), 3.0, 0.0);
    const struct common_gguf_tensor *t1 = common_gguf_tensor_find(g, "t1");
    cr_assert_not_null(t1);
    cr_assert_eq(t1->size, 68);
    cr_assert_eq(t1->offset % 32, 0);
    uint8_t back[68];
    cr_assert_eq(pread(common_gguf_split_fd(g, 0), back, 68, (off_t)t1->offset), 68);
    cr_assert_eq(memcmp(back, d1, 68), 0);
    common_gguf_close(g);
    fixture_rmtree(dir);
    free(dir);
}

/* Writes split `no` of `count` holding tensor `name` (16 f32 values = base..base+15). */
static void write_split(const char *path, uint32_t no, uint32_t count, const char *name, float base)
{
    struct common_gguf_writer *w = NULL;
    cr_assert_eq(common_gguf_writer_create(&w, 32), COMMON_OK);
    if (no == 0)
        cr_assert_eq(common_gguf_writer_set_str(w, "general.architecture", "llama"), COMMON_OK);
    common_gguf_writer_set_u32(w, "split.no", no);
    common_gguf_writer_set_u32(w, "split.count", count);
    common_gguf_writer_set_i32(w, "split.tensors.count", (int32_t)count);
    cr_assert_eq(common_gguf_writer_add_tensor(w, name, COMMON_GGML_TYPE_F32, 1, (uint64_t[]){16}),
                 COMMON_OK);
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_writer_begin(w, path, &e), COMMON_OK, "%s", e.text);
    float d[16];
    for (int i = 0; i < 16; i++)
        d[i] = base + (float)i;
    cr_assert_eq(common_gguf_writer_write_data(w, d, sizeof(d), &e), COMMON_OK);
    cr_assert_eq(common_gguf_writer_finish(w, &e), COMMON_OK);
    common_gguf_writer_destroy(w);
}

Test(common_gguf, split_files_open_as_one_model)
{
    char *dir = fixture_tmpdir();
    char  p1[512], p2[512];
    snprintf(p1, sizeof(p1), "%s/m-00001-of-00002.gguf", dir);
    snprintf(p2, sizeof(p2), "%s/m-00002-of-00002.gguf", dir);
    write_split(p1, 0, 2, "a", 0.0f);
    write_split(p2, 1, 2, "b", 100.0f);
    for (int which = 0; which < 2; which++) {
        struct common_gguf  *g = NULL;
        struct common_errmsg e = {{0}};
        cr_assert_eq(common_gguf_open(which ? p2 : p1, NULL, &g, &e), COMMON_OK, "%s", e.text);
        cr_assert_eq(common_gguf_n_splits(g), 2);
        cr_assert_eq(common_gguf_n_tensors(g), 2);
        const struct common_gguf_tensor *b = common_gguf_tensor_find(g, "b");
        cr_assert_not_null(b);
        cr_assert_eq(b->split, 1);
        float v;
        cr_assert_eq(pread(common_gguf_split_fd(g, 1), &v, 4, (off_t)(b->offset + 8)), 4);
        cr_assert_float_eq(v, 102.0f, 0.0f);
        common_gguf_close(g);
    }
    /* no_splits opens one file alone. */
    struct common_gguf *g1 = NULL;
    cr_assert_eq(common_gguf_open(p1, &(struct common_gguf_opts){.no_splits = true}, &g1, NULL),
                 COMMON_OK);
    cr_assert_eq(common_gguf_n_tensors(g1), 1);
    common_gguf_close(g1);
    /* A missing split is named. */
    remove(p2);
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_open(p1, NULL, &g, &e), COMMON_ENOENT);
    cr_assert_not_null(strstr(e.text, "m-00002-of-00002.gguf"), "%s", e.text);
    fixture_rmtree(dir);
    free(dir);
}

/* An image with two f32 tensors "a" [8] and "b" [8] at data offsets off_a and off_b (the data
 * section holds 64 bytes), tensor b of type type_b. */
static struct bb make_two(uint64_t off_a, uint64_t off_b, uint32_t type_b)
{
    struct bb b = {0};
    bb_u32(&b, COMMON_GGUF_MAGIC);
    bb_u32(&b, 3);
    bb_u64(&b, 2); /* tensors */
    bb_u64(&b, 1); /* kvs */
    bb_str(&b, "general.architecture");
    bb_u32(&b, COMMON_GGUF_STRING);
    bb_str(&b, "llama");
    const char *names[2] = {"a", "b"};
    uint64_t    offs[2] = {off_a, off_b};
    uint32_t    types[2] = {COMMON_GGML_TYPE_F32, type_b};
    for (int t = 0; t < 2; t++) {
        bb_str(&b, names[t]);
        bb_u32(&b, 1);
        bb_u64(&b, 8);
        bb_u32(&b, types[t]);
        bb_u64(&b, offs[t]);
    }
    bb_pad(&b, 32);
    static const uint8_t data[64];
    bb_put(&b, data, sizeof(data));
    return b;
}

static void expect_two(uint64_t off_a, uint64_t off_b, uint32_t type_b, int want,
                       const char *needle)
{
    struct bb            b = make_two(off_a, off_b, type_b);
    struct common_errmsg e = {{0}};
    int                  rc = parse(&b, &e);
    cr_assert_eq(rc, want, "offsets %llu, %llu: rc %d (%s)", (unsigned long long)off_a,
                 (unsigned long long)off_b, rc, e.text);
    if (needle)
        cr_assert_not_null(strstr(e.text, needle), "message '%s' lacks '%s'", e.text, needle);
    free(b.p);
}

/* As llama.cpp: each tensor's data follows the previous one's, padded to the alignment. */
Test(common_gguf, overlapping_or_out_of_order_tensor_data_is_refused)
{
    expect_two(0, 32, COMMON_GGML_TYPE_F32, COMMON_OK, NULL);
    expect_two(0, 0, COMMON_GGML_TYPE_F32, COMMON_ECORRUPT,
               "tensor 'b': data offset 0, expected 32");
    expect_two(32, 0, COMMON_GGML_TYPE_F32, COMMON_ECORRUPT, "tensor 'a'");
}

/* A FIFO (or a directory) as a model is refused at once, never waited on. */
Test(common_gguf, fifo_or_directory_is_refused_without_waiting, .timeout = 30)
{
    char *dir = fixture_tmpdir();
    char  path[600];
    snprintf(path, sizeof(path), "%s/f.gguf", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_open(path, NULL, &g, &e), COMMON_EINVAL);
    cr_assert_null(g);
    cr_assert(strstr(e.text, "FIFO"), "%s", e.text);
    cr_assert_eq(common_gguf_open(dir, NULL, &g, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "directory") || strstr(e.text, "regular"), "%s", e.text);
    fixture_rmtree(dir);
    free(dir);
}
